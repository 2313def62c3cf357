"""The four localisation measures of one model together (what ``posgeom localise`` runs): :func:`localise`
and its :class:`LocalisationResult` (JSON, markdown tables, one figure of four panels).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch.nn as nn

from ..errors import SettingError, require
from ..measuring.settings import MeasureSettings
from ..results.jsonio import dump_json, tagged
from .ablation import AblationResult, position_ablation
from .encoding_cka import EncodingCKAResult, encoding_cka
from .imprint import ImprintResult, pe_imprint
from .patching import PatchingResult, activation_patching
from .result import LayerCurves, layer_name

__all__ = ["localise", "LocalisationResult", "MEASURES"]

MEASURES = ("patching", "imprint", "ablation", "cka")


@dataclass
class LocalisationResult:
    """The measures :func:`localise` ran (None: not asked for) and the run's settings."""

    patching: PatchingResult | None = None
    imprint: ImprintResult | None = None
    ablation: AblationResult | None = None
    cka: EncodingCKAResult | None = None
    settings: dict[str, Any] = field(default_factory=dict)

    def measures(self) -> dict[str, LayerCurves]:
        return {name: r for name in MEASURES if (r := getattr(self, name)) is not None}

    def to_dict(self) -> dict[str, Any]:
        return {"settings": self.settings, **{name: r.to_dict() for name, r in self.measures().items()}}

    def to_json(self, path: str | Path | None = None, indent: int = 2) -> str:
        """All the measures as JSON (NaN as null); written atomically to ``path`` when given."""
        return dump_json(tagged("localisation", self.to_dict()), path, indent)

    def tables(self) -> str:
        """One markdown table per measure, each number with its 95% interval."""
        shown = {
            "patching": ["top1_restored", "ssdc_restored", "top1_patched", "ssdc_patched"],
            "imprint": ["ssdc"],
            "ablation": ["top1_drop", "top1_drop_control", "ssdc_drop", "ssdc_drop_control"],
            "cka": ["cka"],
        }
        return "\n\n".join(f"{name}\n\n{r.table(shown[name])}" for name, r in self.measures().items())

    def plot(self, path: str | Path | None = None):
        """One panel per measure: the fraction patching restores, the imprint, the ablation's drops against the
        control's, the CKA of the encoding; every point with its 95% interval. Returns the Figure."""
        FigureCanvasAgg = require("matplotlib.backends.backend_agg", "plotting").FigureCanvasAgg
        Figure = require("matplotlib.figure", "plotting").Figure
        from ..results.plotting import fit_titles, save_figure

        panels = {
            "patching": (["top1_restored", "ssdc_restored"], "fraction of the RPI gap restored"),
            "imprint": (["ssdc"], "SSDC of constant images"),
            "ablation": (["top1_drop", "top1_drop_control", "ssdc_drop", "ssdc_drop_control"], "drop when ablated"),
            "cka": (["cka"], "CKA, alpha 1 vs alpha 0"),
        }
        shown = self.measures()
        fig = Figure(figsize=(3.4 * max(len(shown), 1), 3.2), layout="constrained")
        FigureCanvasAgg(fig)
        axes = fig.subplots(1, max(len(shown), 1), squeeze=False)[0]
        for ax, (name, result) in zip(axes, shown.items()):
            fields, label = panels[name]
            _panel(ax, result, fields)
            ax.set_title(name, fontsize=9)
            ax.set_ylabel(label, fontsize=8)
        fig.suptitle(str(self.settings.get("model", "")), fontsize=9)
        fit_titles(fig)
        if path is not None:
            save_figure(fig, path, dpi=110)
        return fig


def _panel(ax: Any, result: LayerCurves, fields: list[str]) -> None:
    """Each per-layer field of ``result`` as a line with 95% error bars, against its layers."""
    x = np.arange(len(result.layers))
    for offset, name in enumerate(fields):
        values = np.asarray(result.values[name], dtype=float)
        low, high = (np.asarray(v, dtype=float) for v in result.intervals.get(name, (values, values)))
        shift = (offset - (len(fields) - 1) / 2) * 0.08
        errors = np.nan_to_num(np.abs(np.stack([values - low, high - values])), nan=0.0)
        dashed = name.endswith("control")
        ax.errorbar(
            x + shift, values, yerr=errors, marker="o", ms=3, lw=1, capsize=2, ls="--" if dashed else "-", label=name
        )
    ax.set_xticks(x, [layer_name(layer).replace("block ", "") for layer in result.layers], fontsize=7)
    ax.set_xlabel("layer (block; embedding: its input)", fontsize=8)
    ax.axhline(0.0, color="0.7", lw=0.6)
    ax.legend(fontsize=6)


def localise(
    model: nn.Module,
    data: Any,
    settings: MeasureSettings | None = None,
    *,
    measures: tuple[str, ...] = MEASURES,
    patch: str = "residual",
    colours: int = 8,
    alpha: float = 0.0,
    fit: Any = None,
    **options: Any,
) -> LocalisationResult:
    """Run the chosen localisation measures on ``model`` over ``data`` (``(images, labels)`` batches, read once
    per measure): :func:`activation_patching` (``patch``), :func:`pe_imprint` (``colours``; no data),
    :func:`position_ablation` (probe fitted on ``fit``, else on ``data``) and :func:`encoding_cka` (``alpha``).
    ``settings`` (or its fields as keywords) is every measure's."""
    unknown = [m for m in measures if m not in MEASURES]
    if unknown or not measures:
        raise SettingError(f"measures must be among {', '.join(MEASURES)}, got {list(measures)}")
    settings, _ = MeasureSettings.resolve("localise", settings, options)
    out = LocalisationResult(settings={"measures": list(measures)})
    if "patching" in measures:
        out.patching = activation_patching(model, data, settings, patch=patch)
    if "imprint" in measures:
        out.imprint = pe_imprint(model, None, settings, colours=colours)
    if "ablation" in measures:
        out.ablation = position_ablation(model, data, settings, fit=fit)
    if "cka" in measures:
        out.cka = encoding_cka(model, data, settings, alpha=alpha)
    first = next(iter(out.measures().values()))
    out.settings["model"] = first.settings.get("model")
    return out
