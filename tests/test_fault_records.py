"""Bad-input suite, class "records and neutral settings" (issue 40, item 2): a record is reused only for the same
inputs, and a setting called neutral changes no number.

* Zoo and study records carry a fingerprint of the data they measured (its content: every image's bytes), and
  of every setting that changes a number: a rerun on images replaced under the same path is refused in one line
  (it kept the old rows, "measured before, kept", and measured new models on the new images: one table of two
  data sets), or measures again with ``--allow-changes``; a merge refuses a record of other data or settings.
* A lock of a process that is gone, here or on another host, is reported with how to clear it and never makes a
  model look measured.
* The batch size is neutral (``NEUTRAL_KEYS``): a zoo row (SSDC, RPI, delta SSDC, the position probe, attention,
  fragility) and the study's measuring functions give the same numbers at batch 1, 3 and 6 (to 1e-6)."""

from __future__ import annotations

import json
import math
import os
import shutil
from dataclasses import replace

import numpy as np
import pytest
import timm
import torch
from faultsuite import cli, fake_study, judge, library, library_refused, refused, right, snapshot
from PIL import Image

APE = "posgeom_vit_micro_patch8_64_ape"
ZOO = ["--img-size", "32", "--num-workers", "0", "--no-progress", "--rpi-permutations", "2"]


def _folder(root, n: int = 6, seed: int = 0):
    rng = np.random.default_rng(seed)
    for split in ("train", "validation"):
        for cls in ("ant", "bee"):
            (root / split / cls).mkdir(parents=True, exist_ok=True)
            for j in range(n):
                Image.fromarray(rng.integers(0, 256, (20, 20, 3), dtype=np.uint8)).save(root / split / cls / f"{j}.png")
    return root


def _export(root):
    """A 2-class APE model that records its class names: the zoo scores its top-1 (about half right)."""
    from timm_posgeom.app.hub import export_for_hub

    torch.manual_seed(0)
    args = dict(img_size=32, depth=2, num_classes=2, embed_dim=32, num_heads=2)
    model = timm.create_model(APE, **args).eval()
    with torch.no_grad():
        model.pos_embed.normal_(0, 1)
    export_for_hub(
        model, root / "export", args, dict(input_size=(3, 32, 32), num_classes=2, label_names=["ant", "bee"])
    )
    return f"local-dir:{root / 'export'}"


def _replace(paths) -> None:
    for i, png in enumerate(paths):
        Image.fromarray(np.full((20, 20, 3), 7 * i, np.uint8)).save(png)


def _record(out):
    from timm_posgeom.app.records import ZooModel

    return ZooModel.read(next((out / "models").glob("*.json")))


@pytest.fixture(scope="module")
def zoo_of_one(tmp_path_factory):
    root = tmp_path_factory.mktemp("records")
    data, model = _folder(root / "data"), _export(root)
    run = cli(["zoo", model, "--data", data, "--out", root / "zoo", *ZOO, "--extras", "none"])
    assert run.code == 0, run.err + run.trace
    return root, data, model


# --------------------------------------------------------------------------------------------
# records reused only for the same inputs
# --------------------------------------------------------------------------------------------
def test_a_zoo_rerun_on_images_replaced_under_the_same_path_is_refused(zoo_of_one, tmp_path, one_thread):
    """The issue's example: the rerun kept the old rows ("measured before, kept"), exit 0."""
    root, data, model = zoo_of_one
    shutil.copytree(root, tmp_path / "r", symlinks=True)
    data, out = tmp_path / "r" / "data", tmp_path / "r" / "zoo"
    for record in (out / "models").glob("*.json"):  # the copy measured the copied folder: the same path as now
        record.write_text(record.read_text().replace(str(root / "data"), str(data)))
    (out / "zoo.json").write_text((out / "zoo.json").read_text().replace(str(root / "data"), str(data)))
    _replace(sorted((data / "validation").rglob("*.png"))[-1:])  # one image, the last: not among the first 8
    before = snapshot(out)
    run = cli(["zoo", "--data", data, "--out", out, *ZOO, "--extras", "none"])
    outcome = refused(run, "other data")
    judge("records", outcome if snapshot(out) == before else "loss", "refused", run.out + run.err + run.trace)


