"""probe_ssdc: the paper's formula, streaming, RPI, every flat timm ViT family, clear errors, CLI."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import timm
import torch
import torch.nn.functional as F
from conftest import IMAGENETTE
from scipy.stats import spearmanr
from scipy.stats import t as student_t

import timm_posgeom  # noqa: F401  (registers the models)
from timm_posgeom.probes import SSDCResult, UnsupportedModelError, find_sites, probe_ssdc


def smooth_images(n: int, size: int = 64, seed: int = 0) -> torch.Tensor:
    """Images with spatial structure (nearby patches look alike): upsampled low-resolution noise."""
    gen = torch.Generator().manual_seed(seed)
    return F.interpolate(torch.randn(n, 3, 4, 4, generator=gen), size=size, mode="bicubic", align_corners=False)


@pytest.fixture(scope="module")
def nope():
    torch.manual_seed(0)
    return timm.create_model("posgeom_vit_micro_patch8_64_nope").eval()


@pytest.fixture(scope="module")
def images():
    return smooth_images(10)


def _norm1_maps(model, images) -> list[np.ndarray]:
    """Reference: (n, N, N) cosine maps of the patch tokens at every block's norm1 output."""
    maps = []
    hooks = [b.norm1.register_forward_hook(lambda m, a, out: maps.append(out)) for b in model.blocks]
    with torch.no_grad():
        model(images)
    for h in hooks:
        h.remove()
    out = []
    for tokens in maps:
        z = tokens[:, model.num_prefix_tokens :].double()
        z = z / z.norm(dim=-1, keepdim=True)
        out.append((z @ z.transpose(1, 2)).numpy())
    return out


def _paper_ssdc(sim: np.ndarray, h: int, w: int) -> float:
    """The paper's formula: spearman of S_ij and -|r_i - r_j| - |c_i - c_j| over i < j (scipy)."""
    i, j = np.triu_indices(h * w, 1)
    r, c = np.divmod(np.arange(h * w), w)
    return spearmanr(sim[i, j], -(np.abs(r[i] - r[j]) + np.abs(c[i] - c[j]))).statistic


def test_mean_map_and_per_image_match_direct_formula(nope, images):
    result = probe_ssdc(nope, images, reduction="both", progress=False)
    assert isinstance(result, SSDCResult) and result.layers == [0, 1, 2, 3]
    maps = _norm1_maps(nope, images)
    expected = [_paper_ssdc(m.mean(0), 8, 8) for m in maps]
    np.testing.assert_allclose(result.per_layer, expected, atol=1e-6)
    assert min(result.per_layer) > 0.2  # structured images: content-driven structure without any PE
    n = len(images)
    for stats, layer_maps in zip(result.per_image, maps):
        values = np.array([_paper_ssdc(m, 8, 8) for m in layer_maps])
        half = student_t.ppf(0.975, n - 1) * values.std(ddof=1) / np.sqrt(n)
        np.testing.assert_allclose(
            [stats.mean, stats.std, stats.ci_low, stats.ci_high],
            [values.mean(), values.std(ddof=1), values.mean() - half, values.mean() + half],
            atol=1e-6,
        )
        assert stats.n == n and stats.n_nan == 0
    torch.testing.assert_close(result.mean_maps[0].double(), torch.from_numpy(maps[0].mean(0)), atol=1e-6, rtol=0)
    assert result.rise == pytest.approx(result.per_layer[1] - result.per_layer[0])
    with pytest.warns(DeprecationWarning, match="delta SSDC under RPI"):  # delta is defined under RPI only
        assert result.delta == result.rise
    assert result.delta_ci == (pytest.approx(math.nan, nan_ok=True),) * 2
    assert result.metadata["n_images"] == n and result.metadata["grid_size"] == [8, 8]


def test_streaming_equals_one_batch(nope, images):
    whole = probe_ssdc(nope, images, reduction="both", batch_size=None, progress=False)
    chunks = [images[:4], (images[4:7], torch.zeros(3)), {"image": images[7:]}]  # tensors, tuples, dicts
    streamed = probe_ssdc(nope, iter(chunks), reduction="both", progress=False)
    np.testing.assert_allclose(streamed.per_layer, whole.per_layer, atol=1e-6)
    np.testing.assert_allclose([s.mean for s in streamed.per_image], [s.mean for s in whole.per_image], atol=1e-6)
    np.testing.assert_allclose([s.std for s in streamed.per_image], [s.std for s in whole.per_image], atol=1e-6)
    torch.testing.assert_close(streamed.mean_maps, whole.mean_maps, atol=1e-6, rtol=0)
    assert streamed.metadata["n_images"] == len(images)


