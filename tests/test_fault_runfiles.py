"""Bad-input suite, class "damaged run files" (issue 54, class 1): every file a command reads back is a user input.

A training run's ``recipe.yaml``, ``data.json`` and ``metrics.jsonl``, an export's ``config.json``, the records
(``summary.json``, ``eval.json``, ``results.json``, ``zoo.json``, ``models/*.json``), a study's ``plan.json`` and
its runs' ``recipe.yaml``, ``maps.pt``, and the records the scripts read: each is damaged four ways (not text, cut
in half, not a mapping, a value of the wrong type) and the command that reads it back is run. Each ends in one line
naming the file and what to do (exit 2), with nothing changed on disk, or, where the file is a log or a figure's
input, in the right result with what was left out said in a warning. Before: a ``yaml.scanner.ScannerError`` or a
``TypeError`` traceback (``train --resume`` on a damaged recipe.yaml, a probe of an export whose config.json holds a
list), an ``AttributeError`` from a card, an ``UnpicklingError`` from ``posgeom report``."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from faultsuite import cli, fake_study, judge, refused, right, snapshot
from PIL import Image

pytestmark = pytest.mark.xdist_group("runfiles")

ROOT = Path(__file__).resolve().parents[1]
TRAIN = [
    *("--set", "epochs=2", "--set", "max_train_images=32", "--set", "max_val_images=8", "--set", "batch_size=16"),
    *("--set", "model_kwargs.depth=1", "--set", "model_kwargs.embed_dim=16", "--set", "model_kwargs.num_heads=2"),
    *("--set", "img_size=16", "--set", "workers=0", "--set", "checkpoint_every=1", "--no-progress"),
]


def _binary(path: Path) -> None:
    path.write_bytes(b"\xff\xfe\x00\x81 not text \x00\x9c")


def _cut(path: Path) -> None:
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2])


def _listed(path: Path) -> None:
    path.write_text("[1, 2, 3]\n")


def _set(key: str, value) -> callable:
    """A damage that sets ``key`` (dotted: ``settings.shifts``) of a JSON or YAML file to ``value``."""

    def damage(path: Path) -> None:
        load, dump = (yaml.safe_load, yaml.safe_dump) if path.suffix == ".yaml" else (json.loads, json.dumps)
        values = load(path.read_text())
        *parents, last = key.split(".")
        node = values
        for part in parents:
            node = node[part]
        node[last] = value
        path.write_text(dump(values))

    return damage


DAMAGES = {"not text": _binary, "cut in half": _cut, "not a mapping": _listed}


def _folder(root: Path, n: int = 6) -> Path:
    rng = np.random.default_rng(0)
    for split in ("train", "validation"):
        for cls in ("ant", "bee"):
            (root / split / cls).mkdir(parents=True, exist_ok=True)
            for j in range(n):
                Image.fromarray(rng.integers(0, 256, (20, 20, 3), dtype=np.uint8)).save(root / split / cls / f"{j}.png")
    return root


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A finished training run, the same run interrupted (no summary, its last checkpoint gone), a measured
    study of one run, and a zoo of one model."""
    root = tmp_path_factory.mktemp("runfiles")
    run = cli(["train", "--out", root / "run", *TRAIN])
    assert run.code == 0, run.err + run.trace
    shutil.copytree(root / "run", root / "interrupted")
    (root / "interrupted" / "summary.json").unlink()
    shutil.rmtree(sorted((root / "interrupted" / "checkpoints").glob("step_*"))[-1])
    data = _folder(root / "data")
    study, argv = fake_study(root, data, seeds=1)
    run = cli(argv)
    assert run.code == 0, run.err + run.trace
    zoo = ["zoo", "posgeom_vit_micro_patch8_64_nope", "--data", data, "--out", root / "zoo", "--img-size", "32"]
    run = cli([*zoo, "--num-workers", "0", "--no-progress", "--rpi-permutations", "2", "--extras", "none"])
    assert run.code == 0, run.err + run.trace
    return root, argv


def _copy(folders, name: str, tmp_path: Path) -> Path:
    shutil.copytree(folders[0] / name, tmp_path / name, symlinks=True)
    return tmp_path / name


def _refused_unchanged(run, out: Path, before: dict, phrase: str) -> str:
    outcome = refused(run, phrase)
    return outcome if outcome != "refused" or snapshot(out) == before else "loss"


# --------------------------------------------------------------------------------------------
# a training run resumed: recipe.yaml, data.json (one line each); metrics.jsonl (skipped lines said)
# --------------------------------------------------------------------------------------------
RESUME = [
    *((f"recipe.yaml {k}", "recipe.yaml", d, "recipe.yaml") for k, d in DAMAGES.items()),
    ("recipe.yaml wrong type", "recipe.yaml", _set("model_kwargs", 5), "another recipe (model_kwargs: 5"),
    *((f"data.json {k}", "data.json", d, "data.json") for k, d in DAMAGES.items()),
    ("data.json wrong type", "data.json", _set("train", 5), "data.json: train holds 5"),
]


