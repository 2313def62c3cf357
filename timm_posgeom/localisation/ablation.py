"""Ablating the position probe's directions per block, then measuring top-1 and SSDC again
(docs/method.md#position-direction-ablation).

The linear position probe (:func:`~timm_posgeom.probes.fit_position_map`) is fitted on the residual stream of
every block (``block_output``) of the ``fit`` images; its readout of block b reads the r_b token directions
spanned by its weight columns (orthonormal basis Q_b, :meth:`~timm_posgeom.probes.position.PositionMap.directions`).
Ablating them at block b replaces each patch token x of that block's output by its mean along them,

    x <- x - ((x - mu_b) Q_b) Q_b^T      (mu_b: the mean patch token of the fitted images),

so what the probe reads of a token's position is gone and the rest of the token is left as it was; the forward
then goes on. As a control, a random subspace of the same rank r_b (orthonormal, from ``seed`` and b) is
ablated the same way: the position directions matter only where their ablation costs more than the control's.

On the ``data`` images: top-1 and the SSDC of the last block's image-mean map (against the patch grid), clean,
ablated at each block, and with the control ablated, each with a delete-a-group jackknife 95% interval over
20 random groups of images; and the drops (clean minus ablated, paired on the same images) with theirs.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn as nn

from ..errors import SettingError
from ..interventions import check_unpermuted, eval_mode
from ..measuring.settings import MeasureSettings
from ..probes.position import PositionMap, fit_position_map
from ..probes.sites import find_sites
from .batches import labelled_batches, placed
from .result import LayerCurves
from .tally import Tally
from .tracing import hits, similarity_maps, traced_forward

__all__ = ["position_ablation", "AblationResult", "JACKKNIFE_GROUPS"]

JACKKNIFE_GROUPS = 20


class AblationResult(LayerCurves):
    """Position-direction ablation per block: scalars ``top1_clean``, ``ssdc_clean``; per block ``top1_ablated``,
    ``ssdc_ablated``, ``top1_control``, ``ssdc_control``, the paired drops ``top1_drop``, ``ssdc_drop``,
    ``top1_drop_control``, ``ssdc_drop_control``, and ``rank`` (the directions ablated); each number's
    interval in ``intervals`` (jackknife over images)."""

    kind: ClassVar[str] = "position-ablation"


def random_subspace(dim: int, rank: int, seed: int) -> torch.Tensor:
    """(dim, rank) float64 orthonormal columns spanning a uniformly random ``rank``-dimensional subspace."""
    gaussian = torch.randn(dim, max(rank, 1), generator=torch.Generator().manual_seed(int(seed)), dtype=torch.float64)
    return torch.linalg.qr(gaussian)[0][:, :rank]


def ablation_edit(basis: torch.Tensor, mean: torch.Tensor, n_patches: int):
    """The edit of :func:`~timm_posgeom.localisation.tracing.traced_forward` that ablates ``basis`` (C, r) of the
    block's patch tokens around ``mean`` (C,)."""

    def edit(block_input: torch.Tensor, output: torch.Tensor) -> torch.Tensor:
        q = basis.to(output.device, output.dtype)
        patches = output[:, output.shape[1] - n_patches :]
        removed = ((patches - mean.to(output.device, output.dtype)) @ q) @ q.T
        return torch.cat([output[:, : output.shape[1] - n_patches], patches - removed], dim=1)

    return edit


def _subspaces(fitted: PositionMap, layers: list[int], seed: int) -> dict[str, dict[int, torch.Tensor]]:
    probe = {layer: fitted.directions(layer) for layer in layers}
    dim = next(iter(fitted.mean.values())).numel()
    control = {layer: random_subspace(dim, probe[layer].shape[1], seed * 1000 + layer) for layer in layers}
    return {"ablated": probe, "control": control}


