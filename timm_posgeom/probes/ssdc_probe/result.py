"""``SSDCResult``: what :func:`~timm_posgeom.probes.probe_ssdc` returns (numbers, maps, settings, plot).

Every result of the package names how its numbers were made ``settings`` (attribute and JSON key);
:class:`SettingsRecord` keeps the old name ``metadata`` of the probes' results readable and writable.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import InitVar, asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ...errors import require
from ...results.intervals import t_quantile
from ...results.jsonio import dump_json, tagged

__all__ = ["SSDCResult", "PerImageStats", "SettingsRecord"]


class SettingsRecord:
    """What the results that once named their settings ``metadata`` share: ``settings`` is the dict, and
    ``metadata`` (attribute, constructor keyword, JSON key) its old name, kept for old code and files."""

    settings: dict[str, Any]

    def _take_metadata(self, metadata: dict[str, Any] | None) -> None:
        """``metadata=`` given to the constructor: the settings under their old name (not both)."""
        if metadata is not None:
            if self.settings:
                raise TypeError(f"{type(self).__name__}() got both settings and metadata (its old name)")
            self.settings = metadata

    def _settings_json(self) -> dict[str, Any]:
        """The settings under ``"settings"``, and under ``"metadata"`` for readers of the old key."""
        return {"settings": dict(self.settings), "metadata": dict(self.settings)}

    @staticmethod
    def settings_of(record: dict[str, Any]) -> dict[str, Any]:
        """The settings of a written result: its ``"settings"``, or ``"metadata"`` in an older file."""
        return dict(record.get("settings") or record.get("metadata") or {})


def _metadata(self: SettingsRecord) -> dict[str, Any]:
    """The old name of ``settings`` (the same dict)."""
    return self.settings


def _set_metadata(self: SettingsRecord, value: dict[str, Any]) -> None:
    self.settings = value


METADATA_ALIAS = property(_metadata, _set_metadata, doc="The old name of ``settings`` (the same dict).")


@dataclass
class PerImageStats:
    """Per-image SSDC of one layer over n images: mean, sample std (ddof 1), two-sided 95% CI of the mean
    (Student t), and how many maps were NaN (constant maps; left out of the statistics).

    ``over`` says what the interval is over: ``"images"``; under RPI ``"K RPI permutations"`` (the mean is then
    the mean over K permutations of each one's image mean, the std that of every (image, permutation), and
    ``n_nan`` counts NaN maps over every permutation)."""

    mean: float
    std: float
    ci_low: float
    ci_high: float
    n: int
    n_nan: int = 0
    over: str = "images"

    @classmethod
    def from_moments(cls, n: int, mean: float, m2: float, n_nan: int = 0) -> PerImageStats:
        """From a count, a mean and a sum of squared deviations (Chan et al. streaming moments)."""
        if n == 0:
            return cls(math.nan, math.nan, math.nan, math.nan, 0, n_nan)
        if n == 1:
            return cls(mean, math.nan, math.nan, math.nan, 1, n_nan)
        std = math.sqrt(max(m2, 0.0) / (n - 1))
        half = t_quantile(n - 1) * std / math.sqrt(n)
        return cls(mean, std, mean - half, mean + half, n, n_nan)


@dataclass
class SSDCResult(SettingsRecord):
    """SSDC of one model at one probe site, layer by layer.

    Attributes:
        per_layer: SSDC per probed layer in depth order, against the index grid (the token slots'
            own positions; under RPI the paper's measure). From the mean map when it was computed
            (``reduction`` "mean_map" or "both"), else the mean of the per-image values.
        layers: the block index of each entry of ``per_layer``.
        per_image: per-image statistics per layer (``reduction`` "per_image" or "both"), else None.
        content_per_layer / content_per_image: under RPI, the same against the content grid (where
            each token's content came from: slot i holds patch p[i], at grid position p[i]); None
            without RPI. For a model without PE this equals the unpermuted SSDC.
        mean_maps: (L, N, N) float32 CPU tensor of the similarity maps averaged over images (in token
            slot order), when the mean map was computed; a list of L (N_l, N_l) tensors when the
            layers' grids differ (stages of a hierarchical model or CNN).
        permutation: under RPI, the first of the K permutations (N,) (slot i holds patch p[i]).
        settings: model, site, reduction, rpi, seed, rpi_permutations (K), permutation_seeds, interval
            (what ``per_layer_ci`` is over), jackknife_groups, distance, n_images, image_size, grid_size
            (the first layer's), grid_sizes (each layer's), granularity ("block" or "stage"), modules (per
            stage: the module each feature map comes from), alpha...; ``metadata`` is its old name.
        per_layer_ci / content_per_layer_ci: the 95% interval (low, high) of each entry of ``per_layer`` /
            ``content_per_layer``: over the K permutations under RPI (Student t; NaN with K = 1), else over
            images (the mean map's: a delete-a-group jackknife; the per-image reduction's: Student t).
        by_permutation / content_by_permutation: under RPI, (K, L) SSDC per permutation and layer (what the
            mean and the interval are made of).
        permutations: under RPI, the (K, N) permutations (permutation k from the seed ``seed + k``).
        rise_ci: the 95% interval of :attr:`rise`, made the same way as ``per_layer_ci`` (the rise of each
            permutation, or of each jackknife replicate).
        jackknife: without RPI, the mean map's jackknife replicates: ``{"deleted": (G, L) SSDC per layer with
            group g's images left out, "sizes": (G,) images per group}`` (:meth:`interval_of` reads them).
    """

    per_layer: list[float]
    layers: list[int]
    per_image: list[PerImageStats] | None = None
    content_per_layer: list[float] | None = None
    content_per_image: list[PerImageStats] | None = None
    mean_maps: torch.Tensor | list[torch.Tensor] | None = field(default=None, repr=False)
    permutation: torch.Tensor | None = field(default=None, repr=False)
    settings: dict[str, Any] = field(default_factory=dict)
    metadata: InitVar[dict[str, Any] | None] = None
    per_layer_ci: list[tuple[float, float]] | None = None
    content_per_layer_ci: list[tuple[float, float]] | None = None
    by_permutation: list[list[float]] | None = None
    content_by_permutation: list[list[float]] | None = None
    permutations: torch.Tensor | None = field(default=None, repr=False)
    rise_ci: tuple[float, float] | None = None
    jackknife: dict[str, Any] | None = None

    def __post_init__(self, metadata: dict[str, Any] | None) -> None:
        self._take_metadata(metadata)

    @property
    def rpi(self) -> bool:
        return bool(self.settings.get("rpi"))

    @property
    def rise(self) -> float:
        """SSDC(layer 1) - SSDC(layer 0) of a flat ViT's blocks, whatever the intervention (NaN unless both were
        probed; NaN per stage, where the two maps lie on different grids). Under RPI it is the paper's delta
        SSDC (:attr:`delta`)."""
        if self.settings.get("granularity") == "stage":
            return math.nan
        if 0 in self.layers and 1 in self.layers:
            return self.per_layer[self.layers.index(1)] - self.per_layer[self.layers.index(0)]
        return math.nan

    @property
    def delta(self) -> float:
        """The paper's delta SSDC: SSDC(layer 1) - SSDC(layer 0) under RPI (the mean over permutations of each
        permutation's rise; its interval: :attr:`delta_ci`). Without RPI it is not defined: the rise of a probe
        without RPI is :attr:`rise` (read here, it is returned with a DeprecationWarning, for one release)."""
        if not self.rpi:
            warnings.warn(
                "SSDCResult.delta is delta SSDC under RPI; without RPI, SSDC(layer 1) - SSDC(layer 0) is "
                "SSDCResult.rise (delta will be NaN without RPI in the next release)",
                DeprecationWarning,
                stacklevel=2,
            )
        return self.rise

    def interval_of(self, statistic: Callable[[np.ndarray], float]) -> tuple[float, float, float]:
        """(value, low, high): a statistic of the per-layer SSDC vector (L,) (e.g. ``np.nanmean``, its mean over
        layers) with its 95% interval, made as ``per_layer_ci`` is: under RPI the statistic of each
        permutation's vector, their mean and Student t interval; without RPI the statistic of ``per_layer``
        and the delete-a-group jackknife of its replicates. (NaN, NaN) where there are none."""
        from ...results.intervals import jackknife_interval, t_interval

        if self.by_permutation is not None:
            values = [statistic(np.asarray(row, dtype=float)) for row in self.by_permutation]
            mean, low, high = t_interval(np.asarray(values, dtype=float))
            return float(mean), float(low), float(high)
        value = float(statistic(np.asarray(self.per_layer, dtype=float)))
        if self.jackknife is None:
            return value, math.nan, math.nan
        deleted = [statistic(np.asarray(row, dtype=float)) for row in self.jackknife["deleted"]]
        low, high = jackknife_interval(value, deleted, self.jackknife["sizes"])
        return value, float(low), float(high)

    @property
    def delta_ci(self) -> tuple[float, float]:
        """The 95% interval of delta SSDC under RPI, over the permutations ((NaN, NaN) without RPI or with one
        permutation)."""
        if not self.rpi or self.rise_ci is None:
            return (math.nan, math.nan)
        low, high = self.rise_ci
        return (low, high)

    def to_dict(self, include_maps: bool = False) -> dict[str, Any]:
        """A JSON-ready dict (NaN kept as float NaN); the mean maps only when ``include_maps``. Every number a
        reader compares has its interval beside it under the same name + ``_ci`` ([low, high]): ``per_layer``,
        ``content_per_layer``, ``delta`` (under RPI only: None without) and ``rise`` (SSDC(layer 1) - SSDC(layer
        0), any probe)."""

        def pairs(ci):
            return [list(c) for c in ci] if ci is not None else None

        out: dict[str, Any] = {
            "per_layer": list(self.per_layer),
            "per_layer_ci": pairs(self.per_layer_ci),
            "layers": list(self.layers),
            "delta": self.rise if self.rpi else None,
            "delta_ci": list(self.delta_ci) if self.rpi else None,
            "rise": self.rise,
            "rise_ci": list(self.rise_ci) if self.rise_ci is not None else None,
            "per_image": [asdict(s) for s in self.per_image] if self.per_image is not None else None,
            "content_per_layer": list(self.content_per_layer) if self.content_per_layer is not None else None,
            "content_per_layer_ci": pairs(self.content_per_layer_ci),
            "content_per_image": (
                [asdict(s) for s in self.content_per_image] if self.content_per_image is not None else None
            ),
            "by_permutation": self.by_permutation,
            "jackknife": self.jackknife,
            "content_by_permutation": self.content_by_permutation,
            "permutation": self.permutation.tolist() if self.permutation is not None else None,
            "permutations": self.permutations.tolist() if self.permutations is not None else None,
            **self._settings_json(),
        }
        if include_maps and self.mean_maps is not None:
            out["mean_maps"] = [m.tolist() for m in self.mean_maps]
        return out

    def to_json(self, path: str | Path | None = None, include_maps: bool = False, indent: int = 2) -> str:
        """The :meth:`to_dict` as JSON (NaN written as null); also written to ``path`` when given (atomically)."""
        return dump_json(tagged("ssdc-result", self.to_dict(include_maps)), path, indent)

    def table(self) -> str:
        """A plain-text per-layer table. Each number a reader compares stands beside its own 95% interval:
        ``ssdc`` (the headline: SSDC of the mean map, or the mean of the per-image SSDC when only that was
        kept) and ``ssdc_ci95``; ``img_mean`` and ``img_mean_ci95``; ``content`` and ``content_ci95``. The last
        lines give delta SSDC (under RPI) or the rise from layer 0 to layer 1 (without), with its interval, and
        what the intervals are over."""
        grids = self.settings.get("grid_sizes") or []
        show_grid = len({tuple(g) for g in grids}) > 1
        head = [self._unit(), "ssdc", "ssdc_ci95"] + (["grid"] if show_grid else [])
        if self.per_image is not None:
            head += ["img_mean", "img_mean_ci95", "img_std"]
        if self.content_per_layer is not None:
            head += ["content", "content_ci95"]
        rows = [head]
        for k, layer in enumerate(self.layers):
            row = [str(layer), f"{self.per_layer[k]:.4f}", _ci_text(self.per_layer_ci, k)]
            row += ["x".join(map(str, grids[k]))] if show_grid else []
            if self.per_image is not None:
                s = self.per_image[k]
                row += [f"{s.mean:.4f}", _ci_text([(s.ci_low, s.ci_high)], 0), f"{s.std:.4f}"]
            if self.content_per_layer is not None:
                row += [f"{self.content_per_layer[k]:.4f}", _ci_text(self.content_per_layer_ci, k)]
            rows.append(row)
        widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
        lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
        unit = self._unit()
        if not math.isnan(self.rise):
            ci = _ci_text([self.rise_ci] if self.rise_ci is not None else None, 0)
            name = "delta SSDC under RPI" if self.rpi else "rise without RPI"
            lines.append(f"{name} ({unit} 1 - {unit} 0): {self.rise:.4f} {ci}")
        lines.append(
            f"intervals: 95%, ssdc {self.settings.get('interval', 'not recorded')}"
            + (f"; img_mean over {self.per_image[0].over}" if self.per_image else "")
        )
        return "\n".join(lines)

    def _unit(self) -> str:
        return "stage" if self.settings.get("granularity") == "stage" else "layer"

    def plot(self, path: str | Path | None = None, maps: bool = True, max_maps: int = 4):
        """SSDC across depth and, when ``maps`` and mean maps exist, up to ``max_maps`` mean similarity
        maps (first, ..., last layer; diagonal masked, each with its colour bar).

        The depth panel draws the SSDC of the mean map (the headline number) and, when per-image SSDC was
        kept, the mean of the per-image SSDCs with its own 95% interval as a band: the two are different
        statistics (averaging the maps first removes per-image noise, so the mean map's SSDC is usually the
        higher), and each band belongs to the line drawn with it. Under RPI the content grid is drawn too.

        Uses matplotlib's Agg canvas (no display, global backend untouched). Returns the Figure;
        saves it to ``path`` when given.
        """
        FigureCanvasAgg = require("matplotlib.backends.backend_agg", "plotting").FigureCanvasAgg
        Figure = require("matplotlib.figure", "plotting").Figure

        from ...results.plotting import fit_titles, save_figure, show_map

        mean_maps = self.mean_maps if maps else None
        idx = _spread(len(self.layers), max_maps) if mean_maps is not None else []
        fig = Figure(figsize=(4.8 + 2.9 * len(idx), 4.6), layout="constrained")
        FigureCanvasAgg(fig)
        axes = fig.subplots(1, 1 + len(idx), squeeze=False)[0]
        ax = axes[0]
        grid = " (index grid)" if self.content_per_layer else ""
        headline = "SSDC of the mean map" if md_reduction(self) != "per_image" else "per-image SSDC, mean"
        ax.plot(self.layers, self.per_layer, "o-", color="C0", label=f"{headline}{grid}")
        if self.per_layer_ci is not None and not all(math.isnan(lo) for lo, _ in self.per_layer_ci):
            ax.fill_between(
                self.layers,
                [lo for lo, _ in self.per_layer_ci],
                [hi for _, hi in self.per_layer_ci],
                color="C0",
                alpha=0.2,
                lw=0,
                label=f"its 95% interval, {self.settings.get('interval', '')}",
            )
        if self.per_image is not None and md_reduction(self) != "per_image":
            ax.plot(
                self.layers,
                [s.mean for s in self.per_image],
                "^:",
                color="C2",
                ms=4,
                label=f"per-image SSDC, mean{grid}",
            )
            ax.fill_between(
                self.layers,
                [s.ci_low for s in self.per_image],
                [s.ci_high for s in self.per_image],
                color="C2",
                alpha=0.2,
                lw=0,
                label=f"per-image SSDC, 95% interval of its mean over {self.per_image[0].over}",
            )
        if self.content_per_layer is not None:
            ax.plot(self.layers, self.content_per_layer, "s--", color="C1", label="SSDC of the mean map (content grid)")
        ax.axhline(0.0, color="0.6", lw=0.8)
        ax.set_xlabel(self._unit())
        ax.set_ylabel("SSDC")
        md = self.settings
        ax.set_title(f"{md.get('model', '')} {md.get('site', '')}{' RPI' if md.get('rpi') else ''}".strip(), fontsize=9)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.18))  # under the panel, off the lines
        for a, k in zip(axes[1:], idx):
            if mean_maps is not None:  # idx is empty without them
                show_map(a, mean_maps[k])
                a.set_title(f"{self._unit()} {self.layers[k]} mean map", fontsize=8)
        fit_titles(fig)
        if path is not None:
            save_figure(fig, path, dpi=120)
        return fig


# after the dataclass: the constructor keeps its keyword (an InitVar, which mypy does not take for an attribute)
SSDCResult.metadata = METADATA_ALIAS  # type: ignore[attr-defined]


def md_reduction(result: SSDCResult) -> str:
    """The result's reduction (``mean_map``, ``per_image`` or ``both``; ``mean_map`` when not recorded)."""
    return str(result.settings.get("reduction") or "mean_map")


def _ci_text(ci: list[tuple[float, float]] | None, k: int) -> str:
    """``[low, high]`` of entry k (4 decimals), ``[nan, nan]`` where there is none."""
    if ci is None:
        return "[nan, nan]"
    low, high = ci[k]
    return f"[{low:.4f}, {high:.4f}]"


def _spread(n: int, k: int) -> list[int]:
    if n <= k:
        return list(range(n))
    return sorted({round(i * (n - 1) / (k - 1)) for i in range(k)})
