"""``probe_ssdc``: SSDC of any timm model, block by block (flat ViTs) or stage by stage, over a whole dataset.

Per batch and probed layer: patch tokens (B, N, C) -> unit-normalised -> cosine maps (B, N, N).
Only running sums are kept (the summed map per layer, and streaming per-image moments,
:mod:`.accumulator`), so memory does not grow with the number of images. The SSDC formula lives in
:mod:`.spearman`; this module is the edge: hooks, devices, the reduction across processes (the data and its
shards: :mod:`.streaming`). Definitions: docs/method.md#similarity-maps-and-probe-sites.

Under RPI every image is read (decoded, resized) once and goes through the model under each of the K
permutations of the protocol (:mod:`~timm_posgeom.interventions.draws`); a forward pass stacks several of
them (``forward_size``) as chunks of one batch. Each permutation keeps its own sums, and the result is their
mean with a Student t interval over permutations. Without RPI the summed map is kept per random group of
images, and the SSDC of the mean map gets the interval of a delete-a-group jackknife over images
(:mod:`~timm_posgeom.intervals`).
"""
from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn as nn

from .. import distributed as _dist
from ..errors import NonFiniteWarning, nonfinite_message
from ..intervals import jackknife_interval, t_interval
from ..interventions import (
    TokenPermutationError,
    check_unpermuted,
    eval_mode,
    find_embed_module,
    pe_scale,
    permutation_seeds,
    token_permutation,
)
from ..measuring import DISTRIBUTED_MODES, MeasureSettings
from ..protocol import JACKKNIFE_GROUPS, rpi_count
from .accumulator import MAX_GRID_TOKENS, _Accumulator, _Moments
from .result import PerImageStats, SSDCResult
from .sites import ProbeSites, StageSites, find_sites, find_stages, resolve_site
from .spearman import DISTANCES, ConstantMapWarning, ssdc_pairs
from .streaming import (  # noqa: F401  (_batches, _Shard and the others: their old home, still importable)
    FORWARD_IMAGES,
    Stream,
    _batches,
    _check_images,
    _data_signature,
    _images_of,
    _model_name,
    _placement,
    _resolve_layers,
    _Shard,
    _StopForward,
    open_stream,
)

__all__ = ["probe_ssdc", "REDUCTIONS", "DISTRIBUTED_MODES", "MAX_GRID_TOKENS"]

REDUCTIONS = ("mean_map", "per_image", "both")


@dataclass(frozen=True)
class _Probe:
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


