"""Attention-level measures of a flat timm ViT, per block and per head, streamed over a dataset.

:func:`attention_measures` runs the data through the model with the hooks of :mod:`.attention` and
feeds each probed block's attention weights A (B, heads, T, T) to a set of measures, batch by batch.
Each measure keeps float64 running sums only (memory does not grow with the number of images), which
several processes reduce by summing. The built-in measures (definitions: docs/attention.md):

* ``mean_distance``: the attention-weighted mean Euclidean distance (in patch units) between a patch
  query and the patch keys, over patch keys renormalised, averaged over patch queries and images
  (the ViT paper's attention distance, Fig. 7, in patch units); also ``mean_distance_unnormalised``
  (prefix keys counted at distance 0, as common public code does) and ``prefix_attention`` (the mass
  a patch query puts on prefix tokens);
* ``entropy``: the entropy (nats) of a patch query's attention row over all T keys, averaged over
  patch queries and images;
* ``ssdc``: the SSDC formula (:mod:`.spearman`) applied to each head's mean attention map among patch
  tokens, symmetrised: S = (Abar + Abar^T) / 2 with Abar the patch x patch block averaged over images.

New measures subclass :class:`AttentionMeasure` and are passed as ``measures=[...]``.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn as nn

from .. import distributed as _dist
from ..interventions import eval_mode, pe_scale, token_permutation
from ..jsonio import dumps
from .attention import attention_modules, capture_attention
from .probe import _batches, _data_signature, _model_name, _resolve_layers, _Shard, _StopForward
from .sites import ProbeSites, find_sites
from .spearman import DISTANCES, _distance_ranks, grid_positions, ssdc_pairs, upper_pairs

__all__ = ["attention_measures", "AttentionResult", "AttentionMeasure", "AttentionView", "MeanAttentionDistance",
           "AttentionEntropy", "AttentionSSDC", "default_measures"]


@dataclass(frozen=True)
class AttentionView:
    """How to read one block's attention weights A (B, heads, T, T) of a batch.

    grid: the (H, W) patch grid; N = H * W patch tokens are the last N of the T tokens (row-major:
    token ``prefix + k`` sits at (k // W, k % W)), the first ``prefix`` = T - N are prefix tokens
    (class, register, distillation). Under RPI, slot k still sits at (k // W, k % W): the index grid.
    """

    layer: int
    grid: tuple[int, int]
    prefix: int

    @property
    def num_patches(self) -> int:
        return self.grid[0] * self.grid[1]


class AttentionMeasure:
    """A measure of attention weights, per probed block and head, reduced over images.

    Subclasses define :meth:`update` (one block's weights of one batch), keep their running sums in
    ``self.sums[(name, layer)]`` as float64 tensors (summed across processes) and define
    :meth:`finish`. ``names`` are the result fields it produces, each an (L, heads) array.
    """

    names: tuple[str, ...] = ()

    def __init__(self) -> None:
        self.sums: dict[tuple[str, int], torch.Tensor] = {}

    def add(self, name: str, layer: int, value: torch.Tensor) -> None:
        """Add ``value`` (any shape, the same every batch) into the float64 sum ``(name, layer)``."""
        value = value.detach().to("cpu", torch.float64)
        if (name, layer) in self.sums:
            self.sums[(name, layer)] += value
        else:
            self.sums[(name, layer)] = value.clone()

    def update(self, attn: torch.Tensor, view: AttentionView) -> None:
        """Consume one block's weights ``attn`` (B, heads, T, T) float32 of one batch."""
        raise NotImplementedError

    def finish(self, layers: list[int], n_images: int, grid: tuple[int, int]) -> dict[str, np.ndarray]:
        """The result fields, each (L, heads) float64, from the (reduced) sums over ``n_images`` images."""
        raise NotImplementedError

    def metadata(self) -> dict[str, Any]:
        """Settings to record in the result's metadata."""
        return {}


def _patch_block(attn: torch.Tensor, view: AttentionView) -> torch.Tensor:
    """(B, h, T, T) -> the (B, h, N, N) weights of patch queries on patch keys."""
    p = view.prefix
    return attn[:, :, p:, p:]


def _per_image_mean(name: str, measure: AttentionMeasure, layer: int, per_query: torch.Tensor) -> None:
    """per_query (B, h, N): mean over queries per image and head, summed over the batch's images."""
    measure.add(name, layer, per_query.double().mean(-1).sum(0))


def _stacked(measure: AttentionMeasure, name: str, layers: list[int], n_images: int) -> np.ndarray:
    return torch.stack([measure.sums[(name, layer)] for layer in layers]).numpy() / n_images


class MeanAttentionDistance(AttentionMeasure):
    """Mean attention distance (ViT paper, Fig. 7), Euclidean, in patch units.

    For a patch query i and patch keys j (positions on the grid, d_ij Euclidean):
    ``mean_distance`` = sum_j A_ij d_ij / sum_j A_ij (patch keys only, renormalised: prefix tokens have
    no position); ``mean_distance_unnormalised`` = sum_j A_ij d_ij (prefix keys weigh in at distance 0,
    as common public code computes it); ``prefix_attention`` = 1 - sum_j A_ij, the mass on prefix keys.
    Each is averaged over the patch queries of an image, then over images. Multiply by the patch size
    for pixels (square patches).
    """

    names = ("mean_distance", "mean_distance_unnormalised", "prefix_attention")

    def __init__(self) -> None:
        super().__init__()
        self._dist: dict[tuple[tuple[int, int], torch.device], torch.Tensor] = {}

    def _distances(self, grid: tuple[int, int], device: torch.device) -> torch.Tensor:
        key = (grid, device)
        if key not in self._dist:
            pos = grid_positions(grid)
            self._dist[key] = torch.cdist(pos, pos).float().to(device)  # (N, N) Euclidean, patch units
        return self._dist[key]

    def update(self, attn: torch.Tensor, view: AttentionView) -> None:
        a = _patch_block(attn, view)
        mass = a.sum(-1)  # (B, h, N)
        weighted = (a * self._distances(view.grid, a.device)).sum(-1)  # (B, h, N)
        _per_image_mean("mean_distance", self, view.layer, weighted / mass)
        _per_image_mean("mean_distance_unnormalised", self, view.layer, weighted)
        _per_image_mean("prefix_attention", self, view.layer, 1.0 - mass)

    def finish(self, layers: list[int], n_images: int, grid: tuple[int, int]) -> dict[str, np.ndarray]:
        return {name: _stacked(self, name, layers, n_images) for name in self.names}


class AttentionEntropy(AttentionMeasure):
    """``entropy``: H_i = -sum_j A_ij log A_ij (nats, 0 log 0 = 0) of a patch query's attention row over
    all T keys (prefix keys included: the softmax's own distribution), averaged over the patch queries
    of an image, then over images. Uniform attention over T keys gives log T."""

    names = ("entropy",)

    def update(self, attn: torch.Tensor, view: AttentionView) -> None:
        rows = attn[:, :, view.prefix:, :]  # (B, h, N, T) patch queries, every key
        _per_image_mean("entropy", self, view.layer, -torch.special.xlogy(rows, rows).sum(-1))

    def finish(self, layers: list[int], n_images: int, grid: tuple[int, int]) -> dict[str, np.ndarray]:
        return {"entropy": _stacked(self, "entropy", layers, n_images)}


class AttentionSSDC(AttentionMeasure):
    """``ssdc`` per head: SSDC (:func:`~timm_posgeom.probes.ssdc`, ``distance`` on the index grid) of
    S = (Abar + Abar^T) / 2, Abar (N, N) the weights of patch queries on patch keys averaged over images
    (not renormalised). NaN for a map constant over the pairs i < j."""

    names = ("ssdc",)

    def __init__(self, distance: str = "manhattan") -> None:
        super().__init__()
        if distance not in DISTANCES:
            raise ValueError(f"unknown distance {distance!r}; expected one of {', '.join(DISTANCES)}")
        self.distance = distance

    def update(self, attn: torch.Tensor, view: AttentionView) -> None:
        a = _patch_block(attn, view).sum(0, dtype=torch.float64)  # (h, N, N) summed over the batch
        self.add("pair_sum", view.layer, upper_pairs(a + a.transpose(1, 2)) / 2)  # (h, M) pairs i < j

    def finish(self, layers: list[int], n_images: int, grid: tuple[int, int]) -> dict[str, np.ndarray]:
        target = _distance_ranks(grid, self.distance, None, torch.device("cpu"))
        rows = [ssdc_pairs(self.sums[("pair_sum", layer)] / n_images, [target])[0] for layer in layers]
        return {"ssdc": torch.stack(rows).numpy()}

    def metadata(self) -> dict[str, Any]:
        return {"ssdc_distance": self.distance}


def default_measures(distance: str = "manhattan") -> list[AttentionMeasure]:
    """Fresh instances of the built-in measures: distance, entropy, SSDC per head."""
    return [MeanAttentionDistance(), AttentionEntropy(), AttentionSSDC(distance)]


FIELDS = ("mean_distance", "entropy", "ssdc", "prefix_attention", "mean_distance_unnormalised")


@dataclass
class AttentionResult:
    """Attention measures of one model, per probed block (rows) and head (columns).

    Attributes:
        layers: the block index of each row.
        values: field name -> (L, heads) float64 array (``mean_distance``, ``mean_distance_unnormalised``,
            ``prefix_attention``, ``entropy``, ``ssdc`` and any custom measure's fields).
        permutation: under RPI, the (N,) permutation p used for every batch (slot i holds patch p[i]).
        metadata: model, rpi, seed, alpha, n_images, image_size, grid_size, num_prefix_tokens, num_heads,
            patch_size, ssdc_distance, distance ("euclidean, patch units"), family.
    """

    layers: list[int]
    values: dict[str, np.ndarray]
    permutation: torch.Tensor | None = field(default=None, repr=False)
    metadata: dict[str, Any] = field(default_factory=dict)

    def __getattr__(self, name: str) -> np.ndarray:
        values = self.__dict__.get("values") or {}
        if name in values:
            return values[name]
        raise AttributeError(name)

    def head_mean(self, name: str) -> np.ndarray:
        """(L,) the mean over heads of field ``name`` (NaN heads left out)."""
        with np.errstate(all="ignore"):
            return np.nanmean(self.values[name], axis=1) if self.values[name].size else self.values[name][:, 0]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: every field as a list of L lists of per-head values."""
        return {"layers": list(self.layers), **{k: v.tolist() for k, v in self.values.items()},
                "permutation": self.permutation.tolist() if self.permutation is not None else None,
                "metadata": dict(self.metadata)}

    def to_json(self, path: str | Path | None = None, indent: int = 2) -> str:
        """:meth:`to_dict` as JSON (NaN written as null); also written to ``path`` when given."""
        text = dumps(self.to_dict(), indent=indent)
        if path is not None:
            Path(path).write_text(text + "\n")
        return text

    def table(self) -> str:
        """Plain text: per layer, the mean over heads and the range over heads of each built-in field."""
        cols = [f for f in FIELDS[:4] if f in self.values]
        head = ["layer"] + [f"{c} (mean [min, max])" for c in cols]
        rows = [head]
        for k, layer in enumerate(self.layers):
            row = [str(layer)]
            for c in cols:
                v = self.values[c][k]
                row.append(f"{np.nanmean(v):.3f} [{np.nanmin(v):.3f}, {np.nanmax(v):.3f}]"
                           if np.isfinite(v).any() else "nan")
            rows.append(row)
        widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
        return "\n".join("  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows)

    def plot(self, path: str | Path | None = None):
        """Per-head figure: one panel per built-in field, each head a dot at its layer (as the ViT paper's
        Fig. 7), the mean over heads a line. Agg canvas (no display). Returns the Figure."""
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        cols = [f for f in FIELDS[:4] if f in self.values]
        labels = {"mean_distance": "mean attention distance (patches)", "entropy": "attention entropy (nats)",
                  "ssdc": "attention SSDC (symmetrised)", "prefix_attention": "attention on prefix tokens"}
        fig = Figure(figsize=(3.6 * len(cols), 3.4), layout="constrained")
        FigureCanvasAgg(fig)
        axes = fig.subplots(1, len(cols), squeeze=False)[0]
        layers = np.asarray(self.layers)
        for ax, c in zip(axes, cols):
            v = self.values[c]
            for h in range(v.shape[1]):
                ax.scatter(layers, v[:, h], s=10, alpha=0.7)
            ax.plot(layers, self.head_mean(c), "k-", lw=1, label="mean over heads")
            ax.set_xlabel("layer")
            ax.set_ylabel(labels.get(c, c))
        md = self.metadata
        axes[0].legend(fontsize=7)
        fig.suptitle(f"{md.get('model', '')}{' RPI' if md.get('rpi') else ''}"
                     f"{'' if md.get('alpha') is None else ' alpha=' + str(md['alpha'])}", fontsize=9)
        if path is not None:
            fig.savefig(path, dpi=120)
        return fig


class _Router:
    """Hook target: hands each probed block's weights to every measure; stops after the last block."""

    def __init__(self, measures: list[AttentionMeasure], last: int, prefix: int) -> None:
        self.measures, self.last, self.prefix = measures, last, prefix
        self.grid: tuple[int, int] | None = None
        self.heads: dict[int, int] = {}

    def __call__(self, layer: int, attn: torch.Tensor) -> None:
        n = self.grid[0] * self.grid[1]
        prefix = attn.shape[-1] - n
        if prefix not in (0, self.prefix):
            raise ValueError(f"block {layer}'s attention covers {attn.shape[-1]} tokens but the {self.grid[0]}x"
                             f"{self.grid[1]} grid has {n} patches (+ {self.prefix} prefix tokens)")
        self.heads[layer] = int(attn.shape[1])
        view = AttentionView(layer=layer, grid=self.grid, prefix=prefix)
        for m in self.measures:
            m.update(attn, view)
        if layer == self.last:
            raise _StopForward


def attention_measures(
        model: nn.Module,
        data: Any,
        *,
        rpi: bool = False,
        seed: int | None = 0,
        alpha: float | None = None,
        layers: list[int] | None = None,
        distance: str = "manhattan",
        measures: list[AttentionMeasure] | None = None,
        max_images: int | None = None,
        device: str | torch.device | None = None,
        progress: bool = True,
        batch_size: int | None = 64,
        distributed: str = "auto",
) -> AttentionResult:
    """Mean attention distance, attention entropy and attention SSDC, per block and head, over ``data``.

    Definitions: docs/attention.md (and the classes :class:`MeanAttentionDistance`,
    :class:`AttentionEntropy`, :class:`AttentionSSDC`). The weights are recomputed from each attention
    module's own queries and keys (:mod:`.attention`); the model's outputs are unchanged.

    Args:
        model: a flat timm ViT whose blocks use timm's ``Attention`` / ``AttentionRope`` or eva's
            ``EvaAttention`` (vision_transformer, deit, eva incl. RoPE, ``posgeom_vit_*``); eval mode
            is set for the call and restored.
        data: as :func:`~timm_posgeom.probes.probe_ssdc`: a (B, C, H, W) tensor (chunks of
            ``batch_size``) or an iterable of batches, transformed for the model; one image size.
        rpi: random permutation of the patch tokens at inference (one permutation from ``seed`` for
            the whole call, as :func:`~timm_posgeom.probes.probe_ssdc`); the distances stay those of
            the index grid (token slots), as SSDC under RPI.
        seed: the RPI permutation's seed.
        alpha: scale the positional encoding by alpha for the call (:func:`~timm_posgeom.pe_scale`);
            None leaves the model as it is.
        layers: block indices (negative allowed); default every block.
        distance: the grid distance of the attention SSDC (``manhattan``, the paper's; ``euclidean``;
            ``chebyshev``). The mean attention distance is always Euclidean.
        measures: the measures to run (default :func:`default_measures`\\ (``distance``)).
        max_images, device, progress, batch_size, distributed: as
            :func:`~timm_posgeom.probes.probe_ssdc` (several processes sum their float64 sums).

    Returns:
        An :class:`AttentionResult`: each field (L, heads).
    """
    if distributed not in ("auto", "presharded", "off"):
        raise ValueError(f"unknown distributed mode {distributed!r}; expected auto, presharded or off")
    if max_images is not None and max_images < 1:
        raise ValueError(f"max_images must be >= 1, got {max_images}")
    if alpha is not None and not (math.isfinite(alpha) and alpha >= 0):
        raise ValueError(f"alpha must be a finite number >= 0, got {alpha}")
    measures = default_measures(distance) if measures is None else list(measures)
    if not measures:
        raise ValueError("measures is empty")
    sites = find_sites(model)
    layer_ids = _resolve_layers(layers, len(sites.blocks))
    attention_modules(sites, layer_ids)  # refuse an unsupported attention before reading any data
    world = _dist.setup() if distributed != "off" else 1
    shard = None
    if world > 1:
        _dist.check_same((rpi, seed, alpha, distance, layer_ids, max_images, batch_size, distributed,
                          [type(m).__name__ for m in measures],
                          None if distributed == "presharded" else _data_signature(data)),
                         "attention_measures settings or data")
        if distributed == "presharded" and max_images is not None:
            raise ValueError("max_images cannot be applied to pre-sharded data: cut the shards instead")
        if rpi:
            seed = _dist.shared_seed(seed)
        shard = _Shard(data, batch_size, world, _dist.rank(), max_images, distributed == "presharded")
    param = next((p for p in model.parameters() if p.is_floating_point()), None)
    home = param.device if param is not None else torch.device("cpu")
    device = torch.device(device) if device is not None else home
    dtype = param.dtype if param is not None else torch.float32
    from tqdm.auto import tqdm

    show = progress and (shard is None or _dist.is_main())
    total = max_images if max_images is not None else (len(data) if isinstance(data, torch.Tensor) else None)
    bar = tqdm(total=total if shard is None else None, unit="img", desc="attention", disable=not show, leave=False)
    router = _Router(measures, max(layer_ids), sites.num_prefix_tokens)
    batches = shard if shard is not None else _batches(data, batch_size)
    scale = pe_scale(model, alpha) if alpha is not None else contextlib.nullcontext()
    with _dist.fail_together() if shard is not None else contextlib.nullcontext(), scale:
        n_images, image_size, grid, perm = _stream(model, sites, batches, layer_ids, router, rpi, seed,
                                                   None if shard is not None else max_images, device, home,
                                                   dtype, bar)
    if shard is not None:
        n_images, image_size, grid = _reduce(measures, router, layer_ids, n_images, image_size, grid, shard.seen)
    if n_images == 0:
        raise ValueError("data yielded no images")
    values: dict[str, np.ndarray] = {}
    for m in measures:
        values.update(m.finish(layer_ids, n_images, grid))
    heads = sorted(set(router.heads.values()))
    metadata = {
        "model": _model_name(model), "family": sites.family, "rpi": rpi, "seed": seed if rpi else None,
        "alpha": alpha, "n_images": n_images, "image_size": list(image_size), "grid_size": list(grid),
        "num_prefix_tokens": sites.num_prefix_tokens, "num_heads": heads[0] if len(heads) == 1 else heads,
        "patch_size": _patch_size(model), "distance": "euclidean, patch units",
        "definitions": "docs/attention.md",
    }
    for m in measures:
        metadata.update(m.metadata())
    return AttentionResult(layers=layer_ids, values=values, permutation=perm, metadata=metadata)


def _patch_size(model: nn.Module) -> list[int] | None:
    size = getattr(getattr(model, "patch_embed", None), "patch_size", None)
    return [int(s) for s in size] if size is not None else None


def _stream(model: nn.Module, sites: ProbeSites, batches: Any, layers: list[int], router: _Router, rpi: bool,
            seed: int | None, max_images: int | None, device: torch.device, home: torch.device,
            dtype: torch.dtype, bar: Any) -> tuple[int, tuple[int, int] | None, tuple[int, int] | None, Any]:
    """This process's batches through the model; returns (images, image size, grid, RPI permutation)."""
    n_images, image_size, grid, perm = 0, None, None, None
    try:
        if device != home:
            model.to(device)
        rpi_ctx = token_permutation(model, seed=seed, per="call") if rpi else contextlib.nullcontext()
        with torch.no_grad(), eval_mode(model), rpi_ctx as handle, capture_attention(sites, layers, router):
            for images in batches:
                if max_images is not None:
                    images = images[:max_images - n_images]
                if len(images) == 0:
                    continue
                hw = (int(images.shape[-2]), int(images.shape[-1]))
                if image_size is not None and hw != image_size:
                    raise ValueError(f"the image size changed from {image_size} to {hw}: attention measures average "
                                     "over one grid (resize the data)")
                image_size = hw
                grid = router.grid = sites.grid_size(hw)
                try:
                    model(images.to(device=device, dtype=dtype, non_blocking=True))
                except _StopForward:
                    pass
                n_images += len(images)
                bar.update(len(images))
                if max_images is not None and n_images >= max_images:
                    break
            if handle is not None and handle.permutation is not None:
                perm = handle.permutation.cpu()
    finally:
        bar.close()
        if device != home:
            model.to(home)
    return n_images, image_size, grid, perm


def _reduce(measures: list[AttentionMeasure], router: _Router, layers: list[int], n_images: int,
            image_size: tuple[int, int] | None, grid: tuple[int, int] | None,
            seen: int | None) -> tuple[int, tuple[int, int] | None, tuple[int, int] | None]:
    """Sum every measure's float64 sums, and the image counts, across processes (a process without
    images adds zeros of the shapes the others report)."""
    states = _dist.all_gather_objects({"n": n_images, "seen": seen, "image_size": image_size, "grid": grid,
                                       "heads": dict(router.heads),
                                       "shapes": [{k: tuple(v.shape) for k, v in m.sums.items()} for m in measures]})
    total = sum(s["n"] for s in states)
    seens = [s["seen"] for s in states]
    if any(v != seens[0] for v in seens) or (seens[0] is not None and total != seens[0]):
        raise RuntimeError(f"the processes read different data (images seen: {seens}): an iterable of batches "
                           "must yield the same batches in the same order on every process")
    grids = {tuple(s["grid"]) for s in states if s["grid"] is not None}
    if len(grids) > 1:
        raise ValueError(f"the processes' token grids differ ({sorted(grids)}): use one image size")
    for s in states:
        router.heads.update(s["heads"])
    for k, m in enumerate(measures):
        shapes: dict = {}
        for s in states:
            shapes.update(s["shapes"][k])
        for key in sorted(shapes, key=repr):  # the same keys in the same order on every process
            local = m.sums.get(key)
            m.sums[key] = _dist.all_reduce_sum(local if local is not None else torch.zeros(shapes[key],
                                                                                          dtype=torch.float64))
    image_size = next((s["image_size"] for s in states if s["image_size"] is not None), None)
    return total, image_size, next(iter(grids), None)
