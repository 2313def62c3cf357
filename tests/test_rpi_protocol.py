"""The permutation protocol: RPI is K seeded permutations, every number their mean with an interval over them,
the images read once; per-image permutations for accuracy; nothing depends on batching (docs/method.md)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import timm
import torch
import torch.nn.functional as F
from scipy.stats import spearmanr
from scipy.stats import t as student_t

import timm_posgeom  # noqa: F401  (registers the models)
from timm_posgeom.data.synthetic import SyntheticShapes
from timm_posgeom.interventions import (
    TokenPermutationError,
    draw_permutations,
    image_permutations,
    permutation_seeds,
    token_permutation,
)
from timm_posgeom.probes import probe_ssdc
from timm_posgeom.robustness import alpha_sweep, fragility


def smooth_images(n: int, size: int = 64, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return F.interpolate(torch.randn(n, 3, 4, 4, generator=gen), size=size, mode="bicubic", align_corners=False)


def visible_ape() -> torch.nn.Module:
    """A micro APE model whose table is loud enough to show through the blocks (a random-init table of std
    0.02 would hide any PE effect)."""
    torch.manual_seed(0)
    model = timm.create_model("posgeom_vit_micro_patch8_64_ape", num_classes=3).eval()
    with torch.no_grad():
        model.pos_embed.normal_(0, 1.0)
    return model


@pytest.fixture(scope="module")
def images():
    return smooth_images(9, seed=2)


def _mean_map_ssdc(model: torch.nn.Module, images: torch.Tensor, seed: int | None) -> list[float]:
    """Reference: SSDC (scipy) of each block's norm1 mean map, under token_permutation(seed) or none."""
    maps = []
    hooks = [b.norm1.register_forward_hook(lambda m, a, out: maps.append(out)) for b in model.blocks]
    try:
        with torch.no_grad():
            if seed is None:
                model(images)
            else:
                with token_permutation(model, seed=seed, per="call"):
                    model(images)
    finally:
        for h in hooks:
            h.remove()
    i, j = np.triu_indices(64, 1)
    r, c = np.divmod(np.arange(64), 8)
    d = -(np.abs(r[i] - r[j]) + np.abs(c[i] - c[j]))
    out = []
    for tokens in maps:
        z = F.normalize(tokens[:, 1:].double(), dim=-1)
        mean = (z @ z.transpose(1, 2)).mean(0).numpy()
        out.append(spearmanr(mean[i, j], d).statistic)
    return out


def test_rpi_is_the_mean_over_k_seeded_permutations_with_their_interval(images):
    model = visible_ape()
    result = probe_ssdc(model, images, rpi=True, seed=4, rpi_permutations=3, batch_size=4, progress=False)
    # each permutation k is token_permutation(seed=4 + k): the reference, one whole forward each
    refs = np.array([_mean_map_ssdc(model, images, 4 + k) for k in range(3)])  # (K, L)
    np.testing.assert_allclose(result.by_permutation, refs, atol=2e-6)
    np.testing.assert_allclose(result.per_layer, refs.mean(0), atol=2e-6)
    half = student_t.ppf(0.975, 2) * refs.std(0, ddof=1) / math.sqrt(3)
    np.testing.assert_allclose(
        np.array(result.per_layer_ci), np.stack([refs.mean(0) - half, refs.mean(0) + half], 1), atol=2e-6
    )
    rises = refs[:, 1] - refs[:, 0]
    assert result.delta == pytest.approx(rises.mean(), abs=2e-6)
    rise_half = student_t.ppf(0.975, 2) * rises.std(ddof=1) / math.sqrt(3)
    assert result.delta_ci == pytest.approx((rises.mean() - rise_half, rises.mean() + rise_half), abs=2e-6)
    assert result.settings["rpi_permutations"] == 3 and result.settings["permutation_seeds"] == [4, 5, 6]
    assert torch.equal(result.permutations, draw_permutations(64, [4, 5, 6]))
    assert torch.equal(result.permutation, result.permutations[0])
    assert rises.std() > 0  # the permutations differ: the interval is not vacuous


def test_the_default_is_ten_permutations_and_one_gives_no_interval(images):
    model = visible_ape()
    ten = probe_ssdc(model, images[:4], rpi=True, progress=False)
    assert ten.settings["rpi_permutations"] == 10 and len(ten.by_permutation) == 10
    one = probe_ssdc(model, images[:4], rpi=True, rpi_permutations=1, progress=False)
    assert all(math.isnan(lo) and math.isnan(hi) for lo, hi in one.per_layer_ci)  # never a zero-width interval
    assert all(math.isnan(v) for v in one.delta_ci) and "one RPI permutation" in one.settings["interval"]
    np.testing.assert_allclose(one.per_layer, ten.by_permutation[0], atol=2e-6)  # permutation 0 alike


def test_a_model_without_pe_is_exactly_equivariant_under_every_permutation(images):
    """Each permutation's SSDC against the content grid is the unpermuted SSDC (to float rounding)."""
    torch.manual_seed(0)
    nope = timm.create_model("posgeom_vit_micro_patch8_64_nope").eval()
    plain = probe_ssdc(nope, images, progress=False)
    rpi = probe_ssdc(nope, images, rpi=True, rpi_permutations=4, progress=False)
    for row in rpi.content_by_permutation:
        np.testing.assert_allclose(row, plain.per_layer, atol=1e-5)
    assert max(abs(v) for v in rpi.per_layer) < 0.2 < min(plain.per_layer)  # and the index grid loses it


