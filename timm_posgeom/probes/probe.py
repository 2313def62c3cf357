"""``probe_ssdc``: SSDC of any timm model, block by block (flat ViTs) or stage by stage, over a whole dataset.

Per batch and probed layer: patch tokens (B, N, C) -> unit-normalised -> cosine maps (B, N, N).
Only running sums are kept (the summed map per layer, and streaming per-image moments), so memory
does not grow with the number of images. The SSDC formula lives in :mod:`.spearman`; this module is
the edge: hooks, data, devices, progress. Definitions: docs/method.md#similarity-maps-and-probe-sites.
"""
from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, RandomSampler

from .. import distributed as _dist
from ..interventions import (
    TokenPermutationError,
    check_unpermuted,
    eval_mode,
    find_embed_module,
    token_permutation,
)
from .result import PerImageStats, SSDCResult
from .sites import ProbeSites, StageSites, find_sites, find_stages, resolve_site
from .spearman import (
    DISTANCES,
    ConstantMapWarning,
    _distance_ranks,
    grid_positions,
    ssdc,
    ssdc_pairs,
    upper_pairs,
)

__all__ = ["probe_ssdc", "REDUCTIONS", "DISTRIBUTED_MODES"]

REDUCTIONS = ("mean_map", "per_image", "both")
DISTRIBUTED_MODES = ("auto", "presharded", "off")


MAX_GRID_TOKENS = 128 * 128  # a larger map's pairs (> 134M) and their ranks need tens of GB: refused, not OOM-killed
_DEFER_BYTES = 256 * 2 ** 20  # per batch, the pairs of all layers kept for one SSDC call after the forward


class _StopForward(Exception):
    """Raised by the last probed hook: the rest of the forward pass is not needed."""


class _Moments:
    """Streaming count / mean / sum of squared deviations of per-image values (Chan et al. merge)."""

    def __init__(self) -> None:
        self.n, self.mean, self.m2, self.n_nan = 0, 0.0, 0.0, 0

    def update(self, values: torch.Tensor) -> None:
        """values: (B,) float64; NaN entries (constant maps) are counted apart."""
        nan = torch.isnan(values)
        n_nan = int(nan.sum())
        if n_nan:
            values = values[~nan]
        self.n_nan += n_nan
        nb = values.numel()
        if nb == 0:
            return
        mb = float(values.mean())
        m2b = float((values - mb).square().sum())
        tot = self.n + nb
        delta = mb - self.mean
        self.mean += delta * nb / tot
        self.m2 += m2b + delta * delta * self.n * nb / tot
        self.n = tot

    def stats(self) -> PerImageStats:
        return PerImageStats.from_moments(self.n, self.mean, self.m2, self.n_nan)

    def state(self) -> tuple[int, float, float, int]:
        """(n, mean, m2, n_nan): what another process needs to :meth:`merge` these moments."""
        return self.n, self.mean, self.m2, self.n_nan

    def merge(self, state: tuple[int, float, float, int]) -> None:
        """Add another stream's moments (:meth:`state`): Chan et al.'s pairwise merge, as in :meth:`update`
        (n and n_nan summed exactly; into empty moments the other's are copied as they are)."""
        nb, mb, m2b, n_nan = state
        self.n_nan += int(n_nan)
        if nb == 0:
            return
        if self.n == 0:
            self.n, self.mean, self.m2 = int(nb), float(mb), float(m2b)
            return
        tot = self.n + nb
        delta = mb - self.mean
        self.mean += delta * nb / tot
        self.m2 += m2b + delta * delta * self.n * nb / tot
        self.n = tot


