"""``probe_ssdc``: SSDC of any flat timm ViT, layer by layer, streamed over a whole dataset.

Per batch and probed layer: patch tokens (B, N, C) -> unit-normalised -> cosine maps (B, N, N).
Only running sums are kept (the summed map per layer, and streaming per-image moments), so memory
does not grow with the number of images. The SSDC formula lives in :mod:`.spearman`; this module is
the edge: hooks, data, devices, progress. Definitions: docs/method.md#similarity-maps-and-probe-sites.
"""
from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..interventions import eval_mode, token_permutation
from .result import PerImageStats, SSDCResult
from .sites import SITES, ProbeSites, find_sites
from .spearman import DISTANCES, _distance_ranks, grid_positions, ssdc, ssdc_pairs, upper_pairs

__all__ = ["probe_ssdc", "REDUCTIONS"]

REDUCTIONS = ("mean_map", "per_image", "both")


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


class _Accumulator:
    """Hook target: turns the tokens of each probed layer into running sums."""

    def __init__(self, sites: ProbeSites, layers: list[int], reduction: str, distance: str,
                 permutation: Any | None) -> None:
        self.sites, self.layers, self.distance = sites, layers, distance
        self.want_map = reduction in ("mean_map", "both")
        self.want_images = reduction in ("per_image", "both")
        self.permutation = permutation  # TokenPermutation handle under RPI
        self.last_layer = max(layers)
        self.grid: tuple[int, int] | None = None
        self.map_grid: tuple[int, int] | None = None
        self.map_sum: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.index_moments = {layer: _Moments() for layer in layers}
        self.content_moments = {layer: _Moments() for layer in layers}
        self._targets: list | None = None
        self._slot = {layer: k for k, layer in enumerate(layers)}
        self._pairs: torch.Tensor | None = None  # (L, B, M) this batch's per-image pairs i < j, per layer
        self._pending = False  # _pairs holds this batch's maps, for end_batch

    def start_batch(self, grid: tuple[int, int]) -> None:
        if self.want_map and self.map_grid is not None and grid != self.map_grid:
            raise ValueError(f"the token grid changed from {self.map_grid} to {grid} between batches: the mean "
                             "map needs one image size (resize the data, or use reduction='per_image')")
        self.grid = grid
        self.map_grid = self.map_grid or grid
        self._targets = None
        self._pending = False

    def _distance_targets(self, device: torch.device) -> list:
        if self._targets is None:  # after the patch embedding ran: the permutation of this batch is known
            targets = [_distance_ranks(self.grid, self.distance, None, device)]
            if self.permutation is not None:
                targets.append(_distance_ranks(self.grid, self.distance, self.content_positions(), device))
            self._targets = targets
        return self._targets

    def content_positions(self) -> torch.Tensor:
        """(N, 2) grid position of the content held by each token slot (slot i holds patch p[i])."""
        perm = self.permutation.permutation
        return grid_positions(self.grid)[perm.cpu()]

    def patch_tokens(self, layer: int, tokens: torch.Tensor) -> torch.Tensor:
        """(B, T, C) or (B, H, W, C) -> the (B, N, C) patch tokens, prefix tokens dropped."""
        H, W = self.grid
        n = H * W
        if tokens.ndim == 4:
            tokens = tokens.reshape(tokens.shape[0], -1, tokens.shape[-1])
        if tokens.ndim != 3:
            raise ValueError(f"layer {layer}: expected (B, T, C) tokens, got shape {tuple(tokens.shape)}")
        prefix = tokens.shape[1] - n
        if prefix not in (0, self.sites.num_prefix_tokens):
            raise ValueError(
                f"layer {layer} carries {tokens.shape[1]} tokens but the {H}x{W} patch grid has {n} (+ "
                f"{self.sites.num_prefix_tokens} prefix tokens): the model changes its token count (hierarchical, "
                "pooling or token-dropping models are not supported)")
        return tokens[:, prefix:]

    def __call__(self, layer: int, tokens: torch.Tensor) -> None:
        patches = self.patch_tokens(layer, tokens)
        z = F.normalize(patches.float(), dim=-1)  # (B, N, C) unit tokens
        if self.want_images:
            sim = torch.bmm(z, z.transpose(1, 2))  # (B, N, N) cosine similarity per image
            pairs = self._per_image(layer, sim)  # (B, M) the pairs i < j
            if self.want_map:
                self._add_map(layer, pairs.sum(0), sim.diagonal(dim1=1, dim2=2).sum(0))
        else:  # the summed map in one GEMM: sum_b z_b z_b^T = Z Z^T with Z = (N, B * C)
            flat = z.transpose(0, 1).reshape(z.shape[1], -1)
            total = flat @ flat.T  # (N, N)
            self._add_map(layer, upper_pairs(total), total.diagonal())
        if layer == self.last_layer:
            raise _StopForward

    def _per_image(self, layer: int, sim: torch.Tensor) -> torch.Tensor:
        """Per-image SSDC of ``layer``'s maps sim (B, N, N): their pairs i < j are kept for
        :meth:`end_batch` when those of every probed layer of the batch fit in ``_DEFER_BYTES``, else
        computed now. Returns the pairs (B, M)."""
        B, n = sim.shape[0], sim.shape[-1]
        shape = (len(self.layers), B, n * (n - 1) // 2)
        if math.prod(shape) * sim.element_size() > _DEFER_BYTES:
            pairs = upper_pairs(sim)
            self._update(layer, ssdc_pairs(pairs, self._distance_targets(sim.device)))
            return pairs
        if self._pairs is None or self._pairs.shape != shape or self._pairs.device != sim.device:
            self._pairs = torch.empty(shape, dtype=sim.dtype, device=sim.device)
        self._pending = True
        return upper_pairs(sim, out=self._pairs[self._slot[layer]])

    def end_batch(self) -> None:
        """Per-image SSDC of every probed layer of the batch kept by :meth:`_per_image`, in one call
        after the batch's forward pass.

        Deferred on purpose: between two layers the CPU's OpenMP threads of the forward still spin
        (up to milliseconds after each parallel op) and would halve the speed of the sort-bound SSDC;
        one call per batch also spreads L * B maps over the thread pool at once.
        """
        if not self._pending:
            return
        L, B, M = self._pairs.shape
        rhos = ssdc_pairs(self._pairs.view(L * B, M), self._distance_targets(self._pairs.device))
        for layer, k in self._slot.items():
            self._update(layer, [r[k * B:(k + 1) * B] for r in rhos])
        self._pending = False

    def _update(self, layer: int, rhos: list[torch.Tensor]) -> None:
        """Add one batch's per-image SSDC of ``layer``: against the index grid, and the content grid."""
        self.index_moments[layer].update(rhos[0])
        if self.permutation is not None:
            self.content_moments[layer].update(rhos[1])

    def _add_map(self, layer: int, pair_sum: torch.Tensor, diag_sum: torch.Tensor) -> None:
        """Accumulate (in float64) the batch's summed similarities: pairs i < j (M,) and diagonal (N,)."""
        if layer in self.map_sum:
            self.map_sum[layer][0].add_(pair_sum)
            self.map_sum[layer][1].add_(diag_sum)
        else:
            self.map_sum[layer] = (pair_sum.to(torch.float64), diag_sum.to(torch.float64))

    def mean_map(self, layer: int, n_images: int) -> torch.Tensor:
        """(N, N) float64: the similarity map averaged over the images, rebuilt symmetric."""
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


def _model_name(model: nn.Module) -> str:
    cfg = getattr(model, "pretrained_cfg", None) or getattr(model, "default_cfg", None) or {}
    return str(cfg.get("architecture") or type(model).__name__)


def probe_ssdc(
        model: nn.Module,
        data: Any,
        *,
        site: str = "attn_input",
        rpi: bool = False,
        seed: int | None = 0,
        reduction: str = "mean_map",
        distance: str = "manhattan",
        layers: Sequence[int] | None = None,
        max_images: int | None = None,
        device: str | torch.device | None = None,
        progress: bool = True,
        batch_size: int | None = 64,
) -> SSDCResult:
    """SSDC of every (or the chosen) block of a timm ViT, streamed over ``data``.

    For each probed layer, the patch tokens at ``site`` (prefix tokens dropped) are unit-normalised
    and their cosine-similarity map S (N x N) formed per image; SSDC = Spearman({S_ij}, {-D_ij}) over
    i < j with D the grid distance (see :func:`~timm_posgeom.probes.spearman.ssdc`).

    Args:
        model: a flat timm ViT (see :mod:`.sites` for the families). Put in eval mode for the probe;
            its mode (and device, when ``device`` moves it) is restored afterwards.
        data: a tensor batch (B, C, H, W) (split into chunks of ``batch_size``), or any iterable of
            batches: tensors, (images, labels) tuples, or dicts with "image"/"pixel_values" (e.g. a
            DataLoader). Images must already be transformed for the model.
        site: ``attn_input`` (the paper's: the input of each block's attention, i.e. norm1's output)
            or ``block_output`` (the residual stream).
        rpi: random permutation at inference: one permutation of the patch-token contents (drawn
            from ``seed``) for the whole probe, after the patch embedding and before any PE.
            ``per_layer`` is then SSDC against the index grid (the paper's) and
            ``content_per_layer`` against the content grid.
        seed: seed of the RPI permutation (None: torch's global RNG).
        reduction: ``mean_map`` (the paper's: SSDC of the similarity map averaged over all images),
            ``per_image`` (mean, std and 95% CI of the per-image SSDC) or ``both``.
        distance: ``manhattan`` (the paper's), ``euclidean`` or ``chebyshev``.
        layers: block indices to probe (negative allowed); default all.
        max_images: stop after this many images.
        device: run there (the model is moved for the probe and moved back); default the model's.
        progress: show a tqdm bar.
        batch_size: chunk size when ``data`` is one tensor.

    Returns:
        An :class:`SSDCResult`.
    """
    if site not in SITES:
        raise ValueError(f"unknown site {site!r}; expected one of {', '.join(SITES)}")
    if reduction not in REDUCTIONS:
        raise ValueError(f"unknown reduction {reduction!r}; expected one of {', '.join(REDUCTIONS)}")
    if distance not in DISTANCES:
        raise ValueError(f"unknown distance {distance!r}; expected one of {', '.join(DISTANCES)}")
    if max_images is not None and max_images < 1:
        raise ValueError(f"max_images must be >= 1, got {max_images}")
    sites = find_sites(model)
    layer_ids = _resolve_layers(layers, len(sites.blocks))

    param = next((p for p in model.parameters() if p.is_floating_point()), None)
    home = param.device if param is not None else torch.device("cpu")
    device = torch.device(device) if device is not None else home
    dtype = param.dtype if param is not None else torch.float32

    total = max_images if max_images is not None else (len(data) if isinstance(data, torch.Tensor) else None)
    from tqdm.auto import tqdm

    bar = tqdm(total=total, unit="img", desc="probe_ssdc", disable=not progress, leave=False)
    hooks = []
    n_images = 0
    image_size = None
    try:
        if device != home:
            model.to(device)
        rpi_ctx = token_permutation(model, seed=seed, per="call") if rpi else contextlib.nullcontext()
        with torch.no_grad(), eval_mode(model), rpi_ctx as handle:
            acc = _Accumulator(sites, layer_ids, reduction, distance, handle)
            hooks = sites.register(site, layer_ids, acc)
            for images in _batches(data, batch_size):
                if max_images is not None:
                    images = images[:max_images - n_images]
                if len(images) == 0:
                    continue
                hw = (int(images.shape[-2]), int(images.shape[-1]))
                acc.start_batch(sites.grid_size(hw))
                image_size = image_size or hw
                try:
                    model(images.to(device=device, dtype=dtype, non_blocking=True))
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
    if n_images == 0:
        raise ValueError("data yielded no images")
    return _finish(acc, layer_ids, reduction, distance, rpi, seed, site, n_images, image_size, model)


def _finish(acc: _Accumulator, layers: list[int], reduction: str, distance: str, rpi: bool, seed,
            site: str, n_images: int, image_size, model: nn.Module) -> SSDCResult:
    grid = acc.map_grid
    perm = acc.permutation.permutation.cpu() if rpi else None
    mean_maps = per_layer = content = None
    if acc.want_map:
        maps = torch.stack([acc.mean_map(layer, n_images) for layer in layers])  # (L, N, N) float64
        per_layer = [float(v) for v in ssdc(maps, grid, distance)]
        if rpi:
            content = [float(v) for v in ssdc(maps, grid, distance, positions=grid_positions(grid)[perm])]
        mean_maps = maps.float().cpu()
    per_image = content_per_image = None
    if acc.want_images:
        per_image = [acc.index_moments[layer].stats() for layer in layers]
        if rpi:
            content_per_image = [acc.content_moments[layer].stats() for layer in layers]
        if per_layer is None:
            per_layer = [s.mean for s in per_image]
            content = [s.mean for s in content_per_image] if rpi else None
    metadata = {
        "model": _model_name(model), "site": site, "reduction": reduction, "rpi": rpi,
        "seed": seed if rpi else None, "distance": distance, "n_images": n_images,
        "image_size": list(image_size), "grid_size": list(grid), "num_prefix_tokens": acc.sites.num_prefix_tokens,
        "family": acc.sites.family,
    }
    return SSDCResult(per_layer=per_layer, layers=list(layers), per_image=per_image, content_per_layer=content,
                      content_per_image=content_per_image, mean_maps=mean_maps, permutation=perm,
                      metadata=metadata)
