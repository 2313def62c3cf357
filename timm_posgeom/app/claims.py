"""The paper's five claims, decided on a study's results with the seed spread, or honestly left undecided.

A claim is decided only where the run can decide it:

* **near chance**: a model whose clean top-1 (mean over seeds) is below ``CHANCE_FACTOR`` x chance
  (1 / classes) has not learned what the claim is about: every claim that involves it is
  ``undecided``, never ``no``;
* **one rule for every verdict** (docs/method.md#verdicts): each part of a claim is a quantity with a
  two-sided 95% interval; the part is ``yes`` when the claim holds beyond the interval, ``no`` when its
  opposite holds beyond the interval, and ``within noise`` otherwise. A claim is held when every part is
  yes, not held when some part is no, undecided ("within noise") otherwise. Peaks and trends are
  quantities too: "peaks early" is the maximum over the first half of the layers minus the maximum over
  the second half, per seed (and permutation); "falls as alpha shrinks" needs every seed's trend to have
  the claimed sign and the change from the largest to the smallest alpha beyond its interval (and "no"
  the mirror of both). An interval is over seeds, and over RPI permutations where the study measured
  several (:func:`spread_sp`). With one seed there is no seed spread: fragility comparisons use the
  interval of the difference recovered from each run's own bootstrap interval (MOVER, see ``_less``),
  RPI quantities their interval over permutations, the rest their point values, and the evidence says
  "1 seed".

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

__all__ = ["Spread", "Verdict", "spread", "spread_sp", "rpi_cube", "evaluate_claims", "CLAIMS", "NEAR_ZERO", "SUBSTANTIAL", "CHANCE_FACTOR",
           "LABELS"]

NEAR_ZERO = 0.1
SUBSTANTIAL = 0.1
CHANCE_FACTOR = 1.5
LABELS = {"nope": "no PE", "ape": "APE", "sincos": "sincos", "rope": "RoPE", "rpt": "RPT"}
_PE, _NON_PE = ("ape", "sincos", "rope"), ("nope", "rpt")


@dataclass(frozen=True)
class Spread:
    """Mean over seeds, sample std, and the two-sided 95% Student-t interval of the mean (lo = hi = mean and
    std NaN with one seed; all NaN with none).

    Over seeds x RPI permutations (:func:`spread_sp`): ``std`` is the std of the per-seed means over
    permutations, ``perm_std`` the std of the per-permutation means over seeds, ``permutations`` their
    number; ``var`` is the variance of the mean and ``df`` the degrees of freedom of its t interval."""

    mean: float
    std: float
    lo: float
    hi: float
    n: int
    perm_std: float = math.nan
    permutations: int = 1
    var: float = math.nan
    df: float = math.nan

    @property
    def has_interval(self) -> bool:
        return self.n >= 1 and math.isfinite(self.var) and math.isfinite(self.df) and self.df >= 1

    def text(self, digits: int = 3) -> str:
        if self.n == 0:
            return "n/a"
        if not self.has_interval:
            return f"{self.mean:.{digits}f}"
        seeds = f" ± {self.std:.{digits}f}" if self.n >= 2 else ""
        perms = f" (permutations ± {self.perm_std:.{digits}f})" if self.permutations >= 2 else ""
        return f"{self.mean:.{digits}f}{seeds}{perms} [{self.lo:.{digits}f}, {self.hi:.{digits}f}]"

    def bound(self, side: str, digits: int = 3) -> str:
        """How an end of the interval is computed: ``mean - k x s = lo`` (side '-') or ``mean + k x s = hi``
        (side '+'), with k = t(0.975, df) / sqrt(n) and s = sqrt(var x n) (the seed std when only seeds
        vary: k = 8.98 with 2 seeds); the point value alone when there is no interval."""
        if not self.has_interval:
            return f"{self.mean:.{digits}f} (no interval)"
        from scipy.stats import t

        k = float(t.ppf(0.975, self.df)) / math.sqrt(self.n)
        s = math.sqrt(self.var * self.n)
        end = self.lo if side == "-" else self.hi
        return f"{self.mean:.{digits}f} {'-' if side == '-' else '+'} {k:.2f} x {s:.{digits}f} = {end:.{digits}f}"


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
    return Spread(mean, std, mean - half, mean + half, n, var=std ** 2 / n, df=float(n - 1))


def spread_sp(cells: np.ndarray | Sequence[Sequence[float | None]]) -> Spread:
    """The :class:`Spread` of a quantity measured on seeds x RPI permutations (rows: seeds, columns: the
    permutations, the same permutation seeds in every row; NaN / None left out).

    The permutations are crossed with the seeds (permutation p is drawn with seed p for every model), so the
    variance of the grand mean is estimated as var(per-seed means) / S + var(per-permutation means) / P: the
    seed term as over seeds alone, plus the permutation variance, which the per-seed means share and so
    cannot show (this counts the seed x permutation residual twice: conservative). The interval is Student-t
    with Welch-Satterthwaite degrees of freedom. One permutation: :func:`spread` over seeds. One seed: the
    interval over permutations alone (there is no seed spread)."""
    arr = np.array([[math.nan if v is None else float(v) for v in row] for row in cells], dtype=float)
    if arr.ndim != 2 or arr.size == 0:
        return spread([])
    arr = arr[~np.all(np.isnan(arr), 1)]  # seeds without a value
    arr = arr[:, ~np.any(np.isnan(arr), 0)] if arr.size else arr  # a permutation missing in some seed
    if arr.size == 0:
        return spread([])
    s_n, p_n = arr.shape
    if p_n == 1:
        return spread(arr[:, 0].tolist())
    from scipy.stats import t

    seed_means, perm_means = arr.mean(1), arr.mean(0)
    mean = float(arr.mean())
    v_perm = float(np.var(perm_means, ddof=1)) / p_n
    if s_n >= 2:
        std = float(np.std(seed_means, ddof=1))
        v_seed = std ** 2 / s_n
        den = v_seed ** 2 / (s_n - 1) + v_perm ** 2 / (p_n - 1)
        df = (v_seed + v_perm) ** 2 / den if den > 0 else float(s_n - 1)
    else:
        std, v_seed, df = math.nan, 0.0, float(p_n - 1)
    var = v_seed + v_perm
    half = float(t.ppf(0.975, df)) * math.sqrt(var)
    return Spread(mean, std, mean - half, mean + half, s_n, perm_std=float(np.std(perm_means, ddof=1)),
                  permutations=p_n, var=var, df=df)


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
# decisions beyond the interval: 'yes', 'no' (the opposite holds beyond it) or 'noise', and why
# --------------------------------------------------------------------------------------------
def _above(s: Spread, threshold: float) -> tuple[str, str]:
    """value > threshold: 'yes' (the interval is above), 'no' (below) or 'noise' (it contains the threshold),
    with the end of the interval that decided it."""
    if s.lo > threshold:
        return "yes", f"{s.bound('-')} > {threshold:g}"
    if s.hi < threshold:
        return "no", f"{s.bound('+')} < {threshold:g}"
    return "noise", f"{s.bound('-' if s.mean >= threshold else '+')} crosses {threshold:g}"


def _near_zero(s: Spread) -> tuple[str, str]:
    """|value| < NEAR_ZERO: 'yes' (the interval is inside), 'no' (it is outside), or 'noise'; with the end of
    the interval that decided it."""
    if -NEAR_ZERO < s.lo and s.hi < NEAR_ZERO:
        side = "+" if s.mean >= 0 else "-"
        return "yes", f"{s.bound(side)} {'<' if side == '+' else '>'} {NEAR_ZERO if side == '+' else -NEAR_ZERO:g}"
    if s.lo >= NEAR_ZERO:
        return "no", f"{s.bound('-')} >= {NEAR_ZERO:g}"
    if s.hi <= -NEAR_ZERO:
        return "no", f"{s.bound('+')} <= {-NEAR_ZERO:g}"
    side = "+" if s.mean >= 0 else "-"
    return "noise", f"{s.bound(side)} crosses {NEAR_ZERO if side == '+' else -NEAR_ZERO:g}"


def _worst(parts: list[tuple[str, str]], names: Sequence[str]) -> str:
    """The part that decided a list of parts (the first 'no', else the first 'noise', else the last 'yes')."""
    for word in ("no", "noise", "yes"):
        hits = [(n, why) for n, (d, why) in zip(names, parts) if d == word]
        if hits:
            n, why = hits[0] if word != "yes" else hits[-1]
            return f"{n}: {why}"
    return ""


def _less(a: Spread, b: Spread, a_interval=None, b_interval=None) -> tuple[str, str]:
    """a < b beyond the noise: 'yes', 'no' or 'noise', and the interval of b - a that decided it.

    With an interval on both sides (2 seeds or more, or several RPI permutations): the Welch 95% interval of
    b - a (variance a.var + b.var, the smaller of the two degrees of freedom). With one seed each: the 95%
    interval of b - a recovered from each value's own interval (given as (lo, hi)) by MOVER, the method of
    variance estimates recovery (Zou & Donner 2008): lower = d - sqrt((b - b_lo)^2 + (a_hi - a)^2), upper =
    d + sqrt((b_hi - b)^2 + (a - a_lo)^2), d = b - a. It is exact for independent estimates and wider than
    needed when their errors are positively correlated (two models scored on the same images), so it never
    decides more than the data allow; asking that the two intervals do not overlap, as before, decided far
    less (about a 99.4% test for two intervals of equal width). Otherwise (a side without a value, seed
    counts that differ, a missing interval): 'noise', never the point values, which would decide any
    difference at all."""
    if a.n == 0 or b.n == 0:
        return "noise", "no value"
    diff = b.mean - a.mean
    if a.n >= 2 and b.n >= 2 and a.has_interval and b.has_interval:
        from scipy.stats import t

        half = float(t.ppf(0.975, min(a.df, b.df))) * math.sqrt(a.var + b.var)
        lower, upper = diff - half, diff + half
    elif a.n == 1 and b.n == 1 and a_interval and b_interval and None not in (*a_interval, *b_interval):
        (a_lo, a_hi), (b_lo, b_hi) = a_interval, b_interval
        lower = diff - math.hypot(max(b.mean - b_lo, 0.0), max(a_hi - a.mean, 0.0))
        upper = diff + math.hypot(max(b_hi - b.mean, 0.0), max(a.mean - a_lo, 0.0))
    else:
        return "noise", f"difference {diff:+.3f} without an interval"
    word = "yes" if lower > 0 else "no" if upper < 0 else "noise"
    return word, f"difference {diff:+.3f} [{lower:+.3f}, {upper:+.3f}]"


def _combine(parts: list[str]) -> str:
    return "not held" if "no" in parts else "undecided" if "noise" in parts else "held"


def _verdict(parts: list[str], evidence: str, seeds: int) -> Verdict:
    status = _combine(parts)
    note = "" if seeds >= 2 else " (1 seed: no seed spread)"
    inside = ("its 95% interval over seeds (and RPI permutations)" if seeds >= 2 else
              "its 95% interval over the evaluation images or RPI permutations (1 seed: there is no seed spread)")
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


def rpi_cube(runs: list[StudyRun]) -> np.ndarray:
    """(seeds, permutations, layers) SSDC under RPI: each run's ``rpi_by_permutation`` where it was measured
    with several permutations, else its one ``rpi_per_layer``; cut to the permutations every run has (NaN
    for missing values)."""
    rows = []
    for r in runs:
        ssdc = r.eval.ssdc
        if ssdc is None or not ssdc.rpi_per_layer:
            continue
        rows.append(ssdc.rpi_by_permutation or [ssdc.rpi_per_layer])
    if not rows:
        return np.zeros((0, 0, 0))
    p_n, l_n = min(len(p) for p in rows), min(len(layer) for p in rows for layer in p)
    return np.array([[[math.nan if v is None else v for v in layer[:l_n]] for layer in p[:p_n]] for p in rows],
                    dtype=float)


def _layer_spreads(runs: list[StudyRun], key: str) -> list[Spread]:
    if key == "rpi_per_layer":
        cube = rpi_cube(runs)
        return [spread_sp(cube[:, :, k]) for k in range(cube.shape[2])]
    arr = _per_seed_layers(runs, key)
    return [spread(arr[:, k].tolist()) for k in range(arr.shape[1])]


def _fmt(spreads: list[Spread]) -> str:
    return "[" + ", ".join(f"{s.mean:.3f}" for s in spreads) + "]"


def _units(spreads: list[Spread]) -> str:
    """' (2 seeds x 3 RPI permutations)' or ' (2 seeds)': what an interval is over."""
    s = next((x for x in spreads if x.n), None)
    if s is None:
        return ""
    perms = f" x {s.permutations} RPI permutations" if s.permutations >= 2 else ""
    return f" ({s.n} seed{'s' if s.n != 1 else ''}{perms})"


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
def _collapses(runs: list[StudyRun]) -> tuple[list[str], list[Spread], str]:
    """|SSDC under RPI| < NEAR_ZERO at every layer: the parts, the layers' spreads and the deciding layer."""
    rpi = _layer_spreads(runs, "rpi_per_layer")
    parts = [_near_zero(s) for s in rpi]
    names = [f"layer {k}" for k in range(len(rpi))]
    if all(d == "yes" for d, _ in parts):  # every layer holds: show the one nearest the threshold
        k = int(np.argmax([max(abs(s.lo), abs(s.hi)) for s in rpi]))
        return ["yes"] * len(parts), rpi, f"{names[k]}: {parts[k][1]}"
    return [d for d, _ in parts], rpi, _worst(parts, names)


