"""What :func:`~timm_posgeom.resolution.extrapolate` returns: one row per input size and mode, with intervals.

:class:`ExtrapolationRow` holds one (size, mode): top-1 with its Wilson interval, SSDC per layer (clean images,
the mean map's jackknife interval), SSDC per layer and delta SSDC under RPI (Student t over the permutations),
attention entropy and mean attention distance per layer (means over heads), and the fragility scores when asked.
:class:`ExtrapolationResult` holds the rows of one model with the settings they were measured with: JSON (NaN
written as null, read back as NaN), CSV, a markdown table and the figure (:func:`extrapolation_figure`: top-1,
delta SSDC and the last layer's attention entropy against the scale, one line per mode, error bars).
Definitions: docs/method.md#resolution-extrapolation.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ResultFileError, require
from ..results.jsonio import dump_json, nan_if_none, tagged, write_atomic

__all__ = ["ExtrapolationRow", "ExtrapolationResult", "extrapolation_figure", "SCHEMA"]

SCHEMA = "extrapolation-result"
Interval = tuple[float, float]


def _nan(value: Any) -> Any:
    """JSON's nulls back to NaN, in numbers, lists and dicts."""
    if isinstance(value, list):
        return [_nan(v) for v in value]
    if isinstance(value, dict):
        return {k: _nan(v) for k, v in value.items()}
    return nan_if_none(value)


def _pair(value: Sequence[float]) -> Interval:
    return float(value[0]), float(value[1])


@dataclass
class ExtrapolationRow:
    """One model at one input size, carried there in one mode.

    Attributes:
        size: the input size S (S x S pixels); ``scale`` = S / the training size; ``grid`` the (h, w) patch grid.
        mode: how the PE was carried (:data:`~timm_posgeom.resolution.MODES`).
        top1, top1_ci: top-1 accuracy over ``top1_images`` images and its Wilson 95% interval.
        ssdc, ssdc_ci: per layer, SSDC of the mean similarity map of ``probe_images`` clean images at the
            attention input, and its delete-a-group jackknife 95% interval over images.
        rpi_ssdc, rpi_ssdc_ci: per layer, SSDC under RPI against the index grid: the mean over the K permutations
            and its Student t 95% interval over them.
        delta_ssdc, delta_ssdc_ci: SSDC(layer 1) - SSDC(layer 0) under RPI (the paper's delta SSDC), its interval.
        entropy: per layer, the attention entropy (nats) of a patch query over all keys, mean over heads and
            images; ``uniform_entropy`` = log T, the entropy of uniform attention over the T tokens.
        mean_distance: per layer, the mean attention distance in patches (patch keys), mean over heads and images.
        fs, fs_ci: the fragility score of each shift asked for, and its paired bootstrap 95% interval.
        seconds: the time the row took.
    """

    size: int
    mode: str
    scale: float
    grid: list[int]
    top1: float
    top1_ci: Interval
    top1_images: int
    ssdc: list[float]
    ssdc_ci: list[Interval]
    rpi_ssdc: list[float]
    rpi_ssdc_ci: list[Interval]
    delta_ssdc: float
    delta_ssdc_ci: Interval
    entropy: list[float]
    uniform_entropy: float
    mean_distance: list[float]
    probe_images: int
    fs: dict[str, float] = field(default_factory=dict)
    fs_ci: dict[str, Interval] = field(default_factory=dict)
    seconds: float = math.nan

    @property
    def key(self) -> tuple[int, str]:
        return self.size, self.mode

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> ExtrapolationRow:
        values = {f.name: _nan(record[f.name]) for f in dataclasses.fields(cls) if f.name in record}
        values["size"], values["top1_images"], values["probe_images"] = (
            int(record["size"]),
            int(record["top1_images"]),
            int(record["probe_images"]),
        )
        for name in ("top1_ci", "delta_ssdc_ci"):
            values[name] = _pair(values[name])
        for name in ("ssdc_ci", "rpi_ssdc_ci"):
            values[name] = [_pair(v) for v in values[name]]
        values["fs_ci"] = {k: _pair(v) for k, v in values.get("fs_ci", {}).items()}
        return cls(**values)


