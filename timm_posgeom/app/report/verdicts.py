"""The statistics a claim's verdict rests on (docs/method.md#verdicts): a quantity's spread over seeds (and RPI
permutations), its interval at any confidence level, the test of one part of a claim at a level, that part's
p-value, and Holm's step-down procedure over a claim's parts.

A part of a claim is a quantity with a claimed side of a threshold. Its test at a two-sided ``alpha`` reads
``yes`` when the ``1 - alpha`` interval lies on the claimed side, ``no`` when it lies on the other side, and
``noise`` otherwise. Its p-value is the smallest ``alpha`` at which it is decided (:func:`p_value`). Holm's
procedure (:func:`decide`) sorts a claim's m parts by p-value and decides the k-th smallest at ``alpha / (m - k
+ 1)`` until one is not decided; that one and every later one are ``noise``: the chance that any part of the
claim is decided wrongly stays below ``alpha`` (0.05) whatever the number of parts.

Two rules are kept (:data:`RULES`), so that a verdict can be recomputed under the rule that first gave it:

* ``"2026-12"`` (issue 39, the default): Holm over a claim's parts; intervals over seeds x RPI permutations
  on ``seeds - 1`` degrees of freedom; one seed never decides; claim 1's "builds structure" is trained SSDC
  above the same seed's untrained SSDC; "peaks early" is the rise over block 1 against the rise after it.
* ``"2026-11"`` (issue 32): each part at its own 95% interval; Welch-Satterthwaite degrees of freedom over
  seeds x permutations; a one-seed point value decides; "builds" is mean SSDC > 0.1; "peaks early" is the
  maximum over the first half of the layers against the maximum over the rest.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ...results.jsonio import nan_if_none

__all__ = [
    "Spread",
    "spread",
    "spread_sp",
    "Rule",
    "RULES",
    "DEFAULT_RULE",
    "ALPHA",
    "Test",
    "Decision",
    "p_value",
    "decide",
    "shown",
    "combine",
    "above",
    "near_zero",
    "less",
    "level_text",
]

ALPHA = 0.05  # the family-wise error of a claim (Holm), or of each part (rule 2026-11)
P_FLOOR = 1e-12  # p-values below it are reported as below it
_P_MIN = 1e-100  # the smallest p-value computed (it still orders parts far beyond any level)
Test = Callable[
    [float], tuple[str, str]
]  # alpha -> ('yes' | 'no' | 'noise', the interval at 1 - alpha and the threshold)


def _t_isf(alpha: float, df: float) -> float:
    """The two-sided Student t quantile: t((1 + L) / 2, df) at level L = 1 - alpha (0 at alpha >= 1)."""
    if alpha >= 1:
        return 0.0
    # Student t's quantile from scipy.special, without scipy.stats' overhead: the bisection calls it often
    from scipy.special import stdtrit

    q = -float(stdtrit(df, alpha / 2))
    return q if math.isfinite(q) and q >= 0 else math.inf


def _z_ratio(alpha: float) -> float:
    """z((1 + L) / 2) / z(0.975): how much wider the normal interval at level L = 1 - alpha is than at 95%."""
    if alpha >= 1:
        return 0.0
    from scipy.special import ndtri

    return float(ndtri(alpha / 2) / ndtri(0.025))


def level_text(alpha: float) -> str:
    """The confidence level 1 - alpha in percent: '95%', '99.17%'."""
    return f"{100 * (1 - alpha):.2f}".rstrip("0").rstrip(".") + "%"


@dataclass(frozen=True)
class Spread:
    """Mean over seeds, sample std, and the two-sided 95% Student-t interval of the mean (lo = hi = mean and
    std NaN with one seed; all NaN with none); :meth:`interval` gives it at any level.

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

    def interval(self, alpha: float = ALPHA) -> tuple[float, float]:
        """The two-sided ``1 - alpha`` interval: mean -+ t((1 + L) / 2, df) sqrt(var), L = 1 - alpha; (NaN, NaN)
        without an interval (one seed and one permutation, or no value)."""
        if not self.has_interval:
            return math.nan, math.nan
        half = _t_isf(alpha, self.df) * math.sqrt(self.var) if self.var > 0 else 0.0
        return self.mean - half, self.mean + half

    def text(self, digits: int = 3) -> str:
        if self.n == 0:
            return "n/a"
        if not self.has_interval:
            return f"{self.mean:.{digits}f}"
        seeds = f" ± {self.std:.{digits}f}" if self.n >= 2 else ""
        perms = f" (permutations ± {self.perm_std:.{digits}f})" if self.permutations >= 2 else ""
        return f"{self.mean:.{digits}f}{seeds}{perms} [{self.lo:.{digits}f}, {self.hi:.{digits}f}]"


