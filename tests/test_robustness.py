"""Fragility and alpha sweeps: exact counts, FS formula, transform order, alpha=1 identity, bad input."""

from __future__ import annotations

import json
import math

import numpy as np
import PIL.Image
import PIL.ImageOps
import pytest
import timm
import torch
import torch.nn as nn
from conftest import IMAGENETTE
from timm.data import create_transform
from torchvision import transforms

import timm_posgeom  # noqa: F401  (registers the models)
from timm_posgeom.data.shifts import JPEG, Shift, parse_shift
from timm_posgeom.data.transforms import eval_transform
from timm_posgeom.robustness import (
    AlphaSweepResult,
    FragilityResult,
    alpha_sweep,
    fragility,
    fragility_score,
    paired_bootstrap_fs,
    wilson_interval,
)

FAST = dict(num_workers=0, progress=False)


pytestmark = pytest.mark.usefixtures("one_thread")


class Brightness(nn.Module):
    """Stub classifier: class 1 when the mean normalised pixel is > 0, else class 0. Records inputs."""

    def __init__(self, size: int = 16, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5)):
        super().__init__()
        self.pretrained_cfg = {
            "architecture": "brightness",
            "input_size": (3, size, size),
            "mean": mean,
            "std": std,
            "interpolation": "bilinear",
            "crop_pct": 0.875,
            "crop_mode": "center",
        }
        self.anchor = nn.Parameter(torch.zeros(()))
        self.seen: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(x.clone())
        m = x.mean(dim=(1, 2, 3))
        return torch.stack([-m, m], dim=1)


class Invert(Shift):
    """A shift that flips Brightness's prediction: PIL negative."""

    spec = "invert"

    def transform(self, inpt, params):
        return PIL.ImageOps.invert(inpt)


def _solid(value: int, size=(20, 30)) -> PIL.Image.Image:
    return PIL.Image.new("RGB", size, (value, value, value))


def _textured(seed: int, size=(56, 40)) -> PIL.Image.Image:
    rng = np.random.default_rng(seed)
    w, h = size
    yy, xx = np.mgrid[0:h, 0:w]
    base = np.stack([128 + 90 * np.sin(xx / (3 + seed) + c) * np.cos(yy / 4 - c) for c in range(3)], -1)
    return PIL.Image.fromarray(np.clip(base + rng.normal(0, 25, base.shape), 0, 255).astype(np.uint8))


# ------------------------------------------------------------------------------------------
# formulas
# ------------------------------------------------------------------------------------------
def test_fs_formula_and_intervals():
    assert fragility_score(0.3, 0.6) == pytest.approx(0.5)
    assert fragility_score(0.6, 0.6) == 0.0
    assert fragility_score(0.7, 0.5) == pytest.approx(-0.4)
    with pytest.warns(RuntimeWarning, match="clean accuracy is 0"):
        assert math.isnan(fragility_score(0.0, 0.0))
    # Wilson score intervals (reference values: statsmodels proportion_confint(method="wilson"))
    assert wilson_interval(5, 10) == pytest.approx((0.236593, 0.763407), abs=1e-6)
    assert wilson_interval(0, 10) == pytest.approx((0.0, 0.277533), abs=1e-6)
    assert all(math.isnan(v) for v in wilson_interval(0, 0))
    clean = np.array([1, 1, 1, 1, 0, 1, 1, 0] * 25, bool)
    shifted = np.array([1, 0, 1, 0, 0, 1, 0, 1] * 25, bool)
    lo, hi = paired_bootstrap_fs(clean, shifted)
    fs = 1 - shifted.mean() / clean.mean()
    assert lo < fs < hi and hi - lo < 0.5
    assert paired_bootstrap_fs(clean, shifted) == (lo, hi)  # seeded


