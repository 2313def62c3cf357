"""The paper's claims decided with the seed spread; undecided (never "no") near chance, within noise or on one
seed. Rule 2026-12 (issue 39, the default): Holm over a claim's parts, seeds - 1 degrees of freedom, one seed
never decides, claim 1 against the untrained start, "early" as the rise over block 1 against the rest; rule
2026-11, the rule before it, stays reachable (``evaluate_claims(results, rule="2026-11")``)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import t
from studies import claims_ssdc, paper_like, paper_seeds, results_of

from timm_posgeom.app.records import StudyResults, StudyRun
from timm_posgeom.app.report.claims import ONE_SEED, evaluate_claims, spread

OLD = "2026-11"  # the rule before issue 39


def _status(results: StudyResults, rule: str = "2026-12") -> list[str]:
    return [c["status"] for c in evaluate_claims(results, rule=rule)]


def test_spread_is_the_student_t_interval_over_seeds():
    s = spread([1.0, 2.0, 4.0, None, math.nan])
    half = t.ppf(0.975, 2) * s.std / math.sqrt(3)
    assert s.n == 3 and s.mean == pytest.approx(7 / 3) and s.lo == pytest.approx(7 / 3 - half)
    assert spread([0.5]).text() == "0.500" and spread([]).text() == "n/a"
    # two seeds: mean ± sample std [mean ± t(0.975, 1) std / sqrt(2)], t(0.975, 1) = 12.706
    assert spread([0.1, 0.2]).text() == "0.150 ± 0.071 [-0.485, 0.785]"
    # at any level L: mean -+ t((1 + L) / 2, df) sqrt(var); one seed has none, and decides nothing
    lo, hi = s.interval(0.01)
    assert hi - s.mean == pytest.approx(t.ppf(0.995, 2) * s.std / math.sqrt(3)) and s.interval() == pytest.approx(
        (s.lo, s.hi)
    )
    assert all(math.isnan(v) for v in spread([0.5]).interval())


def test_every_claim_holds_beyond_the_spread_when_it_does():
    assert _status(results_of(paper_seeds(4))) == ["held"] * 5
    assert _status(results_of(paper_seeds(2)), rule=OLD) == ["held"] * 5  # the old rule: each part at its own 95%


def test_a_difference_inside_the_seed_spread_is_undecided_not_decided():
    """Fragility: PE models 0.02 less fragile on average, seeds 0.2 apart: within noise."""
    for rule in ("2026-12", OLD):
        claims = evaluate_claims(results_of(paper_seeds(2, 0.1)), rule=rule)
        assert claims[3]["status"] == "undecided" and "within noise" in claims[3]["reason"]
        assert claims[3]["held"] is None


def test_a_model_near_chance_makes_its_claims_undecided_never_no():
    """The demo's no-PE model at 0.116 top-1 on 10 classes: claims 1 and 4 involve it."""
    runs = paper_seeds(4, nope_acc=0.116)
    claims = evaluate_claims(results_of(runs))
    assert [c["status"] for c in claims] == ["undecided", "held", "held", "undecided", "held"]
    assert "near chance (no PE at top-1 0.116; chance 0.100" in claims[0]["reason"]
    # without the number of classes the check cannot be made, and the verdict stands
    assert _status(results_of(runs, classes=0))[0] == "held"


def test_a_claim_that_fails_beyond_the_spread_is_no():
    runs = paper_seeds(2)
    for r in runs:
        if r.condition == "rpt":  # RPT keeps a strong index anchor: claim 3 fails
            r.eval.ssdc.rpi_per_layer = [0.5, 0.5, 0.5, 0.5]
    for rule in ("2026-12", OLD):
        claims = evaluate_claims(results_of(runs), rule=rule)
        assert claims[2]["status"] == "not held" and claims[2]["held"] is False
        assert "outside ±0.1" in claims[2]["evidence"]


def test_one_seed_never_decides_and_still_shows_its_evidence():
    """With one seed spread() set lo = hi = mean, so a point estimate decided (the old rule, kept reachable)."""
    claims = evaluate_claims(results_of(paper_like(0)))
    assert all(c["status"] == "undecided" and c["reason"] == ONE_SEED and c["held"] is None for c in claims)
    assert all("1 seed" in c["evidence"] and "[" in c["evidence"] for c in claims[:4])
    assert "no interval, not decided" in claims[0]["evidence"]  # trained - untrained on one seed: a point value
    assert all(c["status"] == "held" for c in evaluate_claims(results_of(paper_like(0)), rule=OLD))
    runs = paper_like(0)
    for r in runs:  # overlapping bootstrap intervals: the one-seed comparison cannot decide
        r.eval.fs_interval = {"jpeg:5": [0.0, 1.0]}
    assert evaluate_claims(results_of(runs), rule=OLD)[3]["status"] == "undecided"
    # a claim whose own conditions have 2 seeds is decided though another condition has one
    runs = paper_seeds(4) + [r for r in paper_like(4) if r.condition == "ape"]
    runs = [r for r in runs if not (r.condition == "rope" and r.seed > 0)]
    claims = evaluate_claims(results_of(runs))
    assert claims[0]["status"] == "held" and claims[2]["status"] == "held"
    assert claims[1]["reason"] == ONE_SEED and claims[3]["reason"] == ONE_SEED