def spread(values: Sequence[float | None]) -> Spread:
    """The :class:`Spread` of the finite values (None and NaN left out)."""
    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    n = len(vals)
    if n == 0:
        return Spread(math.nan, math.nan, math.nan, math.nan, 0)
    mean = float(np.mean(vals))
    if n == 1:
        return Spread(mean, math.nan, mean, mean, 1)
    std = float(np.std(vals, ddof=1))
    half = _t_isf(ALPHA, n - 1) * std / math.sqrt(n)
    return Spread(mean, std, mean - half, mean + half, n, var=std**2 / n, df=float(n - 1))


def spread_sp(cells: np.ndarray | Sequence[Sequence[float | None]], df: str = "seeds") -> Spread:
    """The :class:`Spread` of a quantity measured on seeds x RPI permutations (rows: seeds, columns: the
    permutations, the same permutation seeds in every row; NaN / None left out).

    The permutations are crossed with the seeds (permutation p is drawn with seed p for every model), so the
    variance of the grand mean is estimated as var(per-seed means) / S + var(per-permutation means) / P: the
    seed term as over seeds alone, plus the permutation variance, which the per-seed means share and so
    cannot show (this counts the seed x permutation residual twice: conservative). The interval is Student-t
    on ``S - 1`` degrees of freedom (``df="seeds"``): the seeds are the replicates that limit what is known,
    and the permutation term only widens the interval. ``df="welch"`` (rule 2026-11) gives Welch-Satterthwaite
    degrees of freedom, which with 2 seeds can be far above 1 when the permutation term is large. One
    permutation: :func:`spread` over seeds. One seed: the interval over permutations alone (P - 1 degrees of
    freedom; there is no seed spread)."""
    arr = np.array(nan_if_none([list(row) for row in cells]), dtype=float)
    if arr.ndim != 2 or arr.size == 0:
        return spread([])
    arr = arr[~np.all(np.isnan(arr), 1)]  # seeds without a value
    arr = arr[:, ~np.any(np.isnan(arr), 0)] if arr.size else arr  # a permutation missing in some seed
    if arr.size == 0:
        return spread([])
    s_n, p_n = arr.shape
    if p_n == 1:
        return spread(arr[:, 0].tolist())
    seed_means, perm_means = arr.mean(1), arr.mean(0)
    v_perm = float(np.var(perm_means, ddof=1)) / p_n
    if s_n >= 2:
        std = float(np.std(seed_means, ddof=1))
        v_seed = std**2 / s_n
        dof = float(s_n - 1)
        den = v_seed**2 / (s_n - 1) + v_perm**2 / (p_n - 1)
        if df == "welch" and den > 0:
            dof = (v_seed + v_perm) ** 2 / den
    else:
        std, v_seed, dof = math.nan, 0.0, float(p_n - 1)
    var = v_seed + v_perm
    half = _t_isf(ALPHA, dof) * math.sqrt(var)
    mean = float(arr.mean())
    return Spread(
        mean,
        std,
        mean - half,
        mean + half,
        s_n,
        perm_std=float(np.std(perm_means, ddof=1)),
        permutations=p_n,
        var=var,
        df=dof,
    )


@dataclass(frozen=True)
class Rule:
    """How a study's claims are decided (docs/method.md#verdicts).

    ``holm``: Holm's step-down procedure over a claim's parts at family-wise ``ALPHA`` (else each part at its
    own 95% interval); ``df``: the degrees of freedom over seeds x RPI permutations (:func:`spread_sp`);
    ``one_seed_decides``: a one-seed point value decides a part (else a claim on one seed is not decided);
    ``builds``: claim 1's "builds structure", ``"untrained"`` (trained mean SSDC minus the same seed's
    untrained one > 0) or ``"threshold"`` (mean SSDC > 0.1); ``early``: "peaks early", ``"rise"`` ((S1 - S0)
    - (S_last - S1) > 0) or ``"half-max"`` (max over the first half of the layers - max over the rest > 0)."""

    name: str
    holm: bool = True
    df: str = "seeds"
    one_seed_decides: bool = False
    builds: str = "untrained"
    early: str = "rise"

    def ends(self, s: Spread, alpha: float) -> tuple[float, float]:
        """The ``1 - alpha`` interval of ``s`` that decides; a one-seed point value only where the rule lets
        it decide (2026-11), else (NaN, NaN), which decides nothing."""
        if s.has_interval:
            return s.interval(alpha)
        if self.one_seed_decides and s.n == 1:
            return s.mean, s.mean
        return math.nan, math.nan