def test_a_zoo_rerun_allowed_to_change_measures_the_new_images(zoo_of_one, tmp_path, one_thread):
    root, data, model = zoo_of_one
    new = _folder(tmp_path / "new", seed=5)
    shutil.copytree(root / "zoo", tmp_path / "zoo")
    run = cli(["zoo", "--data", new, "--out", tmp_path / "zoo", *ZOO, "--extras", "none", "--allow-changes"])
    fresh = cli(["zoo", model, "--data", new, "--out", tmp_path / "fresh", *ZOO, "--extras", "none"])
    ok = fresh.code == 0 and run.code == 0 and _record(tmp_path / "zoo").ssdc == _record(tmp_path / "fresh").ssdc
    judge("records", right(run, ok and "1 measured now" in run.out), "right", run.out + run.err + run.trace)


@pytest.mark.parametrize("other", ["data", "seed", "unrecorded"])
def test_a_merge_refuses_a_record_of_other_data_or_settings(zoo_of_one, tmp_path, other, one_thread):
    """A merge never compared a record's settings with the zoo's: one table mixed two measurements."""
    root, data, model = zoo_of_one
    shutil.copytree(root / "zoo", tmp_path / "zoo")
    path = next((tmp_path / "zoo" / "models").glob("*.json"))
    raw = json.loads(path.read_text())
    if other == "unrecorded":  # a record from before data fingerprints: what it measured cannot be told
        raw["settings"].pop("data_fingerprint", None)
        raw["settings"]["data"] = "elsewhere"
    else:
        raw["settings"].update({"data_fingerprint": "0" * 16} if other == "data" else {"seed": 9})
    path.write_text(json.dumps(raw))
    before = snapshot(tmp_path / "zoo")
    run = cli(["zoo", "--out", tmp_path / "zoo", "--merge"])
    outcome = refused(run, "other settings or data")
    judge("records", outcome if snapshot(tmp_path / "zoo") == before else "loss", "refused", run.out + run.err)


@pytest.mark.parametrize("holder", ["another host", "a dead process here"])
def test_a_lock_of_a_process_that_is_gone_never_makes_a_model_look_measured(zoo_of_one, tmp_path, holder, one_thread):
    from timm_posgeom.app.zoo import safe_name

    root, data, model = zoo_of_one
    out = tmp_path / "zoo"
    folder = out / "locks" / safe_name(model)
    folder.mkdir(parents=True)
    pid = 2**22 + 12345  # beyond any pid here: a process that is gone
    host = "node-elsewhere-17" if holder == "another host" else os.uname().nodename
    # what a killed holder leaves: its holder file (the operating system's lock on .lock ended with it)
    (folder / ".holder.json").write_text(json.dumps({"pid": pid, "host": host, "started": "2026-01-01 00:00:00"}))
    run = cli(["zoo", model, "--data", data, "--out", out, *ZOO, "--extras", "none"])
    if holder == "another host":  # cannot be told gone from here: left, said, how to clear it named, not "kept"
        ok = (
            f"remove {folder / '.holder.json'}" in run.out
            and "(0 measured now, 0 kept)" in run.out
            and "not measured here" in run.err
            and not (out / "models" / f"{safe_name(model)}.json").exists()
        )
    else:  # gone, on this host: taken over and measured
        ok = "1 measured now" in run.out and (out / "models" / f"{safe_name(model)}.json").exists()
    judge("records", right(run, ok), "right", run.out + run.err + run.trace)


def test_the_folder_lock_of_another_host_says_how_to_clear_it(tmp_path):
    from timm_posgeom.app.rundir import RunLock

    (tmp_path / ".holder.json").write_text(json.dumps({"pid": 1, "host": "node-elsewhere-17", "started": "x"}))
    _, error, _ = library(lambda: RunLock(tmp_path).acquire(say=lambda s: None))
    judge("records", library_refused(error, f"remove {tmp_path / '.holder.json'}"), "refused", error)


def test_a_study_resumed_on_images_replaced_beyond_the_first_eight_is_refused(tmp_path, one_thread):
    """The study compared the first 8 images' pixels only: a replaced ninth was measured as the same data."""
    from timm_posgeom.data import load_split

    data = _folder(tmp_path / "data")
    out, argv = fake_study(tmp_path, data)
    split = load_split(data, "validation")
    _replace([split.items.samples[9][0]])  # the tenth image in the split's order
    before = snapshot(out)
    run = cli(argv)
    outcome = refused(run, "measured on other data")
    judge("records", outcome if snapshot(out) == before else "loss", "refused", run.err + run.trace)


