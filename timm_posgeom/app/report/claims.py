"""The paper's five claims, decided on a study's results with the seed spread, or honestly left undecided.

A claim is decided only where the run can decide it (docs/method.md#verdicts; the statistics are in
:mod:`.verdicts`):

* **near chance**: a model whose clean top-1 (mean over seeds) is below ``CHANCE_FACTOR`` x chance
  (1 / classes) has not learned what the claim is about: every claim that involves it is
  ``undecided``, never ``no``;
* **one seed never decides**: a claim whose conditions have one seed reads ``undecided`` ("one seed: not
  decided"), its evidence (intervals over RPI permutations, or from each run's bootstrap interval) still shown;
* **one rule for every part**: each part of a claim is a quantity with a claimed side of a threshold, decided
  ``yes`` when its interval lies on the claimed side, ``no`` when on the other, ``within noise`` otherwise,
  with Holm's step-down procedure over the claim's parts (family-wise 95%: the part with the k-th smallest
  p-value is tested at level 1 - 0.05 / (m - k + 1)). A claim is held when every part is yes, not held when
  some part is no, undecided otherwise. Intervals are over seeds, and over seeds x RPI permutations
  (:func:`~.verdicts.spread_sp`, on seeds - 1 degrees of freedom) for SSDC under RPI.

The quantities: claim 1, trained mean SSDC minus the same seed's untrained one > 0 (builds) and |SSDC under RPI|
< ``NEAR_ZERO`` at every layer (collapses); claim 2, mean SSDC under RPI > ``SUBSTANTIAL`` (keeps), "peaks
early" (S1 - S0) - (S_last - S1) > 0 (the rise over block 1 against the rise after it), "accumulates" S_last -
S0 > 0; claim 3, RPT collapses; claim 4, FS differences; claim 5, the change from the largest alpha to the
smallest with every seed's trend agreeing. ``evaluate_claims(results, rule="2026-11")`` decides under the
rule before issue 39 (:data:`~.verdicts.RULES`).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ...errors import SettingError
from ...results.jsonio import nan_if_none
from ..records import RecordError, StudyResults, StudyRun
from .runs import by_condition
from .verdicts import (
    ALPHA,
    DEFAULT_RULE,
    RULES,
    Decision,
    Rule,
    Spread,
    Test,
    above,
    combine,
    decide,
    less,
    level_text,
    near_zero,
    shown,
    spread,
    spread_sp,
)

__all__ = [
    "Spread",
    "Verdict",
    "spread",
    "spread_sp",
    "rpi_cube",
    "evaluate_claims",
    "CLAIMS",
    "NEAR_ZERO",
    "SUBSTANTIAL",
    "CHANCE_FACTOR",
    "LABELS",
    "RULES",
    "Rule",
]

NEAR_ZERO = 0.1
SUBSTANTIAL = 0.1
CHANCE_FACTOR = 1.5
LABELS = {"nope": "no PE", "ape": "APE", "sincos": "sincos", "rope": "RoPE", "rpt": "RPT"}
_PE, _NON_PE = ("ape", "sincos", "rope"), ("nope", "rpt")
_PART_WORDS = {"held": "yes", "not held": "no", "undecided": "within noise"}
ONE_SEED = "one seed: not decided (a claim is decided over seeds; the evidence shows the one seed's values)"


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


@dataclass(frozen=True)
class _Study:
    """What a claim is decided on: the runs by condition, the rule, the fewest seeds of any condition."""

    by: dict[str, list[StudyRun]]
    rule: Rule
    seeds: int


def _verdict(decisions: list[Decision], evidence: str, study: _Study) -> Verdict:
    if not decisions:  # no part to decide (no layer measured under RPI): never "held" by default
        return Verdict("not measured", evidence, "nothing to decide it on (no SSDC under RPI)")
    status = combine([d.word for d in decisions])
    note = "" if study.seeds >= 2 else " (1 seed: no seed spread)"
    reason = ""
    if status == "undecided" and study.rule.holm:
        reason = (
            f"within noise: a part's interval contains its threshold at the level Holm's procedure tested it "
            f"({level_text(ALPHA)} family-wise over the claim's {len(decisions)} parts)"
        )
    elif status == "undecided":
        inside = (
            "its 95% interval over seeds (and RPI permutations)"
            if study.seeds >= 2
            else "its 95% interval over the evaluation images or RPI permutations (1 seed: there is no seed spread)"
        )
        reason = f"within noise: the difference is inside {inside}"
    return Verdict(status, evidence + note, reason)


def _deciding(decisions: list[Decision]) -> str:
    """The part that decided a list of parts (:func:`~.verdicts.shown`: the first 'no', else the first part
    within noise, one leaning against the claim first, else the tightest 'yes')."""
    parts = shown(decisions)
    return parts[0].text() if parts else ""


# --------------------------------------------------------------------------------------------
# per-condition values
# --------------------------------------------------------------------------------------------
def _per_seed_layers(runs: list[StudyRun], key: str) -> np.ndarray:
    """(seeds, layers) of an SSDC list of each run's evaluation (NaN for missing values)."""
    rows = [
        nan_if_none(getattr(r.eval.ssdc, key)) for r in runs if r.eval.ssdc is not None and getattr(r.eval.ssdc, key)
    ]
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
    return np.array(nan_if_none([[layer[:l_n] for layer in p[:p_n]] for p in rows]), dtype=float)


