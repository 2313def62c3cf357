"""Activation patching between a clean and an RPI run: which block carries the position anchor
(docs/method.md#activation-patching).

For each image batch and each of K shared permutations p (permutation k from ``seed + k``, the RPI
protocol): the clean forward records the residual stream; the RPI forward (slot i holds patch p[i], every
PE bound to the index) gives the damaged run; then, for each layer b, the RPI forward is run again with
layer b's output replaced by the clean run's, aligned by the permutation (slot i given the clean token of
patch p[i], prefix tokens as they are): ``patch="residual"`` replaces the whole residual stream, so the
later blocks continue from the clean state; ``patch="update"`` replaces only block b's own update (its
output minus its input) and keeps the RPI run's input. Layer -1 (the embedding, block 0's input) is patched
whole in both modes.

Measured on each run: top-1 (where the data has labels) and the SSDC of the image-mean similarity map of
the last block's patch tokens against the content grid (each token's map row placed at the patch its content
came from: the clean run's own grid). The fraction of the clean-minus-RPI gap that patching layer b restores,
``(x_patched - x_rpi) / (x_clean - x_rpi)``, is computed per permutation; every number is the mean over
the K permutations with a Student t 95% interval over them. No gap (a model without PE, which RPI does not
change: top-1 equal, SSDC within :data:`SSDC_GAP_ATOL`, float rounding) gives NaN, with a warning.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn as nn

from ..defaults import rpi_count
from ..errors import SettingError
from ..interventions import draw_permutations, eval_mode, permutation_seeds
from ..measuring.settings import MeasureSettings
from ..probes.sites import ProbeSites, find_sites
from ..results.intervals import t_interval
from .batches import labelled_batches, placed
from .result import LayerCurves
from .tally import Tally
from .tracing import EMBEDDING, Trace, align, hits, similarity_maps, traced_forward

__all__ = ["activation_patching", "PatchingResult", "PATCH_MODES", "SSDC_GAP_ATOL"]

PATCH_MODES = ("residual", "update")
_MEASURES = ("top1", "ssdc")


class PatchingResult(LayerCurves):
    """Activation patching per layer (docs/method.md#activation-patching).

    Fields (``values``; each with its interval in ``intervals``): ``top1_clean`` and ``ssdc_clean`` (scalars,
    jackknife over images), ``top1_rpi`` and ``ssdc_rpi`` (scalars, over permutations), and per layer
    ``top1_patched``, ``ssdc_patched``, ``top1_restored`` and ``ssdc_restored`` (over permutations);
    ``replicates`` holds each permutation's values. :meth:`peak` names the layer that restores most.
    """

    kind: ClassVar[str] = "activation-patching"


# A gap in SSDC this small is float rounding, not an effect: a model without PE computes the same maps under RPI
# up to float32 rounding (SSDC then moves by ~1e-7..1e-6), and a fraction of that would be a number made of noise.
SSDC_GAP_ATOL = 1e-5


def _restored(patched: np.ndarray, rpi: np.ndarray, clean: float, atol: float) -> np.ndarray:
    """(K, L) fraction of the gap ``clean - rpi[k]`` that each patched run closes; NaN where |gap| <= atol."""
    gap = clean - rpi[:, None]
    real = np.abs(gap) > atol
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(real, (patched - rpi[:, None]) / np.where(real, gap, 1.0), math.nan)


def patch_edit(layer: int, clean: Trace, permutation: torch.Tensor, patch: str):
    """The edit of :func:`traced_forward` that puts the clean run's layer ``layer`` into the permuted run."""
    if layer == EMBEDDING or patch == "residual":
        source = align(clean.outputs[layer], permutation)
        return layer, lambda block_input, output: source
    update = align(clean.outputs[layer] - clean.inputs[layer], permutation)
    return layer, lambda block_input, output: block_input + update


@dataclass
class _Plan:
    """What every batch of one call shares: the model's sites, the layers patched, the mode, the running sums
    (``clean``: the clean run's, per image group; ``permuted``: the RPI and patched runs', one group)."""

    sites: ProbeSites
    layers: list[int]
    patch: str
    clean: Tally
    permuted: Tally


def _run_batch(model: nn.Module, plan: _Plan, images, labels, groups: torch.Tensor, perms: torch.Tensor) -> None:
    """One batch: the clean run, then for each permutation the RPI run and each layer's patched run."""
    sites, last, n = plan.sites, len(plan.sites.blocks) - 1, perms.shape[1]
    clean = traced_forward(model, sites, images, record=set(plan.layers) | {last})
    plan.clean.add("clean", similarity_maps(clean.outputs[last], None, n), hits(clean.logits, labels), groups)
    one = torch.zeros_like(groups)
    for k, p in enumerate(perms):
        rpi = traced_forward(model, sites, images, p, record={last})
        plan.permuted.add(("rpi", k), similarity_maps(rpi.outputs[last], p, n), hits(rpi.logits, labels), one)
        for layer in plan.layers:
            run = traced_forward(model, sites, images, p, record={last}, edit=patch_edit(layer, clean, p, plan.patch))
            maps = similarity_maps(run.outputs[last], p, n)
            plan.permuted.add(("patched", k, layer), maps, hits(run.logits, labels), one)


def _check(patch: str, layers: Sequence[int] | None, depth: int) -> list[int]:
    if patch not in PATCH_MODES:
        raise SettingError(f"patch must be one of {', '.join(PATCH_MODES)}, got {patch!r}")
    if layers is None:
        return [EMBEDDING, *range(depth)]
    out = sorted({int(x) for x in layers})
    if not out or out[0] < EMBEDDING or out[-1] >= depth:
        raise SettingError(f"layers must lie in -1 (the embedding) .. {depth - 1}, got {list(layers)}")
    return out


def activation_patching(
    model: nn.Module,
    data: Any,
    settings: MeasureSettings | None = None,
    *,
    patch: str = "residual",
    layers: Sequence[int] | None = None,
    labels: torch.Tensor | None = None,
    **options: Any,
) -> PatchingResult:
    """How much of the clean-minus-RPI gap in top-1 and SSDC each layer restores when patched (module docstring).

    Args:
        model: a flat timm ViT (:func:`~timm_posgeom.probes.find_sites`) with a patch embedding to permute
            after; eval mode is set for the call and restored.
        data: ``(images, labels)`` batches transformed for the model (:func:`~timm_posgeom.data.eval_data.eval_loader`),
            or one (n, C, H, W) tensor (with ``labels``); without labels top-1 is NaN, with a warning.
        settings: a :class:`~timm_posgeom.measuring.MeasureSettings`: ``max_images``, ``batch_size`` (for a
            tensor), ``seed`` (permutation k: ``seed + k``; the jackknife's groups), ``rpi_permutations`` (K,
            default 10), ``device``, ``progress``; its fields may also be given as keywords. One process.
        patch: ``residual`` (the whole residual stream at the layer's output) or ``update`` (the block's own
            update only).
        layers: the layers to patch (-1: the embedding; default -1 and every block).
        labels: (n,) labels of a tensor ``data``.

    Returns:
        A :class:`PatchingResult`; ``settings`` records K, the seeds, the images, the grid and the mode.
    """
    settings, _ = MeasureSettings.resolve("activation_patching", settings, options)
    sites = find_sites(model)
    layer_ids = _check(patch, layers, len(sites.blocks))
    seed = 0 if settings.seed is None else int(settings.seed)
    seeds = permutation_seeds(seed, rpi_count(settings.rpi_permutations))
    plan: _Plan | None = None
    with placed(model, settings.device) as (device, dtype), eval_mode(model):
        for images, batch_labels, offset in labelled_batches(data, settings, "activation_patching", labels):
            grid = sites.grid_size((images.shape[-2], images.shape[-1]))
            if plan is None:
                plan = _Plan(sites, layer_ids, patch, Tally(grid, 20, seed), Tally(grid, 1, seed))
            groups = plan.clean.group_of(offset, len(images))
            plan.clean.count(groups, batch_labels is not None)
            plan.permuted.count(torch.zeros_like(groups), batch_labels is not None)
            perms = draw_permutations(grid[0] * grid[1], seeds).to(device)
            _run_batch(model, plan, images.to(device=device, dtype=dtype), batch_labels, groups, perms)
    assert plan is not None  # labelled_batches raises on data without images
    result = _finish((plan.clean, plan.permuted), layer_ids, len(seeds))
    result.settings.update(
        model=str((getattr(model, "pretrained_cfg", None) or {}).get("architecture") or type(model).__name__),
        patch=patch,
        site="block_output of the last block (SSDC: content grid, mean map)",
        n_images=int(plan.clean.counts.sum()),
        grid_size=list(plan.clean.grid),
        rpi_permutations=len(seeds),
        permutation_seeds=seeds,
        seed=seed,
        intervals="clean: delete-a-group jackknife over 20 groups of images; the rest: Student t over permutations",
    )
    return result


def _finish(tallies: tuple[Tally, Tally], layers: list[int], k: int) -> PatchingResult:
    """The result from the sums: per permutation, then the mean and interval over permutations."""
    clean_tally, tally = tallies
    values: dict[str, Any] = {}
    intervals: dict[str, tuple[Any, Any]] = {}
    replicates: dict[str, np.ndarray] = {}
    for measure in _MEASURES:
        read = clean_tally.ssdc if measure == "ssdc" else clean_tally.top1
        clean = read(["clean"])["clean"]
        values[f"{measure}_clean"], intervals[f"{measure}_clean"] = clean.value, clean_tally.interval(clean)
        read = tally.ssdc if measure == "ssdc" else tally.top1
        keys = [("rpi", i) for i in range(k)] + [("patched", i, layer) for i in range(k) for layer in layers]
        est = read(keys)
        rpi = np.array([est[("rpi", i)].value for i in range(k)])
        patched = np.array([[est[("patched", i, layer)].value for layer in layers] for i in range(k)])
        atol = SSDC_GAP_ATOL if measure == "ssdc" else 0.0
        restored = _restored(patched, rpi, clean.value, atol)
        for name, rows in (("rpi", rpi), ("patched", patched), ("restored", restored)):
            mean, low, high = t_interval(rows, axis=0)
            key = f"{measure}_{name}"
            values[key], intervals[key], replicates[key] = mean, (low, high), rows
        _warn_gap(measure, clean.value, rpi, atol)
    result = PatchingResult(layers=layers, values=values, intervals=intervals, replicates=replicates)
    result.values["ssdc_rpi"], result.values["top1_rpi"] = float(values["ssdc_rpi"]), float(values["top1_rpi"])
    return result


def _warn_gap(measure: str, clean: float, rpi: np.ndarray, atol: float) -> None:
    """Say where the fraction restored is undefined: no labels (top-1), or RPI changed nothing (no gap)."""
    same = np.abs(rpi - clean) <= atol
    if not math.isfinite(clean):
        what = "the data has no labels" if measure == "top1" else "the clean map is constant or not finite"
        warnings.warn(f"{measure} is not measured ({what}): NaN", RuntimeWarning, stacklevel=4)
    elif np.any(same):
        warnings.warn(
            f"RPI left {measure} unchanged{f' (to {atol:g})' if atol else ''} under {int(np.sum(same))} of {len(rpi)} "
            "permutations: the fraction restored is undefined there (NaN), as everywhere for a model without PE "
            "(permutation-equivariant)",
            RuntimeWarning,
            stacklevel=4,
        )