def probe_ssdc(
        model: nn.Module,
        data: Any,
        *,
        site: str = "auto",
        rpi: bool = False,
        reduction: str = "mean_map",
        distance: str = "manhattan",
        layers: Sequence[int] | None = None,
        settings: MeasureSettings | None = None,
        **options: Any,
) -> SSDCResult:
    """SSDC of every (or the chosen) block or stage of a timm model, streamed over ``data``.

    For each probed layer, the patch tokens at ``site`` (prefix tokens dropped) are unit-normalised
    and their cosine-similarity map S (N x N) formed per image; SSDC = Spearman({S_ij}, {-D_ij}) over
    i < j with D the distance on that layer's grid (see :func:`~timm_posgeom.probes.spearman.ssdc`).

    Args:
        model: a timm model: a flat ViT (see :mod:`.sites` for the families), or a hierarchical ViT,
            MLP model or CNN (probed per stage). Put in eval mode for the probe; its mode (and device,
            when ``device`` moves it) is restored afterwards.
        data: a tensor batch (B, C, H, W) (split into chunks of ``batch_size``), or any iterable of
            batches: tensors, (images, labels) tuples, or dicts with "image"/"pixel_values" (e.g. a
            DataLoader). Images must already be transformed for the model, at the size to probe
            (:func:`~timm_posgeom.eval_data.eval_loader` with ``img_size``).
        site: ``auto`` (default: ``attn_input`` for a flat ViT, ``stage_output`` otherwise),
            ``attn_input`` (the paper's: the input of each block's attention, i.e. norm1's output),
            ``block_output`` (the residual stream) or ``stage_output`` (each feature map of timm's
            ``forward_intermediates``, on its own grid: ``settings["grid_sizes"]``).
        rpi: random permutation at inference: the patch-token contents are permuted after the patch
            embedding and before any PE, under each of ``rpi_permutations`` shared permutations
            (permutation k from the seed ``seed + k``, the same for every image), and every number is
            the mean over them, with a 95% interval over them (Student t). ``per_layer`` is then SSDC
            against the index grid (the paper's) and ``content_per_layer`` against the content grid (NaN
            for a stage whose grid is not the patch grid: its tokens mix several patches). Refused for
            models without a patch embedding.
        settings: a :class:`~timm_posgeom.measuring.MeasureSettings`: ``max_images``, ``batch_size``,
            ``seed``, ``rpi_permutations``, ``device``, ``progress`` and ``distributed`` below (``resize``, ``img_size`` and
            ``num_workers`` are the loader's: ``data`` is already transformed). Each of those fields may
            also be given as a keyword (``batch_size=8``), which overrides ``settings``.
        reduction: ``mean_map`` (the paper's: SSDC of the similarity map averaged over all images),
            ``per_image`` (mean, std and 95% CI of the per-image SSDC) or ``both``.
        distance: ``manhattan`` (the paper's), ``euclidean`` or ``chebyshev``.
        layers: block (or stage) indices to probe (negative allowed); default all.

    Without RPI, the SSDC of the mean map gets a 95% interval over images: a delete-a-group jackknife over
    20 random groups of images (image i's group from (``seed``, i)), Student t on 19 degrees of freedom
    (docs/method.md#intervals). The per-image reduction's interval is Student t over images (over the
    permutations under RPI).

    Keyword Args:
        seed (int | None): seed of the RPI permutations (permutation k: ``seed + k``) and of the jackknife's
            groups (None: one drawn from torch's global RNG; with several processes, drawn on the main
            process and shared; recorded in ``settings["seed"]``).
        rpi_permutations (int | None): the K permutations under RPI (default 10,
            :data:`~timm_posgeom.protocol.RPI_PERMUTATIONS`); each image is read once and forwarded K
            times. K = 1 gives no interval (NaN), never one of zero width.
        alpha (float | None): scale the positional encoding by alpha for the probe (:func:`~timm_posgeom.pe_scale`,
            the class row included); None: as it is.
        forward_size (int | None): at most this many images per forward pass: under RPI, the permutations of
            a batch are stacked up to it (default 512 images, at least one batch).
        max_images (int | None): stop after this many images (with several processes: this many in all).
        device (str | torch.device | None): run there (the model is moved for the probe and moved back); default the model's.
        progress (bool): show a tqdm bar (on the main process only, when several share the probe).
        batch_size (int): chunk size when ``data`` is one tensor.
        distributed (str): how several processes (``accelerate launch``, ``torchrun``: see
            :mod:`timm_posgeom.distributed`) share the probe. ``auto`` (default): alone, nothing
            changes; launched as W > 1 processes, each takes global batches r, r + W, ... (the
            batches one process would read: chunks of ``batch_size`` of a tensor, or the data's own
            batches), cut at the global ``max_images``. A DataLoader over a map-style dataset read in
            order (:func:`~timm_posgeom.eval_data.eval_loader`'s) is re-batched so that each process
            loads only its own images; any other iterable is read whole by every process, which
            forwards only its own batches: it must yield the same batches in the same order
            everywhere (a shuffling DataLoader without a seeded generator is refused). ``presharded``:
            ``data`` is already this process's own shard (``max_images`` refused). ``off``: this
            process probes all of ``data`` alone. Shared (``auto``, ``presharded``): the image count is
            summed (exact), the float64 summed maps are summed across processes (equal to one
            process's up to the order of float64 additions) and the per-image moments merged with
            Chan's formula in process order; the RPI permutation is the same everywhere (drawn from
            ``seed``). Every process returns the same result, the one a single process gets.

    Returns:
        An :class:`SSDCResult`.
    """
    settings, own = MeasureSettings.resolve("probe_ssdc", settings, options, {"forward_size": None, "alpha": None})
    probe = _check_probe(model, site, rpi, reduction, distance, layers, settings.rpi_permutations,
                         own["forward_size"])
    alpha = own["alpha"]
    _check_alpha(alpha)
    stream = open_stream(model, data, settings, True,
                         (probe.site, rpi, probe.permutations, alpha, reduction, distance, probe.layers), "probe_ssdc")
    seed = stream.seed if stream.seed is not None else int(torch.randint(2 ** 31, ()).item())
    acc = _accumulator(probe, seed)
    scale = pe_scale(model, alpha) if alpha is not None else contextlib.nullcontext()
    with stream.together(), scale:
        _stream(model, probe, stream, acc)
    n_images, image_size = stream.n_images, stream.image_size
    if stream.shard is not None:
        n_images, image_size = _reduce_across_processes(acc, n_images, image_size, stream.shard.seen)
    if n_images == 0:
        raise ValueError("data yielded no images")
    result = _finish(acc, probe, seed, n_images, image_size, model)
    result.settings["alpha"] = alpha
    return result