def test_per_image_after_the_forward_equals_per_layer(nope, images, monkeypatch):
    """Per-image SSDC kept for one call after the forward (small batches) or computed at each layer
    (batches over the memory budget) gives the same numbers, also when both happen in one probe."""
    from timm_posgeom.probes.ssdc_probe import accumulator as module

    sincos = timm.create_model("posgeom_vit_micro_patch8_64_sincos").eval()  # a PE: content and index grids differ
    results = {}
    per_image_bytes = 4 * 64 * 63 // 2 * 4  # 4 layers of 2,016 float32 pairs
    for name, budget in (("after", 10**9), ("per layer", 0), ("mixed", 4 * per_image_bytes)):
        monkeypatch.setattr(module, "_DEFER_BYTES", budget)
        chunks = [images[:4], images[4:]]  # with "mixed": 4 images kept, 6 computed per layer
        results[name] = probe_ssdc(sincos, iter(chunks), rpi=True, seed=3, reduction="per_image", progress=False)
    for name in ("per layer", "mixed"):
        for field in ("per_image", "content_per_image"):
            got, want = getattr(results[name], field), getattr(results["after"], field)
            np.testing.assert_allclose([s.mean for s in got], [s.mean for s in want], atol=1e-9)
            np.testing.assert_allclose([s.std for s in got], [s.std for s in want], atol=1e-9)
            assert [s.n for s in got] == [s.n for s in want] == [len(images)] * 4


def test_rpi_without_pe_is_zero_and_equivariant(nope, images):
    plain = probe_ssdc(nope, images, reduction="both", progress=False)
    rpi = probe_ssdc(nope, images, rpi=True, seed=1, reduction="both", progress=False)
    assert not torch.equal(rpi.permutation, torch.arange(64))
    assert max(abs(v) for v in rpi.per_layer) < 0.1  # the index grid carries no structure without a PE
    # permutation-equivariance: against where the content came from, nothing changed
    np.testing.assert_allclose(rpi.content_per_layer, plain.per_layer, atol=1e-5)
    np.testing.assert_allclose([s.mean for s in rpi.content_per_image], [s.mean for s in plain.per_image], atol=1e-5)
    again = probe_ssdc(nope, images, rpi=True, seed=1, progress=False)  # seeded: reproducible
    assert torch.equal(again.permutation, rpi.permutation)


def test_rpi_with_pe_keeps_index_structure():
    torch.manual_seed(0)
    model = timm.create_model("posgeom_vit_micro_patch8_64_sincos").eval()  # fixed 2-D sincos table dominates at init
    result = probe_ssdc(model, smooth_images(4), rpi=True, progress=False)
    assert result.per_layer[0] > 0.3


def test_layers_max_images_and_result_io(nope, images, tmp_path):
    result = probe_ssdc(
        nope,
        [images[:6], images[6:]],
        layers=[1, 0],
        max_images=7,
        site="block_output",
        reduction="per_image",
        progress=False,
    )
    assert result.layers == [0, 1] and result.metadata["n_images"] == 7 and result.mean_maps is None
    assert result.per_layer == [s.mean for s in result.per_image]
    data = json.loads(result.to_json(tmp_path / "r.json"))
    assert data["layers"] == [0, 1] and data["metadata"]["site"] == "block_output"
    written = json.loads((tmp_path / "r.json").read_text())
    assert written["delta"] is None and written["rise"] == pytest.approx(result.rise)  # no RPI: no delta SSDC
    assert written["rise_ci"] is None  # the per-image reduction keeps no per-image rise: no interval for it
    result.plot(tmp_path / "r.png")
    probe_ssdc(nope, images[:2], layers=[-1], progress=False).plot(tmp_path / "m.png")
    assert (tmp_path / "r.png").stat().st_size > 0 and (tmp_path / "m.png").stat().st_size > 0