@dataclass
class ExtrapolationResult:
    """The rows of one model (:class:`ExtrapolationRow`), in measuring order, and their settings.

    Attributes:
        rows: one per (size, mode) measured.
        layers: the block index of each per-layer entry.
        settings: model, training_size, patch_size, top1_images, probe_images, rpi_permutations, seed, resize,
            labels, shifts, site, what every row was measured with (a row measured with other settings is
            never mixed in: :func:`~timm_posgeom.resolution.extrapolate` refuses such a ``resume``).
    """

    rows: list[ExtrapolationRow]
    layers: list[int]
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def sizes(self) -> list[int]:
        return sorted({r.size for r in self.rows})

    @property
    def modes(self) -> list[str]:
        return list(dict.fromkeys(r.mode for r in self.rows))

    def row(self, size: int, mode: str) -> ExtrapolationRow:
        """The row of ``size`` and ``mode``; KeyError when it was not measured."""
        for r in self.rows:
            if r.key == (size, mode):
                return r
        raise KeyError(f"no row for size {size} and mode {mode!r}")

    def to_dict(self) -> dict[str, Any]:
        return {"layers": list(self.layers), "settings": dict(self.settings), "rows": [r.to_dict() for r in self.rows]}

    def to_json(self, path: str | Path | None = None, indent: int = 2) -> str:
        """:meth:`to_dict` as tagged JSON (NaN written as null); also written to ``path`` atomically."""
        return dump_json(tagged(SCHEMA, self.to_dict()), path, indent)

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> ExtrapolationResult:
        schema = record.get("schema")
        if schema is not None and schema != f"timm-posgeom/{SCHEMA}":
            raise ResultFileError(f"not an extrapolation result: schema {schema!r}")
        rows = [ExtrapolationRow.from_dict(r) for r in record.get("rows", [])]
        return cls(rows=rows, layers=[int(v) for v in record.get("layers", [])], settings=dict(record["settings"]))

    @classmethod
    def read(cls, path: str | Path) -> ExtrapolationResult:
        """The result written to ``path`` by :meth:`to_json`."""
        return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))

    def csv_rows(self) -> list[dict[str, Any]]:
        """One flat dict per row: the numbers, intervals as ``_low`` / ``_high``, per layer ``_l{layer}``."""
        return [_csv_row(r, self.layers) for r in self.rows]

    def to_csv(self, path: str | Path | None = None) -> str:
        """:meth:`csv_rows` as CSV text (NaN written as ``nan``); also written to ``path`` atomically."""
        rows = self.csv_rows()
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=list(rows[0]) if rows else ["size", "mode"], lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        if path is not None:
            write_atomic(path, buffer.getvalue())
        return buffer.getvalue()

    def table(self) -> str:
        """A markdown table: per mode and size, top-1, delta SSDC under RPI, the last layer's SSDC (clean and
        under RPI) and attention entropy over log T, with the 95% intervals."""
        head = "| mode | size | scale | top-1 [95% CI] | delta SSDC under RPI [95% CI] | SSDC last | RPI SSDC last | entropy / log T last |"
        lines = [head, "|" + "---|" * 8]
        for mode in self.modes:
            for r in sorted((r for r in self.rows if r.mode == mode), key=lambda r: r.size):
                lines.append(
                    f"| {mode} | {r.size} | {r.scale:g} | {_ci(r.top1, r.top1_ci)} | {_ci(r.delta_ssdc, r.delta_ssdc_ci)} "
                    f"| {_num(r.ssdc[-1])} | {_num(r.rpi_ssdc[-1])} | {_num(r.entropy[-1] / r.uniform_entropy)} |"
                )
        return "\n".join(lines)

    def plot(self, path: str | Path | None = None) -> Any:
        """The figure of this model (:func:`extrapolation_figure`); saved to ``path`` when given. Returns it."""
        return extrapolation_figure([self], path=path, title=str(self.settings.get("model", "")))


def _num(value: float) -> str:
    return "nan" if not math.isfinite(value) else f"{value:.3f}"


def _ci(value: float, interval: Interval) -> str:
    return f"{_num(value)} [{_num(interval[0])}, {_num(interval[1])}]"


def _csv_row(r: ExtrapolationRow, layers: list[int]) -> dict[str, Any]:
    out: dict[str, Any] = {"size": r.size, "mode": r.mode, "scale": r.scale, "grid": f"{r.grid[0]}x{r.grid[1]}"}
    for name, value, interval in (("top1", r.top1, r.top1_ci), ("delta_ssdc", r.delta_ssdc, r.delta_ssdc_ci)):
        out[name], out[f"{name}_low"], out[f"{name}_high"] = value, *interval
    for name in ("ssdc", "rpi_ssdc", "entropy", "mean_distance"):
        for layer, value in zip(layers, getattr(r, name)):
            out[f"{name}_l{layer}"] = value
    out["uniform_entropy"] = r.uniform_entropy
    for shift, value in r.fs.items():
        out[f"fs_{shift}"], out[f"fs_{shift}_low"], out[f"fs_{shift}_high"] = value, *r.fs_ci[shift]
    out.update(top1_images=r.top1_images, probe_images=r.probe_images, seconds=round(r.seconds, 2))
    return {k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in out.items()}


