"""The paper's claims decided with the seed spread; undecided (never "no") near chance or within noise."""
from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import t

from timm_posgeom.app.claims import evaluate_claims, spread
from timm_posgeom.app.records import RunEval, RunSummary, SSDCSummary, StudyResults, StudyRun, SweepSummary

ALPHAS = [1.0, 0.5, 0.0]


def _ssdc(plain: float, rpi: list[float]) -> SSDCSummary:
    return SSDCSummary(n_images=10, per_layer=[plain] * len(rpi), rise=0.0, rpi_per_layer=list(rpi),
                       rpi_delta=rpi[1] - rpi[0], rpi_content_per_layer=[plain] * len(rpi))


def _run(condition: str, seed: int, acc: float, fs: float, plain: float, rpi: list[float],
         sweep: tuple[list[float], list[float]] | None = None) -> StudyRun:
    summary = RunSummary(model="m", steps=1, epochs=1.0, train_images=1, val_images=1, processes=1, time_s=1.0,
                         val_top1=acc)
    sw = None
    if sweep is not None:
        sw = SweepSummary(alphas=ALPHAS, delta_ssdc=sweep[0], fs={"jpeg:5": sweep[1]}, clean_accuracy=[acc] * 3,
                          rpi_per_layer=[rpi] * 3)
    ev = RunEval(clean_accuracy=acc, fs={"jpeg:5": fs}, fs_interval={"jpeg:5": [fs - 0.01, fs + 0.01]},
                 num_images=1000, ssdc=_ssdc(plain, rpi), alpha_sweep=sw)
    return StudyRun(condition=condition, seed=seed, run_dir="r", train=summary, eval=ev, history=[],
                    untrained=_ssdc(0.1, [0.0] * len(rpi)))


def _results(runs: list[StudyRun], classes: int = 10) -> StudyResults:
    return StudyResults(config={}, plan=[], versions={}, runs=runs,
                        eval_data={"source": "x", "split": "validation", "images": 1000, "classes": classes})


def _paper_like(seed: int, jitter: float = 0.0, nope_acc: float = 0.6) -> list[StudyRun]:
    """A study where every claim holds clearly."""
    j = jitter * (1 if seed % 2 else -1)
    return [
        _run("nope", seed, nope_acc, 0.60 + j, 0.5 + j, [0.01, 0.0, 0.02, 0.01]),
        _run("ape", seed, 0.7, 0.40 + j, 0.6, [0.5 + j, 0.4, 0.3, 0.2], sweep=([0.5 + j, 0.2, 0.0], [0.3, 0.4, 0.5 + j])),
        _run("sincos", seed, 0.7, 0.41 + j, 0.6, [0.45, 0.35 + j, 0.3, 0.2]),
        _run("rope", seed, 0.72, 0.30 + j, 0.6, [0.1 + j, 0.2, 0.3, 0.4]),
        _run("rpt", seed, 0.6, 0.62 + j, 0.5, [0.0, 0.02 + j, 0.01, 0.0]),
    ]


def _status(results: StudyResults) -> list[str]:
    return [c["status"] for c in evaluate_claims(results)]


def test_spread_is_the_student_t_interval_over_seeds():
    s = spread([1.0, 2.0, 4.0, None, math.nan])
    half = t.ppf(0.975, 2) * s.std / math.sqrt(3)
    assert s.n == 3 and s.mean == pytest.approx(7 / 3) and s.lo == pytest.approx(7 / 3 - half)
    assert spread([0.5]).text() == "0.500" and spread([]).text() == "n/a"
    # two seeds: mean ± sample std [mean ± t(0.975, 1) std / sqrt(2)], t(0.975, 1) = 12.706
    assert spread([0.1, 0.2]).text() == "0.150 ± 0.071 [-0.485, 0.785]"


def test_every_claim_holds_beyond_the_spread_when_it_does():
    runs = _paper_like(0, 0.005) + _paper_like(1, 0.005)
    assert _status(_results(runs)) == ["held"] * 5


def test_a_difference_inside_the_seed_spread_is_undecided_not_decided():
    """Fragility: PE models 0.02 less fragile on average, seeds 0.2 apart: within noise."""
    runs = _paper_like(0, 0.1) + _paper_like(1, 0.1)
    claims = evaluate_claims(_results(runs))
    assert claims[3]["status"] == "undecided" and "within noise" in claims[3]["reason"]
    assert claims[3]["held"] is None


