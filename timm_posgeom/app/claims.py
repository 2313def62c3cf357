"""The paper's five claims, decided on a study's results with the seed spread, or honestly left undecided.

A claim is decided only where the run can decide it:

* **near chance**: a model whose clean top-1 (mean over seeds) is below ``CHANCE_FACTOR`` x chance
  (1 / classes) has not learned what the claim is about: every claim that involves it is
  ``undecided``, never ``no``;
* **the seed spread**: with 2 or more seeds every quantity is a mean with a two-sided 95% Student-t
  interval over seeds, and a comparison holds (or fails) only when it holds (or fails) beyond that
  interval; otherwise the claim is ``undecided`` ("within noise"). With one seed there is no spread:
  fragility comparisons use the interval of the difference recovered from each run's own bootstrap
  interval (MOVER, see ``_less``), the rest its point values, and the evidence says "1 seed".

Thresholds (documented in the report): ``NEAR_ZERO`` (|SSDC| under RPI at every layer: "collapses"),
``SUBSTANTIAL`` (mean SSDC under RPI across layers: "keeps structure").
"""
from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from .records import StudyResults, StudyRun

__all__ = ["Spread", "Verdict", "spread", "evaluate_claims", "CLAIMS", "NEAR_ZERO", "SUBSTANTIAL", "CHANCE_FACTOR",
           "LABELS"]

NEAR_ZERO = 0.1
SUBSTANTIAL = 0.1
CHANCE_FACTOR = 1.5
LABELS = {"nope": "no PE", "ape": "APE", "sincos": "sincos", "rope": "RoPE", "rpt": "RPT"}
_PE, _NON_PE = ("ape", "sincos", "rope"), ("nope", "rpt")


@dataclass(frozen=True)
class Spread:
    """Mean over seeds, sample std, and the two-sided 95% Student-t interval of the mean (lo = hi = mean and
    std NaN with one seed; all NaN with none)."""

    mean: float
    std: float
    lo: float
    hi: float
    n: int

    def text(self, digits: int = 3) -> str:
        if self.n == 0:
            return "n/a"
        if self.n == 1:
            return f"{self.mean:.{digits}f}"
        return f"{self.mean:.{digits}f} ± {self.std:.{digits}f} [{self.lo:.{digits}f}, {self.hi:.{digits}f}]"


def spread(values: Sequence[float | None]) -> Spread:
    """The :class:`Spread` of the finite values (None and NaN left out)."""
    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    n = len(vals)
    if n == 0:
        return Spread(math.nan, math.nan, math.nan, math.nan, 0)
    mean = float(np.mean(vals))
    if n == 1:
        return Spread(mean, math.nan, mean, mean, 1)
    from scipy.stats import t

    std = float(np.std(vals, ddof=1))
    half = float(t.ppf(0.975, n - 1)) * std / math.sqrt(n)
    return Spread(mean, std, mean - half, mean + half, n)


@dataclass(frozen=True)
class Verdict:
    """``status``: held, not held, undecided or not measured; ``evidence``: the numbers; ``reason``: why a
    claim is undecided or not measured."""

    status: str
    evidence: str
    reason: str = ""

    @property
    def held(self) -> bool | None:
        return {"held": True, "not held": False}.get(self.status)


# --------------------------------------------------------------------------------------------
# decisions beyond the spread
# --------------------------------------------------------------------------------------------
def _above(s: Spread, threshold: float) -> str:
    """'yes' (the interval is above), 'no' (below) or 'noise' (it contains the threshold)."""
    return "yes" if s.lo > threshold else "no" if s.hi < threshold else "noise"


def _near_zero(s: Spread) -> str:
    """|value| < NEAR_ZERO beyond the spread: 'yes', 'no' (the interval is outside), or 'noise'."""
    if -NEAR_ZERO < s.lo and s.hi < NEAR_ZERO:
        return "yes"
    return "no" if s.lo >= NEAR_ZERO or s.hi <= -NEAR_ZERO else "noise"