def test_one_seed_decides_on_the_interval_of_the_difference_not_on_overlap():
    """Rule 2026-11, one seed: RoPE 0.30 against APE 0.40 with bootstrap intervals of +-0.06 overlap ([0.24, 0.36]
    and [0.34, 0.46]), yet their difference 0.10 is beyond its own 95% interval (MOVER: 0.10 - sqrt(2) * 0.06 =
    0.015 > 0); with +-0.08 it is not (0.10 - 0.113 < 0)."""

    def with_half_width(h: float) -> list[StudyRun]:
        runs = paper_like(0)
        for r in runs:
            fs = r.eval.fs["jpeg:5"]
            r.eval.fs_interval = {"jpeg:5": [fs - h, fs + h]}
        return runs

    decided = evaluate_claims(results_of(with_half_width(0.06)), rule=OLD)[3]
    assert decided["status"] == "held", decided
    within = evaluate_claims(results_of(with_half_width(0.08)), rule=OLD)[3]
    assert within["status"] == "undecided" and "evaluation images" in within["reason"]
    runs = with_half_width(0.06)  # RoPE above APE beyond the interval of the difference: decided "not held"
    rope = next(r for r in runs if r.condition == "rope")
    rope.eval.fs = {"jpeg:5": 0.50}
    rope.eval.fs_interval = {"jpeg:5": [0.44, 0.56]}
    assert evaluate_claims(results_of(runs), rule=OLD)[3]["status"] == "not held"


def test_one_seed_mover_interval_is_rescaled_to_the_level_tested():
    """At a level other than 95% the one-seed interval of a difference rescales each run's 95% bootstrap
    half-width by z((1 + L) / 2) / z(0.975) (the bootstrap interval read as a normal one)."""
    from scipy.stats import norm

    from timm_posgeom.app.report.verdicts import less

    a, b = spread([0.30]), spread([0.40])
    test = less(a, b, (0.27, 0.33), (0.36, 0.44))
    half95 = math.hypot(0.04, 0.03)
    assert test(0.05)[1] == f"difference +0.100 [{0.1 - half95:+.3f}, {0.1 + half95:+.3f}]"
    k = norm.ppf(0.9995) / norm.ppf(0.975)
    assert test(0.001)[1] == f"difference +0.100 [{0.1 - k * half95:+.3f}, {0.1 + k * half95:+.3f}]"
    assert test(0.001)[0] == "yes" and test(1e-9)[0] == "noise"
    assert less(a, b)(0.05)[0] == "noise"  # one seed without the bootstrap intervals: never the point values


def test_one_seed_alpha_claim_needs_the_fs_change_beyond_its_interval():
    """One seed: the demo's APE sweep gave JPEG FS 0.022, 0.034, 0.009 at alpha 1, .5, 0 (320 images), and the
    claim read "not held" from the sign of a 1-2% change inside the bootstrap noise. With the sweep's intervals
    the FS part is decided only beyond the interval of FS(alpha 0) - FS(alpha 1) (rule 2026-11; rule 2026-12
    decides nothing on one seed)."""

    def with_sweep_fs(fs: list[float], half: float) -> list[StudyRun]:
        runs = paper_like(0)
        sweep = next(r for r in runs if r.condition == "ape").eval.alpha_sweep
        sweep.fs = {"jpeg:5": fs}
        sweep.fs_interval = {"jpeg:5": [[v - half, v + half] for v in fs]}
        return runs

    assert evaluate_claims(results_of(with_sweep_fs([0.022, 0.034, 0.009], 0.02)), rule=OLD)[4]["status"] == "undecided"
    assert evaluate_claims(results_of(with_sweep_fs([0.30, 0.40, 0.50], 0.02)), rule=OLD)[4]["status"] == "held"
    assert evaluate_claims(results_of(with_sweep_fs([0.30, 0.40, 0.50], 0.2)), rule=OLD)[4]["status"] == "undecided"
    falls = evaluate_claims(results_of(with_sweep_fs([0.50, 0.40, 0.30], 0.02)), rule=OLD)[
        4
    ]  # beyond noise, the wrong way
    assert falls["status"] == "not held" and "FS at alpha 0 minus at 1: difference -0.200 [" in falls["evidence"]
    runs = with_sweep_fs([0.022, 0.034, 0.009], 0.02)  # without the intervals (older records): the trend alone
    next(r for r in runs if r.condition == "ape").eval.alpha_sweep.fs_interval = None
    assert evaluate_claims(results_of(runs), rule=OLD)[4]["status"] == "not held"
    new = evaluate_claims(results_of(with_sweep_fs([0.50, 0.40, 0.30], 0.02)))[4]
    assert new["status"] == "undecided" and new["reason"] == ONE_SEED and "FS rises: no (" in new["evidence"]