def test_a_model_near_chance_makes_its_claims_undecided_never_no():
    """The demo's no-PE model at 0.116 top-1 on 10 classes: claims 1 and 4 involve it."""
    runs = _paper_like(0, nope_acc=0.116)
    claims = evaluate_claims(_results(runs))
    assert [c["status"] for c in claims] == ["undecided", "held", "held", "undecided", "held"]
    assert "near chance (no PE at top-1 0.116; chance 0.100" in claims[0]["reason"]
    # without the number of classes the check cannot be made, and the verdict stands
    assert _status(_results(runs, classes=0))[0] == "held"


def test_a_claim_that_fails_beyond_the_spread_is_no():
    runs = _paper_like(0, 0.005) + _paper_like(1, 0.005)
    for r in runs:
        if r.condition == "rpt":  # RPT keeps a strong index anchor: claim 3 fails
            r.eval.ssdc.rpi_per_layer = [0.5, 0.5, 0.5, 0.5]
    claims = evaluate_claims(_results(runs))
    assert claims[2]["status"] == "not held" and claims[2]["held"] is False


def test_one_seed_says_so_and_uses_each_runs_own_fs_interval():
    claims = evaluate_claims(_results(_paper_like(0)))
    assert all(c["status"] == "held" for c in claims)
    assert all("1 seed" in c["evidence"] for c in claims)
    runs = _paper_like(0)
    for r in runs:  # overlapping bootstrap intervals: the one-seed comparison cannot decide
        r.eval.fs_interval = {"jpeg:5": [0.0, 1.0]}
    assert evaluate_claims(_results(runs))[3]["status"] == "undecided"


def test_one_seed_decides_on_the_interval_of_the_difference_not_on_overlap():
    """One seed: RoPE 0.30 against APE 0.40 with bootstrap intervals of +-0.06 overlap ([0.24, 0.36] and
    [0.34, 0.46]), yet their difference 0.10 is beyond its own 95% interval (MOVER: 0.10 - sqrt(2) * 0.06 =
    0.015 > 0); with +-0.08 it is not (0.10 - 0.113 < 0)."""
    def with_half_width(h: float) -> list[StudyRun]:
        runs = _paper_like(0)
        for r in runs:
            fs = r.eval.fs["jpeg:5"]
            r.eval.fs_interval = {"jpeg:5": [fs - h, fs + h]}
        return runs

    decided = evaluate_claims(_results(with_half_width(0.06)))[3]
    assert decided["status"] == "held", decided
    within = evaluate_claims(_results(with_half_width(0.08)))[3]
    assert within["status"] == "undecided" and "evaluation images" in within["reason"]
    runs = with_half_width(0.06)  # RoPE above APE beyond the interval of the difference: decided "not held"
    rope = next(r for r in runs if r.condition == "rope")
    rope.eval.fs = {"jpeg:5": 0.50}
    rope.eval.fs_interval = {"jpeg:5": [0.44, 0.56]}
    assert evaluate_claims(_results(runs))[3]["status"] == "not held"


def test_one_seed_alpha_claim_needs_the_fs_change_beyond_its_interval():
    """One seed: the demo's APE sweep gave JPEG FS 0.022, 0.034, 0.009 at alpha 1, .5, 0 (320 images), and the
    claim read "not held" from the sign of a 1-2% change inside the bootstrap noise. With the sweep's intervals
    the FS part is decided only beyond the 95% interval of FS(alpha 0) - FS(alpha 1)."""
    def with_sweep_fs(fs: list[float], half: float) -> list[StudyRun]:
        runs = _paper_like(0)
        sweep = next(r for r in runs if r.condition == "ape").eval.alpha_sweep
        sweep.fs = {"jpeg:5": fs}
        sweep.fs_interval = {"jpeg:5": [[v - half, v + half] for v in fs]}
        return runs

    assert evaluate_claims(_results(with_sweep_fs([0.022, 0.034, 0.009], 0.02)))[4]["status"] == "undecided"
    assert evaluate_claims(_results(with_sweep_fs([0.30, 0.40, 0.50], 0.02)))[4]["status"] == "held"
    assert evaluate_claims(_results(with_sweep_fs([0.30, 0.40, 0.50], 0.2)))[4]["status"] == "undecided"
    falls = evaluate_claims(_results(with_sweep_fs([0.50, 0.40, 0.30], 0.02)))[4]  # beyond noise, the wrong way
    assert falls["status"] == "not held" and "beyond its 95% interval" in falls["evidence"]
    runs = with_sweep_fs([0.022, 0.034, 0.009], 0.02)  # without the intervals (older records): the trend alone
    next(r for r in runs if r.condition == "ape").eval.alpha_sweep.fs_interval = None
    assert evaluate_claims(_results(runs))[4]["status"] == "not held"


