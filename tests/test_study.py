"""The whole study: a reduced demo end to end, report regeneration, resume, dry runs."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from timm_posgeom.app import study as study_mod
from timm_posgeom.app.records import HistoryPoint, RunEval, StudyResults
from timm_posgeom.app.report import evaluate_claims
from timm_posgeom.app.report.document import formed_at, training_table
from timm_posgeom.app.report.runs import seed_history, seed_history_std
from timm_posgeom.app.study import StudyError, dry_run, plan_study, preset_config, run_study
from timm_posgeom.app.study import runner as study_runner
from timm_posgeom.cli import main as cli_main

# pytest-xdist (CI): the whole module on one worker, so that the demo study of its module fixture is made once
pytestmark = pytest.mark.xdist_group("study")

TINY = [
    "epochs=1",
    "max_train_images=96",
    "max_val_images=19",
    "batch_size=32",
    "checkpoint_every=2",
    "log_every=1",
    "probe_images=16",
]


def _tiny(conditions=("nope", "ape", "sincos", "rope", "rpt")):
    config = preset_config(
        "demo",
        conditions=tuple(conditions),
        max_images=48,
        probe_images=24,
        sweep_images=24,
        alphas=(1.0, 0.0),
        batch_size=24,
        synthetic_size=120,
        synthetic_val_size=60,
    )
    config.train_overrides = list(config.train_overrides) + TINY
    return config


def _is_png(path) -> bool:
    data = path.read_bytes()
    return data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 2000


@pytest.fixture(scope="module")
def demo_study(tmp_path_factory):
    out = tmp_path_factory.mktemp("study")
    results = run_study(_tiny(), out, progress=False)
    return out, results


@pytest.mark.slow
def test_demo_study_end_to_end(demo_study):
    out, results = demo_study
    assert results.complete and [r.condition for r in results.runs] == list(study_mod.CONDITIONS)
    for run in results.runs:
        ev = run.eval
        assert 0.0 <= ev.clean_accuracy <= 1.0 and set(ev.fs) == {"jpeg:5", "blur:2.5:5"}
        assert len(ev.ssdc.per_layer) == 4 and len(ev.ssdc.rpi_per_layer) == 4
        assert len(run.untrained.per_layer) == 4
        assert (ev.alpha_sweep is not None) == (run.condition in ("ape", "sincos", "rope"))
        if ev.alpha_sweep is not None:  # each alpha's FS with its bootstrap interval (claim 5 with one seed)
            for fs, (lo, hi) in zip(ev.alpha_sweep.fs["jpeg:5"], ev.alpha_sweep.fs_interval["jpeg:5"]):
                assert lo <= fs <= hi or math.isnan(fs)
        assert run.history and len(run.history[-1].rpi_ssdc) == 4  # from the training log
        # the demo monitors on a held-out tenth of its training split; its final numbers are on validation
        assert run.history[-1].monitor == run.train.monitor == "heldout" and run.history[-1].val_top1 is None
        assert run.history[-1].monitor_top1 == pytest.approx(run.train.monitor_top1)
        assert run.train.val_top1 is not None and run.train.val_images == 96 // 5  # the whole validation split
        assert run.train.train_images + run.train.monitor_images == 96 and run.train.monitor_images == 10
    assert results.versions["timm"] and results.config["preset"] == "demo"
    for run in results.runs:  # each run records what trained it and what measured it
        assert run.train.versions == results.versions and run.eval.versions == [results.versions]
    # measured on synthetic_val_size images (not the training runs' 120 // 5 = 24): fragility on max_images
    assert results.eval_data["images"] == 60 and {r.eval.num_images for r in results.runs} == {48}
    # what was written is what was returned: one schema, read back through the records
    assert StudyResults.read(out / "results.json").to_dict() == results.to_dict()
    report = (out / "report.md").read_text()
    for needle in ("Accuracy and fragility", "paper JPEG FS", "five claims", "figures/ssdc_depth.png"):
        assert needle in report
    assert len(evaluate_claims(results)) == 5
    for name in ("ssdc_depth", "fragility", "alpha_sweep", "similarity_maps", "training", "attention_heads"):
        assert _is_png(out / "figures" / f"{name}.png"), name
    page = (out / "report.html").read_text()
    assert "base64" not in page and page.count('<a href="figures/') == 6  # linked, not embedded
    # every claim's evidence reaches the page whole: its deciding interval and threshold (a |SSDC| once cut it)
    claims_table = page.split("five claims in this run</h2>")[1].split("<h2")[0]
    rows = re.findall(
        r"<tr>\s*<td>(\d)</td>\s*<td>.*?</td>\s*<td[^>]*>.*?</td>\s*<td>(.*?)</td>\s*</tr>", claims_table, re.S
    )
    assert [int(n) for n, _ in rows] == [1, 2, 3, 4, 5]
    for n, evidence in rows:
        decided = evaluate_claims(results)[int(n) - 1]
        assert evidence.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&") == decided["evidence"]
        assert "[" in evidence or decided["status"] in ("not measured", "undecided"), evidence
    assert "During training: SSDC under RPI" in report
    # issue 33: attention per head at a few layers, normal and under RPI, in each run's record and the report
    for run in results.runs:
        att = run.eval.attention
        assert att.layers == [0, 1, 2, 3] and att.grid == [8, 8] and att.n_images == 24
        for key in ("mean_distance", "entropy", "ssdc", "rpi_mean_distance", "rpi_entropy", "rpi_ssdc"):
            assert np.shape(getattr(att, key)) == (4, 2), key  # (layers, heads): the demo's 2 heads
        assert all(0 < d < 12 for row in att.mean_distance for d in row)  # patch units on an 8 x 8 grid
    assert (
        "## Attention per head" in report and "figures/attention_heads.png" in report.split("## Attention per head")[1]
    )


def test_no_pe_under_rpi_matches_content_positions_in_the_study(demo_study):
    """A model without PE is permutation-equivariant: measured against where each token's content
    came from, its SSDC under RPI equals its unpermuted SSDC."""
    _, results = demo_study
    nope = next(r for r in results.runs if r.condition == "nope").eval.ssdc
    assert nope.rpi_content_per_layer == pytest.approx(nope.per_layer, abs=1e-4)


def test_report_regenerates_from_results_json_alone(demo_study, tmp_path):
    out, _ = demo_study
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "results.json").write_text((out / "results.json").read_text())
    assert cli_main(["report", str(copy)]) == 0

    def text(md: str) -> str:  # the report less its figures (the copy has no maps.pt: no similarity maps)
        kept = [line for line in md.splitlines() if not line.startswith(("![", "*Figure "))]
        return re.sub(r"\n{2,}", "\n\n", "\n".join(kept))

    assert text((copy / "report.md").read_text()) == text((out / "report.md").read_text().replace(str(out), str(copy)))
    assert _is_png(copy / "figures" / "ssdc_depth.png")


@pytest.mark.slow
def test_study_resumes_after_an_interrupt(tmp_path, monkeypatch):
    config = _tiny(conditions=("nope", "ape"))
    calls = {"n": 0}
    real = study_runner.measure_run

    def interrupt_second(run, measuring):
        calls["n"] += 1
        if run.condition == "ape":
            raise KeyboardInterrupt
        return real(run, measuring)

    monkeypatch.setattr(study_runner, "measure_run", interrupt_second)
    with pytest.raises(KeyboardInterrupt):
        run_study(config, tmp_path, progress=False)
    partial = StudyResults.read(tmp_path / "results.json")
    assert not partial.complete and [r.condition for r in partial.runs] == ["nope"]
    trained_at = (tmp_path / "runs" / "nope_s0" / "summary.json").stat().st_mtime_ns
    monkeypatch.setattr(study_runner, "measure_run", real)
    with pytest.raises(FileExistsError, match="--resume"):
        run_study(config, tmp_path, progress=False)
    # resumed with another accelerate: the report said the resuming invocation's versions measured everything
    other = dict(study_runner.package_versions(), accelerate="0.0.1")
    monkeypatch.setattr(study_runner, "package_versions", lambda: dict(other))
    results = run_study(config, tmp_path, resume=True, progress=False)
    assert results.complete and [r.condition for r in results.runs] == ["nope", "ape"]
    assert (tmp_path / "runs" / "nope_s0" / "summary.json").stat().st_mtime_ns == trained_at  # reused
    nope, ape = results.runs
    assert results.versions == other == ape.eval.versions[0] and nope.eval.versions[0]["accelerate"] != "0.0.1"
    header = (tmp_path / "report.md").read_text().splitlines()[2]
    assert "accelerate 0.0.1, " in header and "(the study's last invocation)" in header
    # both trainings and nope's measurements ran with the installed accelerate, named with the runs
    assert f"; accelerate {nope.train.versions['accelerate']} for nope s0, ape s0." in header


@pytest.mark.slow
def test_a_resume_measures_the_trained_runs_first_so_an_interrupt_keeps_them(tmp_path, monkeypatch):
    """results.json is rewritten after every run with the runs the invocation has done: a resume that went in
    the plan's order and stopped in an untrained run (hours of training) held none of the trained runs
    planned after it. The trained runs go first; results.json keeps the plan's order."""
    config = _tiny(conditions=("nope", "ape"))
    run_study(config, tmp_path, progress=False)
    (tmp_path / "runs" / "nope_s0" / "summary.json").unlink()  # nope (first in the plan) is to train again
    real = study_runner.train_run
    seen = []

    def interrupt_training(run, *args):
        seen.append(run.condition)
        if run.condition == "nope":
            raise KeyboardInterrupt
        return real(run, *args)

    monkeypatch.setattr(study_runner, "train_run", interrupt_training)
    with pytest.raises(KeyboardInterrupt):
        run_study(config, tmp_path, resume=True, progress=False)
    assert seen == ["ape", "nope"]
    partial = StudyResults.read(tmp_path / "results.json")
    assert not partial.complete and [r.condition for r in partial.runs] == ["ape"]
    monkeypatch.setattr(study_runner, "train_run", real)
    results = run_study(config, tmp_path, resume=True, progress=False)
    assert results.complete and [r.condition for r in results.runs] == ["nope", "ape"]
    assert [r.condition for r in StudyResults.read(tmp_path / "results.json").runs] == ["nope", "ape"]