@pytest.mark.slow
@pytest.mark.parametrize("file,damage,phrase", [c[1:] for c in RESUME], ids=[c[0] for c in RESUME])
def test_a_resume_reading_a_damaged_run_file_is_one_line(folders, tmp_path, file, damage, phrase, one_thread):
    """The issue's example: a recipe.yaml that is not YAML gave yaml.scanner.ScannerError."""
    out = _copy(folders, "interrupted", tmp_path)
    damage(out / file)
    before = snapshot(out)
    run = cli(["train", "--resume", "--out", out, *TRAIN])
    judge("runfiles", _refused_unchanged(run, out, before, phrase), "refused", run.err + run.trace)


@pytest.mark.slow
@pytest.mark.parametrize("where", ["a middle line not text", "a middle line not an object"])
def test_a_resume_skips_the_damaged_lines_of_its_log_and_says_so(folders, tmp_path, where, one_thread):
    out = _copy(folders, "interrupted", tmp_path)
    lines = (out / "metrics.jsonl").read_bytes().splitlines(keepends=True)
    lines.insert(1, b"\xff\xfe garbage\n" if "text" in where else b"[1, 2]\n")
    (out / "metrics.jsonl").write_bytes(b"".join(lines))
    run = cli(["train", "--resume", "--out", out, *TRAIN])
    ok = "skipped 1 damaged line(s)" in run.err and (out / "summary.json").is_file()
    judge("runfiles", right(run, ok), "right", run.err + run.trace)


# --------------------------------------------------------------------------------------------
# an export's config.json (a probe of local-dir:, a card, a push) and the records a card reads
# --------------------------------------------------------------------------------------------
EXPORT = [
    *((command, k, d, "config.json") for command in ("probe", "card", "push") for k, d in DAMAGES.items()),
    *(
        (command, "wrong type", _set("model_args", [1]), "model_args holds [1]")
        for command in ("probe", "card", "push")
    ),
    ("probe", "an argument its model does not take", _set("model_args.bogus_kw", 1), "does not describe a model"),
]
COMMANDS = {
    "probe": lambda run, o: ["probe", f"local-dir:{run}/export", "--data", "synthetic", "--max-images", "2", *o],
    "card": lambda run, o: ["card", run],
    "push": lambda run, o: ["push", run, "--repo-id", "org/name", "--dry-run"],
}


@pytest.mark.parametrize(
    "command,damage,phrase", [c[:1] + c[2:] for c in EXPORT], ids=[" ".join(c[:2]) for c in EXPORT]
)
def test_an_export_whose_config_is_damaged_is_one_line(folders, tmp_path, command, damage, phrase, one_thread):
    """A config.json holding a list gave TypeError / AttributeError tracebacks (probe, card, push)."""
    out = _copy(folders, "run", tmp_path)
    damage(out / "export" / "config.json")
    before = snapshot(out)
    run = cli(COMMANDS[command](out, ["--num-workers", "0", "--no-progress", "--out", tmp_path / "o"]))
    judge("runfiles", _refused_unchanged(run, out, before, phrase), "refused", run.err + run.trace)


RECORDS = [
    ("summary.json", "steps", "many", "summary.json: steps"),
    ("summary.json", "val_top1", [0.5], "summary.json: val_top1"),
]


@pytest.mark.parametrize("file,key,value,phrase", RECORDS, ids=[f"{r[0]} {r[1]}" for r in RECORDS])
def test_a_record_holding_a_value_of_the_wrong_type_is_one_line(folders, tmp_path, file, key, value, phrase):
    """A record's values were kept unchecked: a number written as text reached the card's arithmetic."""
    out = _copy(folders, "run", tmp_path)
    _set(key, value)(out / file)
    run = cli(["card", out])
    judge("runfiles", refused(run, phrase), "refused", run.err + run.trace)


# --------------------------------------------------------------------------------------------
# a study resumed (plan.json, a run's recipe.yaml, eval.json) and reported (results.json, maps.pt)
# --------------------------------------------------------------------------------------------
STUDY = [
    *((f"plan.json {k}", "plan.json", d, "plan.json") for k, d in DAMAGES.items()),
    ("plan.json wrong type", "plan.json", _set("config", [1]), "plan.json: config holds [1]"),
    *((f"run recipe.yaml {k}", "runs/nope_s0/recipe.yaml", d, "recipe.yaml") for k, d in DAMAGES.items()),
    ("eval.json wrong type", "runs/nope_s0/eval.json", _set("clean_accuracy", "high"), "eval.json: clean_accuracy"),
]