def _claim_collapse(by, seeds) -> Verdict:
    """(1) no-PE models build content structure that collapses under RPI."""
    if "nope" not in by:
        return Verdict("not measured", "", "no-PE condition not run")
    plain = spread(np.nanmean(_per_seed_layers(by["nope"], "per_layer"), 1).tolist())
    builds, why = _above(plain, SUBSTANTIAL)
    parts, rpi, deciding = _collapses(by["nope"])
    return _verdict([builds] + parts, f"no PE: mean SSDC {plain.text()} ({why}) -> under RPI {_fmt(rpi)}"
                    f"{_units(rpi)}, |SSDC| < {NEAR_ZERO:g} at every layer? {deciding}", seeds)


_SHAPE_WORDS = {"early": {"yes": "peaks early", "no": "peaks late", "noise": "early or late peak within noise"},
                "accumulates": {"yes": "accumulates", "no": "does not accumulate", "noise": "flat within noise"}}


def _claim_anchor(by, seeds) -> Verdict:
    """(2) PE models keep SSDC under RPI; APE/sincos peak early, RoPE accumulates with depth.

    Per seed x RPI permutation: "keeps" is the mean over layers; "peaks early" the maximum over the first
    half of the layers (k < L/2) minus the maximum over the rest, > 0; "accumulates" the last layer minus
    the first, > 0. Each is decided beyond its interval (:func:`spread_sp`), never on the argmax of the
    mean profile."""
    missing = [LABELS[c] for c in _PE if c not in by]
    if missing:  # the claim is about all three: some of them cannot hold (or fail) it
        return Verdict("not measured", "", f"needs APE, sincos and RoPE; not run: {', '.join(missing)}")
    parts, evidence = [], []
    for c in _PE:
        cube = rpi_cube(by[c])  # (seeds, permutations, layers)
        if cube.size == 0:
            return Verdict("not measured", "", f"{LABELS[c]} has no SSDC under RPI")
        layers = _layer_spreads(by[c], "rpi_per_layer")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            keeps = spread_sp(np.nanmean(cube, 2))
            if c == "rope":
                shape_q, kind, what = spread_sp(cube[:, :, -1] - cube[:, :, 0]), "accumulates", "last - first layer"
            else:
                half = (cube.shape[2] + 1) // 2  # layers k < L/2
                shape_q = spread_sp(np.nanmax(cube[:, :, :half], 2) - np.nanmax(cube[:, :, half:], 2))
                kind, what = "early", "max of the first half - max of the rest"
        kept, kept_why = _above(keeps, SUBSTANTIAL)
        shape, shape_why = _above(shape_q, 0.0)
        parts += [kept, shape]
        evidence.append(f"{LABELS[c]} under RPI {_fmt(layers)}{_units(layers)} (mean {keeps.text()}: {kept_why}; "
                        f"{_SHAPE_WORDS[kind][shape]}: {what} {shape_why})")
    return _verdict(parts, "; ".join(evidence), seeds)