def test_resume_naming_fewer_conditions_keeps_the_measured_runs(demo_study, tmp_path, capsys, monkeypatch):
    """A resume with --conditions ape (or fewer --seeds) of a study that holds five measured conditions
    rewrote results.json and the report with APE alone: claims it had decided read "not measured"."""
    import shutil

    from timm_posgeom.app import recipe

    out, results = demo_study
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    before = StudyResults.read(copy / "results.json")
    reads, built = [], []  # issue 29: the study goes one way down, results read once, each recipe built once
    read, load = StudyResults.read.__func__, recipe.load_recipe
    monkeypatch.setattr(StudyResults, "read", classmethod(lambda cls, path: reads.append(path) or read(cls, path)))
    monkeypatch.setattr(recipe, "load_recipe", lambda *a, **k: built.append(a[0]) or load(*a, **k))
    resumed = run_study(_tiny(conditions=("ape",)), copy, resume=True, progress=False)
    monkeypatch.undo()
    assert [p.name for p in reads] == ["results.json"] and sorted(built) == sorted(
        f"imagenette_cpu_{c}" for c in study_mod.CONDITIONS
    )
    assert [(r.condition, r.seed) for r in resumed.runs] == [(r.condition, r.seed) for r in before.runs]
    assert "beyond the ones asked for (nope, sincos, rope, rpt)" in capsys.readouterr().out
    assert resumed.complete and list(resumed.config["conditions"]) == list(study_mod.CONDITIONS)
    assert [r.eval.ssdc.rpi_per_layer for r in resumed.runs] == [r.eval.ssdc.rpi_per_layer for r in before.runs]
    assert "not measured" not in (copy / "report.md").read_text()
    assert json.loads((copy / "plan.json").read_text())["config"]["conditions"] == list(study_mod.CONDITIONS)


