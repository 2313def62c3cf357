"""`posgeom zoo --model-set pe-variants`: timm's PE-variant checkpoints, with timm's published top-1 beside the zoo's.
Offline: the names are checked against timm's registry, and a zoo of two of them runs on their random-init twins
(`--no-pretrained`) with the Hub switched off."""

from __future__ import annotations

import csv

import pytest
import timm
from conftest import IMAGENETTE

from timm_posgeom.app.zoo import MODEL_SETS, PUBLISHED, model_set, published_top1
from timm_posgeom.cli.main import main


def test_every_model_of_the_set_is_a_timm_checkpoint_and_the_published_numbers_are_timms():
    names = model_set("pe-variants")
    assert set(names) <= set(timm.list_models(pretrained=True)) and len(names) == len(set(names)) == 18
    assert set(PUBLISHED) <= set(names) and "vit_small_patch16_dinov3.lvd1689m" not in PUBLISHED  # no head
    # the ViT-S rows as timm's results CSVs give them (issue 51): ImageNet / -R / -A / -Sketch
    assert published_top1("deit3_small_patch16_224.fb_in1k") == dict(
        imagenet=81.382, imagenet_r=45.960, imagenet_a=26.013, sketch=34.685
    )
    assert PUBLISHED["vit_small_patch16_rope_224.naver_in1k"] == (81.222, 44.490, 25.000, 33.831)
    assert PUBLISHED["vit_small_patch16_rope_mixed_224.naver_in1k"] == (81.252, 44.347, 25.227, 34.088)
    assert published_top1("vit_small_patch16_rope_224") is None  # numbers belong to a tag
    with pytest.raises(ValueError, match="pe-variants"):
        model_set("every-vit")
    assert list(MODEL_SETS) == ["pe-variants"]


def test_the_model_set_adds_its_models_to_the_command(tmp_path, monkeypatch):
    import timm_posgeom.app.zoo as zoo_mod

    seen = {}

    def fake_run_zoo(names, config, out, **kwargs):
        seen["names"] = names
        raise KeyboardInterrupt  # stop before measuring anything

    monkeypatch.setattr(zoo_mod, "run_zoo", fake_run_zoo)
    args = ["zoo", "deit3_small_patch16_224.fb_in1k", "--model-set", "pe-variants", "--data", "synthetic"]
    assert main([*args, "--out", str(tmp_path / "zoo")]) == 130
    first = "deit3_small_patch16_224.fb_in1k"  # named first, and not measured twice
    assert seen["names"] == [first] + [n for n in model_set("pe-variants") if n != first]


@pytest.mark.slow
@pytest.mark.skipif(not IMAGENETTE.is_dir(), reason="needs the Imagenette copy (tests/conftest.py)")
def test_a_zoo_of_model_set_puts_timms_numbers_beside_its_own(tmp_path, monkeypatch, one_thread):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # random-init twins: nothing may be downloaded
    out = tmp_path / "zoo"
    models = ["vit_small_patch16_rope_mixed_224.naver_in1k", "deit3_small_patch16_224.fb_in1k"]
    common = ["--no-pretrained", "--img-size", "64", "--max-images", "8", "--batch-size", "4"]
    common += ["--rpi-permutations", "2", "--extras", "none", "--num-workers", "0", "--no-progress", "--device", "cpu"]
    assert main(["zoo", *models, "--data", str(IMAGENETTE), "--out", str(out), *common]) == 0
    with open(out / "zoo.csv", newline="") as f:
        rows = {row["model"]: row for row in csv.DictReader(f)}
    for name in models:
        row = rows[name]
        assert row["weights"] == "random-init" and row["top1"] != ""  # Imagenette's classes onto the ImageNet head
        for key, value in published_top1(name).items():
            assert float(row[f"timm_top1_{key}"]) == pytest.approx(value / 100)
    text = (out / "zoo.md").read_text()
    assert "## Published by timm, beside ours" in text
    assert "| `deit3_small_patch16_224.fb_in1k` | absolute position table | 81.38 / 45.96 / 26.01 / 34.69 |" in text