def _check_alpha(alpha: float | None) -> None:
    if alpha is not None and not (isinstance(alpha, (int, float)) and math.isfinite(alpha) and alpha >= 0):
        raise ValueError(f"alpha must be a finite number >= 0, got {alpha!r}")


def _check_probe(model: nn.Module, site: str, rpi: bool, reduction: str, distance: str,
                 layers: Sequence[int] | None, permutations: int | None, forward_size: int | None) -> _Probe:
    """The call's own settings checked (before any data is read) and its probe sites found."""
    site = resolve_site(model, site)
    if reduction not in REDUCTIONS:
        raise ValueError(f"unknown reduction {reduction!r}; expected one of {', '.join(REDUCTIONS)}")
    if distance not in DISTANCES:
        raise ValueError(f"unknown distance {distance!r}; expected one of {', '.join(DISTANCES)}")
    count = rpi_count(permutations)
    if forward_size is not None and (isinstance(forward_size, bool) or not isinstance(forward_size, int)
                                     or forward_size < 1):
        raise ValueError(f"forward_size must be an integer >= 1, got {forward_size!r}")
    if rpi:
        find_embed_module(model)  # a model without a patch embedding (CNNs): refused before any data is read
    else:
        check_unpermuted(model, "probe_ssdc(rpi=False)")
    sites = find_stages(model) if site == "stage_output" else find_sites(model)
    depth = len(sites.names) if site == "stage_output" else len(sites.blocks)
    return _Probe(site, sites, _resolve_layers(layers, depth), reduction, distance, rpi, count if rpi else 1,
                  forward_size)


def _accumulator(probe: _Probe, seed: int) -> _Accumulator:
    """The running sums of the call: under RPI one replica per permutation (seeds ``seed`` .. ``seed + K - 1``),
    else one replica with the jackknife's groups of images (from ``seed``)."""
    prefix = 0 if probe.staged else probe.sites.num_prefix_tokens
    seeds = permutation_seeds(seed, probe.permutations) if probe.rpi else None
    return _Accumulator(probe.layers, probe.reduction, probe.distance, prefix, permutation_seeds=seeds,
                        groups=0 if probe.rpi else JACKKNIFE_GROUPS, group_seed=seed)


