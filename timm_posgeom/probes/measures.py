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
import copy
import math
import warnings
from collections.abc import Sequence
from dataclasses import InitVar, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn as nn

from ..defaults import check_alpha_spec, rpi_count
from ..errors import DataError, NonFiniteWarning, SettingError, nonfinite_message
from ..interventions import (
    check_unpermuted,
    draw_permutations,
    eval_mode,
    image_permutations,
    pe_scale,
    permutation_seeds,
    token_permutation,
)
from ..measuring import distributed as _dist
from ..measuring.settings import MeasureSettings, sums_budget_error
from ..results.intervals import t_interval
from ..results.jsonio import dump_json, tagged
from .attention import attention_modules, capture_attention
from .sites import ProbeSites, find_sites
from .ssdc_probe.result import METADATA_ALIAS, SettingsRecord
from .streaming import FORWARD_IMAGES, StopForward, Stream, model_name, open_stream, resolve_layers

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
        permutation: under RPI, the first permutation p (N,) (slot i holds patch p[i]).
        settings: model, family, rpi, rpi_per, seed, rpi_permutations, permutation_seeds, interval, alpha,
            n_images, image_size, grid_size, num_prefix_tokens, patch_size, and what each measure records;
            ``metadata`` is its old name.
        intervals: under RPI with shared permutations, field name -> (low, high) arrays of the field's shape:
            the 95% interval of each value over the K permutations (Student t; NaN with K = 1); empty
            otherwise (the values have no interval).
        replicates: under RPI with shared permutations, field name -> (K, L, ...) the field under each
            permutation (``values`` is their mean).
        replica_measures: the measures of each replica (permutation) that ran (not written; :func:`run_measures`
            sets it): a measure that keeps more than its fields (cka's Gram matrices) is read there.
    """

    layers: list[int]
    values: dict[str, np.ndarray]
    permutation: torch.Tensor | None = field(default=None, repr=False)
    settings: dict[str, Any] = field(default_factory=dict)
    metadata: InitVar[dict[str, Any] | None] = None
    intervals: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    replicates: dict[str, np.ndarray] = field(default_factory=dict, repr=False)
    replica_measures: list[list[Measure]] = field(default_factory=list, init=False, repr=False, compare=False)

    def __post_init__(self, metadata: dict[str, Any] | None) -> None:
        self._take_metadata(metadata)

    def __getattr__(self, name: str) -> np.ndarray:
        values = self.__dict__.get("values") or {}
        if name in values:
            return values[name]
        raise AttributeError(name)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: every field as nested lists, first index the layer; under RPI each field's
        interval beside it (``FIELD_ci_low``, ``FIELD_ci_high``, same shape) and ``replicates`` (per permutation)."""
        out = {"layers": list(self.layers), **{k: np.asarray(v).tolist() for k, v in self.values.items()}}
        for k, (low, high) in self.intervals.items():
            out[f"{k}_ci_low"], out[f"{k}_ci_high"] = np.asarray(low).tolist(), np.asarray(high).tolist()
        if self.replicates:
            out["replicates"] = {k: np.asarray(v).tolist() for k, v in self.replicates.items()}
        return {
            **out,
            "permutation": self.permutation.tolist() if self.permutation is not None else None,
            **self._settings_json(),
        }

    def to_json(self, path: str | Path | None = None, indent: int = 2) -> str:
        """:meth:`to_dict` as JSON (NaN written as null); also written to ``path`` when given (atomically)."""
        return dump_json(tagged("measure-result", self.to_dict()), path, indent)


# after the dataclass: the constructor keeps its keyword (an InitVar, which mypy does not take for an attribute)
MeasureResult.metadata = METADATA_ALIAS  # type: ignore[attr-defined]


class _Router:
    """Hook target: hands each probed block's input to the measures of its source (chunk r of a forward pass to
    the measures of replica ``current[r]``); stops the forward after the last event any measure needs."""

    def __init__(self, replicas: list[list[Measure]], last: tuple[int, str], prefix: int) -> None:
        self.replicas, self.last, self.prefix = replicas, last, prefix
        self.current: list[int] = [0]
        self.grid: tuple[int, int] | None = None
        self.heads: dict[int, int] = {}
        self.nonfinite: dict[tuple[int, int], int] = {}  # (layer, replica) -> images whose input was not finite
        self.sized = False  # whether the replicas' running sums were checked against the budget (first forward)

    def receive(self, source: str, layer: int, x: torch.Tensor) -> None:
        if self.grid is None:
            raise RuntimeError(f"block {layer}'s {source} arrived before the batch's patch grid was set")
        n = self.grid[0] * self.grid[1]
        tokens = x.shape[-1] if source == "attention" else x.shape[1]
        prefix = tokens - n
        if prefix not in (0, self.prefix):
            raise ValueError(
                f"block {layer}'s {source} covers {tokens} tokens but the {self.grid[0]}x{self.grid[1]} "
                f"grid has {n} patches (+ {self.prefix} prefix tokens)"
            )
        if source == "attention":
            self.heads[layer] = int(x.shape[1])
        view = LayerView(layer=layer, grid=self.grid, prefix=prefix)
        for replica, chunk in zip(self.current, x.chunk(len(self.current))):
            bad = int((~torch.isfinite(chunk).flatten(1).all(dim=1)).sum())
            if bad:  # that block's fields NaN in this replica (_finish_replicas), never measures of NaN
                self.nonfinite[(layer, replica)] = self.nonfinite.get((layer, replica), 0) + bad
            for m in self.replicas[replica]:
                if m.source == source:
                    m.update(chunk, view)
        if (layer, source) == self.last:
            raise StopForward

    def hook(self, source: str):
        return lambda layer, x: self.receive(source, layer, x)


RPI_PER = ("call", "image")


def run_measures(
    model: nn.Module,
    data: Any,
    measures: Sequence[Measure],
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
        rpi: random permutation of the patch tokens at inference, after the patch embedding and before
            any PE (as ``probe_ssdc``).
        rpi_per: ``call`` (the protocol of ``probe_ssdc``: ``rpi_permutations`` shared permutations, seeds
            ``seed`` .. ``seed + K - 1``, each image forwarded under each; every field is the mean over them,
            with its interval over them in ``intervals``) or ``image`` (one permutation per image, from
            (``seed``, the image's index in the data): what a measure fitted on some images and scored on
            others needs, so that no permutation is shared between them; no interval). ``batch`` is the old
            name of ``image`` (a fresh permutation per batch made the numbers depend on the batch size).
        alpha: scale the positional encoding by alpha for the call (:func:`~timm_posgeom.pe_scale`).
        layers: block indices (negative allowed); default every block.
        settings: a :class:`~timm_posgeom.measuring.MeasureSettings`: ``seed`` (the RPI permutations'),
            ``rpi_permutations``, ``max_images``, ``device``, ``progress``, ``batch_size`` and ``distributed``,
            as those of ``probe_ssdc`` (several processes sum the measures' float64 sums and the image
            counts); each may also be given as a keyword, which overrides ``settings``. ``forward_size`` (at
            most this many images per forward pass, the permutations of a batch stacked up to it) is a
            keyword of this function's own.

    Returns:
        A :class:`MeasureResult` of every measure's fields. Under RPI with shared permutations each replica
        of the measures is a deep copy of ``measures`` made before any data is read; ``measures`` themselves
        hold the first permutation's sums.
    """
    settings, own = MeasureSettings.resolve("run_measures", settings, options, {"forward_size": None})
    measures, sources, rpi_per = _check_measures(measures, rpi_per, alpha)
    sites = find_sites(model)
    layer_ids = resolve_layers(layers, len(sites.blocks))
    if "attention" in sources:
        attention_modules(sites, layer_ids)  # refuse an unsupported attention before reading any data
    k = rpi_count(settings.rpi_permutations) if rpi and rpi_per == "call" else 1
    agreed = (rpi, rpi_per, k, alpha, layer_ids, [(type(m).__name__, m.metadata()) for m in measures])
    stream = open_stream(model, data, settings, rpi, agreed, "run_measures")  # several processes: the same call
    seed = stream.seed if stream.seed is not None or not rpi else int(torch.randint(2**31, ()).item())
    replicas = [measures] + [copy.deepcopy(measures) for _ in range(k - 1)]
    router = _Router(replicas, (max(layer_ids), sources[-1]), sites.num_prefix_tokens)
    plan = _RPIPlan(
        rpi_per if rpi else None, permutation_seeds(seed, k) if rpi and seed is not None else [], own["forward_size"]
    )
    scale = pe_scale(model, alpha) if alpha is not None else contextlib.nullcontext()
    with stream.together(), scale:
        grid, perm = _stream(model, sites, layer_ids, sources, router, plan, stream)
    n_images, image_size = stream.n_images, stream.image_size
    if stream.shard is not None:
        n_images, image_size, grid = _reduce(replicas, router, n_images, image_size, grid, stream.shard.seen)
    if n_images == 0 or image_size is None or grid is None:
        raise DataError("data yielded no images")
    values, intervals, replicates = _finish_replicas(
        replicas, layer_ids, n_images, grid, plan.per == "call", router.nonfinite
    )
    recorded: dict[str, Any] = {
        "model": model_name(model),
        "family": sites.family,
        **_rpi_settings(plan, seed),
        "alpha": alpha,
        "n_images": n_images,
        "image_size": list(image_size),
        "grid_size": list(grid),
        "num_prefix_tokens": sites.num_prefix_tokens,
        "patch_size": _patch_size(model),
        **_router_settings(router, n_images),
    }
    for m in measures:
        recorded.update(m.metadata())
    result = MeasureResult(
        layers=layer_ids, values=values, permutation=perm, settings=recorded, intervals=intervals, replicates=replicates
    )
    result.replica_measures = replicas  # each permutation's measures (not written): cka reads their Grams
    return result


def _rpi_settings(plan: _RPIPlan, seed: int | None) -> dict[str, Any]:
    """The result's record of how the call permuted: rpi, seed, rpi_per, and with shared permutations their
    count, seeds and the interval over them (None where they do not apply)."""
    rpi, shared, k = plan.per is not None, plan.per == "call", len(plan.seeds)
    return {
        "rpi": rpi,
        "seed": seed if rpi else None,
        "rpi_per": plan.per,
        "rpi_permutations": k if shared else None,
        "permutation_seeds": plan.seeds if shared else None,
        "interval": (f"over {k} RPI permutations (Student t, {k - 1} df)" if k >= 2 else "none (one RPI permutation)")
        if shared
        else None,
    }


def _router_settings(router: _Router, n_images: int) -> dict[str, Any]:
    """The result's record of what the blocks gave: the blocks whose input was not finite (said in a
    NonFiniteWarning: their measures are NaN) and, when attention was read, the heads per block."""
    recorded: dict[str, Any] = {"nonfinite_layers": sorted({layer for layer, _ in router.nonfinite})}
    if router.nonfinite:
        warnings.warn(
            nonfinite_message(
                f"the inputs of block(s) {', '.join(map(str, recorded['nonfinite_layers']))}",
                max(router.nonfinite.values()),
                n_images,
                "their measures are NaN",
            ),
            NonFiniteWarning,
            stacklevel=3,
        )
    if router.heads:
        heads = sorted(set(router.heads.values()))
        recorded["num_heads"] = heads[0] if len(heads) == 1 else heads
    return recorded


@dataclass
class _RPIPlan:
    """How a run_measures call permutes: ``per`` (None: no RPI, ``call``: the shared permutations of
    ``seeds``, ``image``: one per image from ``seeds[0]``), and ``forward_size``."""

    per: str | None
    seeds: list[int]
    forward_size: int | None = None
    drawn: dict[int, torch.Tensor] = field(default_factory=dict)

    def shared(self, n: int) -> torch.Tensor:
        """(K, n) the shared permutations of ``n`` tokens (drawn once)."""
        if n not in self.drawn:
            self.drawn[n] = draw_permutations(n, self.seeds)
        return self.drawn[n]

    def per_forward(self, batch: int) -> int:
        """How many shared permutations one forward pass stacks for a batch of ``batch`` images."""
        if self.per != "call":
            return 1
        limit = self.forward_size or FORWARD_IMAGES
        return max(1, min(len(self.seeds), limit // max(batch, 1)))


def _finish_replicas(
    replicas: list[list[Measure]],
    layers: list[int],
    n_images: int,
    grid: tuple[int, int],
    shared: bool,
    nonfinite: dict[tuple[int, int], int] | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, tuple[np.ndarray, np.ndarray]], dict[str, np.ndarray]]:
    """(values, intervals, replicates): each replica's fields; with shared permutations their mean, its
    interval over them and the (K, ...) stacks; else the one replica's fields alone. A block whose input was
    not finite in a replica (``nonfinite``: (layer, replica) -> images) has NaN fields there."""
    per_replica = []
    for r, measures in enumerate(replicas):
        fields: dict[str, np.ndarray] = {}
        for m in measures:
            fields.update(m.finish(layers, n_images, grid))
        rows = [i for i, layer in enumerate(layers) if (layer, r) in (nonfinite or {})]
        for name in fields if rows else ():
            fields[name] = np.array(fields[name], dtype=float)
            fields[name][rows] = math.nan
        per_replica.append(fields)
    if not shared:
        return per_replica[0], {}, {}
    values, intervals, replicates = {}, {}, {}
    for name in per_replica[0]:
        stack = np.stack([np.asarray(f[name], dtype=float) for f in per_replica])  # (K, L, ...)
        mean, low, high = t_interval(stack, axis=0)
        values[name], intervals[name], replicates[name] = mean, (low, high), stack
    return values, intervals, replicates


def _check_measures(
    measures: Sequence[Measure], rpi_per: str, alpha: float | None
) -> tuple[list[Measure], list[str], str]:
    """The call's own settings checked; (the measures, their sources in the order they happen in a block,
    rpi_per with its old name ``batch`` read as ``image``)."""
    if rpi_per == "batch":
        warnings.warn(
            "run_measures(rpi_per='batch') is now rpi_per='image' (one permutation per image, from the "
            "seed and the image's index: the same whatever the batch size)",
            DeprecationWarning,
            stacklevel=3,
        )
        rpi_per = "image"
    if rpi_per not in RPI_PER:
        raise SettingError(f"rpi_per must be one of {', '.join(RPI_PER)}, got {rpi_per!r}")
    if alpha is not None:
        check_alpha_spec(alpha)  # a number, or one per PE component
    measures = list(measures)
    if not measures:
        raise SettingError("measures is empty")
    for m in measures:
        if m.source not in SOURCES:
            raise ValueError(f"{type(m).__name__}.source is {m.source!r}; expected one of {', '.join(SOURCES)}")
    return measures, sorted({m.source for m in measures}, key=SOURCES.index), rpi_per


def _patch_size(model: nn.Module) -> list[int] | None:
    size = getattr(getattr(model, "patch_embed", None), "patch_size", None)
    return [int(s) for s in size] if size is not None else None


def _stream(
    model: nn.Module,
    sites: ProbeSites,
    layers: list[int],
    sources: list[str],
    router: _Router,
    plan: _RPIPlan,
    stream: Stream,
) -> tuple[tuple[int, int] | None, Any]:
    """This process's batches through the model (under each shared permutation, stacked as chunks of a forward
    pass, or under one permutation per image); returns (grid, the first permutation) (the stream counts the
    images and keeps their size)."""
    grid = None
    handles: list = []
    if plan.per is None:  # inside the caller's token_permutation the tokens would be permuted, reported unpermuted
        check_unpermuted(model, "run_measures without rpi")
    try:
        rpi_ctx = token_permutation(model, per="given") if plan.per else contextlib.nullcontext()
        capture = (
            capture_attention(sites, layers, router.hook("attention"))
            if "attention" in sources
            else contextlib.nullcontext()
        )
        with stream.placed(model), torch.no_grad(), eval_mode(model), rpi_ctx as handle, capture:
            for source in sources:
                if source != "attention":
                    handles += sites.register(source, layers, router.hook(source))
            for images, hw, offset in stream.images():
                if hw != stream.image_size:
                    raise DataError(
                        f"the image size changed from {stream.image_size} to {hw}: the measures "
                        "average over one grid (resize the data)"
                    )
                grid = router.grid = sites.grid_size(hw)
                _forward_replicas(model, images, offset, router, plan, handle)
    finally:
        for h in handles:
            h.remove()
    perm = None
    if plan.per == "call" and plan.drawn:
        perm = next(iter(plan.drawn.values()))[0].clone()
    return grid, perm


def _forward_replicas(
    model: nn.Module, images: torch.Tensor, offset: int, router: _Router, plan: _RPIPlan, handle: Any
) -> None:
    """One batch through the model under every replica (its permutations stacked, ``plan.per_forward`` at a
    time) or, per image, under each image's permutation. The call's first forward runs the first replica alone:
    the running sums it makes, times the replicas, are checked against the budget before any other is made."""
    step = plan.per_forward(len(images))
    count = len(router.replicas)
    starts = list(range(0, count, step))
    if not router.sized:
        starts = [0, *range(1, count, step)]
    for first in starts:
        replicas = list(range(first, min(first + (1 if not router.sized else step), count)))
        x = images if len(replicas) == 1 else images.repeat(len(replicas), 1, 1, 1)
        if plan.per == "call":
            handle.give(lambda n, ks=replicas: plan.shared(n)[ks])
        elif plan.per == "image":
            indices = np.arange(offset, offset + len(images))
            handle.give(lambda n, ids=indices: image_permutations(n, plan.seeds[0], ids))
        router.current = replicas
        try:
            model(x)
        except StopForward:
            pass
        if not router.sized:
            router.sized = True
            each = sum(t.numel() * t.element_size() for m in router.replicas[0] for t in m.sums.values())
            error = sums_budget_error("run_measures", count, each)
            if error is not None:
                raise error


def _reduce(
    replicas: list[list[Measure]],
    router: _Router,
    n_images: int,
    image_size: tuple[int, int] | None,
    grid: tuple[int, int] | None,
    seen: int | None,
) -> tuple[int, tuple[int, int] | None, tuple[int, int] | None]:
    """Sum every measure's float64 sums (of every replica), and the image counts, across processes (a process
    without images adds zeros of the shapes the others report)."""
    measures = [m for replica in replicas for m in replica]
    states = _dist.all_gather_objects(
        {
            "n": n_images,
            "seen": seen,
            "image_size": image_size,
            "grid": grid,
            "heads": dict(router.heads),
            "nonfinite": dict(router.nonfinite),
            "shapes": [{k: tuple(v.shape) for k, v in m.sums.items()} for m in measures],
        }
    )
    total = sum(s["n"] for s in states)
    seens = [s["seen"] for s in states]
    if any(v != seens[0] for v in seens) or (seens[0] is not None and total != seens[0]):
        raise RuntimeError(
            f"the processes read different data (images seen: {seens}): an iterable of batches "
            "must yield the same batches in the same order on every process"
        )
    grids = {tuple(s["grid"]) for s in states if s["grid"] is not None}
    if len(grids) > 1:
        raise DataError(f"the processes' token grids differ ({sorted(grids)}): use one image size")
    router.nonfinite = {}
    for s in states:
        router.heads.update(s["heads"])
        for key, count in s["nonfinite"].items():
            router.nonfinite[key] = router.nonfinite.get(key, 0) + count
    for k, m in enumerate(measures):
        shapes: dict = {}
        for s in states:
            shapes.update(s["shapes"][k])
        for key in sorted(shapes, key=repr):  # the same keys in the same order on every process
            local = m.sums.get(key)
            m.sums[key] = _dist.all_reduce_sum(
                local if local is not None else torch.zeros(shapes[key], dtype=torch.float64)
            )
    image_size = next((s["image_size"] for s in states if s["image_size"] is not None), None)
    return total, image_size, next(iter(grids), None)