def _less(a: Spread, b: Spread, a_interval=None, b_interval=None) -> str:
    """a < b beyond the spread: 'yes', 'no' or 'noise'.

    With 2 seeds or more each: the Welch 95% interval of b - a over seeds. With one seed each: the 95%
    interval of b - a recovered from each value's own interval (given as (lo, hi)) by MOVER, the method of
    variance estimates recovery (Zou & Donner 2008): lower = d - sqrt((b - b_lo)^2 + (a_hi - a)^2), upper =
    d + sqrt((b_hi - b)^2 + (a - a_lo)^2), d = b - a. It is exact for independent estimates and wider than
    needed when their errors are positively correlated (two models scored on the same images), so it never
    decides more than the data allow; asking that the two intervals do not overlap, as before, decided far
    less (about a 99.4% test for two intervals of equal width). Otherwise (a side without a value, seed
    counts that differ, a missing interval): 'noise', never the point values, which would decide any
    difference at all."""
    if a.n == 0 or b.n == 0:
        return "noise"
    if a.n >= 2 and b.n >= 2:
        from scipy.stats import t

        se = math.sqrt(a.std ** 2 / a.n + b.std ** 2 / b.n)
        half = float(t.ppf(0.975, min(a.n, b.n) - 1)) * se
        diff = b.mean - a.mean
        return "yes" if diff - half > 0 else "no" if diff + half < 0 else "noise"
    if a_interval and b_interval and None not in (*a_interval, *b_interval):
        (a_lo, a_hi), (b_lo, b_hi) = a_interval, b_interval
        diff = b.mean - a.mean
        lower = diff - math.hypot(max(b.mean - b_lo, 0.0), max(a_hi - a.mean, 0.0))
        upper = diff + math.hypot(max(b_hi - b.mean, 0.0), max(a.mean - a_lo, 0.0))
        return "yes" if lower > 0 else "no" if upper < 0 else "noise"
    return "noise"


def _combine(parts: list[str]) -> str:
    return "not held" if "no" in parts else "undecided" if "noise" in parts else "held"


def _verdict(parts: list[str], evidence: str, seeds: int) -> Verdict:
    status = _combine(parts)
    note = "" if seeds >= 2 else " (1 seed: no seed spread)"
    inside = ("the seed spread" if seeds >= 2 else
              "its 95% interval over the evaluation images (1 seed: there is no seed spread)")
    reason = f"within noise: the difference is inside {inside}" if status == "undecided" else ""
    return Verdict(status, evidence + note, reason)


# --------------------------------------------------------------------------------------------
# per-condition values
# --------------------------------------------------------------------------------------------
def _per_seed_layers(runs: list[StudyRun], key: str) -> np.ndarray:
    """(seeds, layers) of an SSDC list of each run's evaluation (NaN for missing values)."""
    rows = [[math.nan if v is None else v for v in getattr(r.eval.ssdc, key)] for r in runs
            if r.eval.ssdc is not None and getattr(r.eval.ssdc, key)]
    return np.array(rows, dtype=float) if rows else np.zeros((0, 0))


def _layer_spreads(runs: list[StudyRun], key: str) -> list[Spread]:
    arr = _per_seed_layers(runs, key)
    return [spread(arr[:, k].tolist()) for k in range(arr.shape[1])]


def _fmt(spreads: list[Spread]) -> str:
    return "[" + ", ".join(f"{s.mean:.3f}" for s in spreads) + "]"


def _chance_reason(by: dict[str, list[StudyRun]], conditions: Sequence[str], classes: int | None) -> str:
    """Why the claim cannot be decided: the models near chance among ``conditions`` ('' if none)."""
    if not classes:
        return ""
    chance = 1.0 / classes
    near = [(c, spread([r.eval.clean_accuracy for r in by[c]]).mean) for c in conditions if c in by]
    near = [(c, a) for c, a in near if math.isfinite(a) and a < CHANCE_FACTOR * chance]
    if not near:
        return ""
    names = ", ".join(f"{LABELS.get(c, c)} at top-1 {a:.3f}" for c, a in near)
    return (f"near chance ({names}; chance {chance:.3f}, threshold {CHANCE_FACTOR:g}x): a model that has not "
            "learned cannot show it")


# --------------------------------------------------------------------------------------------
# the claims
# --------------------------------------------------------------------------------------------
def _claim_collapse(by, seeds) -> Verdict:
    """(1) no-PE models build content structure that collapses under RPI."""
    if "nope" not in by:
        return Verdict("not measured", "", "no-PE condition not run")
    plain = spread(np.nanmean(_per_seed_layers(by["nope"], "per_layer"), 1).tolist())
    rpi = _layer_spreads(by["nope"], "rpi_per_layer")
    parts = [_above(plain, SUBSTANTIAL)] + [_near_zero(s) for s in rpi]
    return _verdict(parts, f"no PE: mean SSDC {plain.text()} -> under RPI {_fmt(rpi)}", seeds)