def test_result_from_correct():
    r = FragilityResult.from_correct({"clean": np.array([1, 1, 0, 1], bool), "jpeg:5": np.array([1, 0, 0, 0], bool)})
    assert r.num_images == 4 and r.shifts == ["jpeg:5"]
    assert r.clean_accuracy == 0.75 and r.accuracy["jpeg:5"] == 0.25
    assert r.fs["jpeg:5"] == pytest.approx(1 - 0.25 / 0.75)
    assert r.counts == {"clean": {"correct": 3, "total": 4}, "jpeg:5": {"correct": 1, "total": 4}}


# ------------------------------------------------------------------------------------------
# fragility: exact counts, order of the pipeline
# ------------------------------------------------------------------------------------------
def test_exact_counts_with_uneven_last_batch():
    values = [200, 50, 200, 50, 200, 50, 200]
    labels = [1, 1, 1, 0, 0, 0, 1]  # clean correct: T F T T F T T -> 5/7; batches of 3: 2/3, 2/3, 1/1
    data = [(_solid(v), y) for v, y in zip(values, labels)]
    model = Brightness()
    r = fragility(model, data, shifts=("jpeg:5", Invert()), batch_size=3, **FAST)
    assert [x.shape[0] for x in model.seen] == [9, 9, 3]  # 3 copies per image, last batch short
    assert r.num_images == 7
    assert r.counts["clean"] == {"correct": 5, "total": 7}
    assert r.clean_accuracy == 5 / 7  # not the mean of per-batch accuracies (7/9)
    assert r.correct["clean"].tolist() == [True, False, True, True, False, True, True]
    assert r.accuracy["jpeg:5"] == 5 / 7 and r.fs["jpeg:5"] == 0.0  # a solid gray survives JPEG
    assert r.accuracy["invert"] == 2 / 7 and r.fs["invert"] == pytest.approx(1 - 2 / 5)
    lo, hi = r.clean_interval
    assert lo < 5 / 7 < hi
    d = json.loads(r.to_json())
    assert d["counts"]["invert"] == {"correct": 2, "total": 7} and "Wilson" in d["interval_method"]
    fig = r.plot()
    assert len(fig.axes) == 1


