"""Tests of the training loop and recipes: tiny models (32 px, dim 32, depth 2), a few steps."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
import yaml
from conftest import IMAGENETTE, accelerate_launch_argv, run_launched
from safetensors.torch import load_file
from scipy.stats import spearmanr

import timm_posgeom  # noqa: F401
from timm_posgeom.app.recipe import (
    Recipe,
    RecipeError,
    accelerate_configs,
    apply_overrides,
    find_accelerate_config,
    find_recipe,
    load_recipe,
    recipe_from_dict,
    shipped_recipes,
)
from timm_posgeom.app.records import RunSummary
from timm_posgeom.app.rundir import RunDirError
from timm_posgeom.app.train import latest_checkpoint, train
from timm_posgeom.cli import main as cli_main
from timm_posgeom.probes import pe_content_norm_ratio, pe_table_ssdc

REPO = Path(__file__).resolve().parents[1]

TINY = [
    "model_kwargs.embed_dim=32",
    "model_kwargs.depth=2",
    "model_kwargs.num_heads=2",
    "img_size=32",
    "batch_size=16",
    "workers=0",
    "max_train_images=160",
    "max_val_images=32",
    "log_every=1",
]


def tiny(*overrides: str) -> Recipe:
    return load_recipe(None, TINY + list(overrides))


def _env() -> dict[str, str]:
    # one thread per process: deterministic and kind to a shared machine
    return dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")


def main(argv: list[str]) -> int:
    """``posgeom train ARGV``: its exit status (a user error exits 2 with one line on stderr)."""
    try:
        return cli_main(["train", *argv])
    except SystemExit as e:
        return e.code


def _cli(out: Path, *overrides: str, resume: bool = False) -> list[str]:
    cmd = [sys.executable, "-m", "timm_posgeom.cli", "train", "--out", str(out), "--no-progress"]
    for item in TINY + list(overrides):
        cmd += ["--set", item]
    return cmd + (["--resume"] if resume else [])


def _records(out: Path, kind: str) -> list[dict]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


# --------------------------------------------------------------------------------------------
# runs
# --------------------------------------------------------------------------------------------
def test_few_steps_synthetic(tmp_path):
    summary = train(tiny("max_steps=3", "checkpoint_every=2", "probe_images=8"), tmp_path, progress=False)
    assert summary.steps == 3 and 0.0 <= summary.val_top1 <= 1.0
    steps = [r["step"] for r in _records(tmp_path, "train")]
    assert steps == [1, 2, 3]
    rec = _records(tmp_path, "train")[0]
    assert {"step", "epoch", "loss", "lr", "images_per_s", "pe_ssdc", "pe_norm_ratio"} <= set(rec)
    assert -1.0 <= rec["pe_ssdc"] <= 1.0
    (final_eval,) = _records(tmp_path, "eval")
    assert len(final_eval["rpi_ssdc"]) == 2 and final_eval["rpi_delta_ssdc"] is not None
    assert (tmp_path / "export" / "config.json").is_file() and (tmp_path / "export" / "model.safetensors").is_file()
    # the top-1 is tied to the weights it was measured on (issue 31): a card checks this hash
    from timm_posgeom.models.pretrained import weights_sha1

    assert RunSummary.read(tmp_path / "summary.json").export_sha1 == weights_sha1(
        tmp_path / "export" / "model.safetensors"
    )
    assert latest_checkpoint(tmp_path).name == "step_00000003"
    assert not list((tmp_path / "checkpoints").glob(".tmp*"))


@pytest.mark.skipif(not IMAGENETTE.is_dir(), reason="../shared/data/imagenette not present")
@pytest.mark.parametrize("cached", [True, False])
def test_few_steps_imagenette(tmp_path, cached):
    recipe = tiny(
        f"data={IMAGENETTE}",
        "max_train_images=48",
        "max_val_images=32",
        "max_steps=2",
        f"cache={cached}",
        "disk_cache=false",
        f"workers={0 if cached else 1}",
    )
    summary = train(recipe, tmp_path, progress=False)
    assert summary.steps == 2 and summary.val_images == 32
    config = json.loads((tmp_path / "export" / "config.json").read_text())
    assert config["pretrained_cfg"]["label_names"][0] == "tench"


def test_loss_falls_on_learnable_subset(tmp_path):
    # 32 images seen 40 times each, no augmentation or smoothing: the model must fit them
    recipe = tiny(
        "max_train_images=32",
        "max_val_images=6",
        "epochs=20",
        "augment=none",
        "label_smoothing=0",
        "lr=3e-3",
        "weight_decay=0",
        "cache=true",
        "disk_cache=false",
        "warmup_epochs=1",
        "eval_every=100",
    )
    train(recipe, tmp_path, progress=False)
    losses = [r["loss"] for r in _records(tmp_path, "train")]
    assert len(losses) == 40
    assert sum(losses[-5:]) / 5 < 0.9 * sum(losses[:5]) / 5


@pytest.mark.slow
def test_kill_and_resume_is_exact(tmp_path):
    # RPT (token shuffling), drop path, dropout, mixup, EMA, gradient accumulation and a DataLoader worker:
    # every RNG stream and counter in play
    overrides = (
        "model=posgeom_vit_micro_patch8_64_ape_rpt",
        "model_kwargs.drop_path_rate=0.1",
        "model_kwargs.proj_drop_rate=0.1",
        "mixup=0.8",
        "cutmix=1.0",
        "ema=true",
        "ema_decay=0.9",
        "epochs=4",
        "checkpoint_every=3",
        "workers=1",
        "probe_images=8",
        "grad_accum=2",
    )
    full, killed = tmp_path / "full", tmp_path / "killed"
    proc = subprocess.Popen(_cli(killed, *overrides), env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while latest_checkpoint(killed) is None and proc.poll() is None and time.time() < deadline:
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    assert not (killed / "summary.json").exists()
    subprocess.run(_cli(full, *overrides), env=_env(), check=True, capture_output=True)
    resumed = subprocess.run(_cli(killed, *overrides, resume=True), env=_env(), capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from step_" in resumed.stdout
    for export in ("export", "export_ema"):
        a = load_file(full / export / "model.safetensors")
        b = load_file(killed / export / "model.safetensors")
        assert a.keys() == b.keys()
        for key in a:
            assert torch.allclose(a[key], b[key], rtol=0, atol=1e-6), (export, key)
    steps = [r["step"] for r in _records(killed, "train")]
    assert steps == sorted(set(steps)), "metrics.jsonl repeats steps after the resume"


@pytest.mark.slow
@pytest.mark.xdist_group("launch")  # one launch at a time (ports, cores)
def test_two_processes_under_accelerate_launch(tmp_path):
    # two CPU processes (conftest.accelerate_launch_argv says how), and no process left behind on a timeout
    out = tmp_path / "ddp"
    cmd = accelerate_launch_argv("-m", "timm_posgeom.cli", "train", "--out", str(out), "--no-progress")
    # probe_images: the main process alone logs SSDC under RPI (it once waited there for the other process)
    for item in TINY + ["max_steps=3", "checkpoint_every=2", "probe_images=8"]:
        cmd += ["--set", item]
    result = run_launched(cmd, env=dict(_env(), ACCELERATE_USE_CPU="1"), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = RunSummary.read(out / "summary.json")
    assert summary.processes == 2 and summary.steps == 3
    assert len(_records(out, "eval")[-1]["rpi_ssdc"]) == 2  # one value per block, logged once
    assert summary.val_images == 32  # every validation image counted exactly once across processes
    assert (out / "export" / "model.safetensors").is_file()
    assert sorted(p.name for p in latest_checkpoint(out).glob("random_states_*")) == [
        "random_states_0.pkl",
        "random_states_1.pkl",
    ]


def test_export_reloads_identically(tmp_path):
    recipe = tiny(
        "model=posgeom_vit_micro_patch8_64_rope",
        "max_steps=2",
        "model_kwargs.num_heads=4",
        "model_kwargs.drop_path_rate=0.1",
    )
    train(recipe, tmp_path, progress=False)
    reloaded = timm.create_model(f"local-dir:{tmp_path / 'export'}", pretrained=True).eval()
    assert reloaded.pe == "rope" and reloaded.blocks[0].attn.num_heads == 4 and reloaded.embed_dim == 32
    assert reloaded.pretrained_cfg["input_size"] == (3, 32, 32)
    # the reference: the same architecture with the weights accelerate checkpointed from the live model
    reference = timm.create_model(recipe.model, num_classes=10, img_size=32, **recipe.model_kwargs).eval()
    reference.load_state_dict(load_file(latest_checkpoint(tmp_path) / "model.safetensors"))
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(reloaded(x), reference(x))


def test_pe_table_ssdc():
    ape = timm.create_model("posgeom_vit_micro_patch8_64_ape", num_classes=2)
    with torch.no_grad():  # a table whose rows are smooth in the grid position: strongly positive
        grid = torch.stack(torch.meshgrid(torch.arange(8.0), torch.arange(8.0), indexing="ij"), -1).reshape(64, 2)
        freqs = torch.linspace(0.1, 1.0, 64)
        rows = torch.cat([torch.sin(grid[:, :1] * freqs), torch.sin(grid[:, 1:] * freqs)], dim=1)
        ape.pos_embed[0, 1:] = rows
    assert pe_table_ssdc(ape) > 0.5
    with torch.no_grad():  # the reference: scipy on the same pairs
        ape.pos_embed.normal_()
    rows = torch.nn.functional.normalize(ape.pos_embed[0, 1:].detach(), dim=-1)
    sim = rows @ rows.T
    yx = torch.stack(torch.meshgrid(torch.arange(8), torch.arange(8), indexing="ij"), -1).reshape(64, 2)
    dist = (yx[:, None] - yx[None]).abs().sum(-1)
    i, j = torch.triu_indices(64, 64, 1)
    expected = spearmanr(sim[i, j].numpy(), -dist[i, j].numpy()).statistic
    assert abs(pe_table_ssdc(ape) - expected) < 1e-5
    assert pe_table_ssdc(timm.create_model("posgeom_vit_micro_patch8_64_sincos", num_classes=2)) is None
    assert pe_table_ssdc(timm.create_model("posgeom_vit_micro_patch8_64_nope", num_classes=2)) is None


def test_pe_content_norm_ratio_is_the_tables_mean_row_norm_over_the_tokens():
    ape = timm.create_model("posgeom_vit_micro_patch8_64_ape", num_classes=2).eval()
    images = torch.randn(3, 3, 64, 64)
    tokens = ape.patch_embed(images).detach()  # (3, 64, C)
    expected = ape.pos_embed[0, 1:].detach().norm(dim=-1).mean() / tokens.norm(dim=-1).mean()
    assert abs(pe_content_norm_ratio(ape, images) - expected.item()) < 1e-5
    ape.set_alpha(0.5)  # the table as applied: alpha scales it
    assert abs(pe_content_norm_ratio(ape, images) - 0.5 * expected.item()) < 1e-5
    assert pe_content_norm_ratio(timm.create_model("posgeom_vit_micro_patch8_64_nope", num_classes=2), images) is None


# --------------------------------------------------------------------------------------------
# errors before training
# --------------------------------------------------------------------------------------------
def _cli_error(capsys, out: Path, *overrides: str, extra: tuple[str, ...] = ()) -> str:
    argv = ["--out", str(out), "--no-progress", *extra]
    for item in TINY + list(overrides):
        argv += ["--set", item]
    assert main(argv) == 2
    return capsys.readouterr().err


def test_bad_recipe_key_lists_valid_keys(tmp_path, capsys):
    err = _cli_error(capsys, tmp_path / "run", "learning_rate=0.1")
    assert "unknown recipe key 'learning_rate'" in err and "weight_decay" in err and "checkpoint_every" in err
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: posgeom_vit_micro_patch8_64_ape\nepochz: 3\n")
    with pytest.raises(RecipeError, match="epochz.*valid keys: model"):
        load_recipe(bad)
    assert not (tmp_path / "run").exists()


def test_missing_data_path(tmp_path, capsys):
    err = _cli_error(capsys, tmp_path / "run", f"data={tmp_path / 'no_such_dataset'}")
    assert "does not exist" in err and "no_such_dataset" in err
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_unwritable_output_dir(tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    err = _cli_error(capsys, blocker / "run")
    assert "not writable" in err


def test_existing_run_needs_resume(tmp_path, capsys):
    train(tiny("max_steps=1"), tmp_path, progress=False)
    err = _cli_error(capsys, tmp_path, "max_steps=1")
    assert "--resume" in err


def test_resume_with_allowed_changes_uses_the_new_optimiser_settings(tmp_path):
    """load_state restored the checkpoint's lr and weight decay in every parameter group: a resume with
    --allow-changes recorded the new values and went on with the old (with sched none, the lr too)."""
    base = ("sched=none", "opt=adamw", "wd_exclude_1d=false", "checkpoint_every=2", "log_every=1")
    train(tiny(*base, "max_steps=2", "lr=1e-3", "weight_decay=0.05"), tmp_path, progress=False)
    train(
        tiny(*base, "max_steps=4", "lr=2e-3", "weight_decay=0.01"),
        tmp_path,
        resume=True,
        progress=False,
        allow_changes=True,
    )
    assert [r["lr"] for r in _records(tmp_path, "train")] == pytest.approx([1e-3, 1e-3, 2e-3, 2e-3])
    saved = torch.load(latest_checkpoint(tmp_path) / "optimizer.bin", weights_only=False)
    assert [(g["lr"], g["weight_decay"]) for g in saved["param_groups"]] == [
        (2e-3, 0.0),
        (2e-3, 0.01),
    ]  # no-decay group, decayed
    # weight decay 0 makes other parameter groups: refused in one line, not called a damaged checkpoint
    with pytest.raises(RunDirError, match="other parameter groups than this recipe's"):
        train(
            tiny("sched=none", "opt=adamw", "checkpoint_every=2", "max_steps=6", "weight_decay=0"),
            tmp_path,
            resume=True,
            progress=False,
            allow_changes=True,
        )


def test_resume_on_other_data_under_the_same_path_is_refused(tmp_path):
    """Only the data path was compared: with the images of two class folders swapped, a resume trained its
    remaining steps on flipped labels, exit 0. The run's data.json now holds both splits' identity."""
    from PIL import Image

    rng = np.random.default_rng(0)
    data = tmp_path / "data"
    for split in ("train", "validation"):
        for c in ("cat", "dog"):
            (data / split / c).mkdir(parents=True)
            for i in range(16):
                Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(data / split / c / f"{i}.png")
    out = tmp_path / "run"
    base = (f"data={data}", "checkpoint_every=2")
    train(tiny(*base, "max_steps=2"), out, progress=False)
    assert json.loads((out / "data.json").read_text())["train"]["images"] == 32
    (data / "train" / "cat").rename(data / "train" / "tmp")  # the two classes' images swapped
    (data / "train" / "dog").rename(data / "train" / "cat")
    (data / "train" / "tmp").rename(data / "train" / "dog")
    with pytest.raises(RunDirError, match="was trained on other data: .* other labels or images in its train split"):
        train(tiny(*base, "max_steps=4"), out, resume=True, progress=False, allow_changes=True)


def test_diverging_training_stops_and_exports_nothing(tmp_path, capsys):
    """Issue 14, item 2: lr=1e6 gave NaN loss, exited 0 and exported all-NaN weights as a result."""
    err = _cli_error(capsys, tmp_path / "r", "lr=1e6", "max_steps=12", "checkpoint_every=4", "log_every=100")
    assert "training diverged: non-finite loss first at step" in err and "learning rate" in err
    assert "Traceback" not in err
    assert not (tmp_path / "r" / "export").exists() and not (tmp_path / "r" / "summary.json").exists()
    checkpoints = sorted((tmp_path / "r" / "checkpoints").glob("step_*"))  # only steps before the divergence
    first = int(err.split("first at step ")[1].split(" ")[0])
    assert all(int(c.name[5:]) < first for c in checkpoints)
    for bad in ("lr=inf", "lr=nan", "warmup_lr=inf"):  # passed the lr > 0 check before
        assert "must be a finite number" in _cli_error(capsys, tmp_path / "r2", bad)
    assert "interpolation must be one of bicubic" in _cli_error(capsys, tmp_path / "r2", "interpolation=nosuch")


def test_unknown_model_and_bad_values(tmp_path, capsys):
    assert "unknown model" in _cli_error(capsys, tmp_path / "r", "model=vit_nonexistent")
    assert "divisible" in _cli_error(capsys, tmp_path / "r", "batch_size=15", "grad_accum=2")
    assert "augment must be one of" in _cli_error(capsys, tmp_path / "r", "augment=fancy")


# --------------------------------------------------------------------------------------------
# recipes
# --------------------------------------------------------------------------------------------
def test_overrides_are_coerced():
    r = apply_overrides(
        Recipe(),
        [
            "lr=3e-4",
            "epochs=7",
            "ema=yes",
            "max_steps=none",
            "clip_grad=1",
            "model_kwargs.alpha=0.5",
            "scale=[0.5, 1]",
            "data=../x/y",
        ],
    )
    assert r.lr == 3e-4 and r.epochs == 7 and r.ema is True and r.max_steps is None and r.clip_grad == 1.0
    assert r.model_kwargs == {"alpha": 0.5} and r.scale == [0.5, 1.0] and r.data == "../x/y"
    with pytest.raises(RecipeError, match="epochs"):
        apply_overrides(Recipe(), ["epochs=1.5"])
    with pytest.raises(RecipeError, match="key=value"):
        apply_overrides(Recipe(), ["epochs"])


@pytest.mark.parametrize(
    "override, message",
    [
        ("clip_grad=-1", "clip_grad must be > 0"),  # clip_grad_norm_(max_norm=-1) flips the gradient: ascent
        ("ema_decay=1.5", "ema_decay must be in [0, 1)"),
        ("ema_decay=-20", "ema_decay must be in [0, 1)"),
        ("weight_decay=-0.1", "weight_decay must be >= 0"),
        ("hflip=2", "hflip must be in [0, 1]"),
        ("warmup_epochs=-3", "warmup_epochs must be >= 0"),
        ("crop_pct=1.5", "crop_pct must be in (0, 1]"),
        ("scale=[1.0, 0.08]", "0 < min <= max <= 1"),
        ("min_lr=-1", "min_lr must be >= 0"),
        ("momentum=-1", "momentum must be >= 0"),
        ("crop_pad=-2", "crop_pad must be >= 0"),
        ("opt_betas=[0.9, 1.2]", "opt_betas must be two values in [0, 1)"),
    ],
)
def test_recipe_values_that_would_train_something_else_are_refused(override, message):
    """Each was accepted and changed what was trained without an error (a negative clip_grad trained by
    gradient ascent; ema_decay -20 exported weights of 1e11)."""
    with pytest.raises(RecipeError, match=re.escape(message)):
        load_recipe(None, [override])


VARIANTS = {
    "nope": ("none", "none"),
    "ape": ("ape", "none"),
    "sincos": ("sincos", "none"),
    "rope": ("rope", "none"),
    "rpt": ("ape", "train"),
}


@pytest.mark.parametrize("family", ["in100_paper", "in100_deit", "imagenette_cpu"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_shipped_recipes(family, variant):
    recipe = load_recipe(f"{family}_{variant}")
    assert timm.is_model(recipe.model)
    with torch.device("meta"):  # no memory, no init: only the architecture is checked
        model = timm.create_model(recipe.model, num_classes=10, img_size=recipe.img_size, **recipe.model_kwargs)
    assert (model.pe, model.token_shuffle) == VARIANTS[variant]
    assert recipe.label_smoothing == 0.1
    if family == "in100_paper":
        assert (recipe.opt, recipe.lr, recipe.weight_decay, recipe.batch_size, recipe.epochs) == (
            "adam",
            1e-3,
            0.05,
            128,
            60,
        )
        assert recipe.img_size == 224 and recipe.augment == "none" and recipe.eval_resize == "paper"
        assert recipe.data == "clane9/imagenet-100" and recipe.sched == "none"
        assert model.blocks[0].attn.num_heads == 8 and model.embed_dim == 384 and len(model.blocks) == 12
        kw = recipe.model_kwargs  # the paper's layers and sites (tests/test_paper_parity.py checks them all)
        assert kw["layout"] == "paper" and kw["mlp_drop_rate"] == kw["attn_drop_rate"] == kw["pos_drop_rate"] == 0.15
        assert kw["drop_path_rate"] == 0.2 and "drop_rate" not in kw and "proj_drop_rate" not in kw
        assert recipe.interpolation == "bilinear" and not recipe.wd_exclude_1d and not recipe.wd_exclude_model
    if family == "imagenette_cpu":
        assert recipe.img_size == 64 and recipe.cache and recipe.augment == "crop_flip" and recipe.crop_pad == 4
        # the folder the fastai archive unpacks to (docs/guide.md), relative to the working directory: never a
        # path of the developers' machines (the tests' own copy is passed with --data)
        assert recipe.data == "imagenette2-320" and "shared/" not in find_recipe(f"{family}_{variant}").read_text()


@pytest.mark.parametrize("name", ["in100_paper_rpt", "in100_deit_rope", "imagenette_cpu_sincos"])
def test_shipped_recipes_run_when_shrunk(tmp_path, name):
    # the recipe's own optimiser, schedule, augmentation, mixup, EMA and precision; a tiny model on synthetic data
    recipe = load_recipe(
        name,
        [
            "data=synthetic",
            "model_kwargs.depth=1",
            "model_kwargs.embed_dim=32",
            "model_kwargs.num_heads=2",
            "model_kwargs.patch_size=8",
            "img_size=32",
            "batch_size=8",
            "workers=0",
            "max_train_images=40",
            "max_val_images=8",
            "max_steps=3",
            "probe_images=0",
            "disk_cache=false",
        ],
    )
    summary = train(recipe, tmp_path, progress=False)
    assert summary.steps == 3
    assert (tmp_path / ("export_ema" if recipe.ema else "export") / "model.safetensors").is_file()


def test_accelerate_configs_are_shipped():
    assert set(accelerate_configs()) == {"1gpu", "8gpu", "2node_8gpu"}
    for name in accelerate_configs():
        path = find_accelerate_config(name)
        assert path.is_file() and "distributed_type" in path.read_text()
    with pytest.raises(FileNotFoundError, match="1gpu, 2node_8gpu, 8gpu|shipped configs"):
        find_accelerate_config("3gpu")


def test_shipped_recipes_are_found_by_name_and_user_files_still_work(tmp_path):
    names = set(shipped_recipes())
    assert {
        f"{f}_{v}"
        for f in ("imagenette_cpu", "in100_paper", "in100_deit")
        for v in ("nope", "ape", "sincos", "rope", "rpt")
    } == names
    # found through the package (importlib.resources), not through the working directory
    assert find_recipe("imagenette_cpu_ape").parent.name == "recipes"
    own = tmp_path / "mine.yaml"
    own.write_text("model: posgeom_vit_micro_patch8_64_rope\nepochs: 3\n")
    recipe = load_recipe(str(own))
    assert (recipe.model, recipe.epochs) == ("posgeom_vit_micro_patch8_64_rope", 3)
    with pytest.raises(FileNotFoundError, match="not one of the shipped recipes: imagenette_cpu_ape"):
        load_recipe("imagenette_cpu_nosuch")


def test_checkpoint_discovery_ignores_partial_saves(tmp_path):
    root = tmp_path / "checkpoints"
    for name in ("step_00000004", "step_00000012", ".tmp_step_00000016", "step_x"):
        (root / name).mkdir(parents=True)
    assert latest_checkpoint(tmp_path).name == "step_00000012"
    assert latest_checkpoint(tmp_path / "elsewhere") is None


def test_metrics_log_on_resume_drops_later_and_torn_records(tmp_path):
    from timm_posgeom.app.train import MetricsLog

    (tmp_path / "metrics.jsonl").write_text(
        '{"kind": "train", "step": 2}\n{"kind": "eval", "step": 4}\n{"kind": "train", "step": 6}\n{"kind": "tr'
    )
    MetricsLog(tmp_path, True, resume_step=4).log({"kind": "train", "step": 5})
    assert [r["step"] for r in _records(tmp_path, "train")] == [2, 5]


def test_a_launch_on_port_zero_is_refused_before_accelerate_waits(tmp_path, monkeypatch):
    """accelerate < 1.7 hands `launch --main_process_port 0` to the workers as MASTER_PORT=0, where Accelerator()
    waited for the others until the rendezvous timeout: refused at once, before the run directory is touched."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "0")
    with pytest.raises(RuntimeError, match="MASTER_PORT=0"):
        train(tiny(), tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()


# --------------------------------------------------------------------------------------------
# accelerate trackers
# --------------------------------------------------------------------------------------------
def test_tensorboard_tracker_gets_every_number_of_metrics_jsonl(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    train(tiny("max_steps=3", "log_with=[tensorboard]", "tracker_project=tb"), out, progress=False)
    events = list((out / "tb").rglob("events.out.tfevents.*"))
    assert events, f"no TensorBoard event file under {out / 'tb'}"
    scalars = {}
    for event_file in events:
        acc = EventAccumulator(str(event_file))
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            scalars[tag] = [(e.step, e.value) for e in acc.Scalars(tag)]
    # the record is metrics.jsonl: the tracker got the same losses at the same steps
    expected = [(r["step"], r["loss"]) for r in _records(out, "train")]
    got = scalars["train/loss"]
    assert [s for s, _ in got] == [s for s, _ in expected]
    assert all(abs(a - b) < 1e-6 for (_, a), (_, b) in zip(got, expected))
    assert "eval/val_top1" in scalars


def test_a_tracker_that_is_not_installed_is_refused_before_training(tmp_path, capsys, monkeypatch):
    import accelerate.tracking

    monkeypatch.setattr(accelerate.tracking, "get_available_trackers", lambda: [])
    err = _cli_error(capsys, tmp_path / "run", extra=("--log-with", "wandb"))
    assert "wandb is not installed here (pip install wandb)" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "run" / "checkpoints").exists()
    err = _cli_error(capsys, tmp_path / "run2", "log_with=[no_such_tracker]")
    assert "unknown tracker 'no_such_tracker'" in err


def test_a_resume_after_the_final_checkpoint_logs_each_evaluation_once(tmp_path):
    """Killed after its final checkpoint (saved after the epoch-end evaluation), a resumed run repeated
    that evaluation: metrics.jsonl held the last step's eval row twice (three times after two kills), and
    the study's report counted each."""
    import shutil

    out = tmp_path / "run"
    first = train(tiny("epochs=1"), out, progress=False)  # 10 steps: the last is an epoch end
    evals = _records(out, "eval")
    assert [r["step"] for r in evals] == [10]
    # what a SIGKILL between the final checkpoint and the summary leaves
    (out / "summary.json").unlink()
    shutil.rmtree(out / "export")
    lines = (out / "metrics.jsonl").read_text().splitlines()
    (out / "metrics.jsonl").write_text("".join(line + "\n" for line in lines if '"final"' not in line))
    for _ in range(2):
        resumed = train(tiny("epochs=1"), out, resume=True, progress=False)
        assert [r["step"] for r in _records(out, "eval")] == [10]
        assert resumed.val_top1 == first.val_top1
        (out / "summary.json").unlink()
        shutil.rmtree(out / "export")


def test_read_metrics_counts_a_repeated_step_once(tmp_path):
    from timm_posgeom.app.train import read_metrics

    (tmp_path / "metrics.jsonl").write_text(
        '{"kind": "train", "step": 5, "loss": 1}\n{"kind": "eval", "step": 10, "val_top1": 0.5}\n'
        '{"kind": "eval", "step": 10, "val_top1": 0.6}\n{"kind": "eval", "step": 10, "val_top1": 0.7}\n'
        '{"kind": "final", "val_top1": 0.7}\n'
    )
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [(r["kind"], r.get("step")) for r in records] == [("train", 5), ("eval", 10), ("final", None)]
    assert records[1]["val_top1"] == 0.7


# --------------------------------------------------------------------------------------------
# training from any data the probes take: split, config, revision and streaming (issue 42, item 5)
# --------------------------------------------------------------------------------------------
def test_train_trains_on_a_config_of_a_local_parquet_set(tmp_path, capsys):
    """`posgeom train --data-config NAME` trains on that configuration's classes; the flags are recorded as the
    recipe keys of their names; --streaming reads the first --max-images of each split (the same images)."""
    from conftest import parquet_set

    root = parquet_set(tmp_path / "set")  # configurations small (3 classes) and big (4)
    common = [
        "--data",
        str(root),
        "--max-images",
        "8",
        "--no-progress",
        "--set",
        "max_steps=1",
        "--set",
        "model_kwargs.embed_dim=32",
        "--set",
        "model_kwargs.depth=1",
        "--set",
        "model_kwargs.num_heads=2",
        "--set",
        "img_size=16",
        "--set",
        "model_kwargs.patch_size=8",
        "--set",
        "batch_size=4",
        "--set",
        "workers=0",
        "--set",
        "probe_images=0",
    ]
    assert main([*common, "--data-config", "big", "--out", str(tmp_path / "big")]) == 0
    assert main([*common, "--data-config", "small", "--streaming", "--out", str(tmp_path / "small")]) == 0
    for name, classes in (("big", 4), ("small", 3)):
        saved = yaml.safe_load((tmp_path / name / "recipe.yaml").read_text())
        assert saved["data_config"] == name and saved["max_train_images"] == saved["max_val_images"] == 8
        summary = json.loads((tmp_path / name / "summary.json").read_text())
        assert summary["val_images"] == 6  # the validation splits hold 6 (the first 8: all of them)
        assert (
            len(json.loads((tmp_path / name / "export" / "config.json").read_text())["pretrained_cfg"]["label_names"])
            == classes
        )
    assert yaml.safe_load((tmp_path / "small" / "recipe.yaml").read_text())["streaming"] is True
    # the same images streamed or loaded: the run's data identity is the same
    assert main([*common, "--data-config", "small", "--out", str(tmp_path / "loaded")]) == 0
    assert json.loads((tmp_path / "small" / "data.json").read_text()) == json.loads(
        (tmp_path / "loaded" / "data.json").read_text()
    )
    # the splits by name, and a count that streaming needs
    assert (
        main(
            [
                *common,
                "--data-config",
                "big",
                "--train-split",
                "validation",
                "--val-split",
                "train",
                "--out",
                str(tmp_path / "swapped"),
            ]
        )
        == 0
    )
    assert (
        json.loads((tmp_path / "swapped" / "data.json").read_text())["train"]
        == json.loads((tmp_path / "big" / "data.json").read_text())["validation"]
    )
    capsys.readouterr()
    assert main(["--data", str(root), "--data-config", "big", "--streaming", "--out", str(tmp_path / "x")]) == 2
    assert "streaming reads the first N images of each split" in capsys.readouterr().err
    assert main([*common, "--set", "max_train_images=4", "--out", str(tmp_path / "y")]) == 2
    assert "--set max_train_images=... and --max-images both set max_train_images" in capsys.readouterr().err


@pytest.mark.skipif(not IMAGENETTE.is_dir(), reason="../shared/data/imagenette not present")
def test_train_streams_imagenette_by_its_config(tmp_path):
    """A tiny run on Imagenette's `default` configuration, streamed: 16 training and 16 validation images."""
    sets = [
        x
        for item in TINY + ["max_steps=2", "probe_images=0"]
        if not item.startswith("max_images") and not item.startswith(("max_train_images", "max_val_images"))
        for x in ("--set", item)
    ]
    argv = [
        "--data",
        str(IMAGENETTE),
        "--data-config",
        "default",
        "--streaming",
        "--max-images",
        "16",
        "--no-progress",
        "--out",
        str(tmp_path),
        *sets,
    ]
    assert main(argv) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["val_images"] == 16


def test_old_recipe_keys_work_for_one_release_with_a_notice(tmp_path):
    with pytest.warns(FutureWarning, match="recipe key train_subset is deprecated.*use max_train_images"):
        recipe = load_recipe(None, ["train_subset=40", "rpi_ssdc_images=8"])
    assert recipe.max_train_images == 40 and recipe.probe_images == 8
    with pytest.warns(FutureWarning, match="synthetic_size"):  # N synthetic training images and a fifth for validation
        recipe = load_recipe(None, ["synthetic_size=160"])
    assert (recipe.max_train_images, recipe.max_val_images) == (160, 32)
    path = tmp_path / "old.yaml"
    path.write_text("val_subset: 12\nsynthetic_size: 100\n")
    with pytest.warns(FutureWarning):
        recipe = load_recipe(path)
    assert (recipe.max_train_images, recipe.max_val_images) == (100, 12)
    with pytest.raises(RecipeError, match="train_subset is the old name of max_train_images"):
        recipe_from_dict({"train_subset": 4, "max_train_images": 4})
