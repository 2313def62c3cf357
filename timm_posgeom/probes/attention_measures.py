r"""Attention-level measures of a flat timm ViT, per block and per head, streamed over a dataset.

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

The measures are :class:`~.measures.Measure`\ s of the source ``attention`` (:class:`AttentionMeasure`);
new ones are passed as ``measures=[...]``, and :func:`~.measures.run_measures` also runs measures of
the blocks' tokens in the same pass.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn as nn

from ..errors import SettingError, require
from ..measuring.settings import MeasureSettings
from .measures import LayerView, Measure, MeasureResult, run_measures
from .ssdc_probe.spearman import DISTANCES, ConstantMapWarning, distance_ranks, grid_positions, ssdc_pairs, upper_pairs

__all__ = [
    "attention_measures",
    "AttentionResult",
    "AttentionMeasure",
    "AttentionView",
    "MeanAttentionDistance",
    "AttentionEntropy",
    "AttentionSSDC",
    "default_measures",
]


AttentionView = LayerView  # what an attention measure gets with the weights: layer, grid, prefix count


class AttentionMeasure(Measure):
    """A :class:`~.measures.Measure` of one block's attention weights A (B, heads, T, T) float32, per head:
    its fields are (L, heads) arrays."""

    source = "attention"


def _patch_block(attn: torch.Tensor, view: AttentionView) -> torch.Tensor:
    """(B, h, T, T) -> the (B, h, N, N) weights of patch queries on patch keys."""
    p = view.prefix
    return attn[:, :, p:, p:]


def _per_image_mean(name: str, measure: AttentionMeasure, layer: int, per_query: torch.Tensor) -> None:
    """per_query (B, h, N): mean over queries per image and head, summed over the batch's images."""
    measure.add(name, layer, per_query.double().mean(-1).sum(0))


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
        return {name: self.stacked(name, layers, n_images) for name in self.names}


class AttentionEntropy(AttentionMeasure):
    """``entropy``: H_i = -sum_j A_ij log A_ij (nats, 0 log 0 = 0) of a patch query's attention row over
    all T keys (prefix keys included: the softmax's own distribution), averaged over the patch queries
    of an image, then over images. Uniform attention over T keys gives log T."""

    names = ("entropy",)

    def update(self, attn: torch.Tensor, view: AttentionView) -> None:
        rows = attn[:, :, view.prefix :, :]  # (B, h, N, T) patch queries, every key
        _per_image_mean("entropy", self, view.layer, -torch.special.xlogy(rows, rows).sum(-1))

    def finish(self, layers: list[int], n_images: int, grid: tuple[int, int]) -> dict[str, np.ndarray]:
        return {"entropy": self.stacked("entropy", layers, n_images)}


class AttentionSSDC(AttentionMeasure):
    """``ssdc`` per head: SSDC (:func:`~timm_posgeom.probes.ssdc`, ``distance`` on the index grid) of
    S = (Abar + Abar^T) / 2, Abar (N, N) the weights of patch queries on patch keys averaged over images
    (not renormalised). NaN for a map constant over the pairs i < j."""

    names = ("ssdc",)

    def __init__(self, distance: str = "manhattan") -> None:
        super().__init__()
        if distance not in DISTANCES:
            raise SettingError(f"unknown distance {distance!r}; expected one of {', '.join(DISTANCES)}")
        self.distance = distance

    def update(self, attn: torch.Tensor, view: AttentionView) -> None:
        a = _patch_block(attn, view).sum(0, dtype=torch.float64)  # (h, N, N) summed over the batch
        self.add("pair_sum", view.layer, upper_pairs(a + a.transpose(1, 2)) / 2)  # (h, M) pairs i < j

    def finish(self, layers: list[int], n_images: int, grid: tuple[int, int]) -> dict[str, np.ndarray]:
        target = distance_ranks(grid, self.distance, None, torch.device("cpu"))
        rows = [ssdc_pairs(self.sums[("pair_sum", layer)] / n_images, [target])[0] for layer in layers]
        values = torch.stack(rows).numpy()
        flat = [f"layer {lay}: head(s) {np.flatnonzero(np.isnan(v)).tolist()}" for lay, v in zip(layers, values)]
        if np.isnan(values).any():
            warnings.warn(
                "attention SSDC is undefined (NaN) where a head's averaged attention map is constant up to float "
                f"rounding (uniform attention) or not finite: {'; '.join(f for f in flat if not f.endswith('[]'))}",
                ConstantMapWarning,
                stacklevel=2,
            )
        return {"ssdc": values}

    def metadata(self) -> dict[str, Any]:
        return {"ssdc_distance": self.distance}


def default_measures(distance: str = "manhattan") -> list[AttentionMeasure]:
    """Fresh instances of the built-in measures: distance, entropy, SSDC per head."""
    return [MeanAttentionDistance(), AttentionEntropy(), AttentionSSDC(distance)]


FIELDS = ("mean_distance", "entropy", "ssdc", "prefix_attention", "mean_distance_unnormalised")


