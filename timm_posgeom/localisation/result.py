"""The typed result every localisation measure returns: named numbers per layer, each beside its 95% interval
(docs/method.md#causal-localisation).

A field is a scalar (one number for the model: the clean top-1) or an (L,) array over ``layers`` (one number
per patched or ablated layer); ``intervals[name]`` holds its (low, high), of the same shape, and says over
what in ``settings["intervals"]``. NaN stays NaN (written as null in JSON), never a number.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ..results.jsonio import dump_json, tagged

__all__ = ["LayerCurves", "layer_name"]


def layer_name(layer: int) -> str:
    """``embedding`` for layer -1 (block 0's input), else ``block b``."""
    return "embedding" if layer < 0 else f"block {layer}"


def _fmt(value: float) -> str:
    return "nan" if not math.isfinite(value) else f"{value:.3f}"


@dataclass
class LayerCurves:
    """Numbers per layer with their intervals: the base of each localisation result.

    Attributes:
        layers: the layer of each row (-1: the embedding, the input of block 0; b: block b).
        values: name -> a float or an (L,) float64 array.
        intervals: name -> (low, high), each like its value (NaN where none exists).
        settings: what was measured and how (model, images, permutations, seeds, what each interval is over).
        replicates: name -> (K, ...) the field under each permutation, where it is a mean over permutations.
    """

    kind: ClassVar[str] = "layer-curves"
    layers: list[int]
    values: dict[str, Any]
    intervals: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    replicates: dict[str, np.ndarray] = field(default_factory=dict, repr=False)

    def __getattr__(self, name: str) -> Any:
        values = self.__dict__.get("values") or {}
        if name in values:
            return values[name]
        raise AttributeError(name)

    def peak(self, name: str) -> int | None:
        """The layer where the per-layer field ``name`` is largest (NaN left out); None when all are NaN."""
        row = np.asarray(self.values[name], dtype=float)
        if row.ndim != 1 or not np.isfinite(row).any():
            return None
        return self.layers[int(np.nanargmax(row))]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: every field as a number or list, its interval beside it (``NAME_ci_low``, ``NAME_ci_high``)."""
        out: dict[str, Any] = {"layers": list(self.layers)}
        for name, value in self.values.items():
            out[name] = np.asarray(value, dtype=float).tolist()
            if name in self.intervals:
                low, high = self.intervals[name]
                out[f"{name}_ci_low"] = np.asarray(low, dtype=float).tolist()
                out[f"{name}_ci_high"] = np.asarray(high, dtype=float).tolist()
        if self.replicates:
            out["replicates"] = {k: np.asarray(v, dtype=float).tolist() for k, v in self.replicates.items()}
        out["settings"] = self.settings
        return out

    def to_json(self, path: str | Path | None = None, indent: int = 2) -> str:
        """:meth:`to_dict` as JSON (NaN written as null); also written to ``path`` (atomically) when given."""
        return dump_json(tagged(self.kind, self.to_dict()), path, indent)

    def table(self, names: list[str] | None = None) -> str:
        """A markdown table: one row per layer, each per-layer field as ``value [low, high]``."""
        names = [n for n in (names or list(self.values)) if np.ndim(self.values[n]) == 1]
        lines = ["| layer | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
        for i, layer in enumerate(self.layers):
            cells = []
            for n in names:
                low, high = (np.asarray(x, dtype=float) for x in self.intervals.get(n, (np.nan, np.nan)))
                lo, hi = (float(x[i]) if x.ndim else float(x) for x in (low, high))
                cells.append(f"{_fmt(float(self.values[n][i]))} [{_fmt(lo)}, {_fmt(hi)}]")
            lines.append(f"| {layer_name(layer)} | " + " | ".join(cells) + " |")
        return "\n".join(lines)