def test_missing_conditions_are_not_measured():
    """Claim 2 is about APE, sincos and RoPE, claim 4 about every condition: run on some, they were decided
    from those alone (APE alone 'held' claim 2)."""
    claims = evaluate_claims(results_of([r for r in paper_seeds(2) if r.condition in ("ape",)]))
    assert [c["status"] for c in claims] == ["not measured", "not measured", "not measured", "not measured", "held"]
    assert "not run: sincos, RoPE" in claims[1]["reason"]
    claims = evaluate_claims(results_of([r for r in paper_like(0) if r.condition in ("nope", "rope")]))
    assert claims[3]["status"] == "not measured" and "missing: APE, sincos, RPT" in claims[3]["reason"]


def test_a_comparison_without_a_spread_on_one_side_is_not_decided():
    """RoPE on 1 seed (FS .199) against APE on 2 (.200, .202): decided on the point values, 'RoPE least' and
    the claim were 'held'; then within noise, the reason naming the seed counts (rule 2026-11); now a claim with
    a one-seed condition is not decided."""
    runs = paper_like(0) + paper_like(1)
    runs = [r for r in runs if not (r.condition == "rope" and r.seed == 1)]
    for r in runs:
        r.eval.fs["jpeg:5"] = {"nope": 0.300, "ape": 0.200, "sincos": 0.201, "rope": 0.199, "rpt": 0.310}[
            r.condition
        ] + (0.002 * r.seed if r.condition != "rope" else 0.0)
    claim = evaluate_claims(results_of(runs), rule=OLD)[3]
    assert (
        claim["status"] == "undecided"
        and "different seed counts (no PE 2, APE 2, sincos 2, RoPE 1, RPT 2)" in (claim["reason"])
    )
    claim = evaluate_claims(results_of(runs))[3]
    assert claim["status"] == "undecided" and claim["reason"] == ONE_SEED
    assert "RoPE least: within noise (RoPE < no PE: difference +0.102 without an interval" in claim["evidence"]


def test_a_run_counted_twice_is_refused():
    runs = paper_like(0)
    with pytest.raises(ValueError, match="APE seed 0 twice|ape seed 0 twice"):
        evaluate_claims(results_of(runs + [runs[1]]))
    with pytest.raises(ValueError, match="unknown verdict rule 'x'; the rules are 2026-12, 2026-11"):
        evaluate_claims(results_of(paper_like(0)), rule="x")


def test_claim_5_with_undefined_or_too_few_alphas_is_not_decided():
    """A NaN in the mean delta SSDC curve (a one-block model has none) or a one-alpha sweep gave 'not held'."""
    runs = paper_like(0)
    sweep = next(r for r in runs if r.condition == "ape").eval.alpha_sweep
    sweep.delta_ssdc = [0.3, None, 0.0]
    claim = evaluate_claims(results_of(runs))[4]
    assert claim["status"] == "undecided" and "undefined (NaN)" in claim["reason"]
    sweep.alphas, sweep.delta_ssdc, sweep.fs = [1.0], [0.3], {"jpeg:5": [0.3]}
    assert evaluate_claims(results_of(runs))[4]["status"] == "not measured"