RULES = {
    "2026-12": Rule("2026-12"),
    "2026-11": Rule("2026-11", holm=False, df="welch", one_seed_decides=True, builds="threshold", early="half-max"),
}
DEFAULT_RULE = "2026-12"


@dataclass(frozen=True)
class Decision:
    """A part of a claim decided: ``word`` ('yes', 'no', 'noise'), ``why`` (its interval at the level it was
    tested, and the threshold), ``alpha`` (tested at level 1 - alpha), ``p`` (its p-value; NaN when not
    computed), ``step`` (its Holm step, 1 for the smallest p; 0 without Holm) of ``m`` parts, ``leaning`` (the
    decision on the point value alone: which side of the threshold the estimate is on)."""

    name: str
    word: str
    why: str
    alpha: float
    p: float = math.nan
    step: int = 0
    m: int = 1
    leaning: str = "noise"
    stop: int = 0  # the Holm step that was not decided (0: every step was), whose level this part is shown at

    def text(self, named: bool = True) -> str:
        """'NAME: WHY at LEVEL (p P, Holm step K of M)', or 'NAME: WHY at 95%' without Holm (without 'NAME: '
        when not ``named`` or nameless)."""
        head = f"{self.name}: " if self.name and named else ""
        if not self.step:
            return f"{head}{self.why} at {level_text(self.alpha)}"
        p = f"p < {P_FLOOR:g}" if self.p <= P_FLOOR else f"p {self.p:.2g}"
        if self.stop and self.stop < self.step:
            return f"{head}{self.why} at {level_text(self.alpha)} ({p}; Holm stopped at step {self.stop} of {self.m})"
        return f"{head}{self.why} at {level_text(self.alpha)} ({p}, Holm step {self.step} of {self.m})"


def p_value(test: Test, floor: float = _P_MIN) -> float:
    """The smallest two-sided alpha at which ``test`` decides ('yes' or 'no'): 1 when it does not decide even
    on the point value (alpha = 1), ``floor`` when it decides at ``floor`` already. A smaller alpha gives a
    wider interval, so a part decided at alpha is decided at any larger alpha: bisection over log alpha."""
    if test(1.0)[0] == "noise":
        return 1.0
    if test(floor)[0] != "noise":
        return floor
    lo, hi = math.log(floor), 0.0  # not decided at exp(lo), decided at exp(hi)
    for _ in range(64):
        mid = (lo + hi) / 2
        if test(math.exp(mid))[0] == "noise":
            lo = mid
        else:
            hi = mid
    return math.exp(hi)


def decide(parts: Sequence[tuple[str, Test]], rule: Rule, alpha: float = ALPHA) -> list[Decision]:
    """Decide a claim's parts ``(name, test)``, in their order. Without Holm (rule 2026-11): each at ``alpha``.
    With Holm: sorted by p-value, the k-th smallest is tested at ``alpha / (m - k + 1)`` while each is decided;
    from the first that is not, every remaining part is 'noise', shown at that step's level (at which none of
    them is decided either, their p-values being no smaller)."""
    if not rule.holm:
        return [
            Decision(name, *test(alpha), alpha=alpha, p=p_value(test), leaning=test(1.0)[0]) for name, test in parts
        ]
    m = len(parts)
    ps = [p_value(test) for _, test in parts]
    out: list[Decision | None] = [None] * m
    stop, stop_alpha = 0, alpha
    for k, i in enumerate(sorted(range(m), key=lambda j: ps[j])):
        if not stop and ps[i] > alpha / (m - k):
            stop, stop_alpha = k + 1, alpha / (m - k)
        at = stop_alpha if stop else alpha / (m - k)
        name, test = parts[i]
        word, why = test(at)
        out[i] = Decision(
            name, "noise" if stop else word, why, at, p=ps[i], step=k + 1, m=m, leaning=test(1.0)[0], stop=stop
        )
    return [d for d in out if d is not None]


def shown(decisions: Sequence[Decision]) -> list[Decision]:
    """The parts that decided a claim, to show as its evidence: every 'no'; else the parts within noise, those
    whose estimate leans against the claim first; else the 'yes' with the largest p-value (the tightest)."""
    bad = [d for d in decisions if d.word == "no"]
    if bad:
        return bad
    noisy = sorted((d for d in decisions if d.word == "noise"), key=lambda d: d.leaning != "no")
    if noisy:
        return noisy
    return [max(decisions, key=lambda d: d.p)] if decisions else []