def _layer_spreads(runs: list[StudyRun], key: str, rule: Rule) -> list[Spread]:
    if key == "rpi_per_layer":
        cube = rpi_cube(runs)
        return [spread_sp(cube[:, :, k], df=rule.df) for k in range(cube.shape[2])]
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
    return (
        f"near chance ({names}; chance {chance:.3f}, threshold {CHANCE_FACTOR:g}x): a model that has not "
        "learned cannot show it"
    )


# --------------------------------------------------------------------------------------------
# the claims
# --------------------------------------------------------------------------------------------
def _collapse_parts(runs: list[StudyRun], rule: Rule) -> tuple[list[tuple[str, Test]], list[Spread]]:
    """|SSDC under RPI| < NEAR_ZERO, one part per layer, and the layers' spreads."""
    rpi = _layer_spreads(runs, "rpi_per_layer", rule)
    return [(f"layer {k}", near_zero(s, NEAR_ZERO, rule)) for k, s in enumerate(rpi)], rpi


def _builds(runs: list[StudyRun], rule: Rule) -> tuple[Test, str]:
    """Claim 1's "builds structure" and what it compares. Rule 2026-12: per seed, the trained model's mean
    SSDC over layers minus its untrained start's (the same architecture and seed, ``StudyRun.untrained``),
    > 0; rule 2026-11: the trained mean SSDC > SUBSTANTIAL."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        trained = [
            float(np.nanmean(nan_if_none(r.eval.ssdc.per_layer)))
            for r in runs
            if r.eval.ssdc is not None and r.eval.ssdc.per_layer
        ]
        if rule.builds == "threshold":
            plain = spread(trained)
            return above(plain, SUBSTANTIAL, rule), "mean SSDC"
        pairs = [
            (
                float(np.nanmean(nan_if_none(r.eval.ssdc.per_layer))),
                float(np.nanmean(nan_if_none(r.untrained.per_layer))),
            )
            for r in runs
            if r.eval.ssdc is not None and r.eval.ssdc.per_layer and r.untrained.per_layer
        ]
    diff = spread([t - u for t, u in pairs])
    return above(diff, 0.0, rule), (
        f"mean SSDC {spread([t for t, _ in pairs]).mean:.3f} trained against "
        f"{spread([u for _, u in pairs]).mean:.3f} untrained (same seeds), trained "
        "- untrained"
    )


def _claim_collapse(study: _Study) -> Verdict:
    """(1) no-PE models build content structure that collapses under RPI."""
    if "nope" not in study.by:
        return Verdict("not measured", "", "no-PE condition not run")
    runs = study.by["nope"]
    builds, what = _builds(runs, study.rule)
    parts, rpi = _collapse_parts(runs, study.rule)
    ds = decide([("", builds)] + parts, study.rule)
    return _verdict(
        ds,
        f"no PE: {what} {ds[0].text()} -> under RPI {_fmt(rpi)}{_units(rpi)}, |SSDC| < "
        f"{NEAR_ZERO:g} at every layer? {_deciding(ds[1:])}",
        study,
    )


_SHAPE_WORDS = {
    "early": {"yes": "peaks early", "no": "peaks late", "noise": "early or late peak within noise"},
    "accumulates": {"yes": "accumulates", "no": "does not accumulate", "noise": "flat within noise"},
}


def _shape(condition: str, cube: np.ndarray, rule: Rule) -> tuple[Spread, str, str]:
    """Claim 2's shape per seed x permutation over (seeds, permutations, layers): RoPE "accumulates", last
    layer minus first; APE and sincos "peak early": rule 2026-12, the rise over block 1 against the rise after
    it, (S1 - S0) - (S_last - S1) (the paper's early injection); rule 2026-11, the maximum over the first half
    of the layers (k < L/2) minus the maximum over the rest. Its spread, kind and what it is."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        if condition == "rope":
            return spread_sp(cube[:, :, -1] - cube[:, :, 0], df=rule.df), "accumulates", "last - first layer"
        if rule.early == "rise":
            if cube.shape[2] < 2:
                return spread([]), "early", "needs 2 layers"
            q = (cube[:, :, 1] - cube[:, :, 0]) - (cube[:, :, -1] - cube[:, :, 1])
            mean = np.nanmean(cube, (0, 1))
            total = mean[-1] - mean[0]
            share = f", block 1 carries {(mean[1] - mean[0]) / total:.0%} of the mean rise" if total > 0 else ""
            return spread_sp(q, df=rule.df), "early", f"(S1 - S0) - (S_last - S1){share}"
        half = (cube.shape[2] + 1) // 2  # layers k < L/2
        q = np.nanmax(cube[:, :, :half], 2) - np.nanmax(cube[:, :, half:], 2)
        return spread_sp(q, df=rule.df), "early", "max of the first half - max of the rest"


def _claim_anchor(study: _Study) -> Verdict:
    """(2) PE models keep SSDC under RPI; APE/sincos peak early, RoPE accumulates with depth.

    Per seed x RPI permutation: "keeps" is the mean over layers > SUBSTANTIAL, the shape as :func:`_shape`; each
    decided beyond its interval (:func:`spread_sp`), never on the argmax of the mean profile."""
    missing = [LABELS[c] for c in _PE if c not in study.by]
    if missing:  # the claim is about all three: some of them cannot hold (or fail) it
        return Verdict("not measured", "", f"needs APE, sincos and RoPE; not run: {', '.join(missing)}")
    parts, heads = [], []
    for c in _PE:
        cube = rpi_cube(study.by[c])  # (seeds, permutations, layers)
        if cube.size == 0:
            return Verdict("not measured", "", f"{LABELS[c]} has no SSDC under RPI")
        layers = _layer_spreads(study.by[c], "rpi_per_layer", study.rule)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            keeps = spread_sp(np.nanmean(cube, 2), df=study.rule.df)
        shape_q, kind, what = _shape(c, cube, study.rule)
        parts += [("mean", above(keeps, SUBSTANTIAL, study.rule)), (what, above(shape_q, 0.0, study.rule))]
        heads.append((f"{LABELS[c]} under RPI {_fmt(layers)}{_units(layers)}", kind))
    ds = decide(parts, study.rule)
    evidence = [
        f"{head} ({ds[2 * i].text()}; {_SHAPE_WORDS[kind][ds[2 * i + 1].word]}: {ds[2 * i + 1].text()})"
        for i, (head, kind) in enumerate(heads)
    ]
    return _verdict(ds, "; ".join(evidence), study)


def _claim_rpt(study: _Study) -> Verdict:
    """(3) RPT behaves like no PE."""
    if "rpt" not in study.by:
        return Verdict("not measured", "", "RPT condition not run")
    parts, rpi = _collapse_parts(study.by["rpt"], study.rule)
    ds = decide(parts, study.rule)
    return _verdict(
        ds, f"RPT under RPI {_fmt(rpi)}{_units(rpi)}, |SSDC| < {NEAR_ZERO:g} at every layer? {_deciding(ds)}", study
    )


def _fs_interval(runs: list[StudyRun], shift: str):
    return tuple((runs[0].eval.fs_interval or {}).get(shift) or ()) if len(runs) == 1 else None


def _claim_fragility(study: _Study, shift: str = "jpeg:5") -> Verdict:
    """(4) PE models are less fragile than no-PE / RPT, RoPE least: 10 comparisons, decided together."""
    by = study.by
    fs = {c: spread([(r.eval.fs or {}).get(shift) for r in runs]) for c, runs in by.items()}
    missing = [LABELS[c] for c in _PE + _NON_PE if c not in fs or fs[c].n == 0]
    if missing:  # the claim compares every PE model with no PE and RPT
        return Verdict(
            "not measured", "", f"needs every condition with fragility results; missing: {', '.join(missing)}"
        )
    below = [(a, b) for a in _PE for b in _NON_PE]  # PE models less fragile than no PE / RPT
    least = [("rope", c) for c in fs if c != "rope"]  # RoPE least fragile of all
    parts = [
        (
            f"{LABELS.get(a, a)} < {LABELS.get(b, b)}",
            less(fs[a], fs[b], _fs_interval(by[a], shift), _fs_interval(by[b], shift)),
        )
        for a, b in below + least
    ]
    ds = decide(parts, study.rule)
    order = ", ".join(f"{LABELS.get(c, c)} {s.text()}" for c, s in sorted(fs.items(), key=lambda kv: kv[1].mean))
    halves = "; ".join(
        f"{name}: {_PART_WORDS[combine([d.word for d in part])]}{_failed(part)}"
        for name, part in (("PE below no PE / RPT", ds[: len(below)]), ("RoPE least", ds[len(below) :]))
    )
    return _verdict(ds, f"JPEG q5 FS (low to high): {order}; {halves}", study)


def _failed(part: list[Decision]) -> str:
    """' (not A < B: difference ... [lo, hi] at L, ...)': the comparisons a < b that fail beyond the noise, else
    the first one within noise (one whose difference leans the wrong way first), else the tightest one that
    holds, each with the interval of FS(B) - FS(A) at the level it was tested ('' without comparisons)."""
    parts = shown(part)
    if not parts:
        return ""
    if parts[0].word == "no":
        return f" (not {', '.join(d.text() for d in parts)})"
    return f" ({parts[0].text()})" if parts[0].word == "noise" else f" (tightest: {parts[0].text()})"


def _trend(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman correlation of y with x; NaN when either is constant or has missing values."""
    from scipy.stats import spearmanr

    if np.isnan(y).any() or np.ptp(y) == 0 or np.ptp(x) == 0:
        return math.nan
    return float(spearmanr(x, y)[0])


def _alpha_part(alphas: np.ndarray, curves: list, index: int, sign: int, intervals, rule: Rule) -> tuple[Test, str]:
    """One half of claim 5 (index 0: delta SSDC falls, sign 1; index 1: FS rises, sign -1): its test and the
    seeds' trends. 'yes' at a level when every seed's Spearman correlation with alpha has the claimed sign and
    the change from the largest alpha to the smallest is beyond the interval in the claimed direction; 'no' when
    both hold the other way; else 'noise'. With one seed, the FS change's interval comes from each alpha's
    bootstrap interval (MOVER, :func:`~.verdicts.less`) where the sweep kept them."""
    hi, lo = int(np.argmax(alphas)), int(np.argmin(alphas))
    per_seed = [_trend(alphas, c[index]) for c in curves]
    if all(math.isfinite(r) and sign * r > 0 for r in per_seed):
        agree = "yes"
    elif all(math.isfinite(r) and sign * r < 0 for r in per_seed):
        agree = "no"
    else:
        agree = "noise"
    if index == 1 and len(curves) == 1 and intervals:
        fs = curves[0][1]
        moved = less(spread([fs[hi]]), spread([fs[lo]]), intervals[hi], intervals[lo])
        what = f"FS at alpha {alphas[lo]:g} minus at {alphas[hi]:g}"
    else:  # the change as alpha shrinks, signed so that > 0 is the claim: delta(hi) - delta(lo), FS(lo) - FS(hi)
        moved = above(spread([sign * (c[index][hi] - c[index][lo]) for c in curves]), 0.0, rule)
        what = f"change from alpha {alphas[hi]:g} to {alphas[lo]:g} (claimed direction > 0)"

    def test(alpha: float) -> tuple[str, str]:
        word, why = moved(alpha)
        return (agree if agree == word else "noise"), f"{what}: {why}"

    return test, ", ".join(f"{r:+.2f}" for r in per_seed)


def _claim_alpha(study: _Study, shift: str = "jpeg:5") -> Verdict:
    """(5) delta SSDC falls and FS rises as alpha shrinks (APE): two parts, :func:`_alpha_part`."""
    sweeps = [r.eval.alpha_sweep for r in study.by.get("ape", []) if r.eval.alpha_sweep]
    if not sweeps:
        return Verdict("not measured", "", "no APE alpha sweep")
    alphas = np.array(sweeps[0].alphas, dtype=float)
    if len(set(alphas.tolist())) < 2 or any(list(s.alphas) != list(sweeps[0].alphas) for s in sweeps):
        return Verdict("not measured", "", "the APE alpha sweeps need the same 2 alphas or more in every seed")
    curves = [
        (
            np.array(nan_if_none(s.delta_ssdc), dtype=float),
            np.array(nan_if_none((s.fs or {}).get(shift, [None] * len(alphas))), dtype=float),
        )
        for s in sweeps
    ]
    with warnings.catch_warnings():  # an alpha where every seed is NaN stays NaN: checked next
        warnings.simplefilter("ignore", RuntimeWarning)
        delta, fsj = np.nanmean([d for d, _ in curves], 0), np.nanmean([f for _, f in curves], 0)
    head = (
        f"APE: alpha {alphas.tolist()} -> delta SSDC {np.round(delta, 3).tolist()}, JPEG FS {np.round(fsj, 3).tolist()}"
    )
    if not (np.isfinite(delta).all() and np.isfinite(fsj).all()):  # a trend of a curve with holes is not one
        return Verdict(
            "undecided",
            head,
            "delta SSDC or FS is undefined (NaN) at some alpha (e.g. a model with one block has no delta SSDC)",
        )
    intervals = sweeps[0].fs_interval and sweeps[0].fs_interval.get(shift)
    tests = [_alpha_part(alphas, curves, index, sign, intervals, study.rule) for index, sign in ((0, 1), (1, -1))]
    ds = decide([(name, test) for name, (test, _) in zip(("delta SSDC falls", "FS rises"), tests)], study.rule)
    halves = [
        f"{d.name}: {_PART_WORDS[combine([d.word])]} (Spearman with alpha per seed {trends}; {d.text(named=False)})"
        for d, (_, trends) in zip(ds, tests)
    ]
    return _verdict(ds, f"{head}; " + "; ".join(halves), study)


CLAIMS: tuple[tuple[str, Callable, tuple[str, ...]], ...] = (
    ("No-PE models build content-driven structure that collapses to ~0 under RPI", _claim_collapse, ("nope",)),
    (
        "APE/sincos/RoPE keep substantial SSDC under RPI (APE/sincos peak early, RoPE accumulates with depth)",
        _claim_anchor,
        _PE,
    ),
    ("RPT behaves like no PE (SSDC under RPI ~0)", _claim_rpt, ("rpt",)),
    ("PE models are less fragile than no-PE/RPT, RoPE least", _claim_fragility, _PE + _NON_PE),
    ("As alpha shrinks, delta SSDC falls and FS rises (APE)", _claim_alpha, ("ape",)),
)


def _by_condition(results: StudyResults) -> dict[str, list[StudyRun]]:
    """The runs by condition (:func:`~.runs.by_condition`); the same condition and seed twice is refused (it
    would be a second seed with no spread)."""
    seen: set[tuple[str, int]] = set()
    for run in results.runs:
        if (run.condition, run.seed) in seen:
            raise RecordError(f"the results hold {run.condition} seed {run.seed} twice")
        seen.add((run.condition, run.seed))
    return by_condition(results)


def _qualified(verdict: Verdict, study: _Study, conditions: Sequence[str], classes: int | None) -> Verdict:
    """A claim's verdict where its runs cannot decide it: near chance; one seed (rule 2026-12); an undecided
    claim over conditions with different seed counts says so."""
    if verdict.status not in ("held", "not held", "undecided"):
        return verdict
    chance = _chance_reason(study.by, conditions, classes)
    if chance:
        return Verdict("undecided", verdict.evidence, chance)
    counts = {LABELS.get(c, c): len(v) for c, v in study.by.items()}
    decided = verdict.status != "undecided" or verdict.reason.startswith("within noise")  # not a NaN's
    if (
        decided
        and not study.rule.one_seed_decides
        and min((len(study.by[c]) for c in conditions if c in study.by), default=0) == 1
    ):
        return Verdict("undecided", verdict.evidence, ONE_SEED)
    if verdict.status == "undecided" and len(set(counts.values())) > 1:
        return Verdict(
            "undecided",
            verdict.evidence,
            verdict.reason + "; the conditions have different seed "
            f"counts ({', '.join(f'{c} {n}' for c, n in counts.items())}), and a comparison across "
            "them is decided only where both sides have a spread",
        )
    return verdict


def evaluate_claims(results: StudyResults, rule: str | Rule = DEFAULT_RULE) -> list[dict]:
    """The paper's five claims: ``claim``, ``status`` (held / not held / undecided / not measured), ``held``
    (True / False / None), ``evidence``, ``reason`` (why undecided or not measured) and ``rule`` (the name of
    the rule that decided: ``"2026-12"``, the default, or ``"2026-11"``, the rule before issue 39; a
    :class:`~.verdicts.Rule` for any other combination)."""
    if isinstance(rule, str):
        if rule not in RULES:
            raise SettingError(f"unknown verdict rule {rule!r}; the rules are {', '.join(RULES)}")
        rule = RULES[rule]
    by = _by_condition(results)
    study = _Study(by, rule, min((len(v) for v in by.values()), default=0))
    classes = (results.eval_data or {}).get("classes")
    out = []
    for claim, check, conditions in CLAIMS:
        verdict = _qualified(check(study), study, conditions, classes)
        out.append(
            dict(
                claim=claim,
                status=verdict.status,
                held=verdict.held,
                evidence=verdict.evidence,
                reason=verdict.reason,
                rule=rule.name,
            )
        )
    return out