def test_fragility_evidence_names_which_half_of_claim_4_fails():
    """Claim 4 has two halves, PE models below no PE / RPT and RoPE least of all; a reader must see which one
    decided it. The demo on synthetic set v3 (1 seed): no PE 0.640, RPT 0.234 against APE 0.024, sincos
    0.019 and RoPE 0.045, so the first half holds and the second fails (sincos and APE below RoPE)."""
    runs = paper_like(0)
    values = {
        "nope": (0.640, 0.02),
        "rpt": (0.234, 0.04),
        "ape": (0.024, 0.007),
        "sincos": (0.019, 0.005),
        "rope": (0.045, 0.007),
    }
    for r in runs:
        fs, half = values[r.condition]
        r.eval.fs, r.eval.fs_interval = {"jpeg:5": fs}, {"jpeg:5": [fs - half, fs + half]}
    claim = evaluate_claims(results_of(runs), rule=OLD)[3]
    assert claim["status"] == "not held"
    # each failing comparison with the interval of the difference that decided it (MOVER, 1 seed) and its level
    assert "PE below no PE / RPT: yes (tightest: RoPE < RPT: difference +0.189 [" in claim["evidence"]
    assert (
        "; RoPE least: no (not RoPE < APE: difference -0.021 [-0.031, -0.011] at 95%, "
        "RoPE < sincos: difference -0.026 [-0.035, -0.017] at 95%)"
    ) in claim["evidence"]
    new = evaluate_claims(results_of(runs))[3]  # one seed: not decided, the same halves in its evidence
    assert new["status"] == "undecided" and new["reason"] == ONE_SEED
    assert "PE below no PE / RPT: yes (tightest: RoPE < RPT" in new["evidence"]
    assert "; RoPE least: no (not RoPE < APE: difference -0.021 [" in new["evidence"] and "of 10)" in new["evidence"]
    held = evaluate_claims(results_of(paper_seeds(4)))[3]
    assert held["status"] == "held" and "PE below no PE / RPT: yes (" in held["evidence"]
    assert "; RoPE least: yes (tightest: RoPE < " in held["evidence"] and "Holm step 10 of 10)" in held["evidence"]
    runs = paper_seeds(4)
    for r in runs:  # RoPE ties sincos and APE within the noise: that half is "within noise", shown by the
        if r.condition == "rope":  # comparison whose difference leans against the claim
            r.eval.fs = {"jpeg:5": 0.405 + 0.02 * (r.seed % 2)}
    claim = evaluate_claims(results_of(runs))[3]
    assert (
        claim["status"] == "undecided"
        and "RoPE least: within noise (RoPE < APE: difference -0.015" in claim["evidence"]
    )


# --------------------------------------------------------------------------------------------
# one rule for every verdict (issue 32): "no" only when the opposite holds beyond the interval
# --------------------------------------------------------------------------------------------
def test_an_early_or_late_peak_within_the_seed_spread_is_not_a_no():
    """At 8 x 8 with timm's init APE's two seeds peaked at layers 0 and 3 and the seed means differed by 0.008:
    the argmax of the mean profile said "peaks late" and claim 2 was "not held" (rule 2026-11's early peak: the
    maximum over the first half of the layers minus the maximum over the rest)."""
    runs = paper_seeds(2)
    for r in runs:
        if r.condition == "ape":  # means [0.30, 0.30, 0.30, 0.308]: argmax 3
            r.eval.ssdc.rpi_per_layer = [0.40, 0.30, 0.30, 0.30] if r.seed == 0 else [0.20, 0.30, 0.30, 0.316]
    claim = evaluate_claims(results_of(runs), rule=OLD)[1]
    assert claim["status"] == "undecided" and "within noise" in claim["reason"]
    # the interval that decided it: max of the first half - max of the rest, 0.042 +- 8.98 x 0.082
    assert "APE under RPI" in claim["evidence"] and "early or late peak within noise" in claim["evidence"]
    assert "0.042 [-0.695, 0.779] contains 0 at 95%" in claim["evidence"]
    for r in runs:  # both seeds peak late, by more than the spread: the opposite holds beyond it
        if r.condition == "ape":
            r.eval.ssdc.rpi_per_layer = [0.20, 0.25, 0.30, 0.40 + 0.01 * r.seed]
    claim = evaluate_claims(results_of(runs), rule=OLD)[1]
    assert claim["status"] == "not held" and "peaks late" in claim["evidence"] and "< 0 at 95%" in claim["evidence"]


def _with_ape_curve(curve: list[float], seeds: int = 4, permutations: int = 5, noise: float = 0.01) -> list[StudyRun]:
    """``seeds`` seeds of :func:`paper_like` whose APE SSDC under RPI is ``curve`` plus Gaussian noise per seed
    x permutation x layer (fixed seed)."""
    rng = np.random.default_rng(0)
    runs = paper_seeds(seeds)
    for r in runs:
        if r.condition == "ape":
            r.eval.ssdc.rpi_by_permutation = (
                np.array(curve) + noise * rng.standard_normal((permutations, len(curve)))
            ).tolist()
            r.eval.ssdc.rpi_permutations = list(range(permutations))
    return runs


@pytest.mark.parametrize(
    "curve, shape, status",
    [
        ([0.05, 0.25, 0.28, 0.30], "peaks early", "held"),  # the paper's injection: block 1 carries 80% of the rise
        ([0.30, 0.45, 0.40, 0.35], "peaks early", "held"),  # a rise over block 1, then a decay
        ([0.05, 0.08, 0.15, 0.30], "peaks late", "not held"),  # accumulation: block 1 carries 12% of the rise
        ([0.20, 0.20, 0.20, 0.20], "early or late peak within noise", "undecided"),  # flat
    ],
)
def test_early_is_the_rise_over_block_1_against_the_rest(curve, shape, status):
    """ "Peaks early" as the paper means it (an injection at the first block): per seed x permutation, (S1 - S0)
    - (S_last - S1) > 0, on records whose answer is known (4 seeds x 5 permutations, noise 0.01)."""
    claim = evaluate_claims(results_of(_with_ape_curve(curve)))[1]
    ape = claim["evidence"].split("; sincos")[0]
    assert f"{shape}: (S1 - S0) - (S_last - S1)" in ape and claim["status"] == status, claim