def _claim_rpt(by, seeds) -> Verdict:
    """(3) RPT behaves like no PE."""
    if "rpt" not in by:
        return Verdict("not measured", "", "RPT condition not run")
    parts, rpi, deciding = _collapses(by["rpt"])
    return _verdict(parts, f"RPT under RPI {_fmt(rpi)}{_units(rpi)}, |SSDC| < {NEAR_ZERO:g} at every layer? "
                    f"{deciding}", seeds)


def _fs_interval(runs: list[StudyRun], shift: str):
    return tuple((runs[0].eval.fs_interval or {}).get(shift) or ()) if len(runs) == 1 else None


def _claim_fragility(by, seeds, shift: str = "jpeg:5") -> Verdict:
    """(4) PE models are less fragile than no-PE / RPT, RoPE least."""
    fs = {c: spread([(r.eval.fs or {}).get(shift) for r in runs]) for c, runs in by.items()}
    missing = [LABELS[c] for c in _PE + _NON_PE if c not in fs or fs[c].n == 0]
    if missing:  # the claim compares every PE model with no PE and RPT
        return Verdict("not measured", "", f"needs every condition with fragility results; missing: {', '.join(missing)}")
    pe, non_pe = [c for c in _PE if c in fs], [c for c in _NON_PE if c in fs]

    def less(a: str, b: str) -> tuple[str, str]:
        return _less(fs[a], fs[b], _fs_interval(by[a], shift), _fs_interval(by[b], shift))

    below = {(a, b): less(a, b) for a in pe for b in non_pe}  # PE models less fragile than no PE / RPT
    least = {("rope", c): less("rope", c) for c in fs if c != "rope"}  # RoPE least fragile of all
    order = ", ".join(f"{LABELS.get(c, c)} {s.text()}" for c, s in sorted(fs.items(), key=lambda kv: kv[1].mean))
    halves = "; ".join(f"{name}: {_PART_WORDS[_combine([d for d, _ in part.values()])]}{_failed(part)}"
                       for name, part in (("PE below no PE / RPT", below), ("RoPE least", least)))
    return _verdict([d for d, _ in below.values()] + [d for d, _ in least.values()],
                    f"JPEG q5 FS (low to high): {order}; {halves}", seeds)


