"""Bad-input suite, class "nothing destroyed" (issue 40, item 5): a merge or rerun that would shrink ``zoo.csv``
keeps the former one beside it (``zoo.csv.replaced-N``); a refused ``--resume`` (or rerun) of a study, a training
run or a zoo writes nothing; ``posgeom train --out DIR`` never overwrites a folder that holds an export but no run.

The generator lists every refusal path of a resume, each checked on a folder's snapshot (every file's bytes)
taken before: a right outcome is the one-line refusal and the same snapshot after."""

from __future__ import annotations

import re
import shutil

import numpy as np
import pytest
import timm
from faultsuite import cli, fake_study, judge, refused, right, snapshot
from PIL import Image

NOPE, APE = "posgeom_vit_micro_patch8_64_nope", "posgeom_vit_micro_patch8_64_ape"
ZOO = [
    "--img-size",
    "32",
    "--num-workers",
    "0",
    "--no-progress",
    "--no-pretrained",
    "--rpi-permutations",
    "2",
    "--extras",
    "none",
]


def _folder(root, n: int = 3, shift: int = 0):
    rng = np.random.default_rng(shift)
    for cls in ("ant", "bee"):
        for split in ("train", "validation"):
            (root / split / cls).mkdir(parents=True, exist_ok=True)
            for j in range(n):
                Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)).save(root / split / cls / f"{j}.png")
    return root


@pytest.fixture(scope="module")
def zoo_of_two(tmp_path_factory):
    """A zoo of two models on a small folder (module-wide: copied by each test that changes it)."""
    root = tmp_path_factory.mktemp("loss")
    data = _folder(root / "data")
    run = cli(["zoo", NOPE, APE, "--data", data, "--out", root / "zoo", *ZOO])
    assert run.code == 0, run.err + run.trace
    return data, root / "zoo"


def _copy(zoo_of_two, tmp_path):
    data, out = zoo_of_two
    shutil.copytree(out, tmp_path / "zoo")
    return data, tmp_path / "zoo"


def _kept(out, before: bytes) -> bool:
    """The former zoo.csv is beside the new one, byte for byte."""
    return any(p.read_bytes() == before for p in out.glob("zoo.csv.replaced-*"))


def test_a_merge_of_a_partial_copy_keeps_the_former_table(zoo_of_two, tmp_path, one_thread):
    """The issue's example: a merge with some shard records missing rewrote zoo.csv with fewer rows, and the
    others (their only copy) were gone."""
    data, out = _copy(zoo_of_two, tmp_path)
    before = (out / "zoo.csv").read_bytes()
    next((out / "models").glob(f"{APE}.json")).unlink()  # a partial copy from a cluster
    run = cli(["zoo", "--out", out, "--merge"])
    ok = run.code == 0 and _kept(out, before) and "kept the former zoo.csv" in run.out
    judge("loss", "loss" if run.code == 0 and not ok else right(run, ok), "right", run.out + run.err + run.trace)


def test_a_rerun_that_measures_again_keeps_the_former_table(zoo_of_two, tmp_path, one_thread):
    data, out = _copy(zoo_of_two, tmp_path)
    before = (out / "zoo.csv").read_bytes()
    run = cli(["zoo", "--data", data, "--out", out, *ZOO, "--seed", "1", "--allow-changes"])
    ok = run.code == 0 and _kept(out, before) and len(list((out / "models").glob("*.json.replaced-*"))) == 2
    judge("loss", "loss" if run.code == 0 and not ok else right(run, ok), "right", run.out + run.err + run.trace)


def test_a_merge_that_loses_nothing_sets_nothing_aside(zoo_of_two, tmp_path, one_thread):
    _, out = _copy(zoo_of_two, tmp_path)
    assert cli(["zoo", "--out", out, "--merge"]).code == 0
    assert not list(out.glob("*.replaced-*"))


# --------------------------------------------------------------------------------------------
# refused resumes write nothing
# --------------------------------------------------------------------------------------------
TINY = [
    "model_kwargs.embed_dim=32",
    "model_kwargs.depth=1",
    "model_kwargs.num_heads=2",
    "img_size=32",
    "batch_size=8",
    "workers=0",
    "max_train_images=64",
    "max_val_images=12",
    "max_steps=2",
    "checkpoint_every=1",
    "eval_every=100",
]


def _train_argv(out, *extra):
    argv = ["train", "--out", out, "--no-progress"]
    for item in [*TINY, *extra]:
        argv += ["--set", item]
    return argv


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("train") / "run"
    run = cli(_train_argv(out))
    assert run.code == 0, run.err + run.trace
    return out


def _replace_images(data) -> None:
    """The same file names and sizes, other pixels: what a re-download or a copy over the folder does."""
    for i, png in enumerate(sorted(data.rglob("*.png"))):
        Image.fromarray(np.full((16, 16, 3), 10 * i, np.uint8)).save(png)