def test_missing_conditions_are_not_measured():
    """Claim 2 is about APE, sincos and RoPE, claim 4 about every condition: run on some, they were decided
    from those alone (APE alone 'held' claim 2)."""
    claims = evaluate_claims(_results([r for r in _paper_like(0) if r.condition in ("ape",)]))
    assert [c["status"] for c in claims] == ["not measured", "not measured", "not measured", "not measured", "held"]
    assert "not run: sincos, RoPE" in claims[1]["reason"]
    claims = evaluate_claims(_results([r for r in _paper_like(0) if r.condition in ("nope", "rope")]))
    assert claims[3]["status"] == "not measured" and "missing: APE, sincos, RPT" in claims[3]["reason"]


def test_a_comparison_without_a_spread_on_one_side_is_not_decided():
    """RoPE on 1 seed (FS .199) against APE on 2 (.200, .202): decided on the point values, 'RoPE least' and
    the claim were 'held'; now within noise, and the reason names the seed counts."""
    runs = _paper_like(0) + _paper_like(1)
    runs = [r for r in runs if not (r.condition == "rope" and r.seed == 1)]
    for r in runs:
        r.eval.fs["jpeg:5"] = {"nope": 0.300, "ape": 0.200, "sincos": 0.201, "rope": 0.199,
                               "rpt": 0.310}[r.condition] + (0.002 * r.seed if r.condition != "rope" else 0.0)
    claim = evaluate_claims(_results(runs))[3]
    assert claim["status"] == "undecided" and "different seed counts (no PE 2, APE 2, sincos 2, RoPE 1, RPT 2)" in (
        claim["reason"])


def test_a_run_counted_twice_is_refused():
    runs = _paper_like(0)
    with pytest.raises(ValueError, match="APE seed 0 twice|ape seed 0 twice"):
        evaluate_claims(_results(runs + [runs[1]]))


def test_claim_5_with_undefined_or_too_few_alphas_is_not_decided():
    """A NaN in the mean delta SSDC curve (a one-block model has none) or a one-alpha sweep gave 'not held'."""
    runs = _paper_like(0)
    sweep = next(r for r in runs if r.condition == "ape").eval.alpha_sweep
    sweep.delta_ssdc = [0.3, None, 0.0]
    claim = evaluate_claims(_results(runs))[4]
    assert claim["status"] == "undecided" and "undefined (NaN)" in claim["reason"]
    sweep.alphas, sweep.delta_ssdc, sweep.fs = [1.0], [0.3], {"jpeg:5": [0.3]}
    assert evaluate_claims(_results(runs))[4]["status"] == "not measured"


def test_report_html_is_a_rendered_page_that_links_its_figures(tmp_path):
    """report.html was the markdown inside <pre>; now rendered tables, styled, its figures linked (not embedded:
    the PNGs lie beside it, and a copy inside every report doubled what git kept)."""
    from timm_posgeom.app.report import render_html

    figures = tmp_path / "figures"
    figures.mkdir()
    png = b"\x89PNG\r\n\x1a\n" + b"0" * 16
    (figures / "a.png").write_bytes(png)
    md = ("# Title\n\n| # | claim | held here |\n|---|---|---|\n| 1 | c | yes |\n| 2 | d | undecided: near chance |\n\n"
          "![A](figures/a.png)\n\n![missing](figures/b.png)\n")
    page = render_html(md, figures)
    assert page.startswith("<!doctype html>") and "<pre" not in page and "<style>" in page
    assert "<table>" in page and "<th>claim</th>" in page and "<h1>Title</h1>" in page
    assert "base64" not in page and '<a href="figures/a.png"><img alt="A" src="figures/a.png"></a>' in page
    assert 'src="figures/b.png"' in page
    assert '<td class="verdict-yes">yes</td>' in page and 'class="verdict-undecided"' in page