_PANELS = (
    ("top-1", lambda r: r.top1, lambda r: r.top1_ci),
    ("delta SSDC under RPI", lambda r: r.delta_ssdc, lambda r: r.delta_ssdc_ci),
    ("attention entropy / log T (last layer)", lambda r: r.entropy[-1] / r.uniform_entropy, None),
)


def _series(results: Sequence[ExtrapolationResult], mode: str, panel: int) -> tuple[np.ndarray, ...]:
    """(scales, means, lows, highs) of one mode in one panel: over several results (seeds), the mean and its
    Student t 95% interval over them; over one, the row's own interval."""
    from ..results.intervals import t_interval

    _, value, interval = _PANELS[panel]
    scales = sorted({r.scale for res in results for r in res.rows if r.mode == mode})
    means, lows, highs = [], [], []
    for scale in scales:
        rows = [r for res in results for r in res.rows if r.mode == mode and r.scale == scale]
        if len(rows) > 1:
            mean, low, high = (float(v) for v in t_interval([value(r) for r in rows]))
        else:
            mean = value(rows[0])
            low, high = interval(rows[0]) if interval is not None else (math.nan, math.nan)
        means.append(mean)
        lows.append(low)
        highs.append(high)
    return tuple(np.asarray(v, dtype=float) for v in (scales, means, lows, highs))


def extrapolation_figure(
    results: Sequence[ExtrapolationResult],
    labels: Sequence[str] | None = None,
    path: str | Path | None = None,
    title: str = "",
) -> Any:
    """Top-1, delta SSDC under RPI and the last layer's attention entropy over log T against the scale (input
    size / training size, log2 axis), one line per (label, mode) with 95% error bars: over the results that share
    a label (seeds: the mean and its Student t interval), else the row's own. One colour per label (per mode when
    there is one label), one line style per mode of a label; the lines are set slightly apart along the scale so
    that their error bars do not hide each other. ``labels``: one per result (default: each result's model).
    Saved to ``path`` (PNG) when given; returns the Figure (Agg canvas, no display)."""
    FigureCanvasAgg = require("matplotlib.backends.backend_agg", "figures").FigureCanvasAgg
    Figure = require("matplotlib.figure", "figures").Figure
    from ..results.plotting import fit_titles, save_figure

    labels = list(labels) if labels is not None else [str(r.settings.get("model", "")) for r in results]
    groups = {label: [r for r, lab in zip(results, labels) if lab == label] for label in dict.fromkeys(labels)}
    lines = [
        (label, mode) for label, group in groups.items() for mode in dict.fromkeys(m for r in group for m in r.modes)
    ]
    fig = Figure(figsize=(12, 4.6 if len(lines) > 4 else 4.0), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(_PANELS))
    scales = sorted({r.scale for res in results for r in res.rows})
    for ax, (name, _, _) in zip(axes, _PANELS):
        ax.set_xscale("log", base=2)
        ax.set_xticks(scales, [f"{s:g}" for s in scales])
        ax.minorticks_off()
        ax.set_xlabel("input size / training size")
        ax.set_ylabel(name)
        ax.axvline(1.0, color="0.85", lw=0.8, zorder=0)
    colours = {key: f"C{i % 10}" for i, key in enumerate(groups if len(groups) > 1 else [m for _, m in lines])}
    styles = ("-", "--", ":", "-.")
    for i, (label, mode) in enumerate(lines):
        shift = 2.0 ** (0.03 * (i - (len(lines) - 1) / 2))  # set apart along the log axis
        same = [m for lab, m in lines if lab == label]
        look = dict(
            color=colours[label if len(groups) > 1 else mode],
            ls=styles[same.index(mode) % len(styles)] if len(groups) > 1 else "-",
            label=mode if len(groups) == 1 else f"{label}: {mode}",
        )
        for k, ax in enumerate(axes):
            x, y, low, high = _series(groups[label], mode, k)
            err = np.vstack([y - low, high - y])
            ax.errorbar(
                x * shift, y, yerr=np.where(np.isfinite(err), err, 0), marker="o", ms=3, capsize=2, lw=1.2, **look
            )
    axes[1].axhline(0.0, color="0.6", lw=0.8, ls=":")
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncol=min(5, len(lines)), fontsize=7)
    if title:
        fig.suptitle(title, fontsize=9)
    fit_titles(fig)
    if path is not None:
        save_figure(fig, path, dpi=110)
    return fig