@pytest.mark.parametrize("resize", ["paper", "timm"])
def test_model_sees_eval_transform_output(resize):
    """The shift lands after the resize and before normalisation, identically in eval_transform and fragility."""
    images = [_textured(s) for s in range(5)]
    data = [{"image": im, "label": 1} for im in images]
    shifts = ("jpeg:5", "blur:2.5:5", "imagenet-c:gaussian_blur:2")
    model = Brightness(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
    fragility(model, data, shifts=shifts, batch_size=2, resize=resize, **FAST)
    seen = torch.cat(model.seen).view(5, 1 + len(shifts), 3, 16, 16)
    for i, im in enumerate(images):
        for j, shift in enumerate((None, *shifts)):
            assert torch.equal(seen[i, j], eval_transform(model, resize=resize, shift=shift)(im))
    # the batched on-device blur gives the model the same inputs
    model.seen.clear()
    fragility(model, data, shifts=shifts, batch_size=2, resize=resize, blur_on_device=True, **FAST)
    assert torch.equal(torch.cat(model.seen).view_as(seen), seen)


def test_eval_transform_order():
    cfg = {
        "input_size": (3, 24, 24),
        "interpolation": "bicubic",
        "mean": (0.4, 0.5, 0.6),
        "std": (0.2, 0.25, 0.3),
        "crop_pct": 0.875,
    }
    img = _textured(0, size=(90, 60))

    class Spy(Shift):
        spec = "spy"
        seen: list = []

        def transform(self, inpt, params):
            Spy.seen.append(inpt)
            return _solid(51, inpt.size)

    out = eval_transform(cfg, shift=Spy())(img)
    (received,) = Spy.seen
    assert isinstance(received, PIL.Image.Image) and received.size == (24, 24) and received.mode == "RGB"
    expected = (torch.tensor(0.2) - torch.tensor(cfg["mean"])) / torch.tensor(cfg["std"])
    assert torch.allclose(out, expected.view(3, 1, 1).expand(3, 24, 24))  # normalised after the shift
    # JPEG after the resize, not before
    resize = transforms.Resize((24, 24), interpolation=transforms.InterpolationMode.BICUBIC)
    norm = transforms.Compose([transforms.ToTensor(), transforms.Normalize(cfg["mean"], cfg["std"])])
    out = eval_transform(cfg, shift="jpeg:5")(img)
    assert torch.equal(out, norm(JPEG(5)(resize(img))))
    assert not torch.equal(out, norm(resize(JPEG(5)(img))))
    # the timm geometry is timm's own eval transform; grayscale images become RGB
    assert torch.equal(eval_transform(cfg, resize="timm")(img), create_transform(**cfg, is_training=False)(img))
    assert eval_transform(cfg)(img.convert("L")).shape == (3, 24, 24)
    with pytest.raises(ValueError, match="resize must be one of paper, timm"):
        eval_transform(cfg, resize="squash")


# ------------------------------------------------------------------------------------------
# bad input
# ------------------------------------------------------------------------------------------
def test_bad_input():
    model = Brightness()
    with pytest.raises(ValueError, match="data is empty"):
        fragility(model, [], **FAST)
    with pytest.raises(ValueError, match="stream .*give max_images"):  # a stream needs its bound (test_data.py)
        fragility(model, (x for x in [(_solid(1), 0)]), **FAST)
    with pytest.raises(TypeError, match="indexable"):
        fragility(model, 7, **FAST)
    with pytest.raises(TypeError, match="pass one split"):
        fragility(model, {"validation": [(_solid(1), 0)]}, **FAST)
    with pytest.raises(ValueError, match="valid forms"):
        fragility(model, [(_solid(1), 0)], shifts=("sharpen:2",), **FAST)
    with pytest.raises(ValueError, match="from 1 to 100"):
        fragility(model, [(_solid(1), 0)], shifts=("jpeg:0",), **FAST)
    with pytest.raises(ValueError, match="distinct"):
        fragility(model, [(_solid(1), 0)], shifts=("jpeg:5", "jpeg:5"), **FAST)


def test_zero_clean_accuracy_gives_nan_fs_with_warning():
    data = [(_solid(200), 0), (_solid(220), 0)]  # Brightness says 1 for both: nothing correct
    with pytest.warns(RuntimeWarning, match="clean accuracy is 0"):
        r = fragility(Brightness(), data, shifts=("jpeg:5", "blur:1"), **FAST)
    assert r.clean_accuracy == 0.0
    assert math.isnan(r.fs["jpeg:5"]) and math.isnan(r.fs["blur:1"])
    written = r.to_json()  # strict JSON: an undefined FS is null, never a bare NaN
    assert "NaN" not in written and json.loads(written)["fs"] == {"jpeg:5": None, "blur:1": None}


# ------------------------------------------------------------------------------------------
# PE interventions: RPI, alpha, the sweep
# ------------------------------------------------------------------------------------------
def _visible_pe_model(name: str = "posgeom_vit_micro_patch8_64_ape", n: int = 8):
    """A micro ViT whose PE visibly matters, and data labelled by its own clean predictions.

    Random init hides PE effects (every image gets the same class), so on purpose: a unit-scale PE
    table, a unit-scale head, and a head bias that centres the logits on these images, so that
    predictions follow each image's deviation from the mean feature. Clean accuracy is exactly 1.
    """
    torch.manual_seed(0)
    model = timm.create_model(name, num_classes=10).eval()
    images = [_textured(s, size=(64, 64)) for s in range(n)]
    tf = eval_transform(model)
    x = torch.stack([tf(im) for im in images])
    with torch.no_grad():
        if getattr(model, "pos_embed", None) is not None:
            model.pos_embed.normal_(0, 1.0)
        model.head.weight.normal_(0, 1.0)
        feats = model.forward_head(model.forward_features(x), pre_logits=True)
        model.head.bias.sub_(model.head(feats).mean(0))
        labels = model(x).argmax(-1).tolist()
    assert len(set(labels)) > 2
    return model, list(zip(images, labels))


def test_alpha_and_rpi_change_predictions_and_restore_the_model():
    model, data = _visible_pe_model()
    table = model.pos_embed.detach().clone()
    base = fragility(model, data, shifts=("jpeg:5",), batch_size=4, **FAST)
    assert base.clean_accuracy == 1.0
    assert fragility(model, data, shifts=("jpeg:5",), alpha=0.0, batch_size=4, **FAST).clean_accuracy < 1.0
    rpi = fragility(model, data, shifts=("jpeg:5",), rpi=True, seed=0, batch_size=4, **FAST)
    assert rpi.clean_accuracy < 1.0 and rpi.settings["rpi"] is True
    again = fragility(model, data, shifts=("jpeg:5",), rpi=True, seed=0, batch_size=4, **FAST)
    assert np.array_equal(again.correct["jpeg:5"], rpi.correct["jpeg:5"])  # seeded
    assert torch.equal(model.pos_embed, table) and model.alpha == 1.0 and not model.training
    # control: without a PE the model is permutation-invariant, so RPI and alpha change nothing
    nope, nope_data = _visible_pe_model("posgeom_vit_micro_patch8_64_nope")
    assert fragility(nope, nope_data, shifts=(), rpi=True, batch_size=4, **FAST).clean_accuracy == 1.0


def test_alpha_sweep_at_one_equals_unscaled_model():
    from timm_posgeom.probes import probe_ssdc

    model, data = _visible_pe_model(n=6)
    sweep = alpha_sweep(
        model, data, alphas=(1.0, 0.0), shifts=("jpeg:5", "blur:2.5:5"), probe_images=5, batch_size=4, **FAST
    )
    assert isinstance(sweep, AlphaSweepResult) and sweep.alphas == [1.0, 0.0]
    one, zero = sweep.rows
    base = fragility(model, data, shifts=("jpeg:5", "blur:2.5:5"), batch_size=4, **FAST)
    for key in ("clean", "jpeg:5", "blur:2.5:5"):
        assert np.array_equal(one.fragility.correct[key], base.correct[key])
    assert one.fs == base.fs and one.clean_accuracy == 1.0
    tf = eval_transform(model)
    images = torch.stack([tf(im) for im, _ in data[:5]])
    probe = probe_ssdc(model, [(images[:4], None), (images[4:], None)], rpi=True, seed=0, progress=False)
    assert one.ssdc_per_layer == pytest.approx(probe.per_layer, abs=1e-6)
    assert one.delta_ssdc == pytest.approx(probe.delta, abs=1e-6)
    assert zero.clean_accuracy < 1.0 and zero.ssdc_per_layer != one.ssdc_per_layer  # the PE matters here
    md = sweep.to_markdown()
    assert md.splitlines()[0].startswith("| alpha | delta SSDC (RPI)") and "FS blur:2.5:5" in md
    assert len(sweep.plot().axes) == 2  # delta SSDC and FS: two panels sharing alpha, no twin axes
    assert json.loads(sweep.to_json())["rows"][0]["alpha"] == 1.0
    assert model.alpha == 1.0


@pytest.mark.skipif(not IMAGENETTE.exists(), reason="Imagenette copy not present")
@pytest.mark.filterwarnings("ignore:clean accuracy is 0")
def test_fragility_on_real_images():
    datasets = pytest.importorskip("datasets")
    ds = datasets.load_dataset(str(IMAGENETTE), split="validation")
    model = timm.create_model("posgeom_vit_micro_patch8_64_nope", num_classes=10)
    r = fragility(model, ds, shifts=[parse_shift("imagenet-c:jpeg_compression:5")], max_images=10, batch_size=4, **FAST)
    assert r.num_images == 10 and r.shifts == ["imagenet-c:jpeg_compression:5"]
    one = fragility(model, ds, "jpeg:5", max_images=3, **FAST)  # a single spec is accepted too
    assert one.shifts == ["jpeg:5"] and one.num_images == 3
    assert r.counts["clean"]["total"] == 10


@pytest.mark.filterwarnings("ignore:clean accuracy is 0")
def test_cli_fragility_and_sweep(tmp_path, capsys):
    from timm_posgeom.cli import main

    common = [
        "posgeom_vit_micro_patch8_64_ape",
        "--num-classes",
        "10",
        "--data",
        "synthetic",
        "--max-images",
        "6",
        "--batch-size",
        "4",
        "--num-workers",
        "0",
        "--no-progress",
        "--device",
        "cpu",
    ]
    assert (
        main(
            [
                "fragility",
                *common,
                "--shift",
                "jpeg:5",
                "--shift",
                "blur:2.5:5",
                "--rpi",
                "--alpha",
                "0.5",
                "--out",
                str(tmp_path / "f"),
            ]
        )
        == 0
    )
    saved = json.loads((tmp_path / "f" / "fragility.json").read_text())
    assert saved["num_images"] == 6 and saved["settings"]["rpi"] is True and saved["settings"]["alpha"] == 0.5
    assert (tmp_path / "f" / "fragility.png").stat().st_size > 0
    assert main(["sweep", *common, "--alphas", "1,0.5", "--probe-images", "4", "--out", str(tmp_path / "s")]) == 0
    assert [r["alpha"] for r in json.loads((tmp_path / "s" / "sweep.json").read_text())["rows"]] == [1.0, 0.5]
    assert "| alpha |" in (tmp_path / "s" / "sweep.md").read_text()
    # --max-images caps fragility only: --probe-images 10 > 6 probes 10 (the data was cut to 6 first)
    assert main(["sweep", *common, "--alphas", "1,0.5", "--probe-images", "10", "--out", str(tmp_path / "s2")]) == 0
    settings = json.loads((tmp_path / "s2" / "sweep.json").read_text())["settings"]
    assert settings["probe_images"] == 10 and settings["num_images"] == 6
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(["fragility", *common, "--shift", "sharpen:3"])
    assert exit_info.value.code == 2 and "valid forms" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["vit_small_patch16_rope_224", "vit_small_patch16_224"])