@pytest.mark.parametrize("reduction", ["mean_map", "per_image", "both"])
def test_batching_and_stacking_change_no_number(images, reduction):
    """The batch size and how many permutations one forward stacks are neutral (intervals included)."""
    model = visible_ape()
    ref = probe_ssdc(model, images, rpi=True, rpi_permutations=3, batch_size=9, reduction=reduction, progress=False)
    for batch, forward in ((1, None), (3, 3), (4, 8)):
        got = probe_ssdc(
            model,
            images,
            rpi=True,
            rpi_permutations=3,
            batch_size=batch,
            forward_size=forward,
            reduction=reduction,
            progress=False,
        )
        np.testing.assert_allclose(got.per_layer, ref.per_layer, atol=2e-6)
        np.testing.assert_allclose(got.per_layer_ci, ref.per_layer_ci, atol=1e-5)  # float32 sums: rounding
        if reduction != "mean_map":
            np.testing.assert_allclose([s.mean for s in got.per_image], [s.mean for s in ref.per_image], atol=1e-6)
    plain = [probe_ssdc(model, images, batch_size=b, reduction=reduction, progress=False) for b in (1, 4, 9)]
    for other in plain[1:]:  # the jackknife's groups come from each image's index: the same at any batch size
        np.testing.assert_allclose(other.per_layer, plain[0].per_layer, atol=2e-6)
        np.testing.assert_allclose(other.per_layer_ci, plain[0].per_layer_ci, atol=2e-6)


def test_alpha_and_permutations_in_probe_ssdc(images):
    model = visible_ape()
    scaled = probe_ssdc(model, images, rpi=True, rpi_permutations=2, alpha=0.0, progress=False)
    with timm_posgeom.pe_scale(model, 0.0):
        inside = probe_ssdc(model, images, rpi=True, rpi_permutations=2, progress=False)
    np.testing.assert_allclose(scaled.per_layer, inside.per_layer, atol=1e-7)
    assert scaled.settings["alpha"] == 0.0
    with pytest.raises(ValueError, match="alpha must be"):
        probe_ssdc(model, images, alpha=-1.0, progress=False)
    with pytest.raises(ValueError, match="rpi_permutations"):
        probe_ssdc(model, images, rpi=True, rpi_permutations=0, progress=False)


def test_the_alpha_sweep_draws_fresh_permutations_for_every_alpha():
    model = visible_ape()
    data = SyntheticShapes(8, img_size=64, split="validation")
    pairs = [(data[i][0], data[i][1] % 3) for i in range(len(data))]
    sweep = alpha_sweep(
        model,
        pairs,
        [1.0, 0.5, 0.0],
        ["jpeg:5"],
        probe_images=8,
        rpi_permutations=3,
        seed=7,
        batch_size=4,
        num_workers=0,
        progress=False,
    )
    seeds = [r.permutation_seeds for r in sweep.rows]
    assert seeds == [[7, 8, 9], [10, 11, 12], [13, 14, 15]]  # alpha j: seed + jK ...
    for r in sweep.rows:
        low, high = r.delta_ssdc_ci
        assert low <= r.delta_ssdc <= high and high > low
    assert sweep.settings["rpi_permutations"] == 3 and sweep.settings["permutations_per_alpha"] == "fresh"


def test_accuracy_under_rpi_is_per_image_and_does_not_depend_on_the_batch_size():
    model = visible_ape()
    data = SyntheticShapes(11, img_size=64, split="validation")
    pairs = [(data[i][0], data[i][1] % 3) for i in range(len(data))]
    runs = [
        fragility(model, pairs, ["jpeg:5"], rpi=True, seed=2, batch_size=b, num_workers=0, progress=False)
        for b in (1, 4, 11)
    ]
    for other in runs[1:]:
        assert all(np.array_equal(other.correct[k], runs[0].correct[k]) for k in runs[0].correct)
    assert runs[0].settings["rpi_per"] == "image"
    # image i is permuted by image_permutations(N, seed, [i]) (N = 64): one forward per image reproduces it
    expected = []
    with torch.no_grad(), token_permutation(model, per="given") as handle:
        for i, (image, label) in enumerate(pairs):
            handle.give(image_permutations(64, 2, [i]))
            x = timm_posgeom.eval_transform(model)(image)[None]
            expected.append(int(model(x).argmax()) == label)
    assert list(runs[0].correct["clean"]) == expected


def test_image_permutations_depend_on_seed_and_index_only():
    a = image_permutations(16, 5, [0, 1, 2, 3])
    b = torch.cat([image_permutations(16, 5, [2, 3]), image_permutations(16, 5, [0, 1])])
    assert torch.equal(a, b[[2, 3, 0, 1]])
    assert not torch.equal(a, image_permutations(16, 6, [0, 1, 2, 3]))
    assert len({tuple(p.tolist()) for p in a}) == 4
    assert all(sorted(p.tolist()) == list(range(16)) for p in a)
    assert permutation_seeds(3, 4, start=8) == [11, 12, 13, 14]


def test_a_given_permutation_must_be_given_and_fit():
    model = visible_ape()
    x = smooth_images(2)
    with token_permutation(model, per="given") as handle:
        with pytest.raises(TokenPermutationError, match="before give"):
            model(x)
        handle.give(torch.arange(10))
        with pytest.raises(ValueError, match="64 tokens"):
            model(x)
        handle.give(torch.stack([torch.arange(64), torch.arange(64).flip(0)]))  # one per image
        with torch.no_grad():
            both = model(x)
            handle.give(torch.arange(64).flip(0))
            second = model(x[1:])
    torch.testing.assert_close(both[1:], second, atol=1e-5, rtol=0)