def _claim_anchor(by, seeds) -> Verdict:
    """(2) PE models keep SSDC under RPI; APE/sincos peak early, RoPE accumulates with depth."""
    missing = [LABELS[c] for c in _PE if c not in by]
    if missing:  # the claim is about all three: some of them cannot hold (or fail) it
        return Verdict("not measured", "", f"needs APE, sincos and RoPE; not run: {', '.join(missing)}")
    parts, evidence = [], []
    for c in _PE:
        if c not in by:
            continue
        arr = _per_seed_layers(by[c], "rpi_per_layer")
        keeps = spread(np.nanmean(arr, 1).tolist())
        layers = _layer_spreads(by[c], "rpi_per_layer")
        if c == "rope":
            shape = _above(spread((arr[:, -1] - arr[:, 0]).tolist()), 0.0)
            word = "accumulates" if shape == "yes" else "does not accumulate" if shape == "no" else "flat within noise"
        else:
            peak = int(np.nanargmax([s.mean for s in layers]))
            shape, word = ("yes", "peaks early") if peak < len(layers) / 2 else ("no", "peaks late")
        parts += [_above(keeps, SUBSTANTIAL), shape]
        evidence.append(f"{LABELS[c]} under RPI {_fmt(layers)} (mean {keeps.text()}; {word})")
    if not parts:
        return Verdict("not measured", "", "no PE condition run")
    return _verdict(parts, "; ".join(evidence), seeds)


def _claim_rpt(by, seeds) -> Verdict:
    """(3) RPT behaves like no PE."""
    if "rpt" not in by:
        return Verdict("not measured", "", "RPT condition not run")
    rpi = _layer_spreads(by["rpt"], "rpi_per_layer")
    return _verdict([_near_zero(s) for s in rpi], f"RPT under RPI {_fmt(rpi)}", seeds)


def _fs_interval(runs: list[StudyRun], shift: str):
    return tuple((runs[0].eval.fs_interval or {}).get(shift) or ()) if len(runs) == 1 else None


def _claim_fragility(by, seeds, shift: str = "jpeg:5") -> Verdict:
    """(4) PE models are less fragile than no-PE / RPT, RoPE least."""
    fs = {c: spread([(r.eval.fs or {}).get(shift) for r in runs]) for c, runs in by.items()}
    missing = [LABELS[c] for c in _PE + _NON_PE if c not in fs or fs[c].n == 0]
    if missing:  # the claim compares every PE model with no PE and RPT
        return Verdict("not measured", "", f"needs every condition with fragility results; missing: {', '.join(missing)}")
    pe, non_pe = [c for c in _PE if c in fs], [c for c in _NON_PE if c in fs]

    def less(a: str, b: str) -> str:
        return _less(fs[a], fs[b], _fs_interval(by[a], shift), _fs_interval(by[b], shift))

    below = {(a, b): less(a, b) for a in pe for b in non_pe}  # PE models less fragile than no PE / RPT
    least = {("rope", c): less("rope", c) for c in fs if c != "rope"}  # RoPE least fragile of all
    order = ", ".join(f"{LABELS.get(c, c)} {s.text()}" for c, s in sorted(fs.items(), key=lambda kv: kv[1].mean))
    halves = "; ".join(f"{name}: {_PART_WORDS[_combine(list(part.values()))]}{_failed(part)}"
                       for name, part in (("PE below no PE / RPT", below), ("RoPE least", least)))
    return _verdict(list(below.values()) + list(least.values()), f"JPEG q5 FS (low to high): {order}; {halves}", seeds)


_PART_WORDS = {"held": "yes", "not held": "no", "undecided": "within noise"}


def _failed(part: dict[tuple[str, str], str]) -> str:
    """' (not A < B, ...)': the comparisons a < b that fail beyond the noise ('' if none)."""
    bad = [f"{LABELS.get(a, a)} < {LABELS.get(b, b)}" for (a, b), v in part.items() if v == "no"]
    return f" (not {', '.join(bad)})" if bad else ""