def test_third_party_timm_vits(name):
    """Stock timm ViTs (RoPE: angle scaling; APE: table scaling): alpha=1 is the unscaled model, and
    the model still trains afterwards (no inference tensors left behind by pe_scale)."""
    torch.manual_seed(0)
    model = timm.create_model(name, img_size=32, patch_size=8, depth=1, embed_dim=32, num_heads=2, num_classes=3)
    data = [(_textured(s, size=(40, 40)), s % 3) for s in range(5)]
    base = fragility(model, data, shifts="jpeg:5", batch_size=3, **FAST)
    assert base.settings["input_size"] == [3, 32, 32]  # the built size, not the pretrained config's 224
    one = fragility(model, data, shifts="jpeg:5", alpha=1.0, batch_size=3, **FAST)
    assert all(np.array_equal(one.correct[k], base.correct[k]) for k in base.correct)
    fragility(model, data, shifts="jpeg:5", alpha=0.3, rpi=True, batch_size=3, **FAST)
    model.train()
    model(torch.randn(2, 3, 32, 32)).sum().backward()


def test_a_twins_model_built_at_64_px_is_fed_64_px():
    """twins keeps its input size in patch_embeds[0], not patch_embed: built for 64 px, it was fed its
    pretrained config's 224 px by fragility, the probe and eval_loader, and ran without an error."""
    from timm_posgeom.data.transforms import resolve_config

    model = timm.create_model("twins_svt_small", img_size=64, depths=(1, 1, 1, 1), num_classes=3)
    assert resolve_config(model)["input_size"] == (3, 64, 64)
