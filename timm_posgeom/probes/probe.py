"""``probe_ssdc``: SSDC of any timm model, block by block (flat ViTs) or stage by stage, over a whole dataset.

Per batch and probed layer: patch tokens (B, N, C) -> unit-normalised -> cosine maps (B, N, N).
Only running sums are kept (the summed map per layer, and streaming per-image moments,
:mod:`.accumulator`), so memory does not grow with the number of images. The SSDC formula lives in
:mod:`.spearman`; this module is the edge: hooks, devices, the reduction across processes (the data and its
shards: :mod:`.streaming`). Definitions: docs/method.md#similarity-maps-and-probe-sites.
"""
from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from .. import distributed as _dist
from ..interventions import (
    TokenPermutationError,
    check_unpermuted,
    eval_mode,
    find_embed_module,
    token_permutation,
)
from ..measuring import DISTRIBUTED_MODES, MeasureSettings
from .accumulator import MAX_GRID_TOKENS, _Accumulator, _Moments
from .result import SSDCResult
from .sites import ProbeSites, StageSites, find_sites, find_stages, resolve_site
from .spearman import DISTANCES, ConstantMapWarning, grid_positions, ssdc
from .streaming import (  # noqa: F401  (_batches, _Shard and the others: their old home, still importable)
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
    stages), the layer indices, the reduction, the distance, RPI."""

    site: str
    sites: ProbeSites | StageSites
    layers: list[int]
    reduction: str
    distance: str
    rpi: bool

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
        rpi: random permutation at inference: one permutation of the patch-token contents (drawn
            from ``seed``) for the whole probe, after the patch embedding and before any PE.
            ``per_layer`` is then SSDC against the index grid (the paper's) and
            ``content_per_layer`` against the content grid (NaN for a stage whose grid is not the
            patch grid: its tokens mix several patches). Refused for models without a patch embedding.
        settings: a :class:`~timm_posgeom.measuring.MeasureSettings`: ``max_images``, ``batch_size``,
            ``seed``, ``device``, ``progress`` and ``distributed`` below (``resize``, ``img_size`` and
            ``num_workers`` are the loader's: ``data`` is already transformed). Each of those fields may
            also be given as a keyword (``batch_size=8``), which overrides ``settings``.
        reduction: ``mean_map`` (the paper's: SSDC of the similarity map averaged over all images),
            ``per_image`` (mean, std and 95% CI of the per-image SSDC) or ``both``.
        distance: ``manhattan`` (the paper's), ``euclidean`` or ``chebyshev``.
        layers: block (or stage) indices to probe (negative allowed); default all.

    Keyword Args:
        seed (int | None): seed of the RPI permutation (None: torch's global RNG; with several processes, a seed
            drawn on the main process and shared, recorded in ``settings["seed"]``).
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
    settings, _ = MeasureSettings.resolve("probe_ssdc", settings, options)
    probe = _check_probe(model, site, rpi, reduction, distance, layers)
    stream = open_stream(model, data, settings, rpi, (probe.site, rpi, reduction, distance, probe.layers),
                         "probe_ssdc")
    with stream.together():
        acc = _stream(model, probe, stream)
    n_images, image_size = stream.n_images, stream.image_size
    if stream.shard is not None:
        n_images, image_size = _reduce_across_processes(acc, n_images, image_size, stream.shard.seen)
    if n_images == 0:
        raise ValueError("data yielded no images")
    return _finish(acc, probe, stream.seed, n_images, image_size, model)


def _check_probe(model: nn.Module, site: str, rpi: bool, reduction: str, distance: str,
                 layers: Sequence[int] | None) -> _Probe:
    """The call's own settings checked (before any data is read) and its probe sites found."""
    site = resolve_site(model, site)
    if reduction not in REDUCTIONS:
        raise ValueError(f"unknown reduction {reduction!r}; expected one of {', '.join(REDUCTIONS)}")
    if distance not in DISTANCES:
        raise ValueError(f"unknown distance {distance!r}; expected one of {', '.join(DISTANCES)}")
    if rpi:
        find_embed_module(model)  # a model without a patch embedding (CNNs): refused before any data is read
    else:
        check_unpermuted(model, "probe_ssdc(rpi=False)")
    sites = find_stages(model) if site == "stage_output" else find_sites(model)
    depth = len(sites.names) if site == "stage_output" else len(sites.blocks)
    return _Probe(site, sites, _resolve_layers(layers, depth), reduction, distance, rpi)