def test_claim_evidence_with_pipes_stays_in_its_cell():
    """|SSDC| in a claim's evidence split the markdown cell, and the deciding interval never reached the page."""
    from timm_posgeom.app.report import _claims_table, render_html

    claim = {"claim": "no PE collapses", "status": "held", "reason": "",
             "evidence": "no PE under RPI -0.010 [-0.030, 0.010], |SSDC| < 0.1 at every layer? yes: layer 3 "
                         "[-0.031, 0.012] inside (-0.1, 0.1)"}
    page = render_html("\n".join(_claims_table([claim])), Path("."))
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
    from timm_posgeom.app.report_figures import _plt

    plt = _plt()
    monkeypatch.setattr(plt, "close", lambda fig=None: None)
    returned = draw(results, path)
    fig = plt.gcf()
    monkeypatch.undo()
    return returned, fig


def _band_extent(ax) -> tuple[float, float]:
    """(lowest, highest) y of the filled bands of ``ax``."""
    from matplotlib.collections import PolyCollection

    ys = np.concatenate([p.vertices[:, 1] for c in ax.collections if isinstance(c, PolyCollection)
                         for p in c.get_paths()])
    return float(ys.min()), float(ys.max())


def test_two_seed_report_shows_spreads_in_every_table_and_bands(tmp_path, monkeypatch):
    """With 2 seeds every number is a mean with its spread; figures draw the seed bands."""
    from PIL import Image

    from timm_posgeom.app.report import _tables, fig_alpha_sweep, fig_ssdc_depth

    results = _results(_paper_like(0, 0.02) + _paper_like(1, 0.02))  # seed 0 shifted by -0.02, seed 1 by +0.02
    text = "\n".join(_tables(results))
    depth = text.split("## SSDC across depth")[1].split("##")[0]
    rows = [line for line in depth.splitlines() if line.startswith("| ") and not line.startswith("| condition")]
    assert rows and all("±" in r.split("|")[2] and "[" in r.split("|")[4] for r in rows)  # per layer ± std; delta interval
    assert "k = t(0.975, n-1)/√n: 8.98 with 2 seeds" in depth  # 12.706 / sqrt(2)
    # the accuracy table: each measured cell its mean ± std [interval] over the two seeds, the paper's values beside
    assert (f"| APE | 2 | {_interval([0.7, 0.7])} | {_interval([0.38, 0.42])} | n/a | 0.641 | 0.435 | 0.184 |"
            in text.splitlines()), text
    assert f"| RoPE | 2 | {_interval([0.72, 0.72])} | {_interval([0.28, 0.32])} | n/a |" in text
    for title in ("delta SSDC under RPI", "JPEG q5 FS"):  # both sweep tables: mean ± std [interval] in every cell
        sweep = text.split(f"## Alpha sweep: {title}")[1].split("##")[0]
        cells = [c for line in sweep.splitlines() if line.startswith("| ") and line[2].isdigit()
                 for c in line.split("|")[2:-1]]
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


def test_fragility_evidence_names_which_half_of_claim_4_fails():
    """Claim 4 has two halves, PE models below no PE / RPT and RoPE least of all; a reader must see which one
    decided it. The demo on synthetic set v3 (1 seed): no PE 0.640, RPT 0.234 against APE 0.024, sincos
    0.019 and RoPE 0.045, so the first half holds and the second fails (sincos and APE below RoPE)."""
    runs = _paper_like(0)
    values = {"nope": (0.640, 0.02), "rpt": (0.234, 0.04), "ape": (0.024, 0.007), "sincos": (0.019, 0.005),
              "rope": (0.045, 0.007)}
    for r in runs:
        fs, half = values[r.condition]
        r.eval.fs, r.eval.fs_interval = {"jpeg:5": fs}, {"jpeg:5": [fs - half, fs + half]}
    claim = evaluate_claims(_results(runs))[3]
    assert claim["status"] == "not held"
    # each failing comparison with the interval of the difference that decided it (MOVER, 1 seed)
    assert "PE below no PE / RPT: yes (tightest: RoPE < RPT: difference +0.189 [" in claim["evidence"]
    assert ("; RoPE least: no (not RoPE < APE: difference -0.021 [-0.031, -0.011], "
            "RoPE < sincos: difference -0.026 [-0.035, -0.017])") in claim["evidence"]
    held = evaluate_claims(_results(_paper_like(0)))[3]
    assert held["status"] == "held" and "PE below no PE / RPT: yes (" in held["evidence"]
    assert "; RoPE least: yes (tightest: RoPE < APE: difference +0.100 [" in held["evidence"]
    runs = _paper_like(0)
    for r in runs:  # RoPE ties sincos within the bootstrap noise: that half is "within noise"
        if r.condition == "rope":
            r.eval.fs = {"jpeg:5": 0.405}
    claim = evaluate_claims(_results(runs))[3]
    assert claim["status"] == "undecided" and "RoPE least: within noise" in claim["evidence"]