def test_a_study_whose_weights_left_resumes_and_asks_for_them_only_to_measure(demo_study, tmp_path):
    """Issue 53: a committed study's weights (exports, probe maps) live outside git. A resume reuses its trained and
    measured runs without them (nothing trained or measured again, the same numbers, the report and its similarity
    maps kept); a part left to measure asks, in one line, for `posgeom weights restore`."""
    import shutil

    out, _ = demo_study
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    for gone in [*copy.glob("runs/*/export/model.safetensors"), *copy.glob("runs/*/maps.pt")]:
        gone.unlink()
    before = StudyResults.read(copy / "results.json")
    resumed = run_study(_tiny(), copy, resume=True, progress=False)
    assert [r.eval.ssdc.rpi_per_layer for r in resumed.runs] == [r.eval.ssdc.rpi_per_layer for r in before.runs]
    assert [r.eval.fs for r in resumed.runs] == [r.eval.fs for r in before.runs]
    assert (
        not list(copy.glob("runs/*/export/model.safetensors")) and (copy / "figures" / "similarity_maps.png").is_file()
    )
    assert "similarity_maps.png" in (copy / "report.md").read_text()
    run = next(r for r in resumed.runs if r.condition == "ape")
    record = json.loads((copy / run.run_dir / "eval.json").read_text())
    record["alpha_sweep"] = None  # a part not measured yet
    (copy / run.run_dir / "eval.json").write_text(json.dumps(record))
    with pytest.raises(StudyError, match=r"model.safetensors is not here .* `posgeom weights restore .*ape_s0`"):
        run_study(_tiny(), copy, resume=True, progress=False)


