"""The fragility score, its 95% intervals, and :class:`FragilityResult` (docs/method.md#fragility-score-and-shifts).

* top-1 accuracy ``A = k / n``, counted exactly over every image;
* ``FS = 1 - A_shift / A_clean`` (:func:`fragility_score`; NaN with a warning when ``A_clean = 0``);
* accuracies' intervals by the Wilson score interval (:func:`wilson_interval`); FS's by a paired
  percentile bootstrap over images (:func:`paired_bootstrap_fs`, drawing the 2x2 table of pair types
  from a multinomial: the same distribution as resampling the pairs, exactly).

:func:`~timm_posgeom.robustness.fragility` measures them; this module holds the formulas and the result,
which need no model.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import NonFiniteWarning, nonfinite_message, require
from ..results.jsonio import dump_json, tagged, to_jsonable

__all__ = ["fragility_score", "wilson_interval", "paired_bootstrap_fs", "FragilityResult"]

_Z95 = 1.959963984540054  # two-sided 95% normal quantile


# --------------------------------------------------------------------------------------------
# formulas
# --------------------------------------------------------------------------------------------
def fragility_score(shift_accuracy: float, clean_accuracy: float) -> float:
    """``FS = 1 - A_shift / A_clean``; NaN (with a RuntimeWarning) when ``A_clean`` is 0."""
    if clean_accuracy == 0 or math.isnan(clean_accuracy):
        warnings.warn(
            "clean accuracy is 0: the fragility score 1 - A_shift / A_clean is undefined (NaN)",
            RuntimeWarning,
            stacklevel=2,
        )
        return math.nan
    return 1.0 - shift_accuracy / clean_accuracy


def wilson_interval(correct: int, total: int, z: float = _Z95) -> tuple[float, float]:
    """Wilson score interval for a proportion ``correct / total`` (95% for the default ``z``).

    ``(p + z^2/2n -/+ z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n)``; (NaN, NaN) when ``total`` is 0.
    """
    if total <= 0:
        return (math.nan, math.nan)
    p = correct / total
    denom = 1.0 + z * z / total
    centre = (p + z * z / (2 * total)) / denom
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def paired_bootstrap_fs(
    clean_correct: np.ndarray,
    shift_correct: np.ndarray,
    *,
    num_resamples: int = 2000,
    confidence: float = 0.95,
    seed: int | None = 0,
) -> tuple[float, float]:
    """Percentile bootstrap interval of FS over images, pairs (clean, shifted) resampled together.

    Args:
        clean_correct, shift_correct: (N,) bool, whether image i is classified correctly.
        seed: of the resamples (None: fresh entropy, as ``numpy.random.default_rng(None)``).

    Only the 2x2 table of pair types changes between resamples, so each resample's table is drawn
    from ``Multinomial(N, observed pair frequencies)``, which is exactly the distribution of the
    table of N pairs drawn with replacement. Resamples with zero clean accuracy are left out. (NaN, NaN) with
    fewer than 2 images (one observation gives no interval) or none correct on clean images.
    """
    clean = np.asarray(clean_correct, dtype=bool)
    shifted = np.asarray(shift_correct, dtype=bool)
    n = clean.size
    if n < 2 or not clean.any():  # one image: every resample is that image, an interval of zero width
        return (math.nan, math.nan)
    table = np.array(
        [np.sum(~clean & ~shifted), np.sum(~clean & shifted), np.sum(clean & ~shifted), np.sum(clean & shifted)],
        dtype=np.int64,
    )
    draws = np.random.default_rng(seed).multinomial(n, table / n, size=num_resamples)
    a_clean = draws[:, 2] + draws[:, 3]
    a_shift = draws[:, 1] + draws[:, 3]
    ok = a_clean > 0
    if not ok.any():
        return (math.nan, math.nan)
    fs = 1.0 - a_shift[ok] / a_clean[ok]
    tail = (1.0 - confidence) / 2 * 100
    low, high = np.percentile(fs, [tail, 100 - tail])
    return (float(low), float(high))


# --------------------------------------------------------------------------------------------
# result
# --------------------------------------------------------------------------------------------
@dataclass
class FragilityResult:
    """Accuracy of one model on clean and shifted images, and its fragility score per shift.

    Attributes:
        shifts: the shift names (specs), in order.
        num_images: n, the number of images evaluated (every one counted).
        clean_accuracy: A_clean = k_clean / n.
        accuracy: shift -> A_shift.
        fs: shift -> FS = 1 - A_shift / A_clean (NaN when A_clean = 0).
        counts: ``{"clean": {"correct": k, "total": n}, shift: {...}}``.
        clean_interval, accuracy_interval: Wilson 95% intervals of the accuracies.
        fs_interval: shift -> paired-bootstrap 95% interval of FS.
        correct: ``"clean"`` and each shift -> (n,) bool array, per-image correctness (in data
            order), e.g. for McNemar tests; left out of :meth:`to_dict`.
        settings: model, resize, rpi, alpha, seed, ... (how the numbers were made).
    """

    shifts: list[str]
    num_images: int
    clean_accuracy: float
    accuracy: dict[str, float]
    fs: dict[str, float]
    counts: dict[str, dict[str, int]]
    clean_interval: tuple[float, float]
    accuracy_interval: dict[str, tuple[float, float]]
    fs_interval: dict[str, tuple[float, float]]
    correct: dict[str, np.ndarray] = field(default_factory=dict, repr=False)
    settings: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_correct(
        cls,
        correct: Mapping[str, np.ndarray],
        settings: Mapping[str, Any] | None = None,
        seed: int | None = 0,
        nonfinite: Mapping[str, np.ndarray] | None = None,
    ) -> FragilityResult:
        """Build the result from per-image correctness: ``correct["clean"]`` and one (n,) bool array
        per shift. All numbers are exact functions of these arrays.

        ``seed``: of the paired bootstrap (None: fresh entropy). ``nonfinite``: the same keys -> (n,) bool, the images whose logits were not finite (NaN or inf). Such an
        image has no prediction: the accuracy of that copy is NaN, its interval too, and so is the FS of every
        shift it enters (all of them for a clean image), with a :class:`~timm_posgeom.errors.NonFiniteWarning`;
        its count is ``counts[key]["nonfinite"]``."""
        if "clean" not in correct:
            raise ValueError("correct must hold a 'clean' entry")
        clean = np.asarray(correct["clean"], dtype=bool)
        n = int(clean.size)
        shifts = [k for k in correct if k != "clean"]
        arrays = {k: np.asarray(v, dtype=bool) for k, v in correct.items()}
        bad = {k: np.asarray(v, dtype=bool) for k, v in (nonfinite or {}).items() if np.asarray(v).any()}
        for k, v in [*arrays.items(), *bad.items()]:
            if v.shape != (n,):
                raise ValueError(f"correct[{k!r}] has shape {v.shape}, expected ({n},)")
        counts = {k: {"correct": int(v.sum()), "total": n} for k, v in arrays.items()}
        for k, v in bad.items():
            counts[k]["nonfinite"] = int(v.sum())
        undefined = {s for s in shifts if s in bad or "clean" in bad}
        clean_acc = counts["clean"]["correct"] / n if n and "clean" not in bad else math.nan
        accuracy = {s: counts[s]["correct"] / n if s not in bad else math.nan for s in shifts}
        if bad:
            images = int(np.logical_or.reduce(list(bad.values())).sum())
            warnings.warn(
                nonfinite_message(
                    "the logits",
                    images,
                    n,
                    f"top-1 of {', '.join(bad)} and the FS of {', '.join(sorted(undefined)) or 'no shift'} are NaN",
                ),
                NonFiniteWarning,
                stacklevel=2,
            )
        elif n and clean_acc == 0 and shifts:
            warnings.warn("clean accuracy is 0: every fragility score is NaN", RuntimeWarning, stacklevel=2)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            fs = {s: fragility_score(accuracy[s], clean_acc) for s in shifts}
        nan2 = (math.nan, math.nan)
        return cls(
            shifts=shifts,
            num_images=n,
            clean_accuracy=clean_acc,
            accuracy=accuracy,
            fs=fs,
            counts=counts,
            clean_interval=wilson_interval(counts["clean"]["correct"], n) if "clean" not in bad else nan2,
            accuracy_interval={s: wilson_interval(counts[s]["correct"], n) if s not in bad else nan2 for s in shifts},
            fs_interval={
                s: paired_bootstrap_fs(clean, arrays[s], seed=seed) if s not in undefined else nan2 for s in shifts
            },
            correct=arrays,
            settings=dict(settings or {}),
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready numbers (NaN stays float NaN; ``correct`` arrays left out)."""
        return {
            "shifts": list(self.shifts),
            "num_images": self.num_images,
            "clean_accuracy": self.clean_accuracy,
            "clean_interval": list(self.clean_interval),
            "accuracy": dict(self.accuracy),
            "accuracy_interval": {k: list(v) for k, v in self.accuracy_interval.items()},
            "fs": dict(self.fs),
            "fs_interval": {k: list(v) for k, v in self.fs_interval.items()},
            "counts": {k: dict(v) for k, v in self.counts.items()},
            "interval_method": "accuracy: Wilson score 95%; FS: paired percentile bootstrap 95% (2000 resamples)",
            "settings": to_jsonable(self.settings),
        }

    def to_json(self, path: str | os.PathLike | None = None, indent: int = 2) -> str:
        """The :meth:`to_dict` numbers as strict JSON (NaN written as null); also written to ``path`` if given (atomically)."""
        return dump_json(tagged("fragility-result", self.to_dict()), path, indent)

    def plot(self, path: str | os.PathLike | None = None, ax: Any = None) -> Any:
        """Bar chart: clean and shifted accuracy with Wilson 95% error bars, each shift's FS and its paired
        bootstrap 95% interval written above its bar. Returns the matplotlib Figure; also saved to ``path``
        if given."""
        Figure = require("matplotlib.figure", "plotting").Figure

        from ..results.plotting import fit_titles, save_figure

        if ax is None:
            fig = Figure(figsize=(1.8 + 1.5 * (1 + len(self.shifts)), 3.8), layout="constrained")
            ax = fig.subplots()
        else:
            fig = ax.figure
        names = ["clean", *self.shifts]
        values = [self.clean_accuracy, *(self.accuracy[s] for s in self.shifts)]
        intervals = [self.clean_interval, *(self.accuracy_interval[s] for s in self.shifts)]
        err = np.array([[max(v - lo, 0), max(hi - v, 0)] for v, (lo, hi) in zip(values, intervals)]).T
        bars = ax.bar(range(len(names)), values, color=["0.55", *[f"C{i}" for i in range(len(self.shifts))]])
        ax.errorbar(
            range(len(names)), values, yerr=err, fmt="none", ecolor="k", capsize=4, label="top-1: Wilson 95% interval"
        )
        for bar, s in zip(bars[1:], self.shifts):
            top = self.accuracy_interval[s][1]
            top = bar.get_height() if math.isnan(top) else top
            lo, hi = self.fs_interval.get(s, (math.nan, math.nan))
            ax.annotate(
                f"FS {self.fs[s]:.3f}\n[{lo:.3f}, {hi:.3f}]",
                (bar.get_x() + bar.get_width() / 2, top),
                xytext=(0, 4),
                textcoords="offset points",
                ha="center",
                fontsize=7,
            )
        ax.set_xticks(range(len(names)), names)
        ax.set_ylabel("top-1 accuracy (fraction)")
        ax.set_ylim(0, min(1.0, max(values + [0.05]) * 1.25 + 0.1))
        ax.legend(fontsize=7, loc="lower right", title="FS: [paired bootstrap 95%]", title_fontsize=7)
        title = self.settings.get("model") or ""
        ax.set_title(f"{title} (n={self.num_images})".strip(), fontsize=9)
        fit_titles(fig)
        if path is not None:
            save_figure(fig, path, dpi=150)
        return fig
