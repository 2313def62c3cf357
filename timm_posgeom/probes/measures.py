"""Pluggable measures of a flat timm ViT: consume each probed block's tokens or attention weights batch by
batch, keep float64 running sums, reduce them across processes by summing.

A :class:`Measure` names its ``source``: ``"attention"`` (the block's attention weights A (B, heads, T, T),
captured by :mod:`.attention`), or a probe site of :mod:`.sites` (``"attn_input"``, ``"block_output"``:
the block's tokens (B, T, C)). :func:`run_measures` streams the data once through the model, hands every
measure what it asked for, stops the forward pass after the last block any measure needs, and returns a
:class:`MeasureResult` of each measure's fields. The attention measures (docs/attention.md) are built on
it: :mod:`.attention_measures`.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import InitVar, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn as nn

from .. import distributed as _dist
from ..interventions import check_unpermuted, eval_mode, pe_scale, token_permutation
from ..jsonio import dump_json, tagged
from ..measuring import MeasureSettings
from .attention import attention_modules, capture_attention
from .result import METADATA_ALIAS, SettingsRecord
from .sites import ProbeSites, find_sites
from .streaming import Stream, _model_name, _resolve_layers, _StopForward, open_stream

__all__ = ["Measure", "LayerView", "MeasureResult", "run_measures", "SOURCES"]

SOURCES = ("attn_input", "attention", "block_output")  # in the order they happen inside a block


@dataclass(frozen=True)
class LayerView:
    """How to read what one block gave a measure for one batch.

    grid: the (H, W) patch grid; the N = H * W patch tokens are the last N of the T tokens (row-major:
    token ``prefix + k`` sits at (k // W, k % W)); the first ``prefix`` = T - N are prefix tokens (class,
    register, distillation). Under RPI slot k still sits at (k // W, k % W): the index grid.
    """

    layer: int
    grid: tuple[int, int]
    prefix: int

    @property
    def num_patches(self) -> int:
        return self.grid[0] * self.grid[1]


class Measure:
    """A measure per probed block, reduced over images.

    Subclasses set ``source`` (one of :data:`SOURCES`) and ``names`` (the result fields), and define
    :meth:`update` (one block's input of one batch: attention weights (B, heads, T, T) float32, or tokens
    (B, T, C) in the model's dtype) and :meth:`finish`. Running sums go through :meth:`add` into
    ``self.sums[(key, layer)]`` (float64 on the CPU), which several processes sum.
    """

    source: str = "attention"
    names: tuple[str, ...] = ()

    def __init__(self) -> None:
        self.sums: dict[tuple[str, int], torch.Tensor] = {}

    def add(self, key: str, layer: int, value: torch.Tensor) -> None:
        """Add ``value`` (any shape, the same every batch) into the float64 sum ``(key, layer)``."""
        value = value.detach().to("cpu", torch.float64)
        if (key, layer) in self.sums:
            self.sums[(key, layer)] += value
        else:
            self.sums[(key, layer)] = value.clone()

    def stacked(self, key: str, layers: list[int], n_images: int) -> np.ndarray:
        """(L, ...) the sums ``key`` of ``layers`` divided by the image count."""
        return torch.stack([self.sums[(key, layer)] for layer in layers]).numpy() / n_images

    def update(self, x: torch.Tensor, view: LayerView) -> None:
        """Consume one block's attention weights or tokens ``x`` of one batch."""
        raise NotImplementedError

    def finish(self, layers: list[int], n_images: int, grid: tuple[int, int]) -> dict[str, np.ndarray]:
        """The result fields, each an (L, ...) float64 array, from the (reduced) sums over ``n_images``."""
        raise NotImplementedError

    def metadata(self) -> dict[str, Any]:
        """Settings to record in the result's metadata."""
        return {}


@dataclass
class MeasureResult(SettingsRecord):
    """Measures of one model, per probed block (the first axis of every field).

    Attributes:
        layers: the block index of each row.
        values: field name -> (L, ...) float64 array (e.g. (L, heads) for the attention measures).
        permutation: under RPI, the (N,) permutation p used for every batch (slot i holds patch p[i]).
        settings: model, family, rpi, seed, alpha, n_images, image_size, grid_size, num_prefix_tokens,
            patch_size, and what each measure records; ``metadata`` is its old name.
    """

    layers: list[int]
    values: dict[str, np.ndarray]
    permutation: torch.Tensor | None = field(default=None, repr=False)
    settings: dict[str, Any] = field(default_factory=dict)
    metadata: InitVar[dict[str, Any] | None] = None

    def __post_init__(self, metadata: dict[str, Any] | None) -> None:
        self._take_metadata(metadata)

    def __getattr__(self, name: str) -> np.ndarray:
        values = self.__dict__.get("values") or {}
        if name in values:
            return values[name]
        raise AttributeError(name)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: every field as nested lists, first index the layer."""
        return {"layers": list(self.layers), **{k: np.asarray(v).tolist() for k, v in self.values.items()},
                "permutation": self.permutation.tolist() if self.permutation is not None else None,
                **self._settings_json()}

    def to_json(self, path: str | Path | None = None, indent: int = 2) -> str:
        """:meth:`to_dict` as JSON (NaN written as null); also written to ``path`` when given (atomically)."""
        return dump_json(tagged("measure-result", self.to_dict()), path, indent)


MeasureResult.metadata = METADATA_ALIAS  # after the dataclass: the constructor keeps its keyword


class _Router:
    """Hook target: hands each probed block's input to the measures of its source; stops the forward after
    the last event any measure needs."""

    def __init__(self, measures: list[Measure], last: tuple[int, str], prefix: int) -> None:
        self.measures, self.last, self.prefix = measures, last, prefix
        self.grid: tuple[int, int] | None = None
        self.heads: dict[int, int] = {}

    def receive(self, source: str, layer: int, x: torch.Tensor) -> None:
        n = self.grid[0] * self.grid[1]
        tokens = x.shape[-1] if source == "attention" else x.shape[1]
        prefix = tokens - n
        if prefix not in (0, self.prefix):
            raise ValueError(f"block {layer}'s {source} covers {tokens} tokens but the {self.grid[0]}x{self.grid[1]} "
                             f"grid has {n} patches (+ {self.prefix} prefix tokens)")
        if source == "attention":
            self.heads[layer] = int(x.shape[1])
        view = LayerView(layer=layer, grid=self.grid, prefix=prefix)
        for m in self.measures:
            if m.source == source:
                m.update(x, view)
        if (layer, source) == self.last:
            raise _StopForward

    def hook(self, source: str):
        return lambda layer, x: self.receive(source, layer, x)


def run_measures(
        model: nn.Module,
        data: Any,
        measures: list[Measure],
        *,
        rpi: bool = False,
        alpha: float | None = None,
        layers: list[int] | None = None,
        rpi_per: str = "call",
        settings: MeasureSettings | None = None,
        **options: Any,
) -> MeasureResult:
    """Run ``measures`` on every (or the chosen) block of a flat timm ViT over ``data``, in one pass.

    Args:
        model: a flat timm ViT (:func:`~timm_posgeom.probes.find_sites`); measures of the source
            ``attention`` need timm's ``Attention`` / ``AttentionRope`` or eva's ``EvaAttention``. Eval
            mode is set for the call and restored.
        data: as :func:`~timm_posgeom.probes.probe_ssdc`: a (B, C, H, W) tensor (chunks of
            ``batch_size``) or an iterable of batches, transformed for the model; one image size.
        measures: :class:`Measure` instances (fresh: they keep their sums).
        rpi: random permutation of the patch tokens at inference, one permutation (from ``seed``) for
            the call, after the patch embedding and before any PE (as ``probe_ssdc``).
        rpi_per: ``call`` (one permutation for the call) or ``batch`` (a fresh one per batch, from the
            seeded generator: what a measure fitted on some batches and scored on others needs, so that
            no permutation is shared between them).
        alpha: scale the positional encoding by alpha for the call (:func:`~timm_posgeom.pe_scale`).
        layers: block indices (negative allowed); default every block.
        settings: a :class:`~timm_posgeom.measuring.MeasureSettings`: ``seed`` (the RPI permutation's),
            ``max_images``, ``device``, ``progress``, ``batch_size`` and ``distributed``, as those of
            ``probe_ssdc`` (several processes sum the measures' float64 sums and the image counts); each
            may also be given as a keyword, which overrides ``settings``.

    Returns:
        A :class:`MeasureResult` of every measure's fields.
    """
    settings, _ = MeasureSettings.resolve("run_measures", settings, options)
    measures, sources = _check_measures(measures, rpi_per, alpha)
    sites = find_sites(model)
    layer_ids = _resolve_layers(layers, len(sites.blocks))
    if "attention" in sources:
        attention_modules(sites, layer_ids)  # refuse an unsupported attention before reading any data
    stream = open_stream(model, data, settings, rpi, (rpi, alpha, layer_ids, [(type(m).__name__, m.metadata())
                                                                             for m in measures]), "run_measures")
    router = _Router(measures, (max(layer_ids), sources[-1]), sites.num_prefix_tokens)
    scale = pe_scale(model, alpha) if alpha is not None else contextlib.nullcontext()
    with stream.together(), scale:
        grid, perm = _stream(model, sites, layer_ids, sources, router, rpi and rpi_per, stream)
    n_images, image_size = stream.n_images, stream.image_size
    if stream.shard is not None:
        n_images, image_size, grid = _reduce(measures, router, n_images, image_size, grid, stream.shard.seen)
    if n_images == 0:
        raise ValueError("data yielded no images")
    values: dict[str, np.ndarray] = {}
    for m in measures:
        values.update(m.finish(layer_ids, n_images, grid))
    recorded: dict[str, Any] = {
        "model": _model_name(model), "family": sites.family, "rpi": rpi, "seed": stream.seed if rpi else None,
        "rpi_per": rpi_per if rpi else None,
        "alpha": alpha, "n_images": n_images, "image_size": list(image_size), "grid_size": list(grid),
        "num_prefix_tokens": sites.num_prefix_tokens, "patch_size": _patch_size(model),
    }
    if router.heads:
        heads = sorted(set(router.heads.values()))
        recorded["num_heads"] = heads[0] if len(heads) == 1 else heads
    for m in measures:
        recorded.update(m.metadata())
    return MeasureResult(layers=layer_ids, values=values, permutation=perm, settings=recorded)


def _check_measures(measures: list[Measure], rpi_per: str, alpha: float | None) -> tuple[list[Measure], list[str]]:
    """The call's own settings checked; (the measures, their sources in the order they happen in a block)."""
    if rpi_per not in ("call", "batch"):
        raise ValueError(f"rpi_per must be 'call' or 'batch', got {rpi_per!r}")
    if alpha is not None and not (math.isfinite(alpha) and alpha >= 0):
        raise ValueError(f"alpha must be a finite number >= 0, got {alpha}")
    measures = list(measures)
    if not measures:
        raise ValueError("measures is empty")
    for m in measures:
        if m.source not in SOURCES:
            raise ValueError(f"{type(m).__name__}.source is {m.source!r}; expected one of {', '.join(SOURCES)}")
    return measures, sorted({m.source for m in measures}, key=SOURCES.index)


def _patch_size(model: nn.Module) -> list[int] | None:
    size = getattr(getattr(model, "patch_embed", None), "patch_size", None)
    return [int(s) for s in size] if size is not None else None


def _stream(model: nn.Module, sites: ProbeSites, layers: list[int], sources: list[str], router: _Router,
            rpi: bool | str, stream: Stream) -> tuple[tuple[int, int] | None, Any]:
    """This process's batches through the model; returns (grid, RPI permutation) (the stream counts the
    images and keeps their size)."""
    grid, perm = None, None
    handles: list = []
    # rpi: False, or how often a permutation is drawn ("call" or "batch")
    if not rpi:  # inside the caller's token_permutation the tokens would be permuted, reported unpermuted
        check_unpermuted(model, "run_measures without rpi")
    try:
        rpi_ctx = token_permutation(model, seed=stream.seed, per=rpi) if rpi else contextlib.nullcontext()
        capture = (capture_attention(sites, layers, router.hook("attention")) if "attention" in sources
                   else contextlib.nullcontext())
        with stream.placed(model), torch.no_grad(), eval_mode(model), rpi_ctx as handle, capture:
            for source in sources:
                if source != "attention":
                    handles += sites.register(source, layers, router.hook(source))
            for images, hw in stream.images():
                if hw != stream.image_size:
                    raise ValueError(f"the image size changed from {stream.image_size} to {hw}: the measures "
                                     "average over one grid (resize the data)")
                grid = router.grid = sites.grid_size(hw)
                try:
                    model(images)
                except _StopForward:
                    pass
            if handle is not None and handle.permutation is not None:
                perm = handle.permutation.cpu()
    finally:
        for h in handles:
            h.remove()
    return grid, perm


def _reduce(measures: list[Measure], router: _Router, n_images: int, image_size: tuple[int, int] | None,
            grid: tuple[int, int] | None,
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
            m.sums[key] = _dist.all_reduce_sum(local if local is not None
                                               else torch.zeros(shapes[key], dtype=torch.float64))
    image_size = next((s["image_size"] for s in states if s["image_size"] is not None), None)
    return total, image_size, next(iter(grids), None)