# --------------------------------------------------------------------------------------------
# one rule for every verdict (issue 32): "no" only when the opposite holds beyond the interval
# --------------------------------------------------------------------------------------------
def test_an_early_or_late_peak_within_the_seed_spread_is_not_a_no():
    """At 8 x 8 with timm's init APE's two seeds peaked at layers 0 and 3 and the seed means differed by 0.008:
    the argmax of the mean profile said "peaks late" and claim 2 was "not held"."""
    runs = _paper_like(0, 0.005) + _paper_like(1, 0.005)
    for r in runs:
        if r.condition == "ape":  # means [0.30, 0.30, 0.30, 0.308]: argmax 3
            r.eval.ssdc.rpi_per_layer = [0.40, 0.30, 0.30, 0.30] if r.seed == 0 else [0.20, 0.30, 0.30, 0.316]
    claim = evaluate_claims(_results(runs))[1]
    assert claim["status"] == "undecided" and "within noise" in claim["reason"]
    # the interval that decided it: max of the first half - max of the rest, 0.042 +- 8.98 x 0.082
    assert "APE under RPI" in claim["evidence"] and "early or late peak within noise" in claim["evidence"]
    assert "0.042 - 8.98 x 0.082 = -0.695 crosses 0" in claim["evidence"]
    for r in runs:  # both seeds peak late, by more than the spread: the opposite holds beyond it
        if r.condition == "ape":
            r.eval.ssdc.rpi_per_layer = [0.20, 0.25, 0.30, 0.40 + 0.01 * r.seed]
    claim = evaluate_claims(_results(runs))[1]
    assert claim["status"] == "not held" and "peaks late" in claim["evidence"] and "< 0" in claim["evidence"]


def test_a_trend_of_the_mean_curve_against_the_seeds_is_not_a_no():
    """Claim 5's "no" was the sign of the mean curve's Spearman correlation with alpha: one seed whose delta
    SSDC falls and one whose delta SSDC rises, means [0.25, 0.25, 0.26] (rising as alpha shrinks), gave
    "not held"."""
    runs = _paper_like(0, 0.005) + _paper_like(1, 0.005)
    for r in runs:
        if r.condition == "ape":
            r.eval.alpha_sweep.delta_ssdc = [0.5, 0.2, 0.0] if r.seed == 0 else [0.0, 0.3, 0.52]
    claim = evaluate_claims(_results(runs))[4]
    assert claim["status"] == "undecided" and "within noise" in claim["reason"]
    assert "delta SSDC falls: within noise (Spearman with alpha per seed +1.00, -1.00" in claim["evidence"]
    for r in runs:  # both seeds rise as alpha shrinks, beyond the spread: "no"
        if r.condition == "ape":
            r.eval.alpha_sweep.delta_ssdc = [0.0, 0.2, 0.5 + 0.01 * r.seed]
    claim = evaluate_claims(_results(runs))[4]
    assert claim["status"] == "not held" and "delta SSDC falls: no" in claim["evidence"]
    for r in runs:  # every seed agrees, but the change is inside the spread: within noise, not "yes"
        if r.condition == "ape":
            r.eval.alpha_sweep.delta_ssdc = [0.05, 0.02, 0.0] if r.seed == 0 else [0.5, 0.2, 0.0]
    assert evaluate_claims(_results(runs))[4]["status"] == "undecided"