def test_resume_keeps_measured_seeds_and_may_drop_unmeasured_conditions(tmp_path):
    measured = [SimpleNamespace(condition=c, seed=s) for c in ("ape", "rope") for s in (0, 1)]
    config = study_runner._keep_measured(_tiny(conditions=("nope", "ape")), measured, tmp_path)
    assert config.conditions == ("nope", "ape", "rope") and config.seeds == 2
    # a condition the study planned but never measured is not kept: naming it again is the user's choice
    measured = [SimpleNamespace(condition="ape", seed=0)]
    assert study_runner._keep_measured(_tiny(conditions=("ape",)), measured, tmp_path).conditions == ("ape",)


@pytest.mark.slow
def test_resume_with_changed_settings_is_refused_or_recomputes_what_they_affect(tmp_path):
    """Issue 14, item 1: --resume with other settings reused every result and recorded the new settings."""
    config = _tiny(conditions=("nope",))
    run_study(config, tmp_path, progress=False)
    trained_at = (tmp_path / "runs" / "nope_s0" / "summary.json").stat().st_mtime_ns
    changed = _tiny(conditions=("nope",))
    changed.imagenet_c = True
    with pytest.raises(StudyError, match="imagenet_c: False -> True.*--allow-changes"):
        run_study(changed, tmp_path, resume=True, progress=False)
    longer = _tiny(conditions=("nope",))
    longer.train_overrides = list(longer.train_overrides) + ["max_steps=2"]
    with pytest.raises(StudyError, match="train_overrides"):
        run_study(longer, tmp_path, resume=True, progress=False)
    # allowed: the measurements are made again with ImageNet-C, the training is reused
    results = run_study(changed, tmp_path, resume=True, progress=False, allow_changes=True)
    run = results.runs[0]
    assert "imagenet-c:jpeg_compression:5" in run.eval.fs and run.eval.settings["imagenet_c"] is True
    assert (tmp_path / "runs" / "nope_s0" / "eval.json.replaced-1").is_file()
    assert (tmp_path / "runs" / "nope_s0" / "summary.json").stat().st_mtime_ns == trained_at
    assert StudyResults.read(tmp_path / "results.json").config["imagenet_c"] is True
    # allowed: a training change trains the run again (the former one kept) and measures it again
    longer.imagenet_c = True
    results = run_study(longer, tmp_path, resume=True, progress=False, allow_changes=True)
    assert results.runs[0].train.steps == 2 and (tmp_path / "runs" / "nope_s0.replaced-1" / "summary.json").is_file()


def test_training_table_finds_when_the_anchor_forms():
    """'Stays above the threshold from epoch' ignores an early excursion; seeds average per epoch."""

    def run(seed, curve):
        return SimpleNamespace(
            condition="ape",
            seed=seed,
            history=[
                HistoryPoint(step=e, epoch=float(e), val_top1=0.1 * e, rpi_ssdc=[v, v], pe_ssdc=None) for e, v in curve
            ],
        )

    assert formed_at(np.array([2.0, 4.0, 6.0, 8.0]), np.array([0.2, 0.05, 0.15, 0.3])) == 6.0
    assert formed_at(np.array([2.0, 4.0]), np.array([0.3, 0.05])) is None
    results = SimpleNamespace(
        runs=[run(0, [(2, 0.0), (4, 0.12), (6, 0.3), (8, 0.4)]), run(1, [(2, 0.0), (4, 0.06), (6, 0.1), (8, 0.2)])]
    )  # mean 0, .09, .2, .3
    row = next(line for line in training_table(results) if line.startswith("| APE"))
    assert row.split("|")[-3].strip() == "6" and row.split("|")[-2].strip() == "0.800±0.000"
    assert "0.300±0.141 (ep 8)" in row  # mean ± std over seeds of (0.4, 0.2)
    ssdc_sd, top1_sd = seed_history_std(seed_history(results.runs)[3])  # the training figure's bands
    assert ssdc_sd.shape == (4, 2) and np.allclose(ssdc_sd[-1], np.std([0.4, 0.2], ddof=1)) and np.allclose(top1_sd, 0)


