"""Turn a study's ``results.json`` into ``report.md``, ``report.html`` and PNG figures.

Everything here is derived from ``results.json`` (``posgeom report RUN_DIR`` regenerates it), so a
report can be rebuilt, restyled or re-thresholded without re-running a model.
"""
from __future__ import annotations

import base64
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from ..shifts import PAPER_SHIFTS
from .claims import (
    CHANCE_FACTOR,
    LABELS,
    NEAR_ZERO,
    SUBSTANTIAL,
    Spread,
    evaluate_claims,
    rpi_cube,
    spread,
    spread_sp,
)
from .provenance import describe_versions
from .records import HistoryPoint, StudyResults, StudyRun, SweepSummary

__all__ = ["write_report", "render_html", "PAPER", "evaluate_claims"]

COLORS = {"nope": "#7f7f7f", "ape": "#1f77b4", "sincos": "#2ca02c", "rope": "#d62728", "rpt": "#9467bd"}

# The paper's ViT-S/16 on ImageNet-100 (4 seeds, 60 epochs): clean top-1, JPEG q5 FS, blur FS.
PAPER = {
    "ape": (0.641, 0.435, 0.184), "sincos": (0.657, 0.435, 0.208), "rope": (0.690, 0.299, 0.147),
    "nope": (0.568, 0.646, 0.298), "rpt": (0.560, 0.630, 0.243),
}


def _by_condition(results: StudyResults) -> dict[str, list[StudyRun]]:
    out: dict[str, list[StudyRun]] = {}
    for run in results.runs:
        out.setdefault(run.condition, []).append(run)
    return out


def _fs(run: StudyRun, shift: str) -> float | None:
    """The run's fragility score under ``shift`` (None when not measured)."""
    return (run.eval.fs or {}).get(shift)


def _floats(values) -> list[float]:
    """JSON numbers with None (a NaN written by the JSON writer) back to NaN."""
    return [np.nan if v is None else v for v in values]


def _layers(runs: list[StudyRun], key: str, source: str = "eval") -> tuple[np.ndarray, np.ndarray]:
    rows = []
    for r in runs:
        block = r.eval.ssdc if source == "eval" else getattr(r, source)
        if block is not None and getattr(block, key):
            rows.append(_floats(getattr(block, key)))
    if not rows:
        return np.array([]), np.array([])
    arr = np.array(rows, dtype=float)
    return np.nanmean(arr, 0), (np.nanstd(arr, 0, ddof=1) if len(rows) > 1 else np.zeros(arr.shape[1]))


def no_pe_floor(results: StudyResults) -> tuple[list[Spread], Spread, Spread] | None:
    """The no-PE floor under RPI (docs/method.md#rpi-and-rpt): the SSDC a permuted model shows by chance,
    measured on the study's no-PE runs under the same permutations as every other model. Per layer, the
    mean over layers and delta SSDC, each over seeds x permutations (:func:`~.claims.spread_sp`); None
    without a no-PE run."""
    runs = _by_condition(results).get("nope", [])
    cube = rpi_cube(runs)  # (seeds, permutations, layers)
    if cube.size == 0:
        return None
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        layers = [spread_sp(cube[:, :, k]) for k in range(cube.shape[2])]
        mean = spread_sp(np.nanmean(cube, 2))
    delta = spread_sp(cube[:, :, 1] - cube[:, :, 0]) if cube.shape[2] >= 2 else spread([])
    return layers, mean, delta


def _floor_line(results: StudyResults, delta: bool = False) -> str:
    """One line stating the no-PE floor under RPI, to stand next to every SSDC-under-RPI table."""
    floor = no_pe_floor(results)
    if floor is None:
        return ("No-PE floor under RPI (the structure a permuted model shows by chance): not measured, the study "
                "has no no-PE run.")
    layers, mean, d = floor
    perms = mean.permutations
    what = (f"delta SSDC {d.text()}" if delta else
            f"per layer {', '.join(f'{s.mean:.3f}' for s in layers)}; mean over layers {mean.text()}")
    return (f"No-PE floor under RPI (the structure a permuted model shows by chance: this study's no-PE runs under "
            f"the same {perms} permutation{'s' if perms != 1 else ''}, over seeds x permutations): {what}.")