# --------------------------------------------------------------------------------------------
# the batch size is neutral: the same numbers at batch 1, 3 and 6
# --------------------------------------------------------------------------------------------
ROW = {  # zoo record field -> its numbers
    "ssdc": lambda r: r.ssdc,
    "rpi_ssdc": lambda r: r.rpi_ssdc,
    "delta ssdc": lambda r: [r.rpi_delta_ssdc],
    "position": lambda r: r.position_accuracy,
    "position rpi": lambda r: r.position_accuracy_rpi,
    "attention distance": lambda r: r.attention_distance,
    "attention entropy": lambda r: r.attention_entropy,
    "top-1 and FS": lambda r: [r.clean_accuracy, *r.fs.values()],
}


@pytest.fixture(scope="module")
def rows_by_batch(zoo_of_one, tmp_path_factory):
    root, data, model = zoo_of_one
    out = tmp_path_factory.mktemp("batches")
    for batch in (1, 3, 6):
        run = cli(["zoo", model, "--data", data, "--out", out / str(batch), *ZOO, "--batch-size", str(batch)])
        assert run.code == 0, run.err + run.trace
    return {batch: _record(out / str(batch)) for batch in (1, 3, 6)}


def _same(a, b) -> bool:
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    return a.shape == b.shape and bool(np.isfinite(a).all()) and np.allclose(a, b, rtol=0, atol=1e-6)


@pytest.mark.parametrize("batch", [3, 6])
@pytest.mark.parametrize("field", list(ROW))
def test_a_zoo_row_is_the_same_at_any_batch_size(rows_by_batch, field, batch):
    """The position probe drew a fresh RPI permutation per batch: its numbers changed with the batch size."""
    rows = rows_by_batch
    ok = _same(ROW[field](rows[batch]), ROW[field](rows[1]))
    judge("records", "right" if ok else "silent_wrong", "right", (ROW[field](rows[batch]), ROW[field](rows[1])))


STUDY = ["ssdc", "attention", "fragility", "sweep"]


@pytest.fixture(scope="module")
def study_numbers_by_batch(tmp_path_factory):
    """The study's measuring (its protocol through measure_model, app/study/measure.py's records) of one model at
    batch 1, 3 and 6."""
    from timm_posgeom.app.study import measure as M
    from timm_posgeom.app.study import preset_config
    from timm_posgeom.data import load_split
    from timm_posgeom.protocol import measure_model

    root = tmp_path_factory.mktemp("study-batches")
    val = load_split(_folder(root / "data"), "validation")
    torch.manual_seed(0)
    model = timm.create_model(
        "posgeom_vit_micro_patch8_64_sincos", img_size=32, depth=2, num_classes=2, embed_dim=32, num_heads=2
    ).eval()
    numbers = {}
    for batch in (1, 3, 6):
        config = replace(
            preset_config("demo"), batch_size=batch, rpi_permutations=2, probe_images=12, alphas=(1.0, 0.5)
        )
        config = replace(config, max_images=None, sweep_images=None)
        measured = measure_model(model, val, config.protocol("sincos"), parts=("fragility", "alpha_sweep"))
        ssdc = M.ssdc_summary(model, val, config, None)
        att = M.attention_summary(model, val, config)
        numbers[batch] = {
            "ssdc": [*ssdc.per_layer, *ssdc.rpi_per_layer, ssdc.rpi_delta],
            "attention": [v for rows in (att.mean_distance, att.rpi_entropy) for row in rows for v in row],
            "fragility": [measured.fragility.clean_accuracy, *measured.fragility.fs.values()],
            "sweep": [*measured.alpha_sweep.delta_ssdc, *measured.alpha_sweep.fs["jpeg:5"]],
        }
    return numbers


@pytest.mark.parametrize("batch", [3, 6])
@pytest.mark.parametrize("part", STUDY)
def test_the_studys_measurements_are_the_same_at_any_batch_size(study_numbers_by_batch, part, batch):
    study_numbers = study_numbers_by_batch
    ok = _same(study_numbers[batch][part], study_numbers[1][part])
    judge("records", "right" if ok else "silent_wrong", "right", (study_numbers[batch][part], study_numbers[1][part]))


def test_the_neutral_keys_are_what_the_tests_prove():
    """What docs/zoo.md calls neutral is what NEUTRAL_KEYS says, and the batch size is among them."""
    from timm_posgeom.app.rundir import NEUTRAL_KEYS

    assert {"batch_size", "num_workers", "device"} <= NEUTRAL_KEYS["zoo"]
    assert {"batch_size", "workers", "device"} <= NEUTRAL_KEYS["study"]
    assert not math.isnan(0.0)