def test_in100_dry_run_validates_every_recipe(tmp_path, capsys):
    plan = dry_run(preset_config("in100"), tmp_path)
    assert [p["condition"] for p in plan] == list(study_mod.CONDITIONS)
    assert all(p["img_size"] == 224 and p["epochs"] == 60 and "accelerate launch" in p["command"] for p in plan)
    assert {p["model"] for p in plan} == {
        f"posgeom_vit_small_patch16_224_{v}" for v in ("nope", "ape", "sincos", "rope", "ape_rpt")
    }
    assert cli_main(["study", "--preset", "in100", "--dry-run", "--out", str(tmp_path)]) == 0
    assert "every recipe valid" in capsys.readouterr().out


def test_bad_study_input(tmp_path):
    with pytest.raises(ValueError, match="unknown preset"):
        preset_config("imagenet-1k")
    with pytest.raises(ValueError, match="unknown condition"):
        preset_config("demo", conditions=("nope", "alibi"))
    config = preset_config("demo")
    config.train_overrides = list(config.train_overrides) + ["epochz=3"]
    with pytest.raises(ValueError, match="epochz"):
        dry_run(config, tmp_path)
    # a local data path that does not exist is refused by the dry run, not an hour later
    with pytest.raises(FileNotFoundError, match="nowhere/imagenette.*pass --data"):
        dry_run(preset_config("imagenette-cpu", data=str(tmp_path / "nowhere" / "imagenette")), tmp_path)


