"""Per-stage SSDC of hierarchical ViTs and CNNs, the attention input of windowed / parallel blocks, and the
input size of the measuring functions and commands."""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest
import timm
import torch
import torch.nn.functional as F
from scipy.stats import spearmanr

import timm_posgeom  # noqa: F401  (registers the models)
from timm_posgeom.data.eval_data import eval_loader
from timm_posgeom.data.synthetic import SyntheticShapes
from timm_posgeom.probes import ConstantMapWarning, UnsupportedModelError, probe_ssdc
from timm_posgeom.robustness import fragility


def smooth_images(n: int, size: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return F.interpolate(torch.randn(n, 3, 4, 4, generator=gen), size=size, mode="bicubic", align_corners=False)


def tiny_swin():
    torch.manual_seed(0)
    return timm.create_model(
        "swin_tiny_patch4_window7_224",
        img_size=32,
        window_size=2,
        embed_dim=16,
        depths=(1, 1, 1),
        num_heads=(1, 1, 1),
        num_classes=3,
    ).eval()


def _scipy_ssdc(maps: np.ndarray) -> float:
    """The paper's formula on one (H*W, H*W) map of an H x W grid: scipy's Spearman over i < j."""
    n = maps.shape[-1]
    w = int(round(math.sqrt(n)))
    i, j = np.triu_indices(n, 1)
    r, c = np.divmod(np.arange(n), w)
    return spearmanr(maps[i, j], -(np.abs(r[i] - r[j]) + np.abs(c[i] - c[j]))).statistic


def _reference_stage_ssdc(model, images) -> tuple[list[float], list[float], list[tuple[int, int]]]:
    """Independent reference: timm's feature maps -> cosine maps in float64 -> mean-map and per-image SSDC."""
    with torch.no_grad():
        fmaps = model.forward_intermediates(images, intermediates_only=True)
    mean_map, per_image, grids = [], [], []
    for f in fmaps:
        z = f.double().flatten(2).transpose(1, 2)
        z = z / z.norm(dim=-1, keepdim=True)
        sim = (z @ z.transpose(1, 2)).numpy()
        mean_map.append(_scipy_ssdc(sim.mean(0)))
        per_image.append(float(np.mean([_scipy_ssdc(s) for s in sim])))
        grids.append(tuple(f.shape[-2:]))
    return mean_map, per_image, grids


@pytest.mark.parametrize("name", ["swin", "resnet18"])
def test_per_stage_ssdc_matches_scipy_on_each_stage_grid(name):
    model = tiny_swin() if name == "swin" else timm.create_model("resnet18", num_classes=3).eval()
    images = smooth_images(3, 32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = probe_ssdc(model, images, reduction="both", progress=False)
    mean_map, per_image, grids = _reference_stage_ssdc(model, images)
    assert result.metadata["site"] == "stage_output" and result.metadata["granularity"] == "stage"
    assert [tuple(g) for g in result.metadata["grid_sizes"]] == grids and len(set(grids)) > 1
    if name == "resnet18":  # its last stage is 1 x 1 at 32 px: no pair, SSDC undefined (NaN), said in a warning
        assert grids[-1] == (1, 1) and math.isnan(result.per_layer[-1])
        assert any(
            issubclass(w.category, ConstantMapWarning) and "fewer than 2 tokens: layer(s) 4 (1x1)" in str(w.message)
            for w in caught
        )
    k = len(grids) - (name == "resnet18")  # the stages with a pair of tokens
    np.testing.assert_allclose(result.per_layer[:k], mean_map[:k], atol=1e-5)
    np.testing.assert_allclose([s.mean for s in result.per_image[:k]], per_image[:k], atol=1e-5)
    assert isinstance(result.mean_maps, list)
    assert [m.shape[0] for m in result.mean_maps] == [h * w for h, w in grids]
    assert "grid" in result.table() and "stage" in result.table()
    json.loads(result.to_json(include_maps=True))
    result.plot()


def test_stage_output_of_a_flat_vit_equals_block_output():
    torch.manual_seed(0)
    vit = timm.create_model("vit_tiny_patch16_224", img_size=32, depth=3, num_classes=3).eval()
    images = smooth_images(3, 32)
    stages = probe_ssdc(vit, images, site="stage_output", reduction="both", progress=False)
    blocks = probe_ssdc(vit, images, site="block_output", reduction="both", progress=False)
    np.testing.assert_allclose(stages.per_layer, blocks.per_layer, atol=1e-6)
    assert probe_ssdc(vit, images, progress=False).metadata["site"] == "attn_input"  # auto: the paper's site


def test_stage_rpi_content_grid_only_where_tokens_are_the_patches():
    """Under RPI the index grid is every stage's own; the content grid exists only on the patch grid (stage 0 of
    swin); merged stages mix several patches, so their content SSDC is NaN, never a made-up number."""
    model = tiny_swin()
    result = probe_ssdc(model, smooth_images(2, 32), rpi=True, progress=False)
    assert result.permutation.numel() == 8 * 8
    assert math.isfinite(result.content_per_layer[0]) and all(math.isnan(v) for v in result.content_per_layer[1:])
    assert all(math.isfinite(v) for v in result.per_layer)


def test_rpi_on_a_cnn_is_refused_with_the_reason():
    with pytest.raises(TypeError, match="no `patch_embed`"):
        probe_ssdc(timm.create_model("resnet18", num_classes=3), smooth_images(1, 32), rpi=True, progress=False)


def test_hiera_is_probed_per_stage_and_refused_at_block_sites():
    """hiera has `blocks` and a `patch_embed` but pools between them: a flat probe would mix grids."""
    torch.manual_seed(0)
    hiera = timm.create_model("hiera_tiny_224", img_size=64, num_classes=3).eval()
    with pytest.raises(UnsupportedModelError, match="Hiera.*site='stage_output'"):
        probe_ssdc(hiera, smooth_images(1, 64), site="attn_input", progress=False)
    result = probe_ssdc(hiera, smooth_images(2, 64), progress=False)
    assert result.metadata["grid_sizes"] == [[16, 16], [8, 8], [4, 4], [2, 2]]


def _first_attn_input_ssdc(model, images, module) -> float:
    """Reference: mean-map SSDC of ``module``'s output (the attention input), patch tokens only."""
    out = []
    handle = module.register_forward_hook(lambda m, a, o: out.append(o))
    with torch.no_grad():
        model(images)
    handle.remove()
    z = out[0].double().reshape(len(images), -1, out[0].shape[-1])[:, getattr(model, "num_prefix_tokens", 0) :]
    z = z / z.norm(dim=-1, keepdim=True)
    return _scipy_ssdc((z @ z.transpose(1, 2)).mean(0).numpy())


def test_samvit_windowed_blocks_probed_at_attn_input():
    """samvit with windowed attention was refused ("hierarchical, pooling or token-dropping") at attn_input:
    the attention input is norm1's output, before the window partition, on the full grid."""
    torch.manual_seed(0)
    sam = timm.create_model(
        "samvit_base_patch16_224",
        img_size=64,
        window_size=2,
        global_attn_indexes=(1,),
        depth=2,
        embed_dim=32,
        num_heads=2,
        num_classes=0,
    ).eval()
    images = smooth_images(2, 64)
    result = probe_ssdc(sam, images, progress=False)
    assert result.metadata["grid_size"] == [4, 4]
    assert result.per_layer[0] == pytest.approx(_first_attn_input_ssdc(sam, images, sam.blocks[0].norm1), abs=1e-5)


def test_parallel_blocks_probed_at_attn_input():
    """vit_small_patch16_18x2 (two parallel attentions per block) was refused at attn_input."""
    torch.manual_seed(0)
    vit = timm.create_model(
        "vit_small_patch16_18x2_224", img_size=32, depth=2, embed_dim=32, num_heads=2, num_classes=3
    ).eval()
    images = smooth_images(2, 32)
    result = probe_ssdc(vit, images, progress=False)
    assert len(result.per_layer) == 2
    ref = _first_attn_input_ssdc(vit, images, vit.blocks[1].attns[0].norm)
    assert result.per_layer[1] == pytest.approx(ref, abs=1e-5)


# --------------------------------------------------------------------------------------------
# input size
# --------------------------------------------------------------------------------------------
def test_eval_loader_and_fragility_take_an_input_size():
    data = SyntheticShapes(4, img_size=48, split="validation")
    resnet = timm.create_model("resnet18", num_classes=10).eval()
    images, _ = next(iter(eval_loader(resnet, data, img_size=32, num_workers=0)))
    assert tuple(images.shape[-2:]) == (32, 32)
    result = fragility(resnet, data, ["jpeg:5"], img_size=40, num_workers=0, progress=False)
    assert result.settings["input_size"] == [3, 40, 40]
    vit = timm.create_model("vit_tiny_patch16_224", img_size=64, depth=1, num_classes=10)
    with pytest.raises(ValueError, match="takes only 64x64 images"):
        eval_loader(vit, data, img_size=32)


def test_dynamic_size_vit_runs_at_the_given_size():
    """naflexvit has no fixed grid: without img_size it ran at its config's 384 px."""
    torch.manual_seed(0)
    model = timm.create_model("naflexvit_base_patch16_gap", depth=1, embed_dim=32, num_heads=2, num_classes=10).eval()
    data = SyntheticShapes(2, img_size=48, split="validation")
    images, _ = next(iter(eval_loader(model, data, num_workers=0)))
    assert images.shape[-1] == 384  # its own size by default
    loader = eval_loader(model, data, img_size=32, num_workers=0)
    result = probe_ssdc(model, loader, progress=False)
    assert result.metadata["image_size"] == [32, 32] and result.metadata["grid_size"] == [2, 2]


def test_cli_probe_per_stage_with_input_size(tmp_path, capsys):
    from timm_posgeom.cli import main

    code = main(
        [
            "probe",
            "resnet18",
            "--data",
            "synthetic",
            "--max-images",
            "4",
            "--img-size",
            "32",
            "--batch-size",
            "2",
            "--num-workers",
            "0",
            "--out",
            str(tmp_path),
            "--no-progress",
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "site=stage_output" in out and "stage" in out and "16x16" in out
    data = json.loads((tmp_path / "ssdc.json").read_text())
    assert data["metadata"]["image_size"] == [32, 32] and data["metadata"]["grid_sizes"][0] == [16, 16]


def test_a_grid_too_large_for_a_similarity_map_is_refused_not_oom_killed(monkeypatch):
    """inception_resnet_v2's first map at 299 px is 147 x 147 (233M pairs): the probe was killed for memory."""
    import timm_posgeom.probes.ssdc_probe.accumulator as probe_module

    monkeypatch.setattr(probe_module, "MAX_GRID_TOKENS", 8 * 8)
    model = timm.create_model("resnet18", num_classes=3).eval()
    with pytest.raises(ValueError, match=r"layer 0's grid 16x16 has 256 tokens, more than the 64.*layers="):
        probe_ssdc(model, smooth_images(1, 32), progress=False)
    assert probe_ssdc(model, smooth_images(1, 32), layers=[2, 3], progress=False).metadata["grid_sizes"] == [
        [4, 4],
        [2, 2],
    ]


def test_delta_ssdc_is_not_made_up_across_stages():
    """The paper's delta SSDC compares blocks 0 and 1 on one grid; across stages it is NaN, not a number."""
    result = probe_ssdc(tiny_swin(), smooth_images(2, 32), progress=False)
    assert math.isnan(result.delta) and "delta" not in result.table()