def test_the_old_early_peak_called_an_injection_late():
    """The first-half-against-rest maximum read an early injection that keeps growing slowly (8 x 8 paper init:
    0.050 0.253 0.305 0.315, block 1 carrying 76% of the rise) as "peaks late"; the rise over block 1 reads it
    early."""
    runs = _with_ape_curve([0.05, 0.25, 0.30, 0.315])
    assert "peaks late" in evaluate_claims(results_of(runs), rule=OLD)[1]["evidence"].split("; sincos")[0]
    ape = evaluate_claims(results_of(runs))[1]["evidence"].split("; sincos")[0]
    assert "peaks early" in ape and "block 1 carries 75% of the mean rise" in ape


def test_a_trend_of_the_mean_curve_against_the_seeds_is_not_a_no():
    """Claim 5's "no" was the sign of the mean curve's Spearman correlation with alpha: one seed whose delta
    SSDC falls and one whose delta SSDC rises, means [0.25, 0.25, 0.26] (rising as alpha shrinks), gave
    "not held"."""
    runs = paper_seeds(2)
    for r in runs:
        if r.condition == "ape":
            r.eval.alpha_sweep.delta_ssdc = [0.5, 0.2, 0.0] if r.seed == 0 else [0.0, 0.3, 0.52]
    claim = evaluate_claims(results_of(runs))[4]
    assert claim["status"] == "undecided" and "within noise" in claim["reason"]
    assert "delta SSDC falls: within noise (Spearman with alpha per seed +1.00, -1.00" in claim["evidence"]
    for r in runs:  # both seeds rise as alpha shrinks, beyond the spread: "no"
        if r.condition == "ape":
            r.eval.alpha_sweep.delta_ssdc = [0.0, 0.2, 0.5 + 0.01 * r.seed]
    claim = evaluate_claims(results_of(runs))[4]
    assert claim["status"] == "not held" and "delta SSDC falls: no" in claim["evidence"]
    for r in runs:  # every seed agrees, but the change is inside the spread: within noise, not "yes"
        if r.condition == "ape":
            r.eval.alpha_sweep.delta_ssdc = [0.05, 0.02, 0.0] if r.seed == 0 else [0.5, 0.2, 0.0]
    assert evaluate_claims(results_of(runs))[4]["status"] == "undecided"


def test_spread_over_seeds_and_permutations_adds_the_permutation_variance():
    from timm_posgeom.app.report.claims import spread_sp

    cells = [[0.10, 0.20, 0.30], [0.12, 0.22, 0.29]]  # 2 seeds x 3 permutations, permutation p shared
    s = spread_sp(cells)
    seed_means, perm_means = np.mean(cells, 1), np.mean(cells, 0)
    v_seed, v_perm = np.var(seed_means, ddof=1) / 2, np.var(perm_means, ddof=1) / 3
    assert s.mean == pytest.approx(np.mean(cells)) and s.var == pytest.approx(v_seed + v_perm)
    # seeds - 1 degrees of freedom: the seeds are the replicates; the permutation term only adds variance
    assert s.df == 1 and s.hi - s.mean == pytest.approx(t.ppf(0.975, 1) * math.sqrt(v_seed + v_perm))
    assert s.n == 2 and s.permutations == 3 and "permutations ±" in s.text()
    welch = spread_sp(cells, df="welch")  # rule 2026-11: Welch-Satterthwaite, here far above 1
    df = (v_seed + v_perm) ** 2 / (v_seed**2 / 1 + v_perm**2 / 2)
    assert welch.df == pytest.approx(df) and df > 2 and welch.hi - welch.lo < s.hi - s.lo
    # the seed means alone (0.200, 0.210) would give a far narrower interval: the permutations' spread is in it
    assert welch.hi - welch.lo > spread(seed_means.tolist()).hi - spread(seed_means.tolist()).lo
    one = spread_sp([[0.10, 0.20, 0.30]])  # one seed: the interval over permutations alone
    assert one.n == 1 and one.df == 2 and one.lo < 0.2 < one.hi
    assert spread_sp([[0.1], [0.2]]) == spread([0.1, 0.2])  # one permutation: over seeds, as before


def test_two_seeds_decide_on_one_degree_of_freedom():
    """8 x 8 timm init (2 seeds x 10 permutations): RPT at -0.015 under RPI read "held" on Welch-Satterthwaite
    degrees of freedom far above the seeds' 1; on seeds - 1 it is within noise (the only change here)."""
    import dataclasses

    from timm_posgeom.app.report.verdicts import RULES

    rng = np.random.default_rng(1)
    runs = paper_seeds(2)
    for r in runs:
        if r.condition == "rpt":
            r.eval.ssdc.rpi_by_permutation = (-0.015 + 0.005 * r.seed + 0.03 * rng.standard_normal((10, 4))).tolist()
            r.eval.ssdc.rpi_permutations = list(range(10))
    assert evaluate_claims(results_of(runs), rule=OLD)[2]["status"] == "held"
    seeds_df = dataclasses.replace(RULES[OLD], df="seeds")
    assert evaluate_claims(results_of(runs), rule=seeds_df)[2]["status"] == "undecided"


