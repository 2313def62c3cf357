"""The held-out monitor of training: the carving (seeded, stratified, recorded), a run that monitors on it and
reports on the validation split, the records that say which split monitored, the study's option."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import timm_posgeom  # noqa: F401
from timm_posgeom.app.recipe import RecipeError, load_recipe
from timm_posgeom.app.records import HistoryPoint, RunSummary
from timm_posgeom.data import HeldoutError, cache_uint8, carve_heldout, heldout_indices, load_split

TINY = [
    "model_kwargs.embed_dim=32",
    "model_kwargs.depth=2",
    "model_kwargs.num_heads=2",
    "img_size=32",
    "batch_size=16",
    "workers=0",
    "max_train_images=200",
    "max_val_images=40",
    "log_every=1",
]


def test_carving_is_stratified_seeded_and_a_partition():
    labels = np.repeat(np.arange(4), [10, 20, 31, 2])
    held = heldout_indices(labels, 0.1, seed=3)
    # per class round-half-up of 10%, and every class keeps a training image (class 3: 2 images, 0 held out)
    assert np.bincount(labels[held], minlength=4).tolist() == [1, 2, 3, 0]
    assert held.tolist() == heldout_indices(labels, 0.1, seed=3).tolist()  # seeded
    assert held.tolist() != heldout_indices(labels, 0.1, seed=4).tolist()
    # one class's draw does not depend on the others: class 1 drops out, class 2's draw stays
    mask = labels != 1
    other = np.flatnonzero(mask)[heldout_indices(labels[mask], 0.1, seed=3)]
    assert set(other[labels[other] == 2].tolist()) == set(held[labels[held] == 2].tolist())
    split = load_split("synthetic", "train", synthetic_size=200, img_size=32)
    train, heldout, record = carve_heldout(split, 0.2, seed=0)
    assert sorted(train.indices + heldout.indices) == list(range(200)) and not set(train.indices) & set(heldout.indices)
    assert record["images"] == len(heldout) == sum(record["per_class"]) and record["train_images"] == len(train)
    assert record["per_class"] == np.bincount(np.asarray(split.labels)[heldout.indices]).tolist()
    assert heldout[0][1] == split[heldout.indices[0]][1]
    with pytest.raises(HeldoutError, match="holds out no image"):
        carve_heldout(split, 0.001)
    with pytest.raises(RecipeError, match="heldout_fraction must be in"):
        load_recipe(None, ["heldout_fraction=1"])


def test_the_uint8_cache_of_a_synthetic_subset_renders_the_subsets_own_images():
    """The cache rendered a synthetic split's item i directly, which for a subset is its parent's item i."""
    split = load_split("synthetic", "train", synthetic_size=40, img_size=32)
    _, heldout, _ = carve_heldout(split, 0.25)
    cached = cache_uint8(heldout, 32)
    for i in (0, len(heldout) - 1):
        assert torch.equal(cached.images[i], split.items.render(heldout.indices[i]))


@pytest.mark.slow
def test_a_run_monitors_on_the_heldout_split_and_reports_on_validation(tmp_path):
    from timm_posgeom.app.study.training import training_history
    from timm_posgeom.app.train import train

    recipe = load_recipe(
        None,
        TINY
        + ["heldout_fraction=0.2", "max_steps=4", "probe_images=8", "cache=true", "disk_cache=false", "augment=none"],
    )
    summary = train(recipe, tmp_path, progress=False)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if r["kind"] == "eval"]
    assert evals and all(r["monitor"] == "heldout" and "heldout_top1" in r and "val_top1" not in r for r in evals)
    assert all(len(r["rpi_ssdc"]) == 2 for r in evals)
    (final,) = [r for r in records if r["kind"] == "validation"]
    identity = json.loads((tmp_path / "data.json").read_text())
    held = identity["heldout"]
    assert held["fraction"] == 0.2 and held["seed"] == 0 and held["images"] + held["train_images"] == 200
    assert identity["train"]["images"] == held["train_images"] == summary.train_images
    saved = RunSummary.read(tmp_path / "summary.json")
    assert saved.monitor == "heldout" and saved.monitor_images == held["images"]
    assert saved.monitor_top1 == evals[-1]["heldout_top1"] and saved.val_top1 == final["val_top1"]
    assert saved.val_images == 40 and final["val_count"] == 40  # the validation split, whole
    history = training_history(tmp_path)
    assert history[-1].monitor == "heldout" and history[-1].monitor_top1 == evals[-1]["heldout_top1"]
    assert HistoryPoint(step=1, epoch=1.0, val_top1=0.5).monitor_top1 == 0.5  # a log from before: validation


@pytest.mark.slow
def test_a_run_without_heldout_says_it_monitored_on_validation(tmp_path):
    from timm_posgeom.app.train import train

    summary = train(load_recipe(None, TINY + ["max_steps=2"]), tmp_path, progress=False)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["monitor"] for r in records if r["kind"] == "eval"] == ["validation"]
    assert not [r for r in records if r["kind"] == "validation"]
    assert summary.monitor == "validation" and summary.monitor_top1 == summary.val_top1
    assert "heldout" not in json.loads((tmp_path / "data.json").read_text())


def test_study_presets_and_flags_set_the_heldout_fraction(tmp_path):
    from timm_posgeom.app.study import preset_config
    from timm_posgeom.app.study.plan import make_plan
    from timm_posgeom.cli import main

    for preset, fraction in (("demo", 0.1), ("imagenette-cpu", 0.1), ("imagenette-cpu-14", 0.1), ("in100", 0.05)):
        config = preset_config(preset, conditions=("ape",), data="synthetic")
        assert {r.recipe.heldout_fraction for r in make_plan(config, tmp_path).runs} == {fraction}, preset
    config = preset_config("demo", conditions=("ape",), heldout_fraction=0.0)
    assert make_plan(config, tmp_path).runs[0].recipe.heldout_fraction == 0.0
    with pytest.raises(SystemExit) as e:
        main(["study", "--dry-run", "--set", "heldout_fraction=0.3", "--out", str(tmp_path / "s")])
    assert e.value.code == 2
    with pytest.raises(SystemExit) as e:
        main(["study", "--dry-run", "--heldout", "1.5", "--out", str(tmp_path / "s")])
    assert e.value.code == 2


def test_train_flag_sets_the_recipe_key(tmp_path, monkeypatch):
    import timm_posgeom.app.train as train_module
    from timm_posgeom.cli import main

    seen = {}
    monkeypatch.setattr(train_module, "train", lambda recipe, out, **kw: seen.setdefault("r", recipe))
    assert main(["train", "--out", str(tmp_path / "r"), "--heldout", "0.25"]) == 0
    assert seen["r"].heldout_fraction == 0.25


def test_a_recipe_from_before_the_heldout_keys_is_no_change():
    from timm_posgeom.app.recipe import Recipe
    from timm_posgeom.app.rundir import settings_changes

    asked = Recipe().to_dict()
    saved = {k: v for k, v in asked.items() if k not in ("heldout_fraction", "heldout_seed")}
    assert settings_changes("recipe", saved, asked) == {}
    assert settings_changes("recipe", saved, dict(asked, heldout_fraction=0.1)) == {"heldout_fraction": (0.0, 0.1)}
