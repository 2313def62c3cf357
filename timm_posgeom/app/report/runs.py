"""A study's runs as the report reads them, for its tables and figures alike: runs by condition, a run's FS,
per-layer means over seeds, the training curves averaged over seeds and their spread, a sweep's alphas in order.
JSON's None (a NaN as the JSON writer writes it) is read back as NaN."""

from __future__ import annotations

import numpy as np

from ...results.jsonio import nan_if_none
from ..records import HistoryPoint, StudyResults, StudyRun

__all__ = [
    "by_condition",
    "run_fs",
    "layer_mean_std",
    "sweep_order",
    "seed_history",
    "seed_history_std",
]


def by_condition(results: StudyResults) -> dict[str, list[StudyRun]]:
    """The runs of each condition, in the results' order (:mod:`.claims` refuses a condition and seed twice)."""
    out: dict[str, list[StudyRun]] = {}
    for run in results.runs:
        out.setdefault(run.condition, []).append(run)
    return out


def run_fs(run: StudyRun, shift: str) -> float | None:
    """The run's fragility score under ``shift`` (None when not measured)."""
    return (run.eval.fs or {}).get(shift)


def layer_mean_std(runs: list[StudyRun], key: str, source: str = "eval") -> tuple[np.ndarray, np.ndarray]:
    """Per layer, the mean (L,) and std over seeds (L,; 0 with one seed) of the runs' ``key`` list (``per_layer``,
    ``rpi_per_layer``, ...) of their evaluation's SSDC (``source="eval"``) or of another block of the run."""
    rows = []
    for r in runs:
        block = r.eval.ssdc if source == "eval" else getattr(r, source)
        if block is not None and getattr(block, key):
            rows.append(nan_if_none(getattr(block, key)))
    if not rows:
        return np.array([]), np.array([])
    arr = np.array(rows, dtype=float)
    return np.nanmean(arr, 0), (np.nanstd(arr, 0, ddof=1) if len(rows) > 1 else np.zeros(arr.shape[1]))


def sweep_order(alphas: list[float]) -> list[int]:
    """Indices that put a sweep's alphas in increasing order (every figure and table runs alpha upwards)."""
    return sorted(range(len(alphas)), key=lambda k: alphas[k])


def seed_history(runs: list[StudyRun]) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[list[HistoryPoint]]]:
    """Training curves averaged over seeds at the epochs they share.

    Returns epochs (E,), SSDC under RPI per layer (E, L) and top-1 on the monitor split (E,), both means over seeds,
    and per epoch the seeds' records (for spreads); empty when no run logged SSDC under RPI during training.
    """
    by_epoch: dict[float, list[HistoryPoint]] = {}
    for r in runs:
        for rec in r.history or []:
            if rec.rpi_ssdc:
                by_epoch.setdefault(rec.epoch, []).append(rec)
    if not by_epoch:
        return np.array([]), np.zeros((0, 0)), np.array([]), []
    epochs = sorted(by_epoch)  # the runs of one condition share a recipe, hence a depth
    ssdc = np.array([np.nanmean([nan_if_none(rec.rpi_ssdc) for rec in by_epoch[e]], 0) for e in epochs])
    top1 = np.array([np.nanmean(nan_if_none([rec.monitor_top1 for rec in by_epoch[e]])) for e in epochs])
    return np.array(epochs), ssdc, top1, [by_epoch[e] for e in epochs]


def seed_history_std(records: list[list[HistoryPoint]]) -> tuple[np.ndarray, np.ndarray]:
    """Per epoch, the std over seeds of SSDC under RPI per layer (E, L) and of top-1 (E,); 0 with one seed."""

    def sd(rows):
        rows = np.asarray(rows, dtype=float)
        return np.nanstd(rows, 0, ddof=1) if len(rows) > 1 else np.zeros(rows.shape[1:])

    return (
        np.array([sd([nan_if_none(r.rpi_ssdc) for r in recs]) for recs in records]),
        np.array([sd(nan_if_none([r.monitor_top1 for r in recs])) for recs in records]),
    )
