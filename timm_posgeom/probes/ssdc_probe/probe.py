"""``probe_ssdc``: SSDC of any timm model, block by block (flat ViTs) or stage by stage, over a whole dataset.

Per batch and probed layer: patch tokens (B, N, C) -> unit-normalised -> cosine maps (B, N, N).
Only running sums are kept (the summed map per layer, and streaming per-image moments,
:mod:`.accumulator`), so memory does not grow with the number of images. The SSDC formula lives in
:mod:`.spearman`; this module is the edge: hooks, devices, the reduction across processes (the data and its
shards: :mod:`..streaming`, shared with every streaming measure); the numbers and their intervals from the reduced
sums are :mod:`.stats`'s.
Definitions: docs/method.md#similarity-maps-and-probe-sites.

Under RPI every image is read (decoded, resized) once and goes through the model under each of the K
permutations of the protocol (:mod:`~timm_posgeom.interventions.draws`); a forward pass stacks several of
them (``forward_size``) as chunks of one batch. Each permutation keeps its own sums, and the result is their
mean with a Student t interval over permutations. Without RPI the summed map is kept per random group of
images, and the SSDC of the mean map gets the interval of a delete-a-group jackknife over images
(:mod:`~timm_posgeom.results.intervals`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn as nn
from torch.utils.hooks import RemovableHandle

from ...defaults import JACKKNIFE_GROUPS, check_alpha_spec, rpi_count
from ...errors import DataError, SettingError
from ...interventions import (
    TokenPermutationError,
    check_unpermuted,
    eval_mode,
    find_embed_module,
    pe_scale,
    permutation_seeds,
    token_permutation,
)
from ...measuring import distributed as _dist
from ...measuring.settings import DISTRIBUTED_MODES, MeasureSettings
from ..sites import ProbeSites, StageSites, find_sites, find_stages, resolve_site
from ..streaming import FORWARD_IMAGES, StopForward, Stream, open_stream, resolve_layers
from .accumulator import MAX_GRID_TOKENS, Accumulator, Moments
from .result import SSDCResult
from .spearman import DISTANCES
from .stats import Probe, finish

__all__ = ["probe_ssdc", "REDUCTIONS", "DISTRIBUTED_MODES", "MAX_GRID_TOKENS"]

REDUCTIONS = ("mean_map", "per_image", "both")


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
    i < j with D the distance on that layer's grid (see :func:`~timm_posgeom.probes.ssdc_probe.spearman.ssdc`).

    Args:
        model: a timm model: a flat ViT (see :mod:`.sites` for the families), or a hierarchical ViT,
            MLP model or CNN (probed per stage). Put in eval mode for the probe; its mode (and device,
            when ``device`` moves it) is restored afterwards.
        data: a tensor batch (B, C, H, W) (split into chunks of ``batch_size``), or any iterable of
            batches: tensors, (images, labels) tuples, or dicts with "image"/"pixel_values" (e.g. a
            DataLoader). Images must already be transformed for the model, at the size to probe
            (:func:`~timm_posgeom.data.eval_data.eval_loader` with ``img_size``).
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
        alpha (float | dict[str, float] | None): scale the positional encoding by alpha for the probe
            (:func:`~timm_posgeom.pe_scale`, the class row included), or each component by its own
            (``{"ape": 0.0}``); None: as it is.
        forward_size (int | None): at most this many images per forward pass: under RPI, the permutations of
            a batch are stacked up to it (default 512 images, at least one batch).
        max_images (int | None): stop after this many images (with several processes: this many in all).
        device (str | torch.device | None): run there (the model is moved for the probe and moved back); default the model's.
        progress (bool): show a tqdm bar (on the main process only, when several share the probe).
        batch_size (int): chunk size when ``data`` is one tensor.
        distributed (str): how several processes (``accelerate launch``, ``torchrun``: see
            :mod:`timm_posgeom.measuring.distributed`) share the probe. ``auto`` (default): alone, nothing
            changes; launched as W > 1 processes, each takes global batches r, r + W, ... (the
            batches one process would read: chunks of ``batch_size`` of a tensor, or the data's own
            batches), cut at the global ``max_images``. A DataLoader over a map-style dataset read in
            order (:func:`~timm_posgeom.data.eval_data.eval_loader`'s) is re-batched so that each process
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
    probe = _check_probe(model, site, rpi, reduction, distance, layers, settings.rpi_permutations, own["forward_size"])
    alpha = own["alpha"]
    _check_alpha(alpha)
    stream = open_stream(
        model,
        data,
        settings,
        True,
        (probe.site, rpi, probe.permutations, alpha, reduction, distance, probe.layers),
        "probe_ssdc",
    )
    seed = stream.seed if stream.seed is not None else int(torch.randint(2**31, ()).item())
    acc = _accumulator(probe, seed)
    scale = pe_scale(model, alpha) if alpha is not None else contextlib.nullcontext()
    with stream.together(), scale:
        _stream(model, probe, stream, acc)
    n_images, image_size = stream.n_images, stream.image_size
    if stream.shard is not None:
        n_images, image_size = _reduce_across_processes(acc, n_images, image_size, stream.shard.seen)
    if n_images == 0 or image_size is None:
        raise DataError("data yielded no images")
    result = finish(acc, probe, seed, n_images, image_size, model)
    result.settings["alpha"] = alpha
    return result


def _check_alpha(alpha: Any) -> None:
    """ValueError unless ``alpha`` is None, a finite number >= 0 or a mapping PE component -> such a number."""
    if alpha is not None:
        check_alpha_spec(alpha)


def _check_probe(
    model: nn.Module,
    site: str,
    rpi: bool,
    reduction: str,
    distance: str,
    layers: Sequence[int] | None,
    permutations: int | None,
    forward_size: int | None,
) -> Probe:
    """The call's own settings checked (before any data is read) and its probe sites found."""
    site = resolve_site(model, site)
    if reduction not in REDUCTIONS:
        raise SettingError(f"unknown reduction {reduction!r}; expected one of {', '.join(REDUCTIONS)}")
    if distance not in DISTANCES:
        raise SettingError(f"unknown distance {distance!r}; expected one of {', '.join(DISTANCES)}")
    count = rpi_count(permutations)
    if forward_size is not None and (
        isinstance(forward_size, bool) or not isinstance(forward_size, int) or forward_size < 1
    ):
        raise SettingError(f"forward_size must be an integer >= 1, got {forward_size!r}")
    if rpi:
        find_embed_module(model)  # a model without a patch embedding (CNNs): refused before any data is read
    else:
        check_unpermuted(model, "probe_ssdc(rpi=False)")
    sites = find_stages(model) if site == "stage_output" else find_sites(model)
    depth = len(sites.names) if isinstance(sites, StageSites) else len(sites.blocks)
    return Probe(
        site, sites, resolve_layers(layers, depth), reduction, distance, rpi, count if rpi else 1, forward_size
    )