def test_rpt_whose_permutations_disagree_is_within_noise_not_held():
    """RPT at 0.03 under permutation 0 (the one every run used to draw) but up to 0.16 under others: the
    permutation's own variance enters the interval, and 'collapses' is no longer decided."""
    runs = paper_seeds(2)
    for r in runs:
        if r.condition == "rpt":
            r.eval.ssdc.rpi_by_permutation = [[0.03] * 4, [0.16] * 4, [0.0] * 4]
            r.eval.ssdc.rpi_permutations = [0, 1, 2]
    for rule in ("2026-12", OLD):
        claim = evaluate_claims(results_of(runs), rule=rule)[2]
        assert claim["status"] == "undecided" and "(2 seeds x 3 RPI permutations)" in claim["evidence"]
        assert "crosses ±0.1" in claim["evidence"]


# --------------------------------------------------------------------------------------------
# issue 39: Holm over a claim's parts, claim 1 against the untrained start
# --------------------------------------------------------------------------------------------
def _known(p: float):
    """A part decided ('yes') at any alpha >= p: its p-value is p."""
    return lambda alpha: ("yes" if alpha >= p else "noise", f"p-value {p}")


def test_holm_tests_the_kth_smallest_p_at_alpha_over_m_minus_k_plus_1():
    from timm_posgeom.app.report.verdicts import RULES, decide, p_value

    assert p_value(_known(0.0123)) == pytest.approx(0.0123, rel=1e-6)
    new, old = RULES["2026-12"], RULES[OLD]
    ds = decide([("a", _known(0.04)), ("b", _known(0.001)), ("c", _known(0.02))], new)
    assert [d.word for d in ds] == ["yes", "yes", "yes"]  # 0.001 <= .05/3, 0.02 <= .05/2, 0.04 <= .05
    assert [(d.step, round(d.alpha, 5)) for d in ds] == [(3, 0.05), (1, 0.01667), (2, 0.025)]
    assert ds[1].text() == "b: p-value 0.001 at 98.33% (p 0.001, Holm step 1 of 3)"
    ds = decide([("a", _known(0.04)), ("b", _known(0.001)), ("c", _known(0.03))], new)
    assert [d.word for d in ds] == ["noise", "yes", "noise"]  # 0.03 > .05/2: it and every later part stop
    assert ds[0].alpha == pytest.approx(0.025) and "Holm stopped at step 2 of 3" in ds[0].text()
    assert [d.word for d in decide([("a", _known(0.04)), ("c", _known(0.03))], old)] == ["yes", "yes"]  # each at 95%


def test_p_value_of_a_part_is_the_t_tests():
    from scipy.stats import t as student

    from timm_posgeom.app.report.verdicts import RULES, above, p_value

    s = spread([0.12, 0.15, 0.11, 0.16])
    p = 2 * student.sf((s.mean - 0.1) / math.sqrt(s.var), s.df)
    assert p_value(above(s, 0.1, RULES["2026-12"])) == pytest.approx(p, rel=1e-5)


def test_holm_turns_a_lone_no_among_many_parts_into_within_noise():
    """Paper init, 4 seeds: "RoPE is not the least fragile" rested on RoPE minus APE +0.027 [0.000, 0.054], one
    of claim 4's 10 comparisons at its own 95%; tested at the level Holm gives it, it is within noise."""
    runs = paper_seeds(4)
    fs = {"nope": 0.291, "ape": 0.205, "sincos": 0.232, "rope": 0.232, "rpt": 0.246}
    for r in runs:
        r.eval.fs = {"jpeg:5": fs[r.condition] + [-0.010, 0.010, -0.008, 0.008][r.seed]}
    assert evaluate_claims(results_of(runs), rule=OLD)[3]["status"] == "not held"
    claim = evaluate_claims(results_of(runs))[3]
    assert (
        claim["status"] == "undecided"
        and "RoPE least: within noise (RoPE < APE: difference -0.027 [" in claim["evidence"]
    )