def _zoo_refusals(zoo_of_two, tmp_path):
    data, out = _copy(zoo_of_two, tmp_path)
    other = _folder(tmp_path / "other", shift=7)
    return tmp_path, [
        ("zoo: other settings", ["zoo", "--data", data, "--out", out, *ZOO, "--seed", "3"], "other settings"),
        ("zoo: other data", ["zoo", "--data", other, "--out", out, *ZOO], "other settings"),
    ]


@pytest.fixture(scope="module")
def trained_on_folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("train-folder")
    data = _folder(root / "data", n=4)
    run = cli(_train_argv(root / "run", "batch_size=4") + ["--data", data])
    assert run.code == 0, run.err + run.trace
    return root


def _train_refusals(trained, tmp_path, on_folder):
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    finished = tmp_path / "finished"
    shutil.copytree(trained, finished)
    shutil.rmtree(finished / "checkpoints")
    shutil.copytree(on_folder / "run", tmp_path / "folder-run")
    _replace_images(on_folder / "data")
    return tmp_path, [
        ("train: resume with another recipe", _train_argv(run, "lr=0.5") + ["--resume"], "another recipe"),
        (
            "train: resume with trackers and another recipe",
            _train_argv(run, "lr=0.5") + ["--resume", "--log-with", "tensorboard"],
            "another recipe",
        ),
        (
            "train: resume on images replaced under the same path",
            _train_argv(tmp_path / "folder-run", "batch_size=4") + ["--resume", "--data", on_folder / "data"],
            "other data",
        ),
        (
            "train: resume of a finished run without checkpoints",
            _train_argv(finished) + ["--resume"],
            "nothing to continue",
        ),
        ("train: resume of nothing", _train_argv(tmp_path / "nothing") + ["--resume"], "no run to resume"),
        ("train: a finished run without --resume", _train_argv(run), "pass --resume"),
    ]


CASES = [
    "zoo: other settings",
    "zoo: other data",
    "train: resume with another recipe",
    "train: resume with trackers and another recipe",
    "train: resume on images replaced under the same path",
    "train: resume of a finished run without checkpoints",
    "train: resume of nothing",
    "train: a finished run without --resume",
]


@pytest.mark.parametrize("case", CASES)
def test_a_refused_resume_writes_nothing(zoo_of_two, trained, trained_on_folder, tmp_path, case, one_thread):
    root, cases = (
        _zoo_refusals(zoo_of_two, tmp_path)
        if case.startswith("zoo")
        else _train_refusals(trained, tmp_path, trained_on_folder)
    )
    argv, phrase = {c[0]: c[1:] for c in cases}[case]
    before = snapshot(root)
    run = cli(argv)
    outcome = refused(run, phrase)
    if outcome == "refused" and snapshot(root) != before:
        changed = sorted(set(snapshot(root).items()) ^ set(before.items()))
        outcome = "loss" if any(k in before for k, _ in changed) else "silent_wrong"
        run.trace = f"files changed: {changed[:6]}"
    judge("loss", outcome, "refused", run.err + run.trace)


def test_training_never_overwrites_a_folder_that_holds_an_export_but_no_run(tmp_path, one_thread):
    from timm_posgeom.app.hub import export_for_hub

    out = tmp_path / "downloaded"
    export_for_hub(timm.create_model(NOPE, img_size=32, depth=1, num_classes=2), out / "export")
    before = snapshot(out)
    run = cli(_train_argv(out))
    outcome = refused(run, "holds export but no training run")
    if outcome != "refused" and snapshot(out) != before:
        outcome = "loss"
    judge("loss", outcome, "refused", run.err + run.trace)
    assert snapshot(out) == before


def _study_refusal(tmp_path, case: str):
    """A study ready to resume (:func:`faultsuite.fake_study`) and the resume that must be refused."""
    import json as _json

    out, argv = fake_study(tmp_path, _folder(tmp_path / "data", n=6))
    second = out / "runs" / "nope_s1"
    if case == "other settings":
        return out, argv + ["--rpi-permutations", "2"], "other settings"
    if case == "a run measured on other weights":  # found at the second run: the first was measured first
        raw = _json.loads((second / "eval.json").read_text())
        (second / "eval.json").write_text(_json.dumps(dict(raw, weights_sha1="0" * 40)))
        return out, argv, "other settings (weights"
    recipe = (second / "recipe.yaml").read_text()  # a run trained with another recipe
    (second / "recipe.yaml").write_text(re.sub(r"^lr: .*$", "lr: 0.5", recipe, flags=re.M))
    return out, argv, "another recipe"


@pytest.mark.parametrize(
    "case", ["other settings", "a run measured on other weights", "a run trained with another recipe"]
)
def test_a_refused_study_resume_writes_nothing(tmp_path, case, one_thread):
    """A refusal found at the second run came after the first was measured and results.json rewritten."""
    out, argv, phrase = _study_refusal(tmp_path, case)
    before = snapshot(out)
    run = cli(argv)
    outcome = refused(run, phrase)
    if outcome == "refused" and snapshot(out) != before:
        outcome = "silent_wrong"
    judge("loss", outcome, "refused", run.err + run.trace)