def _per_forward(probe: _Probe, batch: int) -> int:
    """How many permutations one forward pass stacks for a batch of ``batch`` images."""
    limit = probe.forward_size or FORWARD_IMAGES
    return max(1, min(probe.permutations, limit // max(batch, 1)))


def _stream(model: nn.Module, probe: _Probe, stream: Stream, acc: _Accumulator) -> None:
    """This process's part of :func:`probe_ssdc`: the stream's batches through the model, under each
    permutation under RPI, into ``acc`` (the stream counts the images and keeps the first batch's size)."""
    hooks = []
    try:
        rpi_ctx = token_permutation(model, per="given") if probe.rpi else contextlib.nullcontext()
        with stream.placed(model), torch.no_grad(), eval_mode(model), rpi_ctx as handle:
            if not probe.staged:
                hooks = probe.sites.register(probe.site, probe.layers, acc)
            for images, hw, offset in stream.images():
                step = _per_forward(probe, len(images))
                for first in range(0, acc.num_replicas, step):
                    replicas = list(range(first, min(first + step, acc.num_replicas)))
                    x = images if len(replicas) == 1 else images.repeat(len(replicas), 1, 1, 1)
                    if handle is not None:  # chunk r of the forward under permutation replicas[r]
                        handle.give(lambda n, ks=replicas: acc.permutations_for(n)[ks])
                    acc.start_batch(None if probe.staged else probe.sites.grid_size(hw), replicas, offset,
                                    len(images))
                    if probe.staged:
                        _forward_stages(probe.sites, acc, x, probe.layers, handle)
                    else:
                        try:
                            model(x)
                        except _StopForward:
                            pass
                    acc.end_batch()
    finally:
        for h in hooks:
            h.remove()


def _reduce_across_processes(acc: _Accumulator, n_images: int, image_size: tuple[int, int] | None,
                             seen: int | None) -> tuple[int, tuple[int, int] | None]:
    """Make every process's accumulator hold the sums of all processes; returns (images, image size).

    Reduced: the image count (summed, exact); each layer's grid (the first process's that has one, as
    the first batch's in one process; a different one refused under the mean map), the layers whose
    grid is too small (union); the per-image moments of each layer and permutation (gathered, merged in
    process order by Chan's formula); each layer's float64 summed maps (every permutation's, or every
    jackknife group's), their diagonals and the groups' image counts (all-reduced sums: a process without
    images adds zeros). The permutations are drawn from the shared seed: the same everywhere.
    """
    states = _dist.all_gather_objects({
        "n": n_images, "seen": seen, "image_size": image_size, "grids": dict(acc.grids),
        "too_small": sorted(acc.too_small), "nonfinite": dict(acc.nonfinite),
        "index": {key: m.state() for key, m in acc.index_moments.items()},
        "content": {key: m.state() for key, m in acc.content_moments.items()},
    })
    seens = [s["seen"] for s in states]
    total = sum(s["n"] for s in states)
    if any(v != seens[0] for v in seens) or (seens[0] is not None and total != seens[0]):
        raise RuntimeError(f"the processes read different data (images seen: {seens}, probed: "
                           f"{[s['n'] for s in states]}): an iterable of batches must yield the same batches in the "
                           "same order on every process, or be sharded by the caller (distributed='presharded')")
    image_size = next((s["image_size"] for s in states if s["image_size"] is not None), None)
    acc.grids = grids = _merged_grids(states, acc.want_map)
    acc.too_small = set().union(*(s["too_small"] for s in states))
    acc.nonfinite = {}
    for s in states:
        for key, count in s["nonfinite"].items():
            acc.nonfinite[key] = acc.nonfinite.get(key, 0) + count
    for key, moments in (("index", acc.index_moments), ("content", acc.content_moments)):
        for slot in moments:
            merged = _Moments()
            for s in states:
                merged.merge(s[key][slot])
            moments[slot] = merged
    acc.group_counts = _dist.all_reduce_sum(acc.group_counts.to(torch.float64)).round().to(torch.int64)
    if acc.want_map:
        _sum_maps(acc, grids)
    return total, image_size


def _merged_grids(states: list[dict[str, Any]], want_map: bool) -> dict[int, tuple[int, int]]:
    """Each layer's grid: the first process's that has one (a different one refused under the mean map)."""
    grids: dict[int, tuple[int, int]] = {}
    for s in states:
        for layer, grid in s["grids"].items():
            known = grids.setdefault(layer, grid)
            if known != grid and want_map:
                raise ValueError(f"the token grid of layer {layer} differs between processes ({known} vs {grid}): "
                                 "the mean map needs one image size (resize the data, or use reduction='per_image')")
    return grids


def _sum_maps(acc: _Accumulator, grids: dict[int, tuple[int, int]]) -> None:
    """Each layer's float64 summed maps (every slot), pairs and diagonal, summed across processes (all-reduce;
    a process without images adds zeros)."""
    for layer in acc.layers:  # the same layers, in the same order, on every process
        if layer in acc.too_small or layer not in grids:
            continue
        n = grids[layer][0] * grids[layer][1]
        m = n * (n - 1) // 2
        local = acc.map_sum.get(layer)
        flat = torch.cat(local, dim=1) if local is not None else torch.zeros(acc.slots, m + n, dtype=torch.float64)
        flat = _dist.all_reduce_sum(flat)
        acc.map_sum[layer] = (flat[:, :m], flat[:, m:])


def _forward_stages(sites: StageSites, acc: _Accumulator, images: torch.Tensor, layers: list[int],
                    handle: Any | None) -> None:
    """One batch through ``forward_intermediates``; each feature map goes to the accumulator on its grid."""
    calls = handle.num_calls if handle is not None else 0
    fmaps = sites.forward(images, layers)
    if handle is not None and handle.num_calls == calls:
        raise TokenPermutationError(f"{type(sites.model).__name__}.forward_intermediates did not call the patch "
                                    "embedding where the permutation is applied: its outputs would not be permuted")
    for layer, fmap in zip(layers, fmaps):
        acc.add_feature_map(layer, fmap)


# The similarities are float32 dot products of unit vectors (relative error ~1e-6 and below); a map whose
# pairs spread less than this, relative to their size, holds no ranking but rounding noise.
_CONSTANT_RTOL = 1e-5


def _near_constant(pairs: torch.Tensor) -> bool:
    """The summed (or mean) similarities of the pairs i < j (M,) are equal up to float32 rounding (NaN: False)."""
    if pairs.numel() == 0 or not torch.isfinite(pairs).all():
        return False
    spread = float(pairs.max() - pairs.min())
    return spread <= _CONSTANT_RTOL * max(float(pairs.abs().mean()), 1e-12)


def _finish(acc: _Accumulator, probe: _Probe, seed: int, n_images: int, image_size: tuple[int, int],
            model: nn.Module) -> SSDCResult:
    """The result from the (reduced) sums: per-layer SSDC of the mean maps and / or the per-image statistics,
    each with its interval (over permutations under RPI, over images without)."""
    layers = probe.layers
    grids = [acc.grids[layer] for layer in layers]
    if acc.too_small:
        names = ", ".join(f"{layer} ({'x'.join(map(str, acc.grids[layer]))})" for layer in sorted(acc.too_small))
        warnings.warn(f"SSDC is undefined (NaN) where the grid has fewer than 2 tokens: layer(s) {names}; use larger "
                      "images", ConstantMapWarning, stacklevel=3)
    maps = _MapStats(layers) if not acc.want_map else _map_ssdc(acc, probe, n_images, grids)
    stats = _image_stats(acc, probe) if acc.want_images else None
    bad, count = acc.nonfinite_layers()
    if bad:  # non-finite tokens: those layers' numbers NaN, said once
        _blank_layers(maps, stats, [layers.index(layer) for layer in bad], probe)
        warnings.warn(nonfinite_message(f"the tokens of layer(s) {', '.join(map(str, bad))}", count, n_images,
                                        "their SSDC is NaN"), NonFiniteWarning, stacklevel=3)
    if not acc.want_map:  # the per-image reduction alone: its means are the numbers
        maps.index = np.array([[s.mean for s in stats[0]]]) if not probe.rpi else stats[2]
        maps.content = stats[3] if probe.rpi else None
        maps.index_ci = [(s.ci_low, s.ci_high) for s in stats[0]]
        maps.content_ci = [(s.ci_low, s.ci_high) for s in stats[1]] if probe.rpi else None
        maps.interval = stats[0][0].over if stats[0] else "none"
        cols = _rise_columns(probe)
        if probe.rpi and cols is not None:  # each permutation's rise of its image means
            _, low, high = t_interval(maps.index[:, cols[1]] - maps.index[:, cols[0]])
            maps.rise_ci = (float(low), float(high))
    staged = probe.staged
    k = acc.num_replicas
    n_tokens = grids[0][0] * grids[0][1] if grids else 0
    perms = acc.permutations.get(n_tokens) if probe.rpi else None
    settings = {
        "model": _model_name(model), "site": probe.site, "reduction": probe.reduction, "rpi": probe.rpi,
        "seed": seed, "rpi_permutations": k if probe.rpi else None,
        "permutation_seeds": list(acc.permutation_seeds) if probe.rpi else None,
        "jackknife_groups": acc.groups or None, "interval": maps.interval,
        "distance": probe.distance, "n_images": n_images,
        "image_size": list(image_size), "grid_size": list(grids[0]), "grid_sizes": [list(g) for g in grids],
        "num_prefix_tokens": 0 if staged else probe.sites.num_prefix_tokens, "family": probe.sites.family,
        "granularity": "stage" if staged else "block",
        # layers whose mean map is constant up to float rounding (their SSDC NaN, with a ConstantMapWarning)
        "constant_layers": maps.flat,
    }
    if staged:
        settings["modules"] = [probe.sites.names[layer] for layer in layers]
    result = SSDCResult(
        per_layer=_mean_rows(maps.index), layers=list(layers),
        per_image=stats[0] if stats else None,
        content_per_layer=_mean_rows(maps.content) if probe.rpi else None,
        content_per_image=stats[1] if stats and probe.rpi else None,
        mean_maps=maps.mean_maps, permutation=perms[0].clone() if perms is not None else None, settings=settings,
        per_layer_ci=maps.index_ci, content_per_layer_ci=maps.content_ci if probe.rpi else None,
        by_permutation=maps.index.tolist() if probe.rpi else None,
        content_by_permutation=maps.content.tolist() if probe.rpi and maps.content is not None else None,
        permutations=perms.clone() if perms is not None else None, rise_ci=maps.rise_ci, jackknife=maps.jackknife)
    return result


def _blank_layers(maps: _MapStats, stats: Any, cols: list[int], probe: _Probe) -> None:
    """Set the numbers of the layers at ``cols`` (and a rise that uses one) to NaN, with their intervals."""
    nan2 = (math.nan, math.nan)
    for values in (maps.index, maps.content, *(stats[2:] if stats else ())):
        if values is not None:
            values[:, cols] = math.nan
    for cis in (maps.index_ci, maps.content_ci):
        for i in cols if cis is not None else ():
            cis[i] = nan2
    rise = _rise_columns(probe)
    if rise is not None and set(rise) & set(cols):
        maps.rise_ci = nan2
    for per in stats[:2] if stats else ():
        for i in cols if per else ():
            per[i] = PerImageStats(math.nan, math.nan, math.nan, math.nan, per[i].n, per[i].n_nan, per[i].over)


def _mean_rows(values: np.ndarray | None) -> list[float] | None:
    """The mean over replicates (rows) of each column, NaN left out (NaN where a column has none)."""
    if values is None:
        return None
    return [float(v) for v in t_interval(values, axis=0)[0]]


@dataclass
class _MapStats:
    """The mean-map numbers of a call: per replicate (permutation) and layer, with their intervals."""

    layers: list[int]
    index: np.ndarray = None  # (K, L) SSDC against the index grid per permutation (K = 1 without RPI)
    content: np.ndarray | None = None  # (K, L) against the content grid (RPI)
    index_ci: list[tuple[float, float]] | None = None
    content_ci: list[tuple[float, float]] | None = None
    rise_ci: tuple[float, float] | None = None
    jackknife: dict[str, Any] | None = None
    interval: str = "none"
    mean_maps: Any = None
    flat: list[int] | None = None

    def __post_init__(self) -> None:
        if self.index is None:
            self.index = np.full((1, len(self.layers)), np.nan)
        self.flat = self.flat or []


def _map_ssdc(acc: _Accumulator, probe: _Probe, n_images: int, grids: list[tuple[int, int]]) -> _MapStats:
    """SSDC of each layer's mean map under each replica (permutation), against the index grid and (RPI) the
    content grid, their intervals (over permutations; without RPI the jackknife over images), the mean maps
    (the first permutation's under RPI), and the layers whose mean map is constant up to float rounding (NaN,
    with a ConstantMapWarning)."""
    layers, k = probe.layers, acc.num_replicas
    stats = _MapStats(layers, index=np.full((k, len(layers)), np.nan),
                      content=np.full((k, len(layers)), np.nan) if probe.rpi else None)
    deleted = np.full((acc.groups, len(layers)), np.nan) if acc.groups else None
    rows: dict[tuple[int, int], list[tuple[int, torch.Tensor]]] = {}  # grid -> [(column, (K + G, M) mean maps)]
    for i, (layer, grid) in enumerate(zip(layers, grids)):
        if layer in acc.too_small:
            continue
        pairs = acc.replica_pairs(layer)  # (K, M) summed maps
        if any(_near_constant(row) for row in pairs):
            stats.flat.append(layer)
            continue
        maps = [pairs / n_images]
        if deleted is not None:  # each group's images left out: the jackknife's replicates
            counts = acc.group_counts.to(pairs.device, torch.float64)
            maps.append((pairs[0][None] - acc.map_sum[layer][0]) / (n_images - counts).clamp(min=1)[:, None])
        # ranked as float32 (values in [-1, 1], rounding 6e-8; a swap of two tied-close ranks moves SSDC by
        # ~1e-12): one sort with its payload, 4x faster than float64 (spearman.py), all of a grid's rows at once
        rows.setdefault(grid, []).append((i, torch.cat(maps).float()))
    for grid, items in rows.items():
        device = items[0][1].device
        (rho,) = ssdc_pairs(torch.cat([m for _, m in items]), acc.distance_targets(grid, 0, device)[:1])
        rho = rho.cpu().numpy().reshape(len(items), -1)  # (layers of this grid, K + G)
        for (i, _), values in zip(items, rho):
            stats.index[:, i] = values[:k]
            if deleted is not None:
                deleted[:, i] = values[k:]
        if probe.rpi and acc.content_defined(grid):
            for r in range(k):  # against where each token's content came from: permutation r's own grid
                (rho,) = ssdc_pairs(torch.stack([m[r] for _, m in items]), acc.distance_targets(grid, r, device)[1:])
                stats.content[r, [i for i, _ in items]] = rho.cpu().numpy()
    if stats.flat:
        warnings.warn(f"the mean similarity map of layer(s) {', '.join(map(str, stats.flat))} is constant up to float "
                      "rounding (every patch token alike): its SSDC is undefined (NaN)", ConstantMapWarning,
                      stacklevel=4)
    _intervals(stats, acc, probe, deleted)
    maps = [acc.mean_map(layer, n_images) for layer in layers]  # (N_l, N_l) float64 each, replica 0
    same = len({m.shape for m in maps}) == 1
    stats.mean_maps = torch.stack(maps).float().cpu() if same else [m.float().cpu() for m in maps]
    return stats


def _intervals(stats: _MapStats, acc: _Accumulator, probe: _Probe, deleted: np.ndarray | None) -> None:
    """Fill the intervals of ``stats``: over permutations under RPI (NaN with one), else the jackknife's."""
    rise_col = _rise_columns(probe)
    if probe.rpi:
        _, lo, hi = t_interval(stats.index, axis=0)
        stats.index_ci = list(zip(lo.tolist(), hi.tolist()))
        _, lo, hi = t_interval(stats.content, axis=0)
        stats.content_ci = list(zip(lo.tolist(), hi.tolist()))
        if rise_col is not None:
            _, lo, hi = t_interval(stats.index[:, rise_col[1]] - stats.index[:, rise_col[0]])
            stats.rise_ci = (float(lo), float(hi))
        stats.interval = (f"over {acc.num_replicas} RPI permutations (Student t, {acc.num_replicas - 1} df)"
                          if acc.num_replicas >= 2 else "none (one RPI permutation)")
        return
    if deleted is None:
        return
    sizes = acc.group_counts.numpy()
    stats.jackknife = {"deleted": deleted.tolist(), "sizes": sizes.tolist()}
    lo, hi = jackknife_interval(stats.index[0], deleted, sizes)
    stats.index_ci = list(zip(lo.tolist(), hi.tolist()))
    if rise_col is not None:
        full = stats.index[0, rise_col[1]] - stats.index[0, rise_col[0]]
        lo, hi = jackknife_interval(full, deleted[:, rise_col[1]] - deleted[:, rise_col[0]], sizes)
        stats.rise_ci = (float(lo), float(hi))
    stats.interval = (f"over images (delete-a-group jackknife, {int((sizes > 0).sum())} random groups, Student t)")


def _rise_columns(probe: _Probe) -> tuple[int, int] | None:
    """(column of layer 0, column of layer 1) when both blocks were probed (None per stage: other grids)."""
    if probe.staged or 0 not in probe.layers or 1 not in probe.layers:
        return None
    return probe.layers.index(0), probe.layers.index(1)


def _image_stats(acc: _Accumulator, probe: _Probe) -> tuple[list[PerImageStats], list[PerImageStats], Any, Any]:
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
            pooled = _Moments()
            for r in range(k):
                pooled.merge(moments[(layer, r)].state())
            whole = pooled.stats()
            stats.append(PerImageStats(mean=float(mean[i]), std=whole.std, ci_low=float(lo[i]), ci_high=float(hi[i]),
                                       n=per[0][i].n, n_nan=pooled.n_nan,
                                       over=f"{k} RPI permutations" if k >= 2 else "none (one RPI permutation)"))
        out.append(stats)
        arrays.append(means)
    return out[0], out[1], arrays[0], arrays[1]
