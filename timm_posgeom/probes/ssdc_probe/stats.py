"""The numbers of a :func:`~timm_posgeom.probes.probe_ssdc` call, from its (reduced) running sums.

Per probed layer: the SSDC of the mean similarity map under each replica (each RPI permutation, against the
index grid and the content grid; without RPI one replica and the delete-a-group jackknife's replicates), the
per-image statistics, their 95% intervals (over permutations under RPI, over images without), the layers
left NaN (too small a grid, a near-constant mean map, non-finite tokens), and the :class:`SSDCResult` that
holds them. The running sums are :mod:`.accumulator`'s; the formula :mod:`.spearman`'s. Definitions:
docs/method.md#similarity-maps-and-probe-sites and docs/method.md#intervals.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn as nn

from ...errors import NonFiniteWarning, nonfinite_message
from ...results.intervals import jackknife_interval, t_interval
from ..sites import ProbeSites, StageSites
from ..streaming import model_name
from .accumulator import Accumulator, Moments
from .result import PerImageStats, SSDCResult
from .spearman import FLAT_RTOL, ConstantMapWarning, ssdc_pairs


@dataclass(frozen=True)
class Probe:
    """What one :func:`probe_ssdc` call measures, checked: the site, the model's probe sites (blocks or
    stages), the layer indices, the reduction, the distance, RPI and its permutation count."""

    site: str
    sites: ProbeSites | StageSites
    layers: list[int]
    reduction: str
    distance: str
    rpi: bool
    permutations: int = 1
    forward_size: int | None = None

    @property
    def staged(self) -> bool:
        return self.site == "stage_output"

    @property
    def num_prefix_tokens(self) -> int:
        """The tokens before the patch tokens of a block (a stage's feature map has none)."""
        return self.sites.num_prefix_tokens if isinstance(self.sites, ProbeSites) else 0


# Per layer, the per-image statistics against the index grid and (RPI; else empty) the content grid; under RPI
# also the (K, L) arrays of each permutation's image means (index grid, content grid), else None.
_ImageStats = tuple[list[PerImageStats], list[PerImageStats], np.ndarray | None, np.ndarray | None]


def _near_constant(pairs: torch.Tensor) -> bool:
    """The summed (or mean) similarities of the pairs i < j (M,) are equal up to float rounding, as
    :data:`~.spearman.FLAT_RTOL` defines it for every map (NaN: False)."""
    if pairs.numel() == 0 or not torch.isfinite(pairs).all():
        return False
    low, high = float(pairs.min()), float(pairs.max())
    return high - low <= FLAT_RTOL * max(abs(low), abs(high))


def finish(
    acc: Accumulator, probe: Probe, seed: int, n_images: int, image_size: tuple[int, int], model: nn.Module
) -> SSDCResult:
    """The result from the (reduced) sums: per-layer SSDC of the mean maps and / or the per-image statistics,
    each with its interval (over permutations under RPI, over images without)."""
    layers = probe.layers
    grids = [acc.grids[layer] for layer in layers]
    if acc.too_small:
        names = ", ".join(f"{layer} ({'x'.join(map(str, acc.grids[layer]))})" for layer in sorted(acc.too_small))
        warnings.warn(
            f"SSDC is undefined (NaN) where the grid has fewer than 2 tokens: layer(s) {names}; use larger images",
            ConstantMapWarning,
            stacklevel=3,
        )
    maps = (
        _map_ssdc(acc, probe, n_images, grids) if acc.want_map else _MapStats(layers, np.full((1, len(layers)), np.nan))
    )  # filled by the per-image reduction
    stats = _image_stats(acc, probe) if acc.want_images else None
    if stats is not None:
        _say_flat_images(stats, layers)
    bad, count = acc.nonfinite_layers()
    if bad:  # non-finite tokens: those layers' numbers NaN, said once
        _blank_layers(maps, stats, [layers.index(layer) for layer in bad], probe)
        warnings.warn(
            nonfinite_message(
                f"the tokens of layer(s) {', '.join(map(str, bad))}", count, n_images, "their SSDC is NaN"
            ),
            NonFiniteWarning,
            stacklevel=3,
        )
    if not acc.want_map and stats is not None:  # the per-image reduction alone: its means are the numbers
        _per_image_numbers(maps, stats, probe)
    n_tokens = grids[0][0] * grids[0][1] if grids else 0
    perms = acc.permutations.get(n_tokens) if probe.rpi else None
    return SSDCResult(
        per_layer=_mean_rows(maps.index),
        layers=list(layers),
        per_image=stats[0] if stats else None,
        content_per_layer=_mean_rows(maps.content) if maps.content is not None else None,  # under RPI
        content_per_image=stats[1] if stats and probe.rpi else None,
        mean_maps=maps.mean_maps,
        permutation=perms[0].clone() if perms is not None else None,
        settings=_recorded(acc, probe, maps, seed, n_images, image_size, model),
        per_layer_ci=maps.index_ci,
        content_per_layer_ci=maps.content_ci if probe.rpi else None,
        by_permutation=maps.index.tolist() if probe.rpi else None,
        content_by_permutation=maps.content.tolist() if probe.rpi and maps.content is not None else None,
        permutations=perms.clone() if perms is not None else None,
        rise_ci=maps.rise_ci,
        jackknife=maps.jackknife,
    )


def _say_flat_images(stats: _ImageStats, layers: list[int]) -> None:
    """A warning naming the layers some of whose per-image maps are constant up to float rounding (or not finite):
    their SSDC is NaN, left out of the per-image statistics, which are NaN where every map is."""
    flat = [(layer, s.n_nan, s.n + s.n_nan) for layer, s in zip(layers, stats[0]) if s.n_nan]
    if flat:
        warnings.warn(
            "per-image similarity maps constant up to float rounding (or not finite), their SSDC NaN and left out "
            "of the per-image statistics: " + ", ".join(f"layer {layer}: {k} of {n}" for layer, k, n in flat),
            ConstantMapWarning,
            stacklevel=4,
        )


def _per_image_numbers(maps: _MapStats, stats: _ImageStats, probe: Probe) -> None:
    """The per-image reduction alone: its means (and intervals) become the layers' numbers in ``maps``."""
    per_index, _, index_means, content_means = stats
    maps.index = index_means if index_means is not None else np.array([[s.mean for s in per_index]])
    maps.content = content_means  # None without RPI
    maps.index_ci = [(s.ci_low, s.ci_high) for s in stats[0]]
    maps.content_ci = [(s.ci_low, s.ci_high) for s in stats[1]] if probe.rpi else None
    maps.interval = stats[0][0].over if stats[0] else "none"
    cols = _rise_columns(probe)
    if probe.rpi and cols is not None:  # each permutation's rise of its image means
        _, low, high = t_interval(maps.index[:, cols[1]] - maps.index[:, cols[0]])
        maps.rise_ci = (float(low), float(high))


def _recorded(
    acc: Accumulator,
    probe: Probe,
    maps: _MapStats,
    seed: int,
    n_images: int,
    image_size: tuple[int, int],
    model: nn.Module,
) -> dict[str, Any]:
    """The result's ``settings``: what was measured, how, on what."""
    staged = probe.staged
    grids = [acc.grids[layer] for layer in probe.layers]
    settings = {
        "model": model_name(model),
        "site": probe.site,
        "reduction": probe.reduction,
        "rpi": probe.rpi,
        "seed": seed,
        "rpi_permutations": acc.num_replicas if probe.rpi else None,
        "permutation_seeds": list(acc.permutation_seeds) if acc.permutation_seeds is not None else None,
        "jackknife_groups": acc.groups or None,
        "interval": maps.interval,
        "distance": probe.distance,
        "n_images": n_images,
        "image_size": list(image_size),
        "grid_size": list(grids[0]),
        "grid_sizes": [list(g) for g in grids],
        "num_prefix_tokens": probe.num_prefix_tokens,
        "family": probe.sites.family,
        "granularity": "stage" if staged else "block",
        # layers whose mean map is constant up to float rounding (their SSDC NaN, with a ConstantMapWarning)
        "constant_layers": maps.flat,
    }
    if isinstance(probe.sites, StageSites):
        settings["modules"] = [probe.sites.names[layer] for layer in probe.layers]
    return settings


def _blank_layers(maps: _MapStats, stats: _ImageStats | None, cols: list[int], probe: Probe) -> None:
    """Set the numbers of the layers at ``cols`` (and a rise that uses one) to NaN, with their intervals."""
    nan2 = (math.nan, math.nan)
    for values in (maps.index, maps.content, *(stats[2:] if stats else ())):
        if values is not None:
            values[:, cols] = math.nan
    for cis in (maps.index_ci, maps.content_ci):
        if cis is not None:
            for i in cols:
                cis[i] = nan2
    rise = _rise_columns(probe)
    if rise is not None and set(rise) & set(cols):
        maps.rise_ci = nan2
    for per in stats[:2] if stats else ():
        for i in cols if per else ():
            per[i] = PerImageStats(math.nan, math.nan, math.nan, math.nan, per[i].n, per[i].n_nan, per[i].over)


def _mean_rows(values: np.ndarray) -> list[float]:
    """The mean over replicates (rows) of each column, NaN left out (NaN where a column has none)."""
    return [float(v) for v in t_interval(values, axis=0)[0]]


@dataclass
class _MapStats:
    """The mean-map numbers of a call: per replicate (permutation) and layer, with their intervals."""

    layers: list[int]
    index: np.ndarray  # (K, L) SSDC against the index grid per permutation (K = 1 without RPI)
    content: np.ndarray | None = None  # (K, L) against the content grid (RPI)
    index_ci: list[tuple[float, float]] | None = None
    content_ci: list[tuple[float, float]] | None = None
    rise_ci: tuple[float, float] | None = None
    jackknife: dict[str, Any] | None = None
    interval: str = "none"
    mean_maps: Any = None
    flat: list[int] = field(default_factory=list)


def _map_ssdc(acc: Accumulator, probe: Probe, n_images: int, grids: list[tuple[int, int]]) -> _MapStats:
    """SSDC of each layer's mean map under each replica (permutation), against the index grid and (RPI) the
    content grid, their intervals (over permutations; without RPI the jackknife over images), the mean maps
    (the first permutation's under RPI), and the layers whose mean map is constant up to float rounding (NaN,
    with a ConstantMapWarning)."""
    layers, k = probe.layers, acc.num_replicas
    stats = _MapStats(
        layers,
        index=np.full((k, len(layers)), np.nan),
        content=np.full((k, len(layers)), np.nan) if probe.rpi else None,
    )
    deleted = np.full((acc.groups, len(layers)), np.nan) if acc.groups else None
    # only the groups that hold images are left out and ranked (an empty one's row stays NaN, and the jackknife
    # ignores it): a probe of 4 images ranked 20 maps a layer where 4 mattered
    filled = torch.nonzero(acc.group_counts > 0).squeeze(1)
    every_group = bool(filled.numel() == acc.groups)
    # each filled group's images left out: the image count the jackknife's replicate divides by, (G, 1)
    left_in = (n_images - acc.group_counts[filled].to(torch.float64)).clamp(min=1)[:, None]
    rows_of = k + (filled.numel() if deleted is not None else 0)  # ranked rows of a layer: K maps + G left out
    summed: dict[int, torch.Tensor] = {}  # layer -> (K, M) summed maps
    by_grid: dict[tuple[int, int], list[tuple[int, int]]] = {}  # grid -> [(column, layer)]
    for i, (layer, grid) in enumerate(zip(layers, grids)):
        if layer in acc.too_small:
            continue
        pairs = summed[layer] = acc.replica_pairs(layer)
        if any(_near_constant(row) for row in pairs):
            stats.flat.append(layer)
            continue
        by_grid.setdefault(grid, []).append((i, layer))
    for grid, items in by_grid.items():
        # a grid's maps ranked as float32 (values in [-1, 1], rounding 6e-8; a swap of two tied-close ranks moves
        # SSDC by ~1e-12): one sort with its payload, 4x faster than float64 (spearman.py), all rows at once,
        # each written as float32 straight from its float64 sums (no float64 copies stacked, then cast)
        first = summed[items[0][1]]
        denominators, kept = left_in.to(first.device), filled.to(first.device)
        ranked = torch.empty(len(items) * rows_of, first.shape[1], dtype=torch.float32, device=first.device)
        for j, (_, layer) in enumerate(items):
            block = ranked[j * rows_of : (j + 1) * rows_of]
            torch.div(summed[layer], n_images, out=block[:k])
            if deleted is not None:  # each group's images left out: the jackknife's replicates
                groups = acc.map_sum[layer][0] if every_group else acc.map_sum[layer][0][kept]
                torch.div(summed[layer][0][None] - groups, denominators, out=block[k:])
        (rho,) = ssdc_pairs(ranked, acc.distance_targets(grid, 0, first.device)[:1])
        by_layer = rho.cpu().numpy().reshape(len(items), -1)  # (layers of this grid, K + G)
        for (i, _), values in zip(items, by_layer):
            stats.index[:, i] = values[:k]
            if deleted is not None:
                deleted[filled.numpy(), i] = values[k:]
        if stats.content is not None and acc.content_defined(grid):  # under RPI
            for r in range(k):  # against where each token's content came from: permutation r's own grid
                (rho,) = ssdc_pairs(ranked[r::rows_of].contiguous(), acc.distance_targets(grid, r, first.device)[1:])
                stats.content[r, [i for i, _ in items]] = rho.cpu().numpy()
    _say_flat(stats, summed)
    _intervals(stats, acc, probe, deleted)
    maps = [acc.mean_map(layer, n_images, pair_sum=summed.get(layer)) for layer in layers]  # (N_l, N_l) each
    same = len({m.shape for m in maps}) == 1
    stats.mean_maps = torch.stack(maps).cpu() if same else [m.cpu() for m in maps]
    return stats


def _say_flat(stats: _MapStats, summed: dict[int, torch.Tensor]) -> None:
    """The layers whose mean map is constant up to float rounding, in ``stats.flat`` (those found before ranking,
    and any whose finite map ranked NaN once divided into float32, a hair's breadth from the bound), said once."""
    for i, layer in enumerate(stats.layers):
        finite = layer in summed and bool(torch.isfinite(summed[layer]).all())
        if finite and layer not in stats.flat and np.isnan(stats.index[:, i]).any():
            stats.flat.append(layer)
    stats.flat.sort()
    if stats.flat:
        warnings.warn(
            f"the mean similarity map of layer(s) {', '.join(map(str, stats.flat))} is constant up to float "
            "rounding (every patch token alike): its SSDC is undefined (NaN)",
            ConstantMapWarning,
            stacklevel=5,
        )


def _intervals(stats: _MapStats, acc: Accumulator, probe: Probe, deleted: np.ndarray | None) -> None:
    """Fill the intervals of ``stats``: over permutations under RPI (NaN with one), else the jackknife's."""
    rise_col = _rise_columns(probe)
    if probe.rpi:
        _, lo, hi = t_interval(stats.index, axis=0)
        stats.index_ci = list(zip(lo.tolist(), hi.tolist()))
        if stats.content is not None:
            _, lo, hi = t_interval(stats.content, axis=0)
            stats.content_ci = list(zip(lo.tolist(), hi.tolist()))
        if rise_col is not None:
            _, lo, hi = t_interval(stats.index[:, rise_col[1]] - stats.index[:, rise_col[0]])
            stats.rise_ci = (float(lo), float(hi))
        stats.interval = (
            f"over {acc.num_replicas} RPI permutations (Student t, {acc.num_replicas - 1} df)"
            if acc.num_replicas >= 2
            else "none (one RPI permutation)"
        )
        return
    if deleted is None:
        if acc.dropped_groups:  # NaN, as with one RPI permutation: a number without its spread is not given one
            stats.index_ci = [(math.nan, math.nan)] * len(stats.layers)
            stats.rise_ci = (math.nan, math.nan) if rise_col is not None else None
            stats.interval = f"none ({acc.dropped_groups})"
        return
    sizes = acc.group_counts.numpy()
    stats.jackknife = {"deleted": deleted.tolist(), "sizes": sizes.tolist()}
    lo, hi = jackknife_interval(stats.index[0], deleted, sizes)
    stats.index_ci = list(zip(lo.tolist(), hi.tolist()))
    if rise_col is not None:
        full = stats.index[0, rise_col[1]] - stats.index[0, rise_col[0]]
        lo, hi = jackknife_interval(full, deleted[:, rise_col[1]] - deleted[:, rise_col[0]], sizes)
        stats.rise_ci = (float(lo), float(hi))
    stats.interval = f"over images (delete-a-group jackknife, {int((sizes > 0).sum())} random groups, Student t)"


def _rise_columns(probe: Probe) -> tuple[int, int] | None:
    """(column of layer 0, column of layer 1) when both blocks were probed (None per stage: other grids)."""
    if probe.staged or 0 not in probe.layers or 1 not in probe.layers:
        return None
    return probe.layers.index(0), probe.layers.index(1)


def _image_stats(acc: Accumulator, probe: Probe) -> _ImageStats:
    """Per layer, the per-image SSDC's statistics (index grid, content grid): without RPI over the images;
    under RPI the mean over permutations of each permutation's image mean, its interval over permutations,
    and the std over every (image, permutation). Also (K, L) arrays of the per-permutation image means."""
    layers, k = probe.layers, acc.num_replicas
    if not probe.rpi:
        return [acc.index_moments[(layer, 0)].stats() for layer in layers], [], None, None
    out = []
    arrays = []
    for moments in (acc.index_moments, acc.content_moments):
        per = [[moments[(layer, r)].stats() for layer in layers] for r in range(k)]  # (K, L)
        means = np.array([[s.mean for s in row] for row in per], dtype=float)
        mean, lo, hi = t_interval(means, axis=0)
        stats = []
        for i, layer in enumerate(layers):
            pooled = Moments()
            for r in range(k):
                pooled.merge(moments[(layer, r)].state())
            whole = pooled.stats()
            stats.append(
                PerImageStats(
                    mean=float(mean[i]),
                    std=whole.std,
                    ci_low=float(lo[i]),
                    ci_high=float(hi[i]),
                    n=per[0][i].n,
                    n_nan=pooled.n_nan,
                    over=f"{k} RPI permutations" if k >= 2 else "none (one RPI permutation)",
                )
            )
        out.append(stats)
        arrays.append(means)
    return out[0], out[1], arrays[0], arrays[1]