def test_mode_and_hooks_restored(nope, images):
    nope.train()
    try:
        probe_ssdc(nope, images[:2], progress=False)
        assert nope.training
        with pytest.raises(TypeError):
            probe_ssdc(nope, [images[:2], "not a batch"], rpi=True, progress=False)
        assert nope.training
        assert not any(m._forward_hooks or m._forward_pre_hooks for m in nope.modules())
        nope.blocks[1].eval()  # a submodule's own mode (e.g. a frozen block) comes back as it was
        probe_ssdc(nope, images[:2], progress=False)
        assert nope.training and nope.blocks[0].training and not nope.blocks[1].training
        assert not any(m.training for m in nope.blocks[1].modules())
    finally:
        nope.eval()


def test_model_still_trains_after_probe():
    torch.manual_seed(0)
    model = timm.create_model(
        "eva02_tiny_patch14_224", img_size=28, patch_size=7, embed_dim=64, num_heads=2, depth=2
    )  # RoPE caches built during the probe must stay usable by autograd
    probe_ssdc(model, smooth_images(2, 28), rpi=True, progress=False)
    assert model.training
    model(smooth_images(2, 28)).sum().backward()
    assert model.patch_embed.proj.weight.grad is not None


SMALL = dict(embed_dim=64, num_heads=2, depth=2, patch_size=8, img_size=32)
FAMILIES = {
    "vit_tiny_patch16_224": SMALL,
    "vit_base_patch16_reg4_gap_256": SMALL,  # registers, no class token, avg pool
    "vit_small_patch16_224": dict(SMALL, class_token=False, global_pool="avg"),
    "deit_tiny_distilled_patch16_224": SMALL,
    "eva02_tiny_patch14_224": SMALL,  # RoPE
    "vit_small_patch16_dinov3": SMALL,  # dinov3-style RoPE + registers
    "beit_base_patch16_224": SMALL,
    "vit_relpos_small_patch16_224": SMALL,
    "cait_xxs24_224": SMALL,  # class token joins only in blocks_token_only
    "naflexvit_base_patch16_gap": SMALL,
    "posgeom_vit_micro_patch8_64_rope": dict(img_size=32),
    # timm's VLM towers: a classifier around `encoder` (its blocks are probed); NHWC tokens (qwen3, deepseek);
    # gemma4's patch embedding adds its own 2-D table
    "qwen3_vit_88m": SMALL,
    "deepseek_vit_412m": SMALL,
    "gemma4_vit_167m": dict(SMALL, global_pool="avg"),
}


@pytest.mark.parametrize("name", list(FAMILIES))
def test_family_probes(name):
    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False, **FAMILIES[name])
    data = smooth_images(2, 32)
    for rpi in (False, True):
        result = probe_ssdc(model, data, rpi=rpi, reduction="both", progress=False)
        assert result.metadata["grid_size"] == [4, 4] and len(result.per_layer) == len(find_sites(model).blocks)
        assert all(np.isfinite(result.per_layer)) and all(np.isfinite([s.mean for s in result.per_image]))


def test_bad_inputs(nope, images):
    with pytest.raises(UnsupportedModelError, match="flat timm ViTs.*site='stage_output'"):
        probe_ssdc(timm.create_model("resnet18", num_classes=2), images[:1], site="attn_input", progress=False)
    swin = timm.create_model(
        "swin_tiny_patch4_window7_224", img_size=32, window_size=2, embed_dim=16, depths=(1, 1), num_heads=(1, 1)
    )
    with pytest.raises(TypeError, match="Hierarchical"):
        probe_ssdc(swin, torch.zeros(1, 3, 32, 32), site="block_output", progress=False)
    with pytest.raises(ValueError, match="expects 64x64 images, got 32x32"):
        probe_ssdc(nope, images[:1, :, :32, :32], progress=False)
    with pytest.raises(ValueError, match="no images"):
        probe_ssdc(nope, [], progress=False)
    with pytest.raises(ValueError, match="unknown site"):
        probe_ssdc(nope, images[:1], site="mlp_output", progress=False)
    with pytest.raises(ValueError, match="unknown reduction"):
        probe_ssdc(nope, images[:1], reduction="median", progress=False)
    with pytest.raises(ValueError, match="out of range"):
        probe_ssdc(nope, images[:1], layers=[4], progress=False)
    with pytest.raises(TypeError, match="pixel_values"):
        probe_ssdc(nope, [{"img": images[:1]}], progress=False)
    with pytest.raises(ValueError, match=r"\(B, C, H, W\)"):
        probe_ssdc(nope, [images[0, 0]], progress=False)