def _accumulator(probe: Probe, seed: int) -> Accumulator:
    """The running sums of the call: under RPI one replica per permutation (seeds ``seed`` .. ``seed + K - 1``),
    else one replica with the jackknife's groups of images (from ``seed``)."""
    prefix = probe.num_prefix_tokens
    seeds = permutation_seeds(seed, probe.permutations) if probe.rpi else None
    return Accumulator(
        probe.layers,
        probe.reduction,
        probe.distance,
        prefix,
        permutation_seeds=seeds,
        groups=0 if probe.rpi else JACKKNIFE_GROUPS,
        group_seed=seed,
    )


def _per_forward(probe: Probe, batch: int) -> int:
    """How many permutations one forward pass stacks for a batch of ``batch`` images."""
    limit = probe.forward_size or FORWARD_IMAGES
    return max(1, min(probe.permutations, limit // max(batch, 1)))


def _stream(model: nn.Module, probe: Probe, stream: Stream, acc: Accumulator) -> None:
    """This process's part of :func:`probe_ssdc`: the stream's batches through the model, under each
    permutation under RPI, into ``acc`` (the stream counts the images and keeps the first batch's size)."""
    sites = probe.sites
    hooks: list[RemovableHandle] = []
    try:
        rpi_ctx = token_permutation(model, per="given") if probe.rpi else contextlib.nullcontext()
        with stream.placed(model), torch.no_grad(), eval_mode(model), rpi_ctx as handle:
            if isinstance(sites, ProbeSites):
                hooks = sites.register(probe.site, probe.layers, acc)
            for images, hw, offset in stream.images():
                step = _per_forward(probe, len(images))
                for first in range(0, acc.num_replicas, step):
                    replicas = list(range(first, min(first + step, acc.num_replicas)))
                    x = images if len(replicas) == 1 else images.repeat(len(replicas), 1, 1, 1)
                    if handle is not None:  # chunk r of the forward under permutation replicas[r]
                        handle.give(_chunk_permutations(acc, replicas))
                    acc.start_batch(
                        sites.grid_size(hw) if isinstance(sites, ProbeSites) else None, replicas, offset, len(images)
                    )
                    if isinstance(sites, StageSites):
                        _forward_stages(sites, acc, x, probe.layers, handle)
                    else:
                        try:
                            model(x)
                        except StopForward:
                            pass
                    acc.end_batch()
    finally:
        for h in hooks:
            h.remove()


def _chunk_permutations(acc: Accumulator, replicas: list[int]) -> Callable[[int], torch.Tensor]:
    """For a forward pass whose chunk r runs under permutation ``replicas[r]``: its (R, n) permutations of the n
    tokens the patch embedding emits."""
    return lambda n: acc.permutations_for(n)[replicas]


def _reduce_across_processes(
    acc: Accumulator, n_images: int, image_size: tuple[int, int] | None, seen: int | None
) -> tuple[int, tuple[int, int] | None]:
    """Make every process's accumulator hold the sums of all processes; returns (images, image size).

    Reduced: the image count (summed, exact); each layer's grid (the first process's that has one, as
    the first batch's in one process; a different one refused under the mean map), the layers whose
    grid is too small (union); the per-image moments of each layer and permutation (gathered, merged in
    process order by Chan's formula); each layer's float64 summed maps (every permutation's, or every
    jackknife group's), their diagonals and the groups' image counts (all-reduced sums: a process without
    images adds zeros). The permutations are drawn from the shared seed: the same everywhere.
    """
    states = _dist.all_gather_objects(
        {
            "n": n_images,
            "seen": seen,
            "image_size": image_size,
            "grids": dict(acc.grids),
            "too_small": sorted(acc.too_small),
            "nonfinite": dict(acc.nonfinite),
            "index": {key: m.state() for key, m in acc.index_moments.items()},
            "content": {key: m.state() for key, m in acc.content_moments.items()},
        }
    )
    seens = [s["seen"] for s in states]
    total = sum(s["n"] for s in states)
    if any(v != seens[0] for v in seens) or (seens[0] is not None and total != seens[0]):
        raise RuntimeError(
            f"the processes read different data (images seen: {seens}, probed: "
            f"{[s['n'] for s in states]}): an iterable of batches must yield the same batches in the "
            "same order on every process, or be sharded by the caller (distributed='presharded')"
        )
    image_size = next((s["image_size"] for s in states if s["image_size"] is not None), None)
    acc.grids = grids = _merged_grids(states, acc.want_map)
    acc.too_small = set().union(*(s["too_small"] for s in states))
    acc.nonfinite = {}
    for s in states:
        for key, count in s["nonfinite"].items():
            acc.nonfinite[key] = acc.nonfinite.get(key, 0) + count
    for key, moments in (("index", acc.index_moments), ("content", acc.content_moments)):
        for slot in moments:
            merged = Moments()
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
                raise DataError(
                    f"the token grid of layer {layer} differs between processes ({known} vs {grid}): "
                    "the mean map needs one image size (resize the data, or use reduction='per_image')"
                )
    return grids


def _sum_maps(acc: Accumulator, grids: dict[int, tuple[int, int]]) -> None:
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


def _forward_stages(
    sites: StageSites, acc: Accumulator, images: torch.Tensor, layers: list[int], handle: Any | None
) -> None:
    """One batch through ``forward_intermediates``; each feature map goes to the accumulator on its grid."""
    calls = handle.num_calls if handle is not None else 0
    fmaps = sites.forward(images, layers)
    if handle is not None and handle.num_calls == calls:
        raise TokenPermutationError(
            f"{type(sites.model).__name__}.forward_intermediates did not call the patch "
            "embedding where the permutation is applied: its outputs would not be permuted"
        )
    for layer, fmap in zip(layers, fmaps):
        acc.add_feature_map(layer, fmap)