def test_spread_over_seeds_and_permutations_adds_the_permutation_variance():
    from timm_posgeom.app.claims import spread_sp

    cells = [[0.10, 0.20, 0.30], [0.12, 0.22, 0.29]]  # 2 seeds x 3 permutations, permutation p shared
    s = spread_sp(cells)
    seed_means, perm_means = np.mean(cells, 1), np.mean(cells, 0)
    v_seed, v_perm = np.var(seed_means, ddof=1) / 2, np.var(perm_means, ddof=1) / 3
    df = (v_seed + v_perm) ** 2 / (v_seed ** 2 / 1 + v_perm ** 2 / 2)
    assert s.mean == pytest.approx(np.mean(cells)) and s.var == pytest.approx(v_seed + v_perm)
    assert s.df == pytest.approx(df) and s.hi - s.mean == pytest.approx(t.ppf(0.975, df) * math.sqrt(v_seed + v_perm))
    assert s.n == 2 and s.permutations == 3 and "permutations ±" in s.text()
    # the seed means alone (0.200, 0.210) would give a far narrower interval: the permutations' spread is in it
    assert s.hi - s.lo > spread(seed_means.tolist()).hi - spread(seed_means.tolist()).lo
    one = spread_sp([[0.10, 0.20, 0.30]])  # one seed: the interval over permutations alone
    assert one.n == 1 and one.df == 2 and one.lo < 0.2 < one.hi
    assert spread_sp([[0.1], [0.2]]) == spread([0.1, 0.2])  # one permutation: over seeds, as before


def test_rpt_whose_permutations_disagree_is_within_noise_not_held():
    """RPT at 0.03 under permutation 0 (the one every run used to draw) but up to 0.16 under others: the
    permutation's own variance enters the interval, and 'collapses' is no longer decided."""
    runs = _paper_like(0, 0.005) + _paper_like(1, 0.005)
    for r in runs:
        if r.condition == "rpt":
            r.eval.ssdc.rpi_by_permutation = [[0.03] * 4, [0.16] * 4, [0.0] * 4]
            r.eval.ssdc.rpi_permutations = [0, 1, 2]
    claim = evaluate_claims(_results(runs))[2]
    assert claim["status"] == "undecided" and "(2 seeds x 3 RPI permutations)" in claim["evidence"]
    assert "crosses 0.1" in claim["evidence"]


def test_report_shows_the_no_pe_floor_next_to_every_rpi_table(tmp_path):
    """No PE under RPI read 0.046-0.049 at 8 x 8: the structure a permuted model shows by chance. The report
    states it (over seeds x permutations) beside the SSDC-under-RPI tables and draws it in their figures."""
    from timm_posgeom.app.report import _tables, fig_alpha_sweep, fig_ssdc_depth, no_pe_floor

    runs = _paper_like(0, 0.005) + _paper_like(1, 0.005)
    for r in runs:
        r.eval.ssdc.rpi_permutations = [0, 1, 2]
        base = r.eval.ssdc.rpi_per_layer
        r.eval.ssdc.rpi_by_permutation = [[v + d for v in base] for d in (0.046, 0.0, -0.01)]
    results = _results(runs)
    layers, mean, delta = no_pe_floor(results)
    assert mean.n == 2 and mean.permutations == 3 and len(layers) == 4
    assert mean.mean == pytest.approx(np.mean([0.01, 0.0, 0.02, 0.01]) + 0.012, abs=1e-3)
    text = "\n".join(_tables(results))
    depth = text.split("## SSDC across depth")[1].split("## Alpha sweep")[0]
    assert "No-PE floor under RPI" in depth and "same 3 permutations" in depth and f"{mean.mean:.3f}" in depth
    assert "permutations ±" in depth  # the permutation spread is reported
    sweep = text.split("## Alpha sweep: delta SSDC under RPI")[1].split("##")[0]
    assert "No-PE floor under RPI" in sweep and "delta SSDC" in sweep
    assert fig_ssdc_depth(results, tmp_path / "d.png") is None and (tmp_path / "d.png").stat().st_size > 0
    assert fig_alpha_sweep(results, tmp_path / "a.png")
    without = _results([r for r in runs if r.condition != "nope"])
    assert no_pe_floor(without) is None and "not measured" in "\n".join(_tables(without))
