"""What the interventions on positions measure (:mod:`.position_interventions`): one :class:`InterventionRow` per
condition (the model as it is, RPI, the encoding shuffled, shifted by s patches, the image cut into g x g tiles and
shuffled), each with top-1 and SSDC per layer and their 95% intervals, in one :class:`InterventionResult` (JSON,
markdown, a figure). Definitions: docs/method.md#pe-shuffle-and-pe-shift and docs/method.md#image-grid-shuffle.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import require
from ..results.intervals import t_interval
from ..results.jsonio import dump_json, tagged, to_jsonable

__all__ = ["InterventionRow", "InterventionResult", "MEASURES"]

MEASURES = ("pe_shuffle", "pe_shift", "tile_shuffle")

_NAN2 = (math.nan, math.nan)


@dataclass
class InterventionRow:
    """One condition of an intervention measure.

    Attributes:
        condition: what was done (``"clean"``, ``"rpi"``, ``"pe shuffle"``, ``"pe shuffle: rope"``, ``"shift
            0.5"``, ``"grid 4"``).
        value: the amount swept (a shift in patches, tiles per side), None for a named condition.
        top1, top1_ci: top-1 accuracy and its 95% interval (over the permutations, Student t, where there are
            several; else over images, Wilson: ``top1_interval`` says which).
        ssdc_content, ssdc_content_ci: SSDC per layer against the **content grid** (where each token's content
            lies in the image) and its 95% intervals.
        ssdc_encoding, ssdc_encoding_ci: SSDC per layer against the **encoding grid** (the position the encoding
            gives each token: the slot under RPI and under a tile shuffle, the moved position under a PE
            shuffle); None where the two grids are one (the model as it is, a shift).
        ssdc_interval: what the SSDC intervals are over (the permutations, or images: a delete-a-group jackknife).
        mean_content, mean_content_ci / mean_encoding, mean_encoding_ci: the mean over layers, with its interval
            made the same way.
        replicates: the permutations the row averages (1: one arrangement).
        by_replicate: ``{"top1": [K], "ssdc_content": [K][L], "ssdc_encoding": [K][L]}``, what the means are of.
    """

    condition: str
    value: float | None
    top1: float
    top1_ci: tuple[float, float]
    top1_interval: str
    ssdc_content: list[float]
    ssdc_content_ci: list[tuple[float, float]]
    ssdc_interval: str
    mean_content: float
    mean_content_ci: tuple[float, float]
    ssdc_encoding: list[float] | None = None
    ssdc_encoding_ci: list[tuple[float, float]] | None = None
    mean_encoding: float = math.nan
    mean_encoding_ci: tuple[float, float] = _NAN2
    replicates: int = 1
    by_replicate: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_replicates(
        cls,
        condition: str,
        value: float | None,
        top1: list[float],
        content: list[list[float]],
        encoding: list[list[float]] | None,
    ) -> InterventionRow:
        """A row over K replicates (permutations): every number their mean with a Student t 95% interval over
        them (NaN replicates left out; NaN with fewer than 2 finite)."""
        t_mean, t_low, t_high = t_interval(np.asarray(top1, dtype=float))
        over = "permutations (Student t)"
        row = _row(condition, value, (float(t_mean), (float(t_low), float(t_high)), over), _layer_stats(content), over)
        row.replicates = len(top1)
        row.by_replicate = {"top1": list(top1), "ssdc_content": content, "ssdc_encoding": encoding}
        return _with_encoding(row, None if encoding is None else _layer_stats(encoding))

    @classmethod
    def from_measurements(cls, condition: str, value: float | None, frag: Any, probe: Any) -> InterventionRow:
        """A row from one :func:`~timm_posgeom.robustness.fragility` (its clean top-1, Wilson interval) and one
        :func:`~timm_posgeom.probes.probe_ssdc` (its intervals: over images without RPI; under RPI over its
        permutations, against the content grid and, as ``ssdc_encoding``, the index grid)."""
        low, high = frag.clean_interval
        top1 = (float(frag.clean_accuracy), (float(low), float(high)), "images (Wilson)")
        if not probe.rpi:
            mean, m_low, m_high = probe.interval_of(np.mean)
            ci = [(float(lo), float(hi)) for lo, hi in probe.per_layer_ci]
            content = ([float(v) for v in probe.per_layer], ci, float(mean), (float(m_low), float(m_high)))
            return _row(condition, value, top1, content, "images (delete-a-group jackknife)")
        row = _row(condition, value, top1, _layer_stats(probe.content_by_permutation), "permutations (Student t)")
        row.replicates = len(probe.by_permutation)
        return _with_encoding(row, _layer_stats(probe.by_permutation))

    def to_dict(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        for key in ("top1_ci", "mean_content_ci", "mean_encoding_ci"):
            out[key] = list(out[key])
        for key in ("ssdc_content_ci", "ssdc_encoding_ci"):
            out[key] = None if out[key] is None else [list(c) for c in out[key]]
        return out


_Stats = tuple  # (per-layer values, their intervals, the mean over layers, its interval)


def _row(condition: str, value: float | None, top1: tuple, content: _Stats, interval: str) -> InterventionRow:
    """A row of one arrangement: ``top1`` (value, interval, what it is over) and ``content`` :data:`_Stats`."""
    return InterventionRow(
        condition=condition,
        value=value,
        top1=top1[0],
        top1_ci=top1[1],
        top1_interval=top1[2],
        ssdc_content=content[0],
        ssdc_content_ci=content[1],
        ssdc_interval=interval,
        mean_content=content[2],
        mean_content_ci=content[3],
    )


def _with_encoding(row: InterventionRow, encoding: _Stats | None) -> InterventionRow:
    """``row`` with its SSDC against the encoding grid (None: the same grid as the content's)."""
    if encoding is not None:
        row.ssdc_encoding, row.ssdc_encoding_ci, row.mean_encoding, row.mean_encoding_ci = encoding
    return row


def _layer_stats(replicates: list[list[float]]) -> tuple[list[float], list[tuple[float, float]], float, tuple]:
    """(per-layer means, their t intervals, the mean over layers, its t interval) of (K, L) replicates; the mean
    over layers of a replicate with a NaN layer is NaN (never a mean of fewer layers)."""
    values = np.asarray(replicates, dtype=float)
    mean, low, high = t_interval(values)
    m_mean, m_low, m_high = t_interval(values.mean(axis=1))
    return (
        [float(v) for v in mean],
        [(float(a), float(b)) for a, b in zip(low, high)],
        float(m_mean),
        (float(m_low), float(m_high)),
    )


@dataclass
class InterventionResult:
    """An intervention measure's rows (in the order measured) for the probed ``layers``; ``settings`` records
    the model, images, permutations, seed and the measure's own options."""

    measure: str
    rows: list[InterventionRow]
    layers: list[int]
    settings: dict[str, Any] = field(default_factory=dict)

    def row(self, condition: str) -> InterventionRow:
        """The row of ``condition`` (KeyError naming the conditions there are)."""
        for r in self.rows:
            if r.condition == condition:
                return r
        raise KeyError(f"no condition {condition!r}: the rows are {[r.condition for r in self.rows]}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "measure": self.measure,
            "layers": list(self.layers),
            "rows": [r.to_dict() for r in self.rows],
            "settings": to_jsonable(self.settings),
        }

    def to_json(self, path: str | os.PathLike | None = None, indent: int = 2) -> str:
        """:meth:`to_dict` as strict JSON (NaN written as null); also written to ``path`` if given (atomically)."""
        return dump_json(tagged("intervention-result", self.to_dict()), path, indent)

    def to_markdown(self, digits: int = 3) -> str:
        """One line per condition: top-1, the mean SSDC over layers against the content grid and against the
        encoding grid, each with its 95% interval, the permutations, and SSDC per layer (content grid)."""
        head = [
            "condition",
            "top-1",
            "top-1 95% CI",
            "SSDC content (mean)",
            "95% CI",
            "SSDC encoding (mean)",
            "95% CI",
            "permutations",
            "SSDC content per layer",
        ]
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

        def num(v: float) -> str:
            return "n/a" if v is None or not math.isfinite(v) else f"{v:.{digits}f}"

        def ci(pair: tuple[float, float]) -> str:
            return "n/a" if not all(math.isfinite(v) for v in pair) else f"[{pair[0]:.{digits}f}, {pair[1]:.{digits}f}]"

        for r in self.rows:
            encoding = r.ssdc_encoding is not None
            cells = [
                r.condition,
                num(r.top1),
                ci(r.top1_ci),
                num(r.mean_content),
                ci(r.mean_content_ci),
                num(r.mean_encoding) if encoding else "(same)",
                ci(r.mean_encoding_ci) if encoding else "",
                str(r.replicates),
                ", ".join(num(v) for v in r.ssdc_content),
            ]
            lines.append("| " + " | ".join(cells) + " |")
        return "\n".join(lines)

    def plot(self, path: str | os.PathLike | None = None) -> Any:
        """Top-1 (top panel) and the mean SSDC over layers against the content and the encoding grid (bottom),
        each with its 95% interval: against the amount swept (shift, tiles per side) where the rows have one,
        else one point per condition. Returns the matplotlib Figure; also saved to ``path`` if given."""
        Figure = require("matplotlib.figure", "plotting").Figure

        from ..results.plotting import fit_titles, save_figure

        fig = Figure(figsize=(5.6, 5.4), layout="constrained")
        top, bottom = fig.subplots(2, 1, sharex=True)
        swept = [r for r in self.rows if r.value is not None]
        rows = swept or self.rows
        x = np.asarray([r.value for r in rows], dtype=float) if swept else np.arange(len(rows), dtype=float)
        _band(top, x, rows, "top1", "k", "top-1")
        _band(bottom, x, rows, "mean_content", "C0", "SSDC against the content grid")
        if any(r.ssdc_encoding is not None for r in rows):
            _band(bottom, x, rows, "mean_encoding", "C3", "SSDC against the encoding grid")
        top.set_ylabel("top-1")
        bottom.set_ylabel("SSDC (mean over layers)")
        bottom.axhline(0, color="0.6", lw=0.5)
        if swept:
            bottom.set_xlabel(str(self.settings.get("axis") or "amount"))
        else:
            bottom.set_xticks(x, [r.condition for r in rows], rotation=20, ha="right", fontsize=7)
        for ax in (top, bottom):
            ax.legend(fontsize=7)
        top.set_title(f"{self.measure}: {self.settings.get('model') or ''}", fontsize=9)
        fit_titles(fig)
        if path is not None:
            save_figure(fig, path, dpi=120)
        return fig


def _band(ax: Any, x: np.ndarray, rows: list[InterventionRow], key: str, color: str, label: str) -> None:
    """``key`` of each row against ``x`` with its 95% interval: a line and band for a sweep, error bars else."""
    y = np.asarray([getattr(r, key) for r in rows], dtype=float)
    ci = np.asarray([getattr(r, f"{key}_ci") for r in rows], dtype=float)
    err = np.abs(np.stack([y - ci[:, 0], ci[:, 1] - y]))
    ax.errorbar(x, y, yerr=np.where(np.isfinite(err), err, 0), fmt="o-", color=color, ms=4, capsize=2, label=label)
