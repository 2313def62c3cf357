"""The intervals of the probes' numbers: Student t over replicates, the delete-a-group jackknife over images
(docs/method.md#intervals), checked against their formulas, a brute-force reference and by coverage."""

from __future__ import annotations

import math

import numpy as np
import pytest
import timm
import torch
import torch.nn.functional as F
from scipy.stats import spearmanr
from scipy.stats import t as student_t

import timm_posgeom  # noqa: F401
from timm_posgeom.probes import probe_ssdc
from timm_posgeom.results.intervals import image_groups, jackknife_interval, t_interval, t_quantile


def test_t_interval_is_students_and_needs_two_finite_replicates():
    values = np.array([[1.0, 2.0], [3.0, np.nan], [5.0, 4.0]])
    mean, low, high = t_interval(values)
    half = student_t.ppf(0.975, 2) * 2.0 / math.sqrt(3)
    assert mean[0] == 3.0 and low[0] == pytest.approx(3 - half) and high[0] == pytest.approx(3 + half)
    half2 = student_t.ppf(0.975, 1) * np.std([2.0, 4.0], ddof=1) / math.sqrt(2)
    assert mean[1] == 3.0 and (low[1], high[1]) == pytest.approx((3 - half2, 3 + half2))  # NaN left out
    mean, low, high = t_interval([[0.5]])
    assert mean[0] == 0.5 and math.isnan(low[0]) and math.isnan(high[0])  # one replicate: no interval


@pytest.mark.parametrize("level", [0.9, 0.95, 0.99])
def test_t_quantile_is_scipy_stats(level):
    """From scipy.special (a lighter import than scipy.stats): the same quantile, to the last digits."""
    for df in (1, 2, 3, 9, 19, 99, 10_000):
        assert t_quantile(df, level) == pytest.approx(student_t.ppf(0.5 + level / 2, df), rel=1e-12, abs=0)
    assert math.isnan(t_quantile(0))


def test_jackknife_of_a_mean_with_equal_groups_is_the_usual_formula():
    rng = np.random.default_rng(0)
    x = rng.normal(size=60)
    groups = np.repeat(np.arange(6), 10)
    deleted = np.array([x[groups != g].mean() for g in range(6)])
    low, high = jackknife_interval(x.mean(), deleted, [10] * 6)
    var = 5 / 6 * ((deleted - deleted.mean()) ** 2).sum()
    half = student_t.ppf(0.975, 5) * math.sqrt(var)
    assert (low, high) == pytest.approx((x.mean() - half, x.mean() + half))
    # for the mean, the delete-a-group jackknife with equal groups is the t interval of the group means
    group_means = np.array([x[groups == g].mean() for g in range(6)])
    _, tl, th = t_interval(group_means)
    assert (low, high) == pytest.approx((float(tl), float(th)))


@pytest.mark.parametrize("statistic", ["mean", "ratio"])
def test_jackknife_covers_the_truth_95_percent_of_the_time(statistic):
    rng = np.random.default_rng(1)
    groups = image_groups(np.arange(300), 3, 20)  # unequal random groups, as the probe makes them
    sizes = np.bincount(groups, minlength=20)
    covered = 0
    for _ in range(1000):
        x = rng.exponential(size=300)
        y = rng.exponential(size=300) + 1.0

        def stat(keep, x=x, y=y):
            return x[keep].mean() if statistic == "mean" else x[keep].mean() / y[keep].mean()

        full = stat(np.ones(300, bool))
        deleted = [stat(groups != g) for g in range(20)]
        low, high = jackknife_interval(full, deleted, sizes)
        covered += low <= (1.0 if statistic == "mean" else 0.5) <= high
    assert 0.92 <= covered / 1000 <= 0.975


def test_image_groups_come_from_the_index_alone():
    a = image_groups(np.arange(100), 0, 20)
    assert np.array_equal(a[40:60], image_groups(np.arange(40, 60), 0, 20))
    assert not np.array_equal(a, image_groups(np.arange(100), 1, 20))
    assert a.min() >= 0 and a.max() < 20 and len(set(a.tolist())) == 20