# --------------------------------------------------------------------------------------------
# claims
# --------------------------------------------------------------------------------------------
def _sweep_means(sweeps: list[SweepSummary], shift: str) -> tuple[np.ndarray, np.ndarray]:
    """Per alpha, delta SSDC and FS of ``shift`` averaged over seeds (missing values ignored)."""
    def mean(rows):
        return np.nanmean([_floats(row) for row in rows], 0)
    return mean(s.delta_ssdc for s in sweeps), mean(s.fs[shift] for s in sweeps)


# --------------------------------------------------------------------------------------------
# figures
# --------------------------------------------------------------------------------------------
def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def fig_ssdc_depth(results: StudyResults, path: Path) -> None:
    plt = _plt()
    by = _by_condition(results)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    for ax, key, title in ((axes[0], "per_layer", "SSDC across depth"), (axes[1], "rpi_per_layer", "under RPI")):
        for c, runs in by.items():
            m, s = _layers(runs, key)
            if m.size == 0:
                continue
            x = np.arange(len(m))
            ax.set_xticks(x)
            ax.plot(x, m, "-o", color=COLORS.get(c), label=LABELS.get(c, c), ms=4)
            ax.fill_between(x, m - s, m + s, color=COLORS.get(c), alpha=0.2)
            u, _ = _layers(runs, key, source="untrained")
            if key == "per_layer" and u.size:
                ax.plot(x, u, ":", color=COLORS.get(c), lw=1)
        ax.axhline(0, color="k", lw=0.5)
        floor = no_pe_floor(results) if key == "rpi_per_layer" else None
        if floor is not None and floor[1].has_interval:  # the no-PE floor: its 95% interval
            ax.axhspan(floor[1].lo, floor[1].hi, color="0.5", alpha=0.15, lw=0)
        if floor is not None:
            ax.axhline(floor[1].mean, color="0.3", lw=0.8, ls="--", label="no-PE floor (RPI)")
            ax.legend(fontsize=7, loc="upper right")
        ax.set_title(title)
        ax.set_xlabel("layer (attention input)")
    axes[0].set_ylabel("SSDC (mean map)")
    axes[0].legend(fontsize=8, title="dotted: untrained", title_fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def fig_fragility(results: StudyResults, path: Path) -> None:
    plt = _plt()
    by = _by_condition(results)
    shifts = sorted({s for r in results.runs for s in r.eval.fs or {}},
                    key=lambda s: (s not in PAPER_SHIFTS, s))
    fig, ax = plt.subplots(figsize=(max(5, 1.6 * len(shifts) + 3), 3.6))
    width = 0.8 / max(1, len(by))
    for i, (c, runs) in enumerate(by.items()):
        stats = [spread([_fs(r, s) for r in runs]) for s in shifts]  # one seed: no error bar (std 0)
        ax.bar(np.arange(len(shifts)) + i * width, [s.mean for s in stats], width,
               yerr=[0.0 if s.n < 2 else s.std for s in stats],
               color=COLORS.get(c), label=LABELS.get(c, c))
    ax.set_xticks(np.arange(len(shifts)) + 0.4 - width / 2)
    ax.set_xticklabels(shifts, rotation=20 if len(shifts) > 3 else 0, fontsize=8)
    ax.set_ylabel("fragility score 1 - A_shift / A_clean")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def fig_alpha_sweep(results: StudyResults, path: Path) -> bool:
    plt = _plt()
    by = _by_condition(results)
    swept = [(c, [r.eval.alpha_sweep for r in runs if r.eval.alpha_sweep]) for c, runs in by.items()]
    swept = [(c, s) for c, s in swept if s]
    if not swept:
        return False
    fig, axes = plt.subplots(1, len(swept), figsize=(4.2 * len(swept), 3.4), squeeze=False)
    for ax, (c, sweeps) in zip(axes[0], swept):
        alphas = sweeps[0].alphas
        delta, fsj = _sweep_means(sweeps, "jpeg:5")
        ax.plot(alphas, delta, "-o", color="#1f77b4", ms=4)
        ax2 = ax.twinx()
        ax2.plot(alphas, fsj, "-s", color="#d62728", ms=4)
        if len(sweeps) > 1:  # the seed spread: mean ± std bands
            for axis, key, color in ((ax, "delta", "#1f77b4"), (ax2, "fs", "#d62728")):
                rows = np.array([_floats(s.delta_ssdc if key == "delta" else s.fs["jpeg:5"]) for s in sweeps], float)
                m, sd = np.nanmean(rows, 0), np.nanstd(rows, 0, ddof=1)
                axis.fill_between(alphas, m - sd, m + sd, color=color, alpha=0.15)
        floor = no_pe_floor(results)
        if floor is not None and math.isfinite(floor[2].mean):  # the no-PE floor of delta SSDC under RPI
            ax.axhline(floor[2].mean, color="0.3", lw=0.8, ls="--", label="no-PE floor")
            ax.legend(fontsize=7, loc="lower left")
        ax.set_xlabel("alpha (PE scale)")
        ax.set_ylabel("delta SSDC under RPI", color="#1f77b4")
        ax.invert_xaxis()
        ax2.set_ylabel("JPEG q5 fragility", color="#d62728")
        ax.set_title(f"{LABELS.get(c, c)} ({len(sweeps)} seed{'s' if len(sweeps) > 1 else ''})")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def fig_similarity_maps(out: Path, results: StudyResults, path: Path) -> bool:
    import torch

    plt = _plt()
    by = _by_condition(results)
    rows = []
    for c, runs in by.items():
        maps_file = out / runs[0].run_dir / "maps.pt"
        if maps_file.is_file():
            rows.append((c, torch.load(maps_file, weights_only=True)))
    if not rows:
        return False
    fig, axes = plt.subplots(len(rows), 4, figsize=(8, 2.1 * len(rows)), squeeze=False)
    for r, (c, maps) in enumerate(rows):
        panels = [(maps["normal"][0], "layer 0"), (maps["normal"][1], "layer 1"),
                  (maps["rpi"][0], "layer 0, RPI"), (maps["rpi"][1], "layer 1, RPI")]
        for k, (m, title) in enumerate(panels):
            ax = axes[r][k]
            img = m.numpy().astype(float)
            np.fill_diagonal(img, np.nan)  # self-similarity (1) would swamp the colour scale
            ax.imshow(img, cmap="viridis")
            ax.set_xticks([])
            ax.set_yticks([])
            if r == 0:
                ax.set_title(title, fontsize=8)
            if k == 0:
                ax.set_ylabel(LABELS.get(c, c), fontsize=8)
    fig.suptitle("mean token-similarity maps (token slot order, row-major; diagonal masked)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


# --------------------------------------------------------------------------------------------
# report
# --------------------------------------------------------------------------------------------
def _history(runs: list[StudyRun]) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[list[HistoryPoint]]]:
    """Training curves averaged over seeds at the epochs they share.

    Returns epochs (E,), SSDC under RPI per layer (E, L) and validation top-1 (E,), both means over seeds,
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
    ssdc = np.array([np.nanmean([_floats(rec.rpi_ssdc) for rec in by_epoch[e]], 0) for e in epochs])
    top1 = np.array([np.nanmean(_floats(rec.val_top1 for rec in by_epoch[e])) for e in epochs])
    return np.array(epochs), ssdc, top1, [by_epoch[e] for e in epochs]


def _history_std(records: list[list[HistoryPoint]]) -> tuple[np.ndarray, np.ndarray]:
    """Per epoch, the std over seeds of SSDC under RPI per layer (E, L) and of top-1 (E,); 0 with one seed."""
    def sd(rows):
        rows = np.asarray(rows, dtype=float)
        return np.nanstd(rows, 0, ddof=1) if len(rows) > 1 else np.zeros(rows.shape[1:])
    return (np.array([sd([_floats(r.rpi_ssdc) for r in recs]) for recs in records]),
            np.array([sd(_floats(r.val_top1 for r in recs)) for recs in records]))


def _formed_at(epochs: np.ndarray, mean_ssdc: np.ndarray) -> float | None:
    """First logged epoch from which the mean SSDC under RPI stays above SUBSTANTIAL, or None."""
    above = mean_ssdc > SUBSTANTIAL
    for i in range(len(epochs)):
        if above[i:].all():
            return float(epochs[i])
    return None


def fig_training(results: StudyResults, path: Path) -> bool:
    """SSDC under RPI per layer across training (one panel per condition), with validation top-1."""
    plt = _plt()
    curves = [(c, _history(runs)) for c, runs in _by_condition(results).items()]
    curves = [(c, h) for c, h in curves if h[0].size]
    if not curves:
        return False
    fig, axes = plt.subplots(1, len(curves), figsize=(3.3 * len(curves), 3.3), sharey=True, squeeze=False)
    cmap = plt.get_cmap("viridis")
    for ax, (c, (epochs, ssdc_l, top1, records)) in zip(axes[0], curves):
        L = ssdc_l.shape[1]
        ssdc_sd, top1_sd = _history_std(records)  # bands: mean ± std over seeds (none with one seed)
        for layer in range(L):
            color = cmap(layer / max(1, L - 1))
            ax.plot(epochs, ssdc_l[:, layer], color=color, lw=1.3,
                    label=f"layer {layer}" if layer in (0, L - 1) else None)
            ax.fill_between(epochs, ssdc_l[:, layer] - ssdc_sd[:, layer], ssdc_l[:, layer] + ssdc_sd[:, layer],
                            color=color, alpha=0.15, lw=0)
        ax.plot(epochs, top1, "--", color="0.45", lw=1, label="val top-1")
        ax.fill_between(epochs, top1 - top1_sd, top1 + top1_sd, color="0.45", alpha=0.12, lw=0)
        ax.axhline(SUBSTANTIAL, color="k", lw=0.5, ls=":")
        ax.axhline(0, color="k", lw=0.5)
        floor = no_pe_floor(results)
        if floor is not None:  # measured at the end by the study's RPI probe
            ax.axhline(floor[1].mean, color="0.3", lw=0.8, ls="--", label="no-PE floor (end)")
        ax.set_title(LABELS.get(c, c))
        ax.set_xlabel("epoch")
    axes[0][0].set_ylabel("SSDC under RPI (lines) / top-1")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def _training_table(results: StudyResults) -> list[str]:
    rows = []
    for c, runs in _by_condition(results).items():
        epochs, ssdc_l, top1, records = _history(runs)
        if not epochs.size:
            continue
        mean = np.nanmean(ssdc_l, 1)
        marks = [int(round(q * (len(epochs) - 1))) for q in (0.25, 0.5, 0.75, 1.0)]
        formed = _formed_at(epochs, mean)

        # at each mark: each seed's mean over layers, then mean ± std over seeds
        at = [_short(spread([float(np.nanmean(_floats(r.rpi_ssdc))) for r in records[i]])) for i in marks]
        rows.append(f"| {LABELS.get(c, c)} | " + " | ".join(f"{a} (ep {epochs[i]:g})" for a, i in zip(at, marks))
                    + f" | {'never' if formed is None else f'{formed:g}'} | "
                    + _short(spread(_floats(r.val_top1 for r in records[-1]))) + " |")
    if not rows:
        return []
    return ["", "## During training: SSDC under RPI (mean over layers; training log, mean ± std over seeds)", "",
            "Logged by the training loop on the first validation images (`rpi_ssdc_images` in the recipe): "
            "when the index anchor forms, and whether it is still moving at the end of training.", "",
            _floor_line(results) + " Measured at the end, by the study's probe.", "",
            "| condition | 1/4 | 1/2 | 3/4 | end | stays above " + f"{SUBSTANTIAL} from epoch | top-1 at end |",
            "|---|---|---|---|---|---|---|"] + rows


def _tables(results: StudyResults) -> list[str]:
    by = _by_condition(results)
    lines = ["## Accuracy and fragility (mean ± std [95% interval] over seeds)", "",
             "| condition | seeds | clean top-1 | JPEG q5 FS | blur σ2.5 FS | paper top-1 | paper JPEG FS | paper blur FS |",
             "|---|---|---|---|---|---|---|---|"]
    for c, runs in by.items():
        acc = spread([r.eval.clean_accuracy for r in runs]).text()
        fj = spread([_fs(r, "jpeg:5") for r in runs]).text()
        fb = spread([_fs(r, "blur:2.5:5") for r in runs]).text()
        pa = PAPER.get(c, (math.nan,) * 3)
        lines.append(f"| {LABELS.get(c, c)} | {len(runs)} | {acc} | {fj} | {fb} | "
                     f"{pa[0]:.3f} | {pa[1]:.3f} | {pa[2]:.3f} |")
    extra = sorted({s for r in results.runs for s in r.eval.fs or {}} - set(PAPER_SHIFTS))
    if extra:
        lines += ["", "Other shifts (FS):", "", "| condition | " + " | ".join(extra) + " |",
                  "|---|" + "---|" * len(extra)]
        for c, runs in by.items():
            lines.append(f"| {LABELS.get(c, c)} | " + " | ".join(
                spread([_fs(r, s) for r in runs]).text() for s in extra) + " |")
    lines += ["", "## SSDC across depth (attention input, mean map; mean ± std over seeds)", ""]
    ns = sorted({len(runs) for runs in by.values() if len(runs) > 1})
    if ns:  # the per-layer lists keep to mean ± std; their 95% intervals follow from it
        from scipy.stats import t

        factors = ", ".join(f"{float(t.ppf(0.975, n - 1)) / math.sqrt(n):.2f} with {n} seeds" for n in ns)
        lines += [f"Per layer: mean ± std over seeds; its 95% interval is mean ± k·std (k = t(0.975, n-1)/√n: "
                  f"{factors}). Delta SSDC gives mean ± std [95% interval].", ""]
    perms = sorted({len(r.eval.ssdc.rpi_by_permutation or [None]) for r in results.runs if r.eval.ssdc})
    lines += [f"Under RPI: the mean over {'/'.join(map(str, perms)) or '1'} permutation(s) per model (seeds 0, 1, ..., "
              "the same for every model); the mean over layers and delta SSDC under RPI give mean ± seed std "
              "(permutations ± the std over permutations) [95% interval over seeds x permutations].",
              "", _floor_line(results), "",
              "| condition | SSDC per layer | under RPI (index grid) | mean under RPI | delta SSDC under RPI | untrained |",
              "|---|---|---|---|---|---|"]
    for c, runs in by.items():
        cube = rpi_cube(runs)
        mean = spread_sp(np.nanmean(cube, 2)).text() if cube.size else "n/a"
        d = spread_sp(cube[:, :, 1] - cube[:, :, 0]).text() if cube.size and cube.shape[2] >= 2 else "n/a"
        lines.append(f"| {LABELS.get(c, c)} | {_layer_text(runs, 'per_layer')} | {_layer_text(runs, 'rpi_per_layer')} | "
                     f"{mean} | {d} | {_layer_text(runs, 'per_layer', 'untrained')} |")
    swept = [(c, [r.eval.alpha_sweep for r in runs if r.eval.alpha_sweep]) for c, runs in by.items()]
    swept = [(c, s) for c, s in swept if s]
    if swept:
        for title, value in (("delta SSDC under RPI", lambda s, i: s.delta_ssdc[i]),
                             ("JPEG q5 FS", lambda s, i: s.fs["jpeg:5"][i])):
            lines += ["", f"## Alpha sweep: {title} (mean ± std [95% interval] over seeds)", ""]
            if title.startswith("delta"):  # the sweep draws one permutation (the first) per alpha
                lines += ["One RPI permutation per alpha (the first of every model). " + _floor_line(results, delta=True), ""]
            lines += ["| alpha | " + " | ".join(LABELS.get(c, c) for c, _ in swept) + " |",
                      "|---|" + "---|" * len(swept)]
            for i, a in enumerate(swept[0][1][0].alphas):
                lines.append(f"| {a:g} | " + " | ".join(
                    spread([value(s, i) for s in sweeps]).text() for _, sweeps in swept) + " |")
    return lines


def _short(s) -> str:
    """mean, or mean±std with 2 seeds or more (the 95% intervals are in the accuracy table's style)."""
    if s.n == 0:
        return "n/a"
    return f"{s.mean:.3f}" if s.n == 1 else f"{s.mean:.3f}±{s.std:.3f}"


def _layer_text(runs: list[StudyRun], key: str, source: str = "eval") -> str:
    """Per layer: the mean over seeds (± std with 2 seeds or more)."""
    m, sd = _layers(runs, key, source)
    many = sum(1 for r in runs if (r.eval.ssdc if source == "eval" else getattr(r, source)) is not None) > 1
    return ", ".join(f"{a:.3f}±{b:.3f}" if many else f"{a:.3f}" for a, b in zip(m, sd))


def _claims_table(claims: list[dict[str, Any]]) -> list[str]:
    lines = ["## The paper's five claims in this run", "",
             f"Thresholds: 'collapses' = |SSDC| < {NEAR_ZERO} at every layer under RPI; 'substantial' = mean "
             f"SSDC under RPI > {SUBSTANTIAL}; early peak = the maximum over the first half of the layers minus the "
             "maximum over the rest > 0; accumulates = last layer minus first > 0; a trend with alpha = every seed's "
             "Spearman correlation with the claimed sign and the change from the largest to the smallest alpha > 0 "
             "in the claimed direction. One rule decides every part (docs/method.md#verdicts): yes when it holds "
             "beyond its 95% interval, no when its opposite holds beyond it, within noise otherwise; the interval "
             "is over seeds, and over seeds x RPI permutations for SSDC under RPI. With one seed a fragility "
             "comparison (claim 4, and claim 5's FS change from the largest to the smallest alpha) counts only "
             "beyond the 95% interval of the difference (recovered from each run's bootstrap interval, MOVER); a "
             "claim that involves a model whose "
             f"clean top-1 is below {CHANCE_FACTOR:g}x chance is undecided. The evidence shows the interval that "
             "decided each part (mean ± k x s = its end).", "",
             "| # | claim | held here | evidence |", "|---|---|---|---|"]
    for i, c in enumerate(claims, 1):
        held = {"held": "yes", "not held": "**no**"}.get(c["status"], f"{c['status']}: {c['reason']}")
        lines.append(f"| {i} | {c['claim']} | {held} | {c['evidence']} |")
    return lines + [""]


def _versions_text(results: StudyResults) -> str:
    """The versions every run was trained and measured with (summary.json, eval.json), against this
    results.json's invocation; runs recorded before per-run versions were kept are named as such."""
    return describe_versions(results.versions, [(f"{r.condition} s{r.seed}", [r.train.versions, *(r.eval.versions or [None])])
                                                for r in results.runs], label="the study's last invocation")


def write_report(out: str | os.PathLike) -> Path:
    """Write report.md, report.html and figures next to ``results.json`` in ``out``; return report.md."""
    out = Path(out)
    results = StudyResults.read(out / "results.json")
    if not results.runs:
        raise ValueError(f"{out / 'results.json'} has no finished runs yet")
    figs = out / "figures"
    figs.mkdir(exist_ok=True)
    fig_ssdc_depth(results, figs / "ssdc_depth.png")
    fig_fragility(results, figs / "fragility.png")
    has_sweep = fig_alpha_sweep(results, figs / "alpha_sweep.png")
    has_maps = fig_similarity_maps(out, results, figs / "similarity_maps.png")
    has_training = fig_training(results, figs / "training.png")
    cfg = results.config
    claims = evaluate_claims(results)
    probed = sorted({r.eval.ssdc.n_images for r in results.runs if r.eval.ssdc is not None})
    probed_text = "no" if not probed else f"{probed[0]}" if len(probed) == 1 else f"{probed[0]}-{probed[-1]}"
    lines = [f"# PE geometry study: preset `{cfg['preset']}`", "",
             f"Data: `{results.eval_data['source']}` ({results.eval_data['split']}, "
             f"{results.eval_data['images']} images); conditions {', '.join(cfg['conditions'])}; "
             f"{cfg['seeds']} seed(s); SSDC on {probed_text} images; "
             f"{'complete' if results.complete else 'INCOMPLETE (resume with --resume)'}; "
             f"{results.elapsed_s:.0f} s (all invocations). Versions: {_versions_text(results)}.", "",
             "The paper's numbers are ViT-S/16 on ImageNet-100 at 224 px (docs/method.md in the timm-posgeom repository); this run's scale "
             "may differ, so compare orderings and shapes rather than values.", ""]
    lines += _claims_table(claims)
    lines += _tables(results)
    lines += _training_table(results)
    lines += ["", "## Figures", "", "![SSDC across depth](figures/ssdc_depth.png)", "",
              "![Fragility](figures/fragility.png)", ""]
    if has_sweep:
        lines += ["![Alpha sweep](figures/alpha_sweep.png)", ""]
    if has_maps:
        lines += ["![Similarity maps](figures/similarity_maps.png)", ""]
    if has_training:
        lines += ["![SSDC under RPI during training](figures/training.png)", ""]
    lines += ["Every number above is in `results.json`; `posgeom report " + str(out) + "` rebuilds this page."]
    md = "\n".join(lines) + "\n"
    (out / "report.md").write_text(md)
    _write_html(out, md)
    return out / "report.md"


_CSS = """
body { font-family: -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif; max-width: 1180px;
       margin: 2em auto; padding: 0 1.5em; color: #1d1d1f; line-height: 1.5; }
h1 { font-size: 1.7em; border-bottom: 2px solid #1f77b4; padding-bottom: .3em; }
h2 { font-size: 1.3em; margin-top: 2em; color: #1f4e79; }
table { border-collapse: collapse; margin: 1em 0; font-size: .88em; width: 100%; }
th { background: #1f4e79; color: white; text-align: left; }
th, td { padding: .45em .7em; border: 1px solid #d0d7de; vertical-align: top; }
tr:nth-child(even) td { background: #f6f8fa; }
td strong { color: #b31d28; }
code { background: #f0f2f4; padding: .1em .3em; border-radius: 3px; font-size: .92em; }
img { max-width: 100%; border: 1px solid #e1e4e8; margin: .5em 0; }
.verdict-yes { color: #1a7f37; font-weight: 600; }
.verdict-undecided { color: #9a6700; }
"""


def render_html(md: str, figures: Path) -> str:
    """A self-contained page from the report's markdown: rendered with Python-Markdown (tables), styled,
    every ``figures/*.png`` it shows embedded as a data URI, the claims' verdicts coloured."""
    import re

    import markdown

    body = markdown.markdown(md, extensions=["tables", "sane_lists"], output_format="html")

    def embed(match: re.Match) -> str:
        png = figures / Path(match.group(1)).name
        if not png.is_file():
            return match.group(0)
        return f'src="data:image/png;base64,{base64.b64encode(png.read_bytes()).decode()}"'

    body = re.sub(r'src="(figures/[^"]+\.png)"', embed, body)
    body = re.sub(r"<td>yes</td>", '<td class="verdict-yes">yes</td>', body)
    body = re.sub(r"<td>(undecided: [^<]*)</td>", r'<td class="verdict-undecided">\1</td>', body)
    return ("<!doctype html>\n<html lang='en'><head><meta charset='utf-8'><title>timm-posgeom report</title>"
            f"<style>{_CSS}</style></head>\n<body>\n{body}\n</body></html>\n")


def _write_html(out: Path, md: str) -> None:
    """``report.html``: :func:`render_html` of the report next to its figures."""
    (out / "report.html").write_text(render_html(md, out / "figures"))