@pytest.mark.parametrize("untrained, status", [(0.1, "held"), (0.57, "not held"), (0.5, "undecided")])
def test_claim_1_compares_the_trained_model_with_its_untrained_start(untrained, status):
    """The untrained no-PE model has SSDC 0.57, above the trained 0.50-0.52 (the paper: 0.57-0.64 untrained):
    a fixed 0.1 threshold held "builds structure" at random initialisation. Now trained minus the same seed's
    untrained mean SSDC, paired over seeds."""
    runs = paper_seeds(4)
    for r in runs:
        if r.condition == "nope":
            r.untrained = claims_ssdc(untrained + 0.003 * r.seed, [0.0] * 4)
    claim = evaluate_claims(results_of(runs))[0]
    assert claim["status"] == status and "untrained (same seeds), trained - untrained" in claim["evidence"]
    assert evaluate_claims(results_of(runs), rule=OLD)[0]["status"] == "held"  # the threshold held it every time


def test_report_html_is_a_rendered_page_that_links_its_figures(tmp_path):
    """report.html was the markdown inside <pre>; now rendered tables, styled, its figures linked (not embedded:
    the PNGs lie beside it, and a copy inside every report doubled what git kept)."""
    from timm_posgeom.app.report import render_html

    figures = tmp_path / "figures"
    figures.mkdir()
    png = b"\x89PNG\r\n\x1a\n" + b"0" * 16
    (figures / "a.png").write_bytes(png)
    md = (
        "# Title\n\n| # | claim | held here |\n|---|---|---|\n| 1 | c | yes |\n| 2 | d | undecided: near chance |\n\n"
        "![A](figures/a.png)\n\n![missing](figures/b.png)\n"
    )
    page = render_html(md, figures)
    assert page.startswith("<!doctype html>") and "<pre" not in page and "<style>" in page
    assert "<table>" in page and "<th>claim</th>" in page and "<h1>Title</h1>" in page
    assert "base64" not in page and '<a href="figures/a.png"><img alt="A" src="figures/a.png"></a>' in page
    assert 'src="figures/b.png"' in page
    assert '<td class="verdict-yes">yes</td>' in page and 'class="verdict-undecided"' in page


def test_claim_evidence_with_pipes_stays_in_its_cell():
    """|SSDC| in a claim's evidence split the markdown cell, and the deciding interval never reached the page."""
    from timm_posgeom.app.report.document import claims_table, render_html

    claim = {
        "claim": "no PE collapses",
        "status": "held",
        "reason": "",
        "evidence": "no PE under RPI -0.010 [-0.030, 0.010], |SSDC| < 0.1 at every layer? yes: layer 3 "
        "[-0.031, 0.012] inside (-0.1, 0.1)",
    }
    page = render_html("\n".join(claims_table([claim])), Path("."))
    cells = re.findall(r"<td[^>]*>(.*?)</td>", page)
    assert len(cells) == 4 and "|SSDC| &lt; 0.1" in cells[3] and cells[3].endswith("inside (-0.1, 0.1)")


def _interval(values: list[float]) -> str:
    """mean ± sample std [95% Student-t interval], as the report writes it (computed here from the formula)."""
    n, mean = len(values), sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = t.ppf(0.975, n - 1) * std / math.sqrt(n)
    return f"{mean:.3f} ± {std:.3f} [{mean - half:.3f}, {mean + half:.3f}]"


def _kept_figure(draw, results: StudyResults, path, monkeypatch: pytest.MonkeyPatch):
    """``draw(results, path)``'s return value and its figure, kept open (the drawing closes it after saving)."""
    import matplotlib

    matplotlib.use("Agg")  # as the report's figures draw
    import matplotlib.pyplot as plt

    monkeypatch.setattr(plt, "close", lambda fig=None: None)
    returned = draw(results, path)
    fig = plt.gcf()
    monkeypatch.undo()
    return returned, fig


def _band_extent(ax) -> tuple[float, float]:
    """(lowest, highest) y of the filled bands of ``ax``."""
    from matplotlib.collections import PolyCollection

    ys = np.concatenate(
        [p.vertices[:, 1] for c in ax.collections if isinstance(c, PolyCollection) for p in c.get_paths()]
    )
    return float(ys.min()), float(ys.max())