def position_ablation(
    model: nn.Module,
    data: Any,
    settings: MeasureSettings | None = None,
    *,
    fit: Any = None,
    ridge: float = 1e-3,
    layers: Sequence[int] | None = None,
    labels: torch.Tensor | None = None,
    **options: Any,
) -> AblationResult:
    """Top-1 and SSDC with the position probe's directions ablated at each block (module docstring).

    Args:
        model: a flat timm ViT; eval mode for the call, restored.
        data: the images measured: ``(images, labels)`` batches (:func:`~timm_posgeom.data.eval_data.eval_loader`) or
            a tensor with ``labels``; read twice when it is also the fit's. Without labels top-1 is NaN.
        settings: :class:`~timm_posgeom.measuring.MeasureSettings` (``max_images``, ``batch_size``, ``seed``: the
            jackknife's groups and the control subspaces, ``device``, ``progress``); fields as keywords too.
        fit: the images the probe is fitted on (batches as ``data``); None: ``data`` itself (the directions are
            then fitted on the images they are ablated on: give other images where that matters).
        ridge: the probe's ridge penalty (:func:`~timm_posgeom.probes.position_probe`).
        layers: the blocks to ablate at (default every block).
        labels: (n,) labels of a tensor ``data``.
    """
    settings, _ = MeasureSettings.resolve("position_ablation", settings, options)
    check_unpermuted(model, "position_ablation")
    sites = find_sites(model)
    depth = len(sites.blocks)
    layer_ids = list(range(depth)) if layers is None else sorted({int(b) % depth for b in layers})
    if layers is not None and (not layer_ids or any(not -depth <= int(b) < depth for b in layers)):
        raise SettingError(f"layers must be block indices of a model with {depth} blocks, got {list(layers)}")
    seed = 0 if settings.seed is None else int(settings.seed)
    fit_settings = settings.replace(distributed="off")
    fitted = fit_position_map(
        model, data if fit is None else fit, site="block_output", ridge=ridge, layers=layer_ids, settings=fit_settings
    )
    spaces = _subspaces(fitted, layer_ids, seed)
    grid = tuple(fitted.settings["grid_size"])
    n = grid[0] * grid[1]
    tally = Tally((int(grid[0]), int(grid[1])), JACKKNIFE_GROUPS, seed)
    last = depth - 1
    with placed(model, settings.device) as (device, dtype), eval_mode(model):
        for images, batch_labels, offset in labelled_batches(data, settings, "position_ablation", labels):
            groups = tally.group_of(offset, len(images))
            tally.count(groups, batch_labels is not None)
            x = images.to(device=device, dtype=dtype)
            run = traced_forward(model, sites, x, record={last})
            tally.add("clean", similarity_maps(run.outputs[last], None, n), hits(run.logits, batch_labels), groups)
            for variant, bases in spaces.items():
                for layer in layer_ids:
                    edit = (layer, ablation_edit(bases[layer], fitted.mean[layer], n))
                    run = traced_forward(model, sites, x, record={last}, edit=edit)
                    maps = similarity_maps(run.outputs[last], None, n)
                    tally.add((variant, layer), maps, hits(run.logits, batch_labels), groups)
    result = _finish(tally, layer_ids, spaces)
    result.settings.update(
        model=fitted.settings["model"],
        fit_images=fitted.settings["train_images"],
        n_images=int(tally.counts.sum()),
        fitted_on="data" if fit is None else "fit",
        grid_size=list(grid),
        ridge=ridge,
        seed=seed,
        site="probe fitted at block_output; SSDC of the last block's output (mean map)",
        intervals=f"delete-a-group jackknife over {JACKKNIFE_GROUPS} random groups of images",
    )
    return result


def _finish(tally: Tally, layers: list[int], spaces: dict[str, dict[int, torch.Tensor]]) -> AblationResult:
    values: dict[str, Any] = {}
    intervals: dict[str, tuple[Any, Any]] = {}
    for measure, read in (("top1", tally.top1), ("ssdc", tally.ssdc)):
        keys = ["clean"] + [(v, layer) for v in spaces for layer in layers]
        est = read(keys)
        clean = est["clean"]
        values[f"{measure}_clean"], intervals[f"{measure}_clean"] = clean.value, tally.interval(clean)
        for variant, drop in (("ablated", "drop"), ("control", "drop_control")):
            rows = [est[(variant, layer)] for layer in layers]
            drops = [clean.combine(e, np.subtract) for e in rows]
            for name, series in ((f"{measure}_{variant}", rows), (f"{measure}_{drop}", drops)):
                values[name] = np.array([e.value for e in series])
                ends = np.array([tally.interval(e) for e in series]).reshape(len(layers), 2)
                intervals[name] = (ends[:, 0], ends[:, 1])
        if not math.isfinite(clean.value):
            warnings.warn(
                f"{measure} is not measured (no labels, or a constant map): NaN", RuntimeWarning, stacklevel=3
            )
    values["rank"] = np.array([spaces["ablated"][layer].shape[1] for layer in layers], dtype=float)
    return AblationResult(layers=layers, values=values, intervals=intervals)