class _Accumulator:
    """Hook target: turns the tokens of each probed layer into running sums.

    Each layer has its own token grid (one grid for every block of a flat ViT; one per stage of a
    hierarchical model or CNN), fixed across batches when the mean map is wanted.
    """

    def __init__(self, layers: list[int], reduction: str, distance: str, permutation: Any | None,
                 num_prefix_tokens: int = 0) -> None:
        self.layers, self.distance, self.num_prefix_tokens = layers, distance, num_prefix_tokens
        self.want_map = reduction in ("mean_map", "both")
        self.want_images = reduction in ("per_image", "both")
        self.permutation = permutation  # TokenPermutation handle under RPI
        self.last_layer = max(layers)
        self.grid: tuple[int, int] | None = None  # the image's patch grid (flat ViTs) for this batch
        self.grids: dict[int, tuple[int, int]] = {}  # each layer's grid (the first batch's, for the mean map)
        self.map_sum: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.index_moments = {layer: _Moments() for layer in layers}
        self.content_moments = {layer: _Moments() for layer in layers}
        self._targets: dict[tuple[int, int], list] = {}
        self._target_perm: torch.Tensor | None = None
        self._pairs: dict[tuple[int, int], torch.Tensor] = {}  # per grid: (L, B, M) this batch's pairs i < j
        self._batch: dict[tuple[int, int], list[int]] = {}  # per grid: the layers whose pairs wait in _pairs
        self.too_small: set[int] = set()  # layers whose grid has fewer than 2 tokens: SSDC undefined

    def start_batch(self, grid: tuple[int, int] | None = None) -> None:
        """A new batch; ``grid`` is the image's patch grid where one grid serves every layer (flat ViTs)."""
        self.grid = grid
        self._batch = {}

    def content_defined(self, grid: tuple[int, int]) -> bool:
        """Under RPI, whether a layer with this grid has a content grid: its tokens are the permuted patch
        slots themselves (same count), not pooled or merged from several of them (later stages)."""
        perm = self.permutation.permutation if self.permutation is not None else None
        return perm is not None and perm.numel() == grid[0] * grid[1]

    def _distance_targets(self, grid: tuple[int, int], device: torch.device) -> list:
        perm = self.permutation.permutation if self.permutation is not None else None
        if perm is not None and (self._target_perm is None or not torch.equal(self._target_perm, perm.cpu())):
            self._targets, self._target_perm = {}, perm.cpu()  # the patch embedding ran: this batch's p is known
        if grid not in self._targets:
            targets = [_distance_ranks(grid, self.distance, None, device)]
            if self.content_defined(grid):
                targets.append(_distance_ranks(grid, self.distance, grid_positions(grid)[perm.cpu()], device))
            self._targets[grid] = targets
        return self._targets[grid]

    def patch_tokens(self, layer: int, tokens: torch.Tensor) -> torch.Tensor:
        """(B, T, C) or (B, H, W, C) -> the (B, N, C) patch tokens of the batch's grid, prefix tokens dropped."""
        H, W = self.grid
        n = H * W
        if tokens.ndim == 4:
            tokens = tokens.reshape(tokens.shape[0], -1, tokens.shape[-1])
        if tokens.ndim != 3:
            raise ValueError(f"layer {layer}: expected (B, T, C) tokens, got shape {tuple(tokens.shape)}")
        prefix = tokens.shape[1] - n
        if prefix not in (0, self.num_prefix_tokens):
            raise ValueError(
                f"layer {layer} carries {tokens.shape[1]} tokens but the {H}x{W} patch grid has {n} (+ "
                f"{self.num_prefix_tokens} prefix tokens): the model changes its token count between blocks; "
                "probe it per stage with site='stage_output'")
        return tokens[:, prefix:]

    def __call__(self, layer: int, tokens: torch.Tensor) -> None:
        """Hook callback of a flat ViT: ``tokens`` (B, T, C) on the batch's patch grid."""
        self.add(layer, self.patch_tokens(layer, tokens), self.grid)
        if layer == self.last_layer:
            raise _StopForward

    def add_feature_map(self, layer: int, fmap: torch.Tensor) -> None:
        """A stage's (B, C, H, W) feature map: its H x W positions are the tokens, on their own grid."""
        if fmap.ndim != 4:
            raise ValueError(f"stage {layer}: expected a (B, C, H, W) feature map, got shape {tuple(fmap.shape)}")
        self.add(layer, fmap.flatten(2).transpose(1, 2), (int(fmap.shape[2]), int(fmap.shape[3])))

    def add(self, layer: int, patches: torch.Tensor, grid: tuple[int, int]) -> None:
        """Add one layer's (B, N, C) tokens on ``grid`` (N = H * W) to the running sums."""
        known = self.grids.setdefault(layer, grid)
        if known != grid and self.want_map:
            raise ValueError(f"the token grid of layer {layer} changed from {known} to {grid} between batches: the "
                             "mean map needs one image size (resize the data, or use reduction='per_image')")
        if grid[0] * grid[1] > MAX_GRID_TOKENS:
            raise ValueError(f"layer {layer}'s grid {grid[0]}x{grid[1]} has {grid[0] * grid[1]:,} tokens, more than the "
                             f"{MAX_GRID_TOKENS:,} a similarity map is built for (its pairs and their ranks would need "
                             "tens of GB): probe the other layers (layers=...) or smaller images")
        if grid[0] * grid[1] < 2:  # no pair i < j (a 1 x 1 last stage of a CNN on small images): NaN, said in _finish
            self.too_small.add(layer)
            return
        z = F.normalize(patches.float(), dim=-1)  # (B, N, C) unit tokens
        if self.want_images:
            sim = torch.bmm(z, z.transpose(1, 2))  # (B, N, N) cosine similarity per image
            pairs = self._per_image(layer, sim, grid)  # (B, M) the pairs i < j
            if self.want_map:
                # summed in float64: a float32 sum adds columns in different orders, so a constant map came
                # out varying by a rounding step, and Spearman ranked that noise (a number where NaN is right)
                self._add_map(layer, pairs.sum(0, dtype=torch.float64), sim.diagonal(dim1=1, dim2=2).sum(0))
        else:  # the summed map in one GEMM: sum_b z_b z_b^T = Z Z^T with Z = (N, B * C)
            flat = z.transpose(0, 1).reshape(z.shape[1], -1)
            total = flat @ flat.T  # (N, N)
            self._add_map(layer, upper_pairs(total), total.diagonal())

    def _per_image(self, layer: int, sim: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        """Per-image SSDC of ``layer``'s maps sim (B, N, N): their pairs i < j are kept for
        :meth:`end_batch` when those of every probed layer of the batch fit in ``_DEFER_BYTES``, else
        computed now. Returns the pairs (B, M)."""
        B, n = sim.shape[0], sim.shape[-1]
        shape = (len(self.layers), B, n * (n - 1) // 2)
        if math.prod(shape) * sim.element_size() > _DEFER_BYTES:
            pairs = upper_pairs(sim)
            self._update(layer, ssdc_pairs(pairs, self._distance_targets(grid, sim.device)))
            return pairs
        buffer = self._pairs.get(grid)
        if buffer is None or buffer.shape != shape or buffer.device != sim.device:
            buffer = self._pairs[grid] = torch.empty(shape, dtype=sim.dtype, device=sim.device)
        waiting = self._batch.setdefault(grid, [])
        waiting.append(layer)
        return upper_pairs(sim, out=buffer[len(waiting) - 1])

    def end_batch(self) -> None:
        """Per-image SSDC of every probed layer of the batch kept by :meth:`_per_image`, one call per grid
        after the batch's forward pass.

        Deferred on purpose: between two layers the CPU's OpenMP threads of the forward still spin
        (up to milliseconds after each parallel op) and would halve the speed of the sort-bound SSDC;
        one call per batch also spreads L * B maps over the thread pool at once.
        """
        for grid, waiting in self._batch.items():
            _, B, M = self._pairs[grid].shape
            L = len(waiting)
            pairs = self._pairs[grid][:L].reshape(L * B, M)
            rhos = ssdc_pairs(pairs, self._distance_targets(grid, pairs.device))
            for k, layer in enumerate(waiting):
                self._update(layer, [r[k * B:(k + 1) * B] for r in rhos])
        self._batch = {}

    def _update(self, layer: int, rhos: list[torch.Tensor]) -> None:
        """Add one batch's per-image SSDC of ``layer``: against the index grid, and the content grid."""
        self.index_moments[layer].update(rhos[0])
        if len(rhos) > 1:
            self.content_moments[layer].update(rhos[1])

    def _add_map(self, layer: int, pair_sum: torch.Tensor, diag_sum: torch.Tensor) -> None:
        """Accumulate (in float64) the batch's summed similarities: pairs i < j (M,) and diagonal (N,)."""
        if layer in self.map_sum:
            self.map_sum[layer][0].add_(pair_sum)
            self.map_sum[layer][1].add_(diag_sum)
        else:
            self.map_sum[layer] = (pair_sum.to(torch.float64), diag_sum.to(torch.float64))

    def mean_map(self, layer: int, n_images: int) -> torch.Tensor:
        """(N, N) float64: the similarity map averaged over the images, rebuilt symmetric (a grid of
        fewer than 2 tokens: its N x N map of NaN, nothing having been summed)."""
        if layer in self.too_small:
            n = self.grids[layer][0] * self.grids[layer][1]
            return torch.full((n, n), math.nan, dtype=torch.float64)
        pair_sum, diag_sum = self.map_sum[layer]
        n = diag_sum.numel()
        iu = torch.triu_indices(n, n, offset=1, device=pair_sum.device)
        full = torch.diag(diag_sum)
        full[iu[0], iu[1]] = pair_sum
        full[iu[1], iu[0]] = pair_sum
        return full / n_images


def _batches(data: Any, batch_size: int | None) -> Iterator[torch.Tensor]:
    """Image batches (B, C, H, W) from a tensor, or an iterable of tensors / (images, ...) / dicts."""
    if isinstance(data, torch.Tensor):
        images = data[None] if data.ndim == 3 else data
        step = batch_size or max(len(images), 1)
        for start in range(0, len(images), step):
            yield _check_images(images[start:start + step])
        return
    if isinstance(data, dict):
        yield _check_images(_images_of(data))
        return
    if not isinstance(data, Iterable):
        raise TypeError(f"data must be a tensor or an iterable of batches, got {type(data).__name__}")
    for batch in data:
        yield _check_images(_images_of(batch))


class _Shard:
    """This process's batches when ``world`` processes share ``data`` (see ``distributed`` in
    :func:`probe_ssdc`): global batch k goes to process k mod ``world``, cut at the global ``max_images``.

    ``seen`` counts the images of every process's batches (None for a pre-sharded ``data``): after
    the iteration, the same on every process, and the sum of the processes' images.
    """

    def __init__(self, data: Any, batch_size: int | None, world: int, rank: int, max_images: int | None,
                 presharded: bool) -> None:
        self.data, self.batch_size, self.world, self.rank = data, batch_size, world, rank
        self.max_images, self.presharded = max_images, presharded
        self.seen: int | None = None
        if not presharded and isinstance(data, DataLoader) and isinstance(data.sampler, RandomSampler) \
                and data.sampler.generator is None and data.generator is None:
            raise ValueError("a shuffling DataLoader without a seeded generator cannot be shared by batch across "
                             "processes (each would draw its own order): pass an unshuffled one, or shard it "
                             "yourself and pass distributed='presharded'")

    def __iter__(self) -> Iterator[torch.Tensor]:
        data, world, rank, limit = self.data, self.world, self.rank, self.max_images
        if self.presharded:
            yield from _batches(data, self.batch_size)
            return
        if isinstance(data, torch.Tensor):
            images = data[None] if data.ndim == 3 else data
            images = images[:limit] if limit is not None else images
            step = self.batch_size or max(len(images), 1)
            self.seen = len(images)
            for start in range(rank * step, len(images), world * step):
                yield _check_images(images[start:start + step])
            return
        sharded = _dist.shard_dataloader(data, limit, world, rank)
        if sharded is not None:  # each process loads only its own batches
            loader, self.seen = sharded
            yield from _batches(loader, None)
            return
        self.seen = 0  # any other iterable: every process reads it all, and forwards its own batches
        for k, images in enumerate(_batches(data, self.batch_size)):
            if limit is not None:
                images = images[:limit - self.seen]
            if len(images):
                self.seen += len(images)
                if k % world == rank:
                    yield images
            if limit is not None and self.seen >= limit:
                break


def _data_signature(data: Any) -> Any:
    """What every process must agree on about ``data`` before sharing it (its length where known)."""
    if isinstance(data, torch.Tensor):
        return ("tensor", tuple(data.shape))
    if isinstance(data, DataLoader):
        try:
            size = len(data.dataset)
        except TypeError:
            size = None
        return ("DataLoader", size, data.batch_size)
    try:
        return (type(data).__name__, len(data))
    except TypeError:
        return (type(data).__name__, None)


def _images_of(batch: Any) -> torch.Tensor:
    if isinstance(batch, torch.Tensor):
        return batch[None] if batch.ndim == 3 else batch
    if isinstance(batch, (tuple, list)) and batch and isinstance(batch[0], torch.Tensor):
        return _images_of(batch[0])
    if isinstance(batch, dict):
        for key in ("image", "pixel_values", "images"):
            if isinstance(batch.get(key), torch.Tensor):
                return _images_of(batch[key])
        raise TypeError(f"a dict batch needs an 'image' or 'pixel_values' tensor, got keys {sorted(batch)}")
    raise TypeError("each batch must be an image tensor (B, C, H, W), an (images, labels, ...) tuple or a dict "
                    f"with 'image'/'pixel_values'; got {type(batch).__name__}")


def _check_images(images: torch.Tensor) -> torch.Tensor:
    if images.ndim != 4:
        raise ValueError(f"expected an image batch (B, C, H, W), got shape {tuple(images.shape)}")
    return images


def _resolve_layers(layers: Sequence[int] | None, depth: int) -> list[int]:
    if layers is None:
        return list(range(depth))
    out = []
    for layer in layers:
        k = int(layer)
        if not -depth <= k < depth:
            raise ValueError(f"layer {layer} is out of range for a model with {depth} blocks")
        out.append(k % depth)
    if not out:
        raise ValueError("layers is empty")
    return sorted(set(out))


def _placement(model: nn.Module, device: str | torch.device | None) -> tuple[torch.device, torch.device, torch.dtype]:
    """(where the model's weights are, where to run it: ``device`` or there, the dtype of its inputs)."""
    param = next((p for p in model.parameters() if p.is_floating_point()), None)
    home = param.device if param is not None else torch.device("cpu")
    return home, torch.device(device) if device is not None else home, param.dtype if param is not None else torch.float32


def _model_name(model: nn.Module) -> str:
    cfg = getattr(model, "pretrained_cfg", None) or getattr(model, "default_cfg", None) or {}
    return str(cfg.get("architecture") or type(model).__name__)


def probe_ssdc(
        model: nn.Module,
        data: Any,
        *,
        site: str = "auto",
        rpi: bool = False,
        seed: int | None = 0,
        reduction: str = "mean_map",
        distance: str = "manhattan",
        layers: Sequence[int] | None = None,
        max_images: int | None = None,
        device: str | torch.device | None = None,
        progress: bool = True,
        batch_size: int | None = 64,
        distributed: str = "auto",
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
            ``forward_intermediates``, on its own grid: ``metadata["grid_sizes"]``).
        rpi: random permutation at inference: one permutation of the patch-token contents (drawn
            from ``seed``) for the whole probe, after the patch embedding and before any PE.
            ``per_layer`` is then SSDC against the index grid (the paper's) and
            ``content_per_layer`` against the content grid (NaN for a stage whose grid is not the
            patch grid: its tokens mix several patches). Refused for models without a patch embedding.
        seed: seed of the RPI permutation (None: torch's global RNG; with several processes, a seed
            drawn on the main process and shared, recorded in ``metadata["seed"]``).
        reduction: ``mean_map`` (the paper's: SSDC of the similarity map averaged over all images),
            ``per_image`` (mean, std and 95% CI of the per-image SSDC) or ``both``.
        distance: ``manhattan`` (the paper's), ``euclidean`` or ``chebyshev``.
        layers: block (or stage) indices to probe (negative allowed); default all.
        max_images: stop after this many images (with several processes: this many in all).
        device: run there (the model is moved for the probe and moved back); default the model's.
        progress: show a tqdm bar (on the main process only, when several share the probe).
        batch_size: chunk size when ``data`` is one tensor.
        distributed: how several processes (``accelerate launch``, ``torchrun``: see
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
    if distributed not in DISTRIBUTED_MODES:
        raise ValueError(f"unknown distributed mode {distributed!r}; expected one of {', '.join(DISTRIBUTED_MODES)}")
    site = resolve_site(model, site)
    if reduction not in REDUCTIONS:
        raise ValueError(f"unknown reduction {reduction!r}; expected one of {', '.join(REDUCTIONS)}")
    if distance not in DISTANCES:
        raise ValueError(f"unknown distance {distance!r}; expected one of {', '.join(DISTANCES)}")
    if max_images is not None and max_images < 1:
        raise ValueError(f"max_images must be >= 1, got {max_images}")
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1):
        raise ValueError(f"batch_size must be an integer >= 1 (or None: the whole tensor at once), got {batch_size!r}")
    if rpi:
        find_embed_module(model)  # a model without a patch embedding (CNNs): refused before any data is read
    else:
        check_unpermuted(model, "probe_ssdc(rpi=False)")
    sites = find_stages(model) if site == "stage_output" else find_sites(model)
    depth = len(sites.names) if site == "stage_output" else len(sites.blocks)
    layer_ids = _resolve_layers(layers, depth)
    world = _dist.setup() if distributed != "off" else 1
    shard = None
    if world > 1:  # the same call on every process, or an error on every one (not a wait in a collective)
        _dist.check_same((site, rpi, seed, reduction, distance, layer_ids, max_images, batch_size, distributed,
                          None if distributed == "presharded" else _data_signature(data)), "probe_ssdc settings or data")
        if distributed == "presharded" and max_images is not None:
            raise ValueError("max_images cannot be applied to pre-sharded data (each process holds its own shard): "
                             "cut the shards instead, or pass the whole data with distributed='auto'")
        if rpi:
            seed = _dist.shared_seed(seed)
        shard = _Shard(data, batch_size, world, _dist.rank(), max_images, distributed == "presharded")

    home, device, dtype = _placement(model, device)

    total = max_images if max_images is not None else (len(data) if isinstance(data, torch.Tensor) else None)
    from tqdm.auto import tqdm

    show = progress and (shard is None or _dist.is_main())
    bar = tqdm(total=total if shard is None else None, unit="img", desc="probe_ssdc", disable=not show, leave=False)
    limit = max_images if shard is None else None  # a shard's batches are cut at the global max_images already
    with _dist.fail_together() if shard is not None else contextlib.nullcontext():
        acc, n_images, image_size = _stream(model, shard if shard is not None else _batches(data, batch_size),
                                            sites, site, layer_ids, reduction, distance, rpi, seed, limit, device,
                                            home, dtype, bar)
    if shard is not None:
        n_images, image_size = _reduce_across_processes(acc, n_images, image_size, shard.seen)
    if n_images == 0:
        raise ValueError("data yielded no images")
    return _finish(acc, sites, layer_ids, reduction, distance, rpi, seed, site, n_images, image_size, model)


def _stream(model: nn.Module, batches: Iterable[torch.Tensor], sites: ProbeSites | StageSites, site: str,
            layer_ids: list[int], reduction: str, distance: str, rpi: bool, seed: int | None,
            max_images: int | None, device: torch.device, home: torch.device, dtype: torch.dtype,
            bar: Any) -> tuple[_Accumulator, int, tuple[int, int] | None]:
    """This process's part of :func:`probe_ssdc`: ``batches`` through the model into an accumulator.
    Returns (accumulator, images, the first batch's image size)."""
    hooks = []
    n_images = 0
    image_size = None
    try:
        if device != home:
            model.to(device)
        rpi_ctx = token_permutation(model, seed=seed, per="call") if rpi else contextlib.nullcontext()
        with torch.no_grad(), eval_mode(model), rpi_ctx as handle:
            num_prefix = getattr(sites, "num_prefix_tokens", 0)
            acc = _Accumulator(layer_ids, reduction, distance, handle, num_prefix)
            if site != "stage_output":
                hooks = sites.register(site, layer_ids, acc)
            for images in batches:
                if max_images is not None:
                    images = images[:max_images - n_images]
                if len(images) == 0:
                    continue
                hw = (int(images.shape[-2]), int(images.shape[-1]))
                image_size = image_size or hw
                images = images.to(device=device, dtype=dtype, non_blocking=True)
                if site == "stage_output":
                    _forward_stages(sites, acc, images, layer_ids, handle)
                else:
                    acc.start_batch(sites.grid_size(hw))
                    try:
                        model(images)
                    except _StopForward:
                        pass
                acc.end_batch()
                n_images += len(images)
                bar.update(len(images))
                if max_images is not None and n_images >= max_images:
                    break
    finally:
        for h in hooks:
            h.remove()
        bar.close()
        if device != home:
            model.to(home)
    return acc, n_images, image_size


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
    grids: dict[int, tuple[int, int]] = {}
    for s in states:
        for layer, grid in s["grids"].items():
            known = grids.setdefault(layer, grid)
            if known != grid and acc.want_map:
                raise ValueError(f"the token grid of layer {layer} differs between processes ({known} vs {grid}): "
                                 "the mean map needs one image size (resize the data, or use reduction='per_image')")
    acc.grids = grids
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
        for layer in acc.layers:  # the same layers, in the same order, on every process
            if layer in acc.too_small or layer not in grids:
                continue
            n = grids[layer][0] * grids[layer][1]
            m = n * (n - 1) // 2
            local = acc.map_sum.get(layer)
            flat = torch.cat(local) if local is not None else torch.zeros(m + n, dtype=torch.float64)
            flat = _dist.all_reduce_sum(flat)
            acc.map_sum[layer] = (flat[:m], flat[m:])
    return total, image_size


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


def _finish(acc: _Accumulator, sites: ProbeSites | StageSites, layers: list[int], reduction: str, distance: str,
            rpi: bool, seed, site: str, n_images: int, image_size, model: nn.Module) -> SSDCResult:
    grids = [acc.grids[layer] for layer in layers]
    perm = acc.permutation.permutation.cpu() if rpi else None
    mean_maps = per_layer = content = None
    flat: list[int] = []
    if acc.too_small:
        names = ", ".join(f"{layer} ({'x'.join(map(str, acc.grids[layer]))})" for layer in sorted(acc.too_small))
        warnings.warn(f"SSDC is undefined (NaN) where the grid has fewer than 2 tokens: layer(s) {names}; use larger "
                      "images", ConstantMapWarning, stacklevel=3)
    if acc.want_map:
        maps = [acc.mean_map(layer, n_images) for layer in layers]  # (N_l, N_l) float64 each
        flat = [layer for layer in layers if layer not in acc.too_small and _near_constant(acc.map_sum[layer][0])]
        if flat:
            warnings.warn(f"the mean similarity map of layer(s) {', '.join(map(str, flat))} is constant up to float "
                          "rounding (every patch token alike): its SSDC is undefined (NaN)", ConstantMapWarning,
                          stacklevel=3)
        per_layer = [float(ssdc(m, g, distance)) if layer not in acc.too_small and layer not in flat else math.nan
                     for layer, m, g in zip(layers, maps, grids)]
        if rpi:
            content = [float(ssdc(m, g, distance, positions=grid_positions(g)[perm]))
                       if acc.content_defined(g) and layer not in acc.too_small and layer not in flat else math.nan
                       for layer, m, g in zip(layers, maps, grids)]
        same = len({m.shape for m in maps}) == 1
        mean_maps = torch.stack(maps).float().cpu() if same else [m.float().cpu() for m in maps]
    per_image = content_per_image = None
    if acc.want_images:
        per_image = [acc.index_moments[layer].stats() for layer in layers]
        if rpi:
            content_per_image = [acc.content_moments[layer].stats() for layer in layers]
        if per_layer is None:
            per_layer = [s.mean for s in per_image]
            content = [s.mean for s in content_per_image] if rpi else None
    staged = site == "stage_output"
    metadata = {
        "model": _model_name(model), "site": site, "reduction": reduction, "rpi": rpi,
        "seed": seed if rpi else None, "distance": distance, "n_images": n_images,
        "image_size": list(image_size), "grid_size": list(grids[0]), "grid_sizes": [list(g) for g in grids],
        "num_prefix_tokens": 0 if staged else sites.num_prefix_tokens, "family": sites.family,
        "granularity": "stage" if staged else "block",
        # layers whose mean map is constant up to float rounding (their SSDC NaN, with a ConstantMapWarning)
        "constant_layers": flat if acc.want_map else [],
    }
    if staged:
        metadata["modules"] = [sites.names[layer] for layer in layers]
    return SSDCResult(per_layer=per_layer, layers=list(layers), per_image=per_image, content_per_layer=content,
                      content_per_image=content_per_image, mean_maps=mean_maps, permutation=perm,
                      metadata=metadata)