def test_two_seed_report_shows_spreads_in_every_table_and_bands(tmp_path, monkeypatch):
    """With 2 seeds every number is a mean with its spread; figures draw the seed bands."""
    from PIL import Image

    from timm_posgeom.app.report.document import fig_alpha_sweep, fig_ssdc_depth, study_tables

    results = results_of(paper_like(0, 0.02) + paper_like(1, 0.02))  # seed 0 shifted by -0.02, seed 1 by +0.02
    text = "\n".join(study_tables(results))
    depth = text.split("## SSDC across depth")[1].split("##")[0]
    rows = [line for line in depth.splitlines() if line.startswith("| ") and not line.startswith("| condition")]
    assert rows and all(
        "±" in r.split("|")[2] and "[" in r.split("|")[4] for r in rows
    )  # per layer ± std; delta interval
    assert "k = t(0.975, n-1)/√n: 8.98 with 2 seeds" in depth  # 12.706 / sqrt(2)
    # the accuracy table: each measured cell its mean ± std [interval] over the two seeds, the paper's values beside
    assert (
        f"| APE | 2 | {_interval([0.7, 0.7])} | {_interval([0.38, 0.42])} | n/a | 0.641 | 0.435 | 0.184 |"
        in text.splitlines()
    ), text
    assert f"| RoPE | 2 | {_interval([0.72, 0.72])} | {_interval([0.28, 0.32])} | n/a |" in text
    for title in ("delta SSDC under RPI", "JPEG q5 FS"):  # both sweep tables: mean ± std [interval] in every cell
        sweep = text.split(f"## Alpha sweep: {title}")[1].split("##")[0]
        cells = [
            c
            for line in sweep.splitlines()
            if line.startswith("| ") and line[2].isdigit()
            for c in line.split("|")[2:-1]
        ]
        assert cells and all("±" in c and "[" in c for c in cells) and "seed 0" not in sweep
    assert f"| 1 | {_interval([0.48, 0.52])} |" in text  # APE's delta SSDC at alpha 1 (and FS at alpha 0)

    drawn, fig = _kept_figure(fig_alpha_sweep, results, tmp_path / "a.png", monkeypatch)
    assert drawn is True and Image.open(tmp_path / "a.png").size == (1200, 480)  # 10 x 4 in at 120 dpi
    left, right = fig.axes
    std = float(np.std([0.48, 0.52], ddof=1))
    line = next(ln for ln in left.get_lines() if ln.get_label().startswith("APE"))
    assert list(line.get_xdata()) == [0.0, 0.5, 1.0] and np.allclose(line.get_ydata(), [0.0, 0.2, 0.5])
    assert np.allclose(_band_extent(left), (0.0, 0.5 + std))  # mean ± std over the seeds
    assert np.allclose(_band_extent(right), (0.3, 0.5 + std))

    drawn, fig = _kept_figure(fig_ssdc_depth, results, tmp_path / "b.png", monkeypatch)
    assert Image.open(tmp_path / "b.png").size == (1200, 504)  # 10 x 4.2 in at 120 dpi
    plain, rpi = fig.axes[:2]
    ape = next(ln for ln in rpi.get_lines() if ln.get_label() == "APE")
    assert np.allclose(ape.get_ydata(), [0.5, 0.4, 0.3, 0.2])  # the mean over seeds of 0.48 / 0.52, 0.4, ...
    untrained = [ln for ln in plain.get_lines() if ln.get_linestyle() == ":"]
    assert len(untrained) == 5 and all(np.allclose(ln.get_ydata(), 0.1) for ln in untrained)
    assert np.allclose(_band_extent(rpi), (0.02 - std, 0.5 + std))  # from RPT's 0.02 ± 0.028 to APE's 0.5 ± 0.028
    assert np.allclose(_band_extent(plain), (0.5 - std, 0.6))  # no PE's 0.5 ± 0.028 (std 0 elsewhere)


def test_report_shows_the_no_pe_floor_next_to_every_rpi_table(tmp_path):
    """No PE under RPI read 0.046-0.049 at 8 x 8: the structure a permuted model shows by chance. The report
    states it (over seeds x permutations) beside the SSDC-under-RPI tables and draws it in their figures."""
    from timm_posgeom.app.report.document import fig_alpha_sweep, fig_ssdc_depth, no_pe_floor, study_tables

    runs = paper_like(0, 0.005) + paper_like(1, 0.005)
    for r in runs:
        r.eval.ssdc.rpi_permutations = [0, 1, 2]
        base = r.eval.ssdc.rpi_per_layer
        r.eval.ssdc.rpi_by_permutation = [[v + d for v in base] for d in (0.046, 0.0, -0.01)]
    results = results_of(runs)
    layers, mean, delta = no_pe_floor(results)
    assert mean.n == 2 and mean.permutations == 3 and len(layers) == 4
    assert mean.mean == pytest.approx(np.mean([0.01, 0.0, 0.02, 0.01]) + 0.012, abs=1e-3)
    text = "\n".join(study_tables(results))
    depth = text.split("## SSDC across depth")[1].split("## Alpha sweep")[0]
    assert "No-PE floor under RPI" in depth and "same 3 permutations" in depth and f"{mean.mean:.3f}" in depth
    assert "permutations ±" in depth  # the permutation spread is reported
    sweep = text.split("## Alpha sweep: delta SSDC under RPI")[1].split("##")[0]
    assert "No-PE floor under RPI" in sweep and "delta SSDC" in sweep
    assert fig_ssdc_depth(results, tmp_path / "d.png") is None and (tmp_path / "d.png").stat().st_size > 0
    assert fig_alpha_sweep(results, tmp_path / "a.png")
    without = results_of([r for r in runs if r.condition != "nope"])
    assert no_pe_floor(without) is None and "not measured" in "\n".join(study_tables(without))