def _stream(model: nn.Module, probe: _Probe, stream: Stream) -> _Accumulator:
    """This process's part of :func:`probe_ssdc`: the stream's batches through the model into an
    accumulator (the stream counts the images and keeps the first batch's size)."""
    hooks = []
    try:
        rpi_ctx = token_permutation(model, seed=stream.seed, per="call") if probe.rpi else contextlib.nullcontext()
        with stream.placed(model), torch.no_grad(), eval_mode(model), rpi_ctx as handle:
            acc = _Accumulator(probe.layers, probe.reduction, probe.distance, handle,
                               getattr(probe.sites, "num_prefix_tokens", 0))
            if not probe.staged:
                hooks = probe.sites.register(probe.site, probe.layers, acc)
            for images, hw in stream.images():
                if probe.staged:
                    _forward_stages(probe.sites, acc, images, probe.layers, handle)
                else:
                    acc.start_batch(probe.sites.grid_size(hw))
                    try:
                        model(images)
                    except _StopForward:
                        pass
                acc.end_batch()
    finally:
        for h in hooks:
            h.remove()
    return acc


def _reduce_across_processes(acc: _Accumulator, n_images: int, image_size: tuple[int, int] | None,
                             seen: int | None) -> tuple[int, tuple[int, int] | None]:
    """Make every process's accumulator hold the sums of all processes; returns (images, image size).

    Reduced: the image count (summed, exact); each layer's grid (the first process's that has one, as
    the first batch's in one process; a different one refused under the mean map), the layers whose
    grid is too small (union), the RPI permutation (the same everywhere, checked); the per-image
    moments (gathered, merged in process order by Chan's formula); each layer's float64 summed map,
    pairs and diagonal (all-reduced sum: a process without images adds zeros).
    """
    perm = acc.permutation.permutation if acc.permutation is not None else None
    states = _dist.all_gather_objects({
        "n": n_images, "seen": seen, "image_size": image_size, "grids": dict(acc.grids),
        "too_small": sorted(acc.too_small), "perm": None if perm is None else perm.cpu(),
        "index": {layer: m.state() for layer, m in acc.index_moments.items()},
        "content": {layer: m.state() for layer, m in acc.content_moments.items()},
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
    for key, moments in (("index", acc.index_moments), ("content", acc.content_moments)):
        for layer in moments:
            merged = _Moments()
            for s in states:
                merged.merge(s[key][layer])
            moments[layer] = merged
    perms = [s["perm"] for s in states if s["perm"] is not None]
    if perms:
        if any(not torch.equal(p, perms[0]) for p in perms[1:]):
            raise RuntimeError("the processes drew different RPI permutations: give probe_ssdc the same seed everywhere")
        acc.permutation.permutation = perms[0]
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
    """Each layer's float64 summed map, pairs and diagonal, summed across processes (all-reduce; a process
    without images adds zeros)."""
    for layer in acc.layers:  # the same layers, in the same order, on every process
        if layer in acc.too_small or layer not in grids:
            continue
        n = grids[layer][0] * grids[layer][1]
        m = n * (n - 1) // 2
        local = acc.map_sum.get(layer)
        flat = torch.cat(local) if local is not None else torch.zeros(m + n, dtype=torch.float64)
        flat = _dist.all_reduce_sum(flat)
        acc.map_sum[layer] = (flat[:m], flat[m:])


def _forward_stages(sites: StageSites, acc: _Accumulator, images: torch.Tensor, layers: list[int],
                    handle: Any | None) -> None:
    """One batch through ``forward_intermediates``; each feature map goes to the accumulator on its grid."""
    calls = handle.num_calls if handle is not None else 0
    acc.start_batch()
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


def _finish(acc: _Accumulator, probe: _Probe, seed: int | None, n_images: int, image_size: tuple[int, int],
            model: nn.Module) -> SSDCResult:
    """The result from the (reduced) sums: per-layer SSDC of the mean maps and / or the per-image statistics."""
    layers, distance = probe.layers, probe.distance
    grids = [acc.grids[layer] for layer in layers]
    perm = acc.permutation.permutation.cpu() if probe.rpi else None
    if acc.too_small:
        names = ", ".join(f"{layer} ({'x'.join(map(str, acc.grids[layer]))})" for layer in sorted(acc.too_small))
        warnings.warn(f"SSDC is undefined (NaN) where the grid has fewer than 2 tokens: layer(s) {names}; use larger "
                      "images", ConstantMapWarning, stacklevel=3)
    per_layer = content = mean_maps = None
    flat: list[int] = []
    if acc.want_map:
        per_layer, content, mean_maps, flat = _map_ssdc(acc, probe, n_images, grids, perm)
    per_image = content_per_image = None
    if acc.want_images:
        per_image = [acc.index_moments[layer].stats() for layer in layers]
        if probe.rpi:
            content_per_image = [acc.content_moments[layer].stats() for layer in layers]
        if per_layer is None:
            per_layer = [s.mean for s in per_image]
            content = [s.mean for s in content_per_image] if probe.rpi else None
    staged = probe.staged
    settings = {
        "model": _model_name(model), "site": probe.site, "reduction": probe.reduction, "rpi": probe.rpi,
        "seed": seed if probe.rpi else None, "distance": distance, "n_images": n_images,
        "image_size": list(image_size), "grid_size": list(grids[0]), "grid_sizes": [list(g) for g in grids],
        "num_prefix_tokens": 0 if staged else probe.sites.num_prefix_tokens, "family": probe.sites.family,
        "granularity": "stage" if staged else "block",
        # layers whose mean map is constant up to float rounding (their SSDC NaN, with a ConstantMapWarning)
        "constant_layers": flat,
    }
    if staged:
        settings["modules"] = [probe.sites.names[layer] for layer in layers]
    return SSDCResult(per_layer=per_layer, layers=list(layers), per_image=per_image, content_per_layer=content,
                      content_per_image=content_per_image, mean_maps=mean_maps, permutation=perm,
                      settings=settings)


def _map_ssdc(acc: _Accumulator, probe: _Probe, n_images: int, grids: list[tuple[int, int]],
              perm: torch.Tensor | None) -> tuple[list[float], list[float] | None, Any, list[int]]:
    """(SSDC of each layer's mean map, under RPI against the content grid, the mean maps, the layers
    whose mean map is constant up to float rounding: NaN, with a ConstantMapWarning)."""
    layers, distance = probe.layers, probe.distance
    maps = [acc.mean_map(layer, n_images) for layer in layers]  # (N_l, N_l) float64 each
    flat = [layer for layer in layers if layer not in acc.too_small and _near_constant(acc.map_sum[layer][0])]
    if flat:
        warnings.warn(f"the mean similarity map of layer(s) {', '.join(map(str, flat))} is constant up to float "
                      "rounding (every patch token alike): its SSDC is undefined (NaN)", ConstantMapWarning,
                      stacklevel=4)
    undefined = acc.too_small | set(flat)
    per_layer = [float(ssdc(m, g, distance)) if layer not in undefined else math.nan
                 for layer, m, g in zip(layers, maps, grids)]
    content = None
    if probe.rpi:
        content = [float(ssdc(m, g, distance, positions=grid_positions(g)[perm]))
                   if acc.content_defined(g) and layer not in undefined else math.nan
                   for layer, m, g in zip(layers, maps, grids)]
    same = len({m.shape for m in maps}) == 1
    mean_maps = torch.stack(maps).float().cpu() if same else [m.float().cpu() for m in maps]
    return per_layer, content, mean_maps, flat