@pytest.mark.skipif(not IMAGENETTE.is_dir(), reason="needs ../shared/data/imagenette")
def test_cli_probe_on_imagenette(tmp_path, capsys):
    from timm_posgeom.cli import main

    code = main(
        [
            "probe",
            "posgeom_vit_micro_patch8_64_ape",
            "--data",
            str(IMAGENETTE),
            "--max-images",
            "4",
            "--batch-size",
            "2",
            "--rpi",
            "--alpha",
            "0.5",
            "--out",
            str(tmp_path),
            "--no-progress",
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "layer" in out and "content" in out
    data = json.loads((tmp_path / "ssdc.json").read_text())
    assert data["metadata"]["n_images"] == 4 and data["metadata"]["rpi"] is True
    assert (tmp_path / "ssdc.png").is_file()


def test_a_constant_layer_is_nan_with_both_reductions_not_rounding_noise():
    """Uniform-colour images through a model without PE: every patch token alike, so the map is constant and
    SSDC undefined. With reduction='both' the float32 batch sum varied by one rounding step (5.9999995 against
    6.0) and Spearman ranked that: SSDC -0.25, no warning."""
    import warnings

    from timm_posgeom.probes.ssdc_probe.spearman import ConstantMapWarning

    torch.manual_seed(0)
    model = timm.create_model("posgeom_vit_micro_patch8_64_nope", depth=1, img_size=32).eval()
    for b in (2, 3, 4, 5):  # the draws before the colours that showed it (most batches round consistently)
        torch.randn(b, 3, 1, 1)
    x = torch.ones(6, 3, 32, 32) * torch.randn(6, 3, 1, 1)
    for reduction in ("both", "mean_map"):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = probe_ssdc(model, x, progress=False, reduction=reduction, batch_size=6)
        assert math.isnan(result.per_layer[0]) and result.metadata["constant_layers"] == [0], reduction
        assert any(issubclass(w.category, ConstantMapWarning) for w in caught), reduction


def test_tokens_too_large_to_square_are_finite_and_a_non_finite_one_is_counted_once():
    """The probe tells non-finite tokens by their norms: a layer of finite tokens whose squares pass float32's
    range (norm inf) is not called non-finite, and one inf value in one image counts that image, once."""
    import warnings

    from timm_posgeom.errors import NonFiniteWarning

    def model(scale_last: float = 1.0):
        torch.manual_seed(0)
        m = timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=3).eval()
        with torch.no_grad():
            m.blocks[2].norm1.weight.mul_(scale_last)  # the last probed site: nothing computed after it
        return m

    x = torch.randn(4, 3, 32, 32)
    clean = probe_ssdc(model(), x, reduction="both", progress=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        huge = probe_ssdc(model(1e25), x, reduction="both", progress=False)  # layer 2's tokens about 1e25
    assert not [w for w in caught if issubclass(w.category, NonFiniteWarning)]
    assert huge.per_layer[:2] == clean.per_layer[:2] and all(math.isfinite(v) for v in clean.per_layer)
    with warnings.catch_warnings(record=True) as caught:  # float64 tokens past float32's range: finite too
        warnings.simplefilter("always")
        wide = model().double()
        with torch.no_grad():
            wide.blocks[2].norm1.weight.mul_(1e40)
        probe_ssdc(wide, x.double(), reduction="both", progress=False)
    assert not [w for w in caught if issubclass(w.category, NonFiniteWarning)]

    def inf_in_image_2(module, args):
        args[0][2, 5, 7] = math.inf

    hit = model()
    hit.blocks[2].norm1.register_forward_pre_hook(inf_in_image_2)
    with pytest.warns(NonFiniteWarning, match=r"layer\(s\) 2 .* 1 of 4 image"):
        result = probe_ssdc(hit, x, reduction="both", progress=False)
    assert math.isnan(result.per_layer[2]) and result.per_layer[:2] == clean.per_layer[:2]