@pytest.mark.slow
@pytest.mark.parametrize("file,damage,phrase", [c[1:] for c in STUDY], ids=[c[0] for c in STUDY])
def test_a_study_resumed_over_a_damaged_file_is_one_line(folders, tmp_path, file, damage, phrase, one_thread):
    out = _copy(folders, "study", tmp_path)
    damage(out / file)
    before = snapshot(out)
    argv = [a if a != folders[0] / "study" else out for a in folders[1]]
    run = cli(argv)
    judge("runfiles", _refused_unchanged(run, out, before, phrase), "refused", run.err + run.trace)


def test_a_damaged_run_recipe_counts_as_changed_with_allow_changes(folders, tmp_path, one_thread):
    """--allow-changes trains a run again when its recipe changed: a recipe that cannot be read is one."""
    from timm_posgeom.app.study.training import check_recipe

    out = _copy(folders, "study", tmp_path)
    _binary(out / "runs" / "nope_s0" / "recipe.yaml")
    said: list[str] = []

    class Run:  # what check_recipe reads of a planned run
        run_dir, label, recipe = out / "runs" / "nope_s0", "nope s0", None

    check_recipe(Run, said.append, allow_changes=True)
    ok = not (out / "runs" / "nope_s0").exists() and (out / "runs" / "nope_s0.replaced-1").is_dir()
    judge("runfiles", "right" if ok and "is not text" in said[0] else "silent_wrong", "right", said)


REPORT = [
    ("results.json cut in half", "results.json", _cut, "results.json"),
    ("results.json wrong type", "results.json", _set("elapsed_s", "long"), "results.json: elapsed_s"),
]


@pytest.mark.parametrize("file,damage,phrase", [c[1:] for c in REPORT], ids=[c[0] for c in REPORT])
def test_a_report_of_a_damaged_results_file_is_one_line(folders, tmp_path, file, damage, phrase):
    out = _copy(folders, "study", tmp_path)
    damage(out / file)
    run = cli(["report", out])
    judge("runfiles", refused(run, phrase), "refused", run.err + run.trace)


@pytest.mark.parametrize("damage", ["cut in half", "a list, not maps"])
def test_a_report_leaves_out_a_damaged_maps_file_and_says_so(folders, tmp_path, damage, one_thread):
    """An UnpicklingError (EOFError, OSError) traceback: the figure of the similarity maps read every maps.pt."""
    out = _copy(folders, "study", tmp_path)
    maps = out / "runs" / "nope_s0" / "maps.pt"
    _cut(maps) if damage == "cut in half" else torch.save([1, 2], maps)
    run = cli(["report", out])
    ok = "maps.pt is damaged" in run.err and (out / "report.md").is_file()
    judge("runfiles", right(run, ok), "right", run.err + run.trace)


# --------------------------------------------------------------------------------------------
# a zoo merged (zoo.json, a model's record); the scripts (a study's results.json)
# --------------------------------------------------------------------------------------------
ZOO = [
    ("zoo.json", "settings.shifts", 5, "shifts"),
    ("models/posgeom_vit_micro_patch8_64_nope.json", "ssdc", "high", "ssdc"),
]


@pytest.mark.parametrize("file,key,value,phrase", ZOO, ids=[z[0].split("/")[0] for z in ZOO])
def test_a_zoo_merged_over_a_damaged_file_is_one_line(folders, tmp_path, file, key, value, phrase):
    out = _copy(folders, "zoo", tmp_path)
    _set(key, value)(out / file)
    before = snapshot(out)
    run = cli(["zoo", "--out", out, "--merge"])
    judge("runfiles", _refused_unchanged(run, out, before, phrase), "refused", run.err + run.trace)


def _script(name: str):
    spec = importlib.util.spec_from_file_location(f"{name}_script", ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("script", ["verdicts", "scaling"])
@pytest.mark.parametrize("damage", ["cut in half", "wrong type"])
def test_the_scripts_say_a_damaged_record_in_one_line(folders, tmp_path, monkeypatch, script, damage):
    out = _copy(folders, "study", tmp_path)
    (_cut if damage == "cut in half" else _set("elapsed_s", "long"))(out / "results.json")
    module, err = _script(script), io.StringIO()
    monkeypatch.setattr(sys, "argv", [script, f"s={out}"])
    code, trace = None, ""
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            module.main([str(out)]) if script == "verdicts" else module.main()
        except SystemExit as e:
            code = e.code
        except Exception as e:  # noqa: BLE001  the suite counts it
            trace = repr(e)
    lines = [line for line in err.getvalue().splitlines() if line.strip()]
    ok = code == 2 and len(lines) == 1 and "results.json" in lines[0] and "error:" in lines[0]
    outcome = "traceback" if trace else "refused" if ok else "other"
    judge("runfiles", outcome, "refused", err.getvalue() + trace)


def test_a_models_file_that_is_not_text_is_one_line(tmp_path):
    (tmp_path / "models.txt").write_bytes(b"\xff\xfe\x00\x81")
    run = cli(["zoo", "--models-file", tmp_path / "models.txt", "--data", "synthetic", "--out", tmp_path / "z"])
    judge("runfiles", refused(run, "models.txt is not a text file"), "refused", run.err + run.trace)