def test_the_14x14_preset_plans_every_condition_at_112_px(tmp_path, capsys):
    """imagenette-cpu-14: the paper's 14 x 14 token grid on a CPU (the micro models at 112 px, patch 8)."""
    import timm

    from timm_posgeom.cli import main as cli_main

    data = tmp_path / "data"
    data.mkdir()
    assert (
        cli_main(
            ["study", "--preset", "imagenette-cpu-14", "--data", str(data), "--dry-run", "--out", str(tmp_path / "s")]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert out.count("112 px") == 5 and "--set img_size=112" in out
    assert out.count("--set crop_pad=7 --set model_kwargs.embed_dim=64 --set model_kwargs.num_heads=2") == 5
    model = timm.create_model("posgeom_vit_micro_patch8_64_ape", img_size=112, embed_dim=64, num_heads=2)
    assert tuple(model.patch_embed.grid_size) == (14, 14) and len(model.blocks) == 4
    assert model.blocks[0].attn.head_dim == 32  # the micro model's head size, kept


def test_report_states_the_images_probed_not_the_images_asked(demo_study, tmp_path):
    """The demo asked for SSDC on 800 images of a 320-image validation set and its report said "SSDC on 800
    images": the header gives the count each probe recorded."""
    import json
    import shutil

    from timm_posgeom.app.report import write_report

    out, results = demo_study
    copy = tmp_path / "study"
    shutil.copytree(out, copy)
    data = json.loads((copy / "results.json").read_text())
    data["config"]["probe_images"] = 800
    (copy / "results.json").write_text(json.dumps(data))
    write_report(copy)
    header = (copy / "report.md").read_text().splitlines()[2]
    counts = {r.eval.ssdc.n_images for r in results.runs}
    assert counts == {24} and "SSDC on 24 images" in header and "800" not in header


def test_a_study_recorded_before_attention_per_head_still_reports(demo_study, tmp_path):
    """Issue 33: results.json of schema version 3 has no attention per head: it still loads and the report
    renders, without the attention section and figure."""
    out, _ = demo_study
    copy = tmp_path / "old"
    copy.mkdir()
    data = json.loads((out / "results.json").read_text())
    data["schema_version"] = 3
    for run in data["runs"]:
        del run["eval"]["attention"]
    (copy / "results.json").write_text(json.dumps(data))
    assert cli_main(["report", str(copy)]) == 0
    report = (copy / "report.md").read_text()
    assert "Attention per head" not in report and "SSDC across depth" in report
    assert not (copy / "figures" / "attention_heads.png").exists() and _is_png(copy / "figures" / "ssdc_depth.png")


def test_report_names_runs_measured_with_other_or_unrecorded_versions(demo_study, tmp_path):
    """The header named results.json's versions as those of every number, also for runs recorded before
    per-run versions were kept, or measured by an earlier invocation with other packages."""
    import shutil

    from timm_posgeom.app.report import write_report

    out, results = demo_study
    header = (out / "report.md").read_text().splitlines()[2]
    assert "Versions: " + ", ".join(f"{k} {v}" for k, v in results.versions.items()) + "." in header
    assert "last invocation" not in header
    copy = tmp_path / "study"
    shutil.copytree(out, copy)
    data = json.loads((copy / "results.json").read_text())
    data["runs"][0]["train"].pop("versions")  # nope s0: trained before versions were kept
    data["runs"][1]["eval"]["versions"].append(dict(results.versions, torch="0.0.1"))  # ape s0: a part measured again
    (copy / "results.json").write_text(json.dumps(data))
    write_report(copy)
    header = (copy / "report.md").read_text().splitlines()[2]
    assert "(the study's last invocation); torch 0.0.1 for ape s0; not recorded for nope s0 (measured before" in header


def test_cli_summary_prints_each_claims_status_and_reason(demo_study, monkeypatch, capsys):
    """The summary printed 'not measured' for every undecided claim (it read only held True/False/None)."""
    out, results = demo_study
    monkeypatch.setattr(study_mod, "run_study", lambda *args, **kwargs: results)
    assert cli_main(["study", "--out", str(out)]) == 0
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  claim ")]
    claims = evaluate_claims(results)
    assert len(printed) == 5
    for line, claim in zip(printed, claims):
        status = {"held": "held", "not held": "did NOT hold"}.get(claim["status"], claim["status"])
        assert line.split(": ")[1].startswith(status), (line, claim["status"])


def _running(pid: int) -> bool:
    """A live process (not a zombie waiting to be reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads process states from /proc")
@pytest.mark.slow
def test_sigterm_stops_the_study_and_its_training_subprocess(tmp_path):
    """`kill` (SIGTERM, as a scheduler sends) on a study mid-training stops the training subprocess too: left
    running, it would go on writing into a run directory whose study has stopped. The study exits 130 with
    one line, and the run keeps its lock-free directory for --resume."""
    out = tmp_path / "study"
    cmd = [
        sys.executable,
        "-m",
        "timm_posgeom.cli",
        "study",
        "--conditions",
        "nope",
        "--out",
        str(out),
        "--set",
        "epochs=200",
        "--set",
        "max_train_images=96",
        "--set",
        "max_val_images=19",
        "--set",
        "batch_size=32",
        "--set",
        "log_every=1",
    ]
    study = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lock, child, deadline = out / "runs" / "nope_s0" / ".holder.json", None, time.time() + 240
    try:
        while time.time() < deadline and study.poll() is None:  # the training subprocess holds the run's lock
            if lock.is_file() and (out / "runs" / "nope_s0" / "metrics.jsonl").is_file():
                child = json.loads(lock.read_text())["pid"]
                break
            time.sleep(0.5)
        assert child is not None and child != study.pid, "the training subprocess never started"
        assert _running(child)
        study.send_signal(signal.SIGTERM)
        err = study.communicate(timeout=120)[1]
        assert study.returncode == 130 and "interrupted: what finished is kept in" in err
        deadline = time.time() + 60
        while _running(child) and time.time() < deadline:
            time.sleep(0.5)
        assert not _running(child), "the training subprocess outlived its study"
    finally:
        study.kill()
        if child is not None and _running(child):
            os.kill(child, signal.SIGKILL)


@pytest.mark.slow
def test_resume_on_other_data_under_the_same_path_is_refused(tmp_path):
    """The study names its data by a path, often relative (committed runs move between checkouts): a resume
    whose path now holds other data reused every trained run and number. The validation split's identity
    (classes, size, labels, first images' pixels) is now recorded in plan.json and compared."""
    from PIL import Image

    rng = np.random.default_rng(0)

    def tree(root, classes):
        for split, count in (("train", 20), ("validation", 6)):
            for c in classes:
                (root / split / c).mkdir(parents=True, exist_ok=True)
                for i in range(count):
                    Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(
                        root / split / c / f"{i}.png"
                    )

    data = tmp_path / "data"
    tree(data, ["a", "b"])
    config = preset_config(
        "demo",
        data=str(data),
        conditions=("nope",),
        max_images=8,
        probe_images=8,
        sweep_images=8,
        alphas=(1.0, 0.0),
        batch_size=8,
    )
    config.train_overrides = list(config.train_overrides) + TINY
    out = tmp_path / "study"
    run_study(config, out, progress=False)
    plan = json.loads((out / "plan.json").read_text())
    assert plan["data"]["classes"] == ["a", "b"] and plan["data"]["images"] == 12  # the validation split
    del plan["data"]  # a plan written before the data was identified: accepted, and it gains the identity
    (out / "plan.json").write_text(json.dumps(plan))
    run_study(config, out, resume=True, progress=False)
    assert json.loads((out / "plan.json").read_text())["data"]["images"] == 12
    for path in (data / "validation").rglob("*.png"):  # same path, same classes and count, other images
        Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(path)
    with pytest.raises(StudyError, match="measured on other data: .* now has other labels or images"):
        run_study(config, out, resume=True, progress=False)
    with pytest.raises(StudyError, match="measured on other data"):  # not even with --allow-changes
        run_study(config, out, resume=True, progress=False, allow_changes=True)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--conditions", "ape,nope,ape"], "condition(s) given twice: ape"),
        (["--set", "seed=7"], "--set seed=... would be replaced by the study's own seed: use --num-seeds"),
        (["--set", "data=/elsewhere"], "use --data"),
        (["--set", "model_kwargs.init=timm"], "use --init"),
    ],
)
def test_study_options_that_would_be_silently_replaced_are_refused(tmp_path, capsys, argv, message):
    """A repeated condition ran once and counted twice (a second 'seed' with no spread); --set seed / data /
    model_kwargs.init were replaced by the study's own values, so the plan was not what was asked."""
    with pytest.raises(SystemExit) as e:
        cli_main(["study", "--preset", "imagenette-cpu", "--dry-run", "--out", str(tmp_path), *argv])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1 and message in err
    config = preset_config("demo", conditions=("nope",))
    config.train_overrides = list(config.train_overrides) + ["seed=3"]  # the library refuses it too
    with pytest.raises(ValueError, match="use --num-seeds"):
        plan_study(config, tmp_path)


@pytest.mark.slow
def test_a_run_exported_again_is_not_reported_with_its_former_measurements(tmp_path):
    """eval.json was reused whatever export/ held since; it now records the SHA-1 of the weights it measured."""
    import timm

    from timm_posgeom.app.hub import export_for_hub

    config = _tiny(conditions=("nope",))
    run_study(config, tmp_path, progress=False)
    export = tmp_path / "runs" / "nope_s0" / "export"
    assert RunEval.read(export.parent / "eval.json").weights_sha1
    args = json.loads((export / "config.json").read_text())
    torch.manual_seed(9)  # other weights, same architecture
    model = timm.create_model(args["architecture"], **args["model_args"])
    export_for_hub(model, export, args["model_args"], args["pretrained_cfg"])
    with pytest.raises(StudyError, match=r"measured with other settings \(weights \(export/model.safetensors\)"):
        run_study(config, tmp_path, resume=True, progress=False)
    results = run_study(config, tmp_path, resume=True, progress=False, allow_changes=True)
    assert (export.parent / "eval.json.replaced-1").is_file() and results.runs[0].eval.weights_sha1


@pytest.mark.slow
def test_rpi_permutations_are_measured_and_a_change_re_measures_only_the_rpi_part(tmp_path, monkeypatch):
    """Issue 32: every model drew RPI with seed 0, so the permutation's own variance was in no spread. The
    study now draws rpi_permutations (seeds 0 .. n-1); a resume that changes it measures the RPI parts again
    (SSDC, attention, the sweep's delta SSDC) and keeps the training, the fragility and the sweep's FS. A
    study recorded before the setting existed counts as one permutation (seed 0 at every alpha)."""
    config = _tiny(conditions=("ape",))
    config.rpi_permutations = 2
    first = run_study(config, tmp_path, progress=False).runs[0]
    ssdc = first.eval.ssdc
    assert ssdc.rpi_permutations == [0, 1] and len(ssdc.rpi_by_permutation) == 2
    assert ssdc.rpi_per_layer == pytest.approx(np.nanmean(ssdc.rpi_by_permutation, 0).tolist())
    assert ssdc.rpi_by_permutation[0] != ssdc.rpi_by_permutation[1]  # two permutations, two measurements
    run_dir = tmp_path / "runs" / "ape_s0"
    trained_at = (run_dir / "summary.json").stat().st_mtime_ns
    more = _tiny(conditions=("ape",))
    more.rpi_permutations = 3
    with pytest.raises(StudyError, match="rpi_permutations: 2 -> 3.*--allow-changes"):
        run_study(more, tmp_path, resume=True, progress=False)
    import timm_posgeom.robustness as robustness

    def not_again(*args, **kwargs):
        raise AssertionError("fragility or the alpha sweep's fragility measured again")

    monkeypatch.setattr(robustness, "fragility", not_again)
    monkeypatch.setattr(robustness, "alpha_sweep", not_again)
    again = run_study(more, tmp_path, resume=True, progress=False, allow_changes=True).runs[0]
    assert (run_dir / "summary.json").stat().st_mtime_ns == trained_at and (run_dir / "eval.json.replaced-1").is_file()
    assert again.eval.ssdc.rpi_permutations == [0, 1, 2] and again.eval.settings["rpi_permutations"] == 3
    assert again.eval.fs == first.eval.fs
    sweep, before = again.eval.alpha_sweep, first.eval.alpha_sweep
    assert sweep.fs == before.fs and sweep.fs_interval == before.fs_interval  # FS kept
    assert sweep.rpi_permutations == 3 and before.rpi_permutations == 2 and sweep.delta_ssdc != before.delta_ssdc
    assert all(lo <= d <= hi for d, (lo, hi) in zip(sweep.delta_ssdc, sweep.delta_ssdc_ci))
    assert again.eval.attention.rpi_permutations == 3
    assert np.allclose(again.eval.ssdc.rpi_by_permutation[:2], ssdc.rpi_by_permutation)  # seeds 0, 1 again
    # a study from before the setting: its plan and eval.json lack it, and it drew one permutation
    for name in ("plan.json", "runs/ape_s0/eval.json"):
        raw = json.loads((tmp_path / name).read_text())
        for key in ("rpi_permutations", "sweep_rpi", "attention_rpi"):
            (raw["config"] if name == "plan.json" else raw["settings"]).pop(key, None)
        (tmp_path / name).write_text(json.dumps(raw))
    assert study_mod.config_changes(
        json.loads((tmp_path / "plan.json").read_text())["config"], dataclasses.asdict(more)
    ) == {"rpi_permutations": (1, 3)}
    one = _tiny(conditions=("ape",))
    one.rpi_permutations = 1
    # one permutation now: the same SSDC and attention as then, but the sweep draws one per alpha afresh
    with pytest.raises(StudyError, match="sweep_rpi: '1 permutation, seed 0 at every alpha' -> '1 permutation"):
        run_study(one, tmp_path, resume=True, progress=False)
    resumed = run_study(one, tmp_path, resume=True, progress=False, allow_changes=True).runs[0]
    assert resumed.eval.settings["rpi_permutations"] == 1 and resumed.eval.ssdc.rpi_permutations == [0, 1, 2]
    assert resumed.eval.alpha_sweep.rpi_permutations == 1 and resumed.eval.attention.rpi_permutations == 3


def test_study_passes_the_data_flags_to_every_training_run_and_measures_within_max_images(tmp_path, capsys):
    """--data-config, --streaming, --max-images, --train-split / --val-split, --bad-images and --device reach
    every run's recipe (issue 42); --max-images bounds the study's measurements too."""
    from timm_posgeom.cli import main
    from timm_posgeom.cli.main import build_parser
    from timm_posgeom.cli.study import study_config

    flags = [
        "--data-config",
        "default",
        "--streaming",
        "--max-images",
        "64",
        "--train-split",
        "train",
        "--val-split",
        "validation",
        "--bad-images",
        "skip",
        "--device",
        "cpu",
    ]
    assert main(["study", "--preset", "demo", "--conditions", "ape", "--dry-run", "--out", str(tmp_path), *flags]) == 0
    command = capsys.readouterr().out
    assert "--set data_config=default --set streaming=true --set max_train_images=64" in command
    assert command.rstrip().endswith("--device cpu")
    config = study_config(build_parser().parse_args(["study", "--preset", "demo", *flags]))
    assert {
        "data_config=default",
        "streaming=true",
        "max_train_images=64",
        "max_val_images=64",
        "bad_images=skip",
        "train_split=train",
        "val_split=validation",
    } <= set(config.train_overrides)
    assert (config.max_images, config.probe_images, config.sweep_images, config.device) == (64, 64, 64, "cpu")
    with pytest.raises(ValueError, match="--set max_val_images=... and --max-images both set max_val_images"):
        study_config(build_parser().parse_args(["study", "--max-images", "8", "--set", "max_val_images=4"]))