_PART_WORDS = {"held": "yes", "not held": "no", "undecided": "within noise"}


def _failed(part: dict[tuple[str, str], tuple[str, str]]) -> str:
    """' (not A < B: difference ... [lo, hi], ...)': the comparisons a < b that fail beyond the noise, else the
    first one within noise, else the tightest one that holds, with the interval of FS(B) - FS(A) that decided
    it ('' without comparisons)."""
    def name(a: str, b: str, why: str) -> str:
        return f"{LABELS.get(a, a)} < {LABELS.get(b, b)}: {why}"

    bad = [name(a, b, why) for (a, b), (d, why) in part.items() if d == "no"]
    if bad:
        return f" (not {', '.join(bad)})"
    noisy = [name(a, b, why) for (a, b), (d, why) in part.items() if d == "noise"]
    if noisy:
        return f" ({noisy[0]})"
    tight = sorted(part.items(), key=lambda kv: float(kv[1][1].split("[")[1].split(",")[0]) if "[" in kv[1][1] else 0)
    return f" (tightest: {name(*tight[0][0], tight[0][1][1])})" if tight else ""


def _trend(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman correlation of y with x; NaN when either is constant or has missing values."""
    from scipy.stats import spearmanr

    if np.isnan(y).any() or np.ptp(y) == 0 or np.ptp(x) == 0:
        return math.nan
    return float(spearmanr(x, y)[0])


def _claim_alpha(by, seeds, shift: str = "jpeg:5") -> Verdict:
    """(5) delta SSDC falls and FS rises as alpha shrinks (APE).

    Each half is 'yes' when every seed's curve has the claimed trend (its Spearman correlation with alpha has
    the claimed sign) and the change from the largest alpha to the smallest is beyond its 95% interval over
    seeds in the claimed direction; 'no' when every seed trends the other way and the change is beyond the
    interval the other way; 'within noise' otherwise. With one seed, the FS change's interval is recovered
    from each alpha's bootstrap interval (MOVER as in :func:`_less`) where the sweep kept them; otherwise
    the one seed's point values decide."""
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
    hi, lo = int(np.argmax(alphas)), int(np.argmin(alphas))
    intervals = sweeps[0].fs_interval and sweeps[0].fs_interval.get(shift)
    parts, halves = [], []
    for name, sign, index in (("delta SSDC falls", 1, 0), ("FS rises", -1, 1)):
        per_seed = [_trend(alphas, c[index]) for c in curves]
        trends = ", ".join(f"{r:+.2f}" for r in per_seed)
        if all(math.isfinite(r) and sign * r > 0 for r in per_seed):
            agree = "yes"
        elif all(math.isfinite(r) and sign * r < 0 for r in per_seed):
            agree = "no"
        else:
            agree = "noise"
        # the change as alpha shrinks, signed so that > 0 is the claim: delta(hi) - delta(lo), FS(lo) - FS(hi)
        change = spread([sign * (c[index][hi] - c[index][lo]) for c in curves])
        if index == 1 and len(sweeps) == 1 and intervals:
            moved, why = _less(spread([fsj[hi]]), spread([fsj[lo]]), intervals[hi], intervals[lo])
            why = (f"FS at alpha {alphas[lo]:g} minus at {alphas[hi]:g}: {why}, "
                   f"{'beyond' if moved != 'noise' else 'within'} its 95% interval")
        else:
            moved, why = _above(change, 0.0)
            why = f"change from alpha {alphas[hi]:g} to {alphas[lo]:g} (claimed direction > 0): {why}"
        part = agree if agree == moved else "noise"
        parts.append(part)
        halves.append(f"{name}: {_PART_WORDS[_combine([part])]} (Spearman with alpha per seed {trends}; {why})")
    evidence = (f"APE: alpha {alphas.tolist()} -> delta SSDC {np.round(delta, 3).tolist()}, JPEG FS "
                f"{np.round(fsj, 3).tolist()}; " + "; ".join(halves))
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
