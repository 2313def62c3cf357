"""Bad-input suite, class "what a refusal leaves" (issue 54, class 7): a refused run leaves no partial table that reads
as a result, and a refused training or study no folder and no ``data.json``.

* Zoo shards: a shard refused because another process changed the zoo's settings (a shard started with other
  settings and ``--allow-changes``) writes neither its record nor a table; no ``zoo.csv`` ever mixes two
  measurements. Before: the table written after each model mixed both settings (a spy sees every table written).
* Training: a run refused during its set-up, after reading its data (a split smaller than one batch), removes the
  folder it created, or in a folder that was there the ``data.json`` it added. Before: a folder holding data.json.
* Study: a study refused before its first run (its data lacks the validation split) creates no folder. Before:
  an empty folder, which the next run refused as "already holds a study"."""

from __future__ import annotations

import csv

import numpy as np
import pytest
from faultsuite import cli, judge, refused, snapshot
from PIL import Image

NOPE, APE = "posgeom_vit_micro_patch8_64_nope", "posgeom_vit_micro_patch8_64_ape"
ZOO = ["--img-size", "32", "--num-workers", "0", "--no-progress", "--extras", "none"]
TRAIN = ["--set", "model_kwargs.depth=1", "--set", "model_kwargs.embed_dim=16", "--set", "model_kwargs.num_heads=2"]
TRAIN += ["--set", "img_size=16", "--set", "workers=0", "--set", "epochs=1", "--no-progress"]


def _folder(root, n: int = 4, splits=("train", "validation")):
    rng = np.random.default_rng(0)
    for split in splits:
        for cls in ("ant", "bee"):
            (root / split / cls).mkdir(parents=True, exist_ok=True)
            for j in range(n):
                Image.fromarray(rng.integers(0, 256, (20, 20, 3), dtype=np.uint8)).save(root / split / cls / f"{j}.png")
    return root


@pytest.mark.slow
def test_a_zoo_shard_refused_for_mixed_settings_never_writes_a_mixed_table(tmp_path, monkeypatch, one_thread):
    """The issue's example: shard A (2 RPI permutations) measures its first model while shard B starts with 3 and
    --allow-changes; A's table after that model mixed both, and stayed on disk."""
    from timm_posgeom.app.zoo import run as zoo_run

    data, out = _folder(tmp_path / "data"), tmp_path / "zoo"
    tables: list[set[str]] = []
    real_csv, real_measure = zoo_run.write_csv, zoo_run.measure_model

    def spy_csv(records, path, config):  # the settings of every table written
        tables.append({str(r.settings.get("rpi_permutations")) for r in records if r.status == "ok"})
        return real_csv(records, path, config)

    def measure(name, config, data_, progress=True):
        if config.rpi_permutations == 2 and name == NOPE:  # shard B starts while A measures NOPE (locked by A)
            b = cli(
                ["zoo", NOPE, APE, "--data", data, "--out", out, *ZOO, "--rpi-permutations", "3", "--allow-changes"]
            )
            assert b.code == 0, b.err + b.trace
        return real_measure(name, config, data_, progress=progress)

    monkeypatch.setattr(zoo_run, "write_csv", spy_csv)
    monkeypatch.setattr(zoo_run, "measure_model", measure)
    a = cli(["zoo", NOPE, APE, "--data", data, "--out", out, *ZOO, "--rpi-permutations", "2"])
    with open(out / "zoo.csv") as f:
        on_disk = {row["rpi_permutations"] for row in csv.DictReader(f)}
    mixed = any(len(t) > 1 for t in tables) or len(on_disk) > 1
    outcome = refused(a, "another process changed this zoo's settings")
    judge("leftovers", "silent_wrong" if mixed else outcome, "refused", (tables, on_disk, a.err + a.trace))


def test_a_training_refused_after_reading_its_data_leaves_no_folder(tmp_path, one_thread):
    data = _folder(tmp_path / "data")
    run = cli(["train", "--data", data, "--out", tmp_path / "run", "--set", "batch_size=64", *TRAIN])
    outcome = refused(run, "smaller than one global batch")
    judge("leftovers", outcome if not (tmp_path / "run").exists() else "other", "refused", run.err + run.trace)


def test_a_training_refused_in_a_folder_that_was_there_removes_only_what_it_added(tmp_path, one_thread):
    data, out = _folder(tmp_path / "data"), tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    before = snapshot(out)
    run = cli(["train", "--data", data, "--out", out, "--set", "batch_size=64", *TRAIN])
    outcome = refused(run, "smaller than one global batch")
    judge("leftovers", outcome if snapshot(out) == before else "other", "refused", run.err + run.trace)


def test_a_study_refused_before_its_first_run_leaves_no_folder(tmp_path, one_thread):
    data = _folder(tmp_path / "data", splits=("train",))
    run = cli(["study", "--preset", "demo", "--data", data, "--conditions", "nope", "--out", tmp_path / "study"])
    outcome = refused(run, "validation")
    judge("leftovers", outcome if not (tmp_path / "study").exists() else "other", "refused", run.err + run.trace)