class AttentionResult(MeasureResult):
    """Attention measures of one model, per probed block (rows) and head (columns).

    Attributes:
        layers: the block index of each row.
        values: field name -> (L, heads) float64 array (``mean_distance``, ``mean_distance_unnormalised``,
            ``prefix_attention``, ``entropy``, ``ssdc`` and any custom measure's fields), also read as
            attributes (``result.ssdc``).
        permutation: under RPI, the first permutation p (N,) (slot i holds patch p[i]).
        intervals / replicates: under RPI, each field's 95% interval over the permutations, and the field
            under each permutation (:class:`~timm_posgeom.probes.MeasureResult`).
        settings: model, rpi, seed, alpha, n_images, image_size, grid_size, num_prefix_tokens, num_heads,
            patch_size, ssdc_distance, distance ("euclidean, patch units"), family (``metadata``: its
            old name).
    """

    def head_mean(self, name: str) -> np.ndarray:
        """(L,) the mean over heads of field ``name`` (NaN heads left out)."""
        with np.errstate(all="ignore"):
            return np.nanmean(self.values[name], axis=1) if self.values[name].size else self.values[name][:, 0]

    def head_mean_interval(self, name: str) -> tuple[np.ndarray, np.ndarray] | None:
        """(L,) low and high of the 95% interval of :meth:`head_mean` over the RPI permutations (the mean over
        heads under each permutation, Student t); None without shared RPI permutations."""
        if name not in self.replicates:
            return None
        from ..results.intervals import t_interval

        with np.errstate(all="ignore"):
            per = np.nanmean(self.replicates[name], axis=2)  # (K, L)
        _, low, high = t_interval(per, axis=0)
        return low, high

    def table(self) -> str:
        """Plain text: per layer and built-in field, the mean over heads (``FIELD``), under RPI its 95% interval
        over the permutations (``FIELD_ci95``), and the range over heads (``FIELD_heads``: [min, max], a spread
        of the heads, not an interval)."""
        cols = [f for f in FIELDS[:4] if f in self.values]
        shared = bool(self.replicates)
        head = ["layer"]
        for c in cols:
            head += [c] + ([f"{c}_ci95"] if shared else []) + [f"{c}_heads"]
        rows = [head]
        for k, layer in enumerate(self.layers):
            row = [str(layer)]
            for c in cols:
                v = self.values[c][k]
                finite = np.isfinite(v).any()
                row.append(f"{np.nanmean(v):.3f}" if finite else "nan")
                if shared:
                    interval = self.head_mean_interval(c)
                    row.append(
                        f"[{interval[0][k]:.3f}, {interval[1][k]:.3f}]" if interval is not None else "[nan, nan]"
                    )
                row.append(f"[{np.nanmin(v):.3f}, {np.nanmax(v):.3f}]" if finite else "[nan, nan]")
            rows.append(row)
        widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
        lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
        if shared:
            lines.append(f"intervals: 95%, {self.settings.get('interval')}; *_heads: the range over heads")
        return "\n".join(lines)

    def plot(self, path: str | Path | None = None):
        """Per-head figure: one panel per built-in field, each head a dot at its layer (as the ViT paper's
        Fig. 7), the mean over heads a line. Agg canvas (no display). Returns the Figure."""
        FigureCanvasAgg = require("matplotlib.backends.backend_agg", "plotting").FigureCanvasAgg
        Figure = require("matplotlib.figure", "plotting").Figure

        from ..results.plotting import save_figure

        cols = [f for f in FIELDS[:4] if f in self.values]
        labels = {
            "mean_distance": "mean attention distance (patches)",
            "entropy": "attention entropy (nats)",
            "ssdc": "attention SSDC (symmetrised)",
            "prefix_attention": "attention on prefix tokens",
        }
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
        md = self.settings
        axes[0].legend(fontsize=7)
        fig.suptitle(
            f"{md.get('model', '')}{' RPI' if md.get('rpi') else ''}"
            f"{'' if md.get('alpha') is None else ' alpha=' + str(md['alpha'])}",
            fontsize=9,
        )
        if path is not None:
            save_figure(fig, path, dpi=120)
        return fig


def attention_measures(
    model: nn.Module,
    data: Any,
    *,
    rpi: bool = False,
    alpha: float | None = None,
    layers: list[int] | None = None,
    distance: str = "manhattan",
    measures: list[AttentionMeasure] | None = None,
    settings: MeasureSettings | None = None,
    **options: Any,
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
        rpi: random permutation of the patch tokens at inference, the protocol of
            :func:`~timm_posgeom.probes.probe_ssdc`: every field is the mean over ``rpi_permutations`` shared
            permutations (default 10), with its 95% interval over them (``intervals``); the distances stay
            those of the index grid (token slots), as SSDC under RPI.
        alpha: scale the positional encoding by alpha for the call (:func:`~timm_posgeom.pe_scale`);
            None leaves the model as it is.
        layers: block indices (negative allowed); default every block.
        distance: the grid distance of the attention SSDC (``manhattan``, the paper's; ``euclidean``;
            ``chebyshev``). The mean attention distance is always Euclidean.
        measures: the measures to run (default :func:`default_measures`\\ (``distance``)).

        settings: a :class:`~timm_posgeom.measuring.MeasureSettings`: ``seed`` (the RPI permutations'),
            ``rpi_permutations``, ``max_images``, ``device``, ``progress``, ``batch_size`` and ``distributed``, as those of
            :func:`~timm_posgeom.probes.probe_ssdc` (several processes sum their float64 sums); each may
            also be given as a keyword, which overrides ``settings``. ``forward_size``: as
            :func:`~timm_posgeom.probes.run_measures`.

    Returns:
        An :class:`AttentionResult`: each field (L, heads).
    """
    settings, own = MeasureSettings.resolve("attention_measures", settings, options, {"forward_size": None})
    measures = default_measures(distance) if measures is None else list(measures)
    result = run_measures(
        model, data, measures, rpi=rpi, alpha=alpha, layers=layers, settings=settings, forward_size=own["forward_size"]
    )
    result.settings.update({"distance": "euclidean, patch units", "definitions": "docs/attention.md"})
    return AttentionResult(
        layers=result.layers,
        values=result.values,
        permutation=result.permutation,
        settings=result.settings,
        intervals=result.intervals,
        replicates=result.replicates,
    )