def combine(words: Sequence[str]) -> str:
    """A claim's status from its parts: not held on any 'no', undecided on any 'noise', else held."""
    return "not held" if "no" in words else "undecided" if "noise" in words else "held"


# --------------------------------------------------------------------------------------------
# tests of one part at a level: 'yes', 'no' (the opposite holds beyond the interval) or 'noise'
# --------------------------------------------------------------------------------------------
def _ends_text(s: Spread, lo: float, hi: float) -> str:
    return f"{s.mean:.3f} [{lo:.3f}, {hi:.3f}]"


def above(s: Spread, threshold: float, rule: Rule) -> Test:
    """value > threshold: 'yes' when the interval is above it, 'no' when below, 'noise' when it contains it."""

    def test(alpha: float) -> tuple[str, str]:
        lo, hi = rule.ends(s, alpha)
        if math.isnan(lo):
            return "noise", f"{s.mean:.3f}: no interval, not decided (threshold {threshold:g})"
        text = _ends_text(s, lo, hi)
        if lo > threshold:
            return "yes", f"{text} > {threshold:g}"
        if hi < threshold:
            return "no", f"{text} < {threshold:g}"
        return "noise", f"{text} contains {threshold:g}"

    return test


def near_zero(s: Spread, bound: float, rule: Rule) -> Test:
    """|value| < bound: 'yes' when the interval lies inside (-bound, bound), 'no' when it lies outside, 'noise'
    when it crosses -bound or bound."""

    def test(alpha: float) -> tuple[str, str]:
        lo, hi = rule.ends(s, alpha)
        if math.isnan(lo):
            return "noise", f"{s.mean:.3f}: no interval, not decided (inside ±{bound:g}?)"
        text = _ends_text(s, lo, hi)
        if -bound < lo and hi < bound:
            return "yes", f"{text} inside ±{bound:g}"
        if lo >= bound or hi <= -bound:
            return "no", f"{text} outside ±{bound:g}"
        return "noise", f"{text} crosses ±{bound:g}"

    return test


def less(a: Spread, b: Spread, a_interval=None, b_interval=None) -> Test:
    """a < b: 'yes' when the interval of b - a is above 0, 'no' when below, else 'noise'.

    With an interval on both sides (2 seeds or more): the Welch interval of b - a (variance a.var + b.var, the
    smaller of the two degrees of freedom). With one seed each: the interval of b - a recovered from each
    value's own 95% bootstrap interval (given as (lo, hi)) by MOVER, the method of variance estimates
    recovery (Zou & Donner 2008): lower = d - sqrt((b - b_lo)^2 + (a_hi - a)^2), upper = d + sqrt((b_hi - b)^2 +
    (a - a_lo)^2), d = b - a; at a level other than 95% each half-width is rescaled by the ratio of normal
    quantiles z((1 + L) / 2) / z(0.975) (the bootstrap interval is read as a normal one). MOVER is exact for
    independent estimates and wider than needed when their errors are positively correlated (two models
    scored on the same images). Otherwise (a side without a value, seed counts of 1 and more, a missing
    interval): 'noise', never the point values, which would decide any difference at all."""
    one = a.n == 1 and b.n == 1 and a_interval and b_interval and None not in (*a_interval, *b_interval)

    def test(alpha: float) -> tuple[str, str]:
        if a.n == 0 or b.n == 0:
            return "noise", "no value"
        diff = b.mean - a.mean
        if a.n >= 2 and b.n >= 2 and a.has_interval and b.has_interval:
            var = a.var + b.var
            half = _t_isf(alpha, min(a.df, b.df)) * math.sqrt(var) if var > 0 else 0.0
            lower, upper = diff - half, diff + half
        elif one:
            (a_lo, a_hi), (b_lo, b_hi) = a_interval, b_interval
            k = _z_ratio(alpha)
            lower = diff - k * math.hypot(max(b.mean - b_lo, 0.0), max(a_hi - a.mean, 0.0))
            upper = diff + k * math.hypot(max(b_hi - b.mean, 0.0), max(a.mean - a_lo, 0.0))
        else:
            return "noise", f"difference {diff:+.3f} without an interval"
        word = "yes" if lower > 0 else "no" if upper < 0 else "noise"
        return word, f"difference {diff:+.3f} [{lower:+.3f}, {upper:+.3f}]"

    return test