def _trend(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman correlation of y with x; NaN when either is constant or has missing values."""
    from scipy.stats import spearmanr

    if np.isnan(y).any() or np.ptp(y) == 0 or np.ptp(x) == 0:
        return math.nan
    return float(spearmanr(x, y)[0])


def _claim_alpha(by, seeds, shift: str = "jpeg:5") -> Verdict:
    """(5) delta SSDC falls and FS rises as alpha shrinks (APE): the trend of the mean curves, and the same
    sign in every seed (with 2 seeds or more) for it to count beyond the spread. With one seed the FS part
    also needs FS at the smallest alpha to differ from FS at the largest beyond the 95% interval of the
    difference (each alpha's bootstrap interval, MOVER as in :func:`_less`), where the sweep kept them."""
    sweeps = [r.eval.alpha_sweep for r in by.get("ape", []) if r.eval.alpha_sweep]
    if not sweeps:
        return Verdict("not measured", "", "no APE alpha sweep")
    alphas = np.array(sweeps[0].alphas, dtype=float)
    if len(set(alphas.tolist())) < 2 or any(list(s.alphas) != list(sweeps[0].alphas) for s in sweeps):
        return Verdict("not measured", "", "the APE alpha sweeps need the same 2 alphas or more in every seed")
    curves = [(np.array([math.nan if v is None else v for v in s.delta_ssdc], dtype=float),
               np.array([math.nan if v is None else v for v in (s.fs or {}).get(shift, [None] * len(alphas))],
                        dtype=float)) for s in sweeps]
    with warnings.catch_warnings():  # an alpha where every seed is NaN stays NaN: checked next
        warnings.simplefilter("ignore", RuntimeWarning)
        delta, fsj = np.nanmean([d for d, _ in curves], 0), np.nanmean([f for _, f in curves], 0)
    if not (np.isfinite(delta).all() and np.isfinite(fsj).all()):  # a trend of a curve with holes is not one
        return Verdict("undecided", f"APE: alpha {alphas.tolist()} -> delta SSDC {np.round(delta, 3).tolist()}, "
                       f"JPEG FS {np.round(fsj, 3).tolist()}",
                       "delta SSDC or FS is undefined (NaN) at some alpha (e.g. a model with one block has no "
                       "delta SSDC)")
    rd, rf = _trend(alphas, delta), _trend(alphas, fsj)
    parts = []
    for sign, mean_r, per_seed in ((1, rd, [_trend(alphas, d) for d, _ in curves]),
                                   (-1, rf, [_trend(alphas, f) for _, f in curves])):
        if not math.isfinite(mean_r) or sign * mean_r <= 0:
            parts.append("no")
        else:
            parts.append("yes" if all(math.isfinite(r) and sign * r > 0 for r in per_seed) else "noise")
    evidence = (f"APE: alpha {alphas.tolist()} -> delta SSDC {np.round(delta, 3).tolist()}, JPEG FS "
                f"{np.round(fsj, 3).tolist()} (Spearman with alpha: delta {rd:+.2f}, FS {rf:+.2f})")
    intervals = sweeps[0].fs_interval and sweeps[0].fs_interval.get(shift)
    if len(sweeps) == 1 and intervals and np.isfinite(fsj).all():
        hi, lo = int(np.argmax(alphas)), int(np.argmin(alphas))  # FS at the largest alpha < FS at the smallest?
        rises = _less(spread([fsj[hi]]), spread([fsj[lo]]), intervals[hi], intervals[lo])
        parts[1] = rises if parts[1] == "yes" or rises == "no" else "noise"
        evidence += (f"; FS at alpha {alphas[lo]:g} minus at {alphas[hi]:g}: {fsj[lo] - fsj[hi]:+.3f}, "
                     f"{'beyond' if rises != 'noise' else 'within'} its 95% interval")
    return _verdict(parts, evidence, seeds)


CLAIMS: tuple[tuple[str, Callable, tuple[str, ...]], ...] = (
    ("No-PE models build content-driven structure that collapses to ~0 under RPI", _claim_collapse, ("nope",)),
    ("APE/sincos/RoPE keep substantial SSDC under RPI (APE/sincos peak early, RoPE accumulates with depth)",
     _claim_anchor, _PE),
    ("RPT behaves like no PE (SSDC under RPI ~0)", _claim_rpt, ("rpt",)),
    ("PE models are less fragile than no-PE/RPT, RoPE least", _claim_fragility, _PE + _NON_PE),
    ("As alpha shrinks, delta SSDC falls and FS rises (APE)", _claim_alpha, ("ape",)),
)


def evaluate_claims(results: StudyResults) -> list[dict]:
    """The paper's five claims: ``claim``, ``status`` (held / not held / undecided / not measured), ``held``
    (True / False / None), ``evidence`` and ``reason`` (why undecided or not measured)."""
    by: dict[str, list[StudyRun]] = {}
    seen: set[tuple[str, int]] = set()
    for run in results.runs:
        if (run.condition, run.seed) in seen:  # counted twice it would be a second seed with no spread
            raise ValueError(f"the results hold {run.condition} seed {run.seed} twice")
        seen.add((run.condition, run.seed))
        by.setdefault(run.condition, []).append(run)
    seeds = min((len(v) for v in by.values()), default=0)
    counts = {LABELS.get(c, c): len(v) for c, v in by.items()}
    classes = (results.eval_data or {}).get("classes")
    out = []
    for claim, check, conditions in CLAIMS:
        verdict = check(by, seeds)
        chance = _chance_reason(by, conditions, classes)
        if chance and verdict.status in ("held", "not held", "undecided"):
            verdict = Verdict("undecided", verdict.evidence, chance)
        elif verdict.status == "undecided" and len(set(counts.values())) > 1:
            verdict = Verdict("undecided", verdict.evidence, verdict.reason + "; the conditions have different "
                              f"seed counts ({', '.join(f'{c} {n}' for c, n in counts.items())}), and a comparison "
                              "across them is decided only where both sides have a spread")
        out.append(dict(claim=claim, status=verdict.status, held=verdict.held, evidence=verdict.evidence,
                        reason=verdict.reason))
    return out
