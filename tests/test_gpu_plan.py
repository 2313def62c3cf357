"""experiments/gpu/plan.py (issue 39's GPU plan) in its tiny CPU mode, so that it cannot rot before a GPU is lent:
the same code (throughput of the paper's model under bf16 autocast, runs trained at once in subprocesses, each
measured: top-1, SSDC under RPI over permutations) on a tiny model and synthetic images; and the runs it plans
on the GPU are the study's runs."""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

import pytest

from timm_posgeom.app.study import preset_config
from timm_posgeom.app.study.plan import make_plan

SCRIPT = Path(__file__).resolve().parents[1] / "experiments" / "gpu" / "plan.py"


@pytest.fixture(scope="module")
def plan():
    spec = importlib.util.spec_from_file_location("gpu_plan", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tiny_plan_run(plan, tmp_path_factory):
    """One tiny run of the whole plan: (out folder, exit code)."""
    root = tmp_path_factory.mktemp("gpu-plan")
    code = plan.main(["--tiny", "--out", str(root / "out"), "--scratch", str(root / "scratch")])
    return root / "out", code


def test_tiny_mode_writes_the_records_and_no_weights(tiny_plan_run):
    out, code = tiny_plan_run
    assert code == 0
    files = sorted(p.name for p in out.iterdir())
    assert files == ["ladder.jsonl", "log.txt", "plan.json", "throughput.json"]  # the GPU machine returns <= 8 files
    assert sum(p.stat().st_size for p in out.iterdir()) < 1 << 20


def test_tiny_throughput_prices_a_paper_run(tiny_plan_run):
    t = json.loads((tiny_plan_run[0] / "throughput.json").read_text())
    assert t["model_kwargs"]["layout"] == "paper" and t["optimizer"] == "Adam" and t["precision"] == "bf16 autocast"
    ips = t["train"]["images_per_s"]
    assert ips > 0 and t["train"]["steps"] >= 2 and t["inference"]["images_per_s"] > 0
    run = t["paper_run"]
    assert run["train_gpu_hours"] == pytest.approx(60 * 126_689 / ips / 3600)
    assert run["gpu_hours"] == pytest.approx(run["train_gpu_hours"] + run["eval_gpu_hours"])


def test_tiny_ladder_trains_and_measures_each_run(tiny_plan_run):
    records = [json.loads(line) for line in (tiny_plan_run[0] / "ladder.jsonl").read_text().splitlines()]
    assert [(r["width"], r["lr"], r["seed"]) for r in records] == [(32, 1e-3, 0), (32, 3.3e-4, 0)]
    for r in records:
        assert r["finished"] and r["exit_code"] == 0 and r["steps"] == 3 and 0 <= r["top1"] <= 1
        rpi = r["rpi"]
        assert rpi["permutations"] == 2 and len(rpi["per_permutation"]) == 2 and len(rpi["per_layer"]) == 4  # depth 4
        assert rpi["per_layer"] == pytest.approx([(a + b) / 2 for a, b in zip(*rpi["per_permutation"])])
        assert rpi["delta"] == pytest.approx(rpi["per_layer"][1] - rpi["per_layer"][0])
        assert rpi["per_permutation"][0] != rpi["per_permutation"][1]  # two permutations, two results
        assert rpi["seeds"] == [0, 1] and len(rpi["delta_ci"]) == 2 and len(rpi["per_layer_ci"]) == 4
        assert len(r["ssdc"]) == 4 and r["probe_images"] == 12  # the tiny validation split has 12 images
        assert [h["step"] for h in r["history"] if h["kind"] == "eval"] == [3]
    assert "deadline" not in (tiny_plan_run[0] / "log.txt").read_text()


def test_the_gpu_runs_are_the_studys_runs(plan, tmp_path):
    """Each planned run's recipe is the one ``posgeom study --preset imagenette-cpu --init paper --conditions ape
    --set model_kwargs.embed_dim=W --set model_kwargs.num_heads=W/32 --set lr=LR --heldout 0`` trains."""
    data = SCRIPT.parents[2] / "data" / "imagenette64"  # recorded relative to the repository root, as the studies do
    specs = plan._specs(argparse.Namespace(tiny=False, data=str(data)), tmp_path)
    assert sorted((s["width"], s["lr"], s["seed"]) for s in specs) == sorted(
        (w, lr, s) for w in (192, 384) for lr in (1e-3, 3.3e-4) for s in (0, 1, 2)
    )
    assert {s["permutations"] for s in specs} == {10} and {s["probe_images"] for s in specs} == {1000}
    for spec in specs:
        # --heldout 0: the committed studies the ladder is compared with trained on the whole training split
        config = preset_config(
            "imagenette-cpu",
            data="data/imagenette64",
            init="paper",
            conditions=("ape",),
            seeds=spec["seed"] + 1,
            heldout_fraction=0.0,
            train_overrides=[
                f"model_kwargs.embed_dim={spec['width']}",
                f"model_kwargs.num_heads={spec['width'] // 32}",
                f"lr={spec['lr']}",
            ],
        )
        study = make_plan(config, tmp_path / "study").runs[spec["seed"]].recipe
        assert spec["recipe"] == study.to_dict()


def test_a_run_past_the_deadline_is_recorded_unfinished(plan, tmp_path):
    code = plan.main(
        [
            "--tiny",
            "--stages",
            "ladder",
            "--deadline-s",
            "31",
            "--out",
            str(tmp_path / "out"),
            "--scratch",
            str(tmp_path / "scratch"),
        ]
    )
    assert code == 0
    records = [json.loads(line) for line in (tmp_path / "out" / "ladder.jsonl").read_text().splitlines()]
    assert len(records) == 2 and not any(r["finished"] for r in records) and all(r["exit_code"] != 0 for r in records)
    assert "deadline: stopping" in (tmp_path / "out" / "log.txt").read_text()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--stages", "speed"], "--stages takes throughput, ladder or both"),
        (["--data", "no/such/folder"], "make_imagenette64.py"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(plan, tmp_path, capsys, args, message):
    assert plan.main(args + ["--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