@pytest.mark.parametrize(
    "defer_bytes,n", [(None, 45), (0, 45), (None, 6)], ids=["per-image-maps", "one-gemm-per-group", "empty-groups"]
)
def test_the_probes_interval_is_the_jackknife_of_the_mean_maps_ssdc(monkeypatch, defer_bytes, n):
    """probe_ssdc's interval without RPI against a brute-force jackknife: each group of images left out of the
    mean map, its SSDC by scipy. Both ways of summing the groups: a batch's per-image maps (small maps), and one
    GEMM per group (maps whose batch exceeds _DEFER_BYTES)."""
    from timm_posgeom.probes.ssdc_probe import accumulator

    if defer_bytes is not None:
        monkeypatch.setattr(accumulator, "_DEFER_BYTES", defer_bytes)
    torch.manual_seed(0)
    model = timm.create_model("posgeom_vit_micro_patch8_64_nope").eval()
    gen = torch.Generator().manual_seed(1)
    images = F.interpolate(torch.randn(n, 3, 4, 4, generator=gen), size=64, mode="bicubic", align_corners=False)
    result = probe_ssdc(model, images, batch_size=10, seed=3, progress=False, layers=[0, 1])
    maps = []
    hooks = [model.blocks[k].norm1.register_forward_hook(lambda m, a, out: maps.append(out)) for k in (0, 1)]
    with torch.no_grad():  # in the probe's batches of 10, so that float32 sums in the same order
        for batch in images.split(10):
            model(batch)
    for h in hooks:
        h.remove()
    maps = [torch.cat(maps[k::2]) for k in (0, 1)]  # (n, 65, D) per layer
    i, j = np.triu_indices(64, 1)
    r, c = np.divmod(np.arange(64), 8)
    d = -(np.abs(r[i] - r[j]) + np.abs(c[i] - c[j]))
    groups = image_groups(np.arange(n), 3, 20)
    sizes = np.bincount(groups, minlength=20)
    for k, tokens in enumerate(maps):
        z = F.normalize(tokens[:, 1:].double(), dim=-1)
        sims = (z @ z.transpose(1, 2)).numpy()[:, i, j]  # (n, M)
        full = spearmanr(sims.mean(0), d).statistic
        deleted = [spearmanr(sims[groups != g].mean(0), d).statistic if sizes[g] else np.nan for g in range(20)]
        low, high = jackknife_interval(full, np.nan_to_num(deleted), sizes)
        assert result.per_layer[k] == pytest.approx(full, abs=1e-6)
        # 1e-5: a jackknife bound is the value plus (G - 1) times a deviation, so it carries float32's rounding of
        # the maps 19-fold (1.3e-6 off on the floors' torch 2.6); a wrong group or weight moves it by 1e-2
        assert result.per_layer_ci[k] == pytest.approx((low, high), abs=1e-5)
        assert low < full < high
    value, low, high = result.interval_of(lambda v: v[1] - v[0])
    assert value == pytest.approx(result.rise) and (low, high) == pytest.approx(result.rise_ci)
    assert "jackknife" in result.settings["interval"] and result.settings["jackknife_groups"] == 20


@pytest.mark.parametrize("fits", [0, 2.5])
def test_group_sums_over_the_memory_budget_give_the_same_numbers_and_a_nan_interval(monkeypatch, fits):
    """A mean map whose jackknife group sums exceed MAX_GROUP_BYTES (a 112 x 112 map's take 12.6 GB) keeps its
    SSDC (to float32 rounding: a batch's map is summed in one GEMM instead of one per group) and gives its interval up: NaN and a warning, never an out-of-memory kill. ``fits`` layers'
    sums fit: 2.5, the groups are summed into one when the third layer comes (what was held is merged)."""
    from timm_posgeom.errors import IntervalWarning
    from timm_posgeom.probes.ssdc_probe import accumulator

    torch.manual_seed(0)
    model = timm.create_model("posgeom_vit_micro_patch8_64_ape").eval()
    images = torch.randn(24, 3, 64, 64, generator=torch.Generator().manual_seed(2))
    kept = probe_ssdc(model, images, batch_size=8, seed=3, progress=False)
    per_layer_bytes = 20 * (64 * 63 // 2 + 64) * 8
    monkeypatch.setattr(accumulator, "MAX_GROUP_BYTES", int(fits * per_layer_bytes))
    with pytest.warns(IntervalWarning, match="no interval over images: the 20 jackknife group sums"):
        dropped = probe_ssdc(model, images, batch_size=8, seed=3, progress=False)
    assert dropped.per_layer == pytest.approx(kept.per_layer, abs=1e-5)
    assert all(math.isfinite(lo) for lo, _ in kept.per_layer_ci)
    assert all(math.isnan(lo) and math.isnan(hi) for lo, hi in dropped.per_layer_ci)
    assert math.isnan(dropped.rise_ci[0]) and dropped.settings["jackknife_groups"] is None
    assert dropped.settings["interval"].startswith("none (the 20 jackknife group sums")
