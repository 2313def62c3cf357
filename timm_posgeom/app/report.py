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
from .records import HistoryPoint, StudyResults, StudyRun

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
# figures
# --------------------------------------------------------------------------------------------
def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _band_note(results: StudyResults) -> str:
    """What a band over seeds is, for a legend: mean ± std over seeds (zero width with one seed)."""
    n = {len(runs) for runs in _by_condition(results).values()}
    return "band: ± std over seeds" + (" (none with 1 seed)" if 1 in n else "")


def _proxy_band(label: str) -> Any:
    from matplotlib.patches import Patch

    return Patch(facecolor="0.6", alpha=0.35, label=label)


def _save(fig: Any, path: Path, dpi: int = 120) -> None:
    """Fit the titles to the canvas, save, close."""
    from ..plotting import fit_titles

    fit_titles(fig)
    fig.savefig(path, dpi=dpi)
    _plt().close(fig)


def fig_ssdc_depth(results: StudyResults, path: Path) -> None:
    """SSDC of the mean map per layer, normal (left) and under RPI (right): one line per condition, the mean
    over seeds with a ± std band; dotted, the untrained models."""
    from matplotlib.lines import Line2D

    plt = _plt()
    by = _by_condition(results)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2), sharey=True, layout="constrained")
    for ax, key, title in ((axes[0], "per_layer", "SSDC across depth"), (axes[1], "rpi_per_layer", "under RPI")):
        for c, runs in by.items():
            m, s = _layers(runs, key)
            if m.size == 0:
                continue
            x = np.arange(len(m))
            ax.set_xticks(x)
            ax.plot(x, m, "-o", color=COLORS.get(c), label=LABELS.get(c, c), ms=4)
            ax.fill_between(x, m - s, m + s, color=COLORS.get(c), alpha=0.2, lw=0, label="_band")
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
    axes[0].set_ylabel("SSDC (mean map), mean over seeds")
    handles = axes[0].get_legend_handles_labels()[0]
    handles += [_proxy_band(_band_note(results)), Line2D([], [], color="0.3", ls=":", lw=1, label="untrained (dotted)")]
    axes[0].legend(handles=handles, fontsize=7)
    _save(fig, path)


def fig_fragility(results: StudyResults, path: Path) -> None:
    """FS per shift and condition: bars the mean over seeds, error bars ± std over seeds (none with one)."""
    plt = _plt()
    by = _by_condition(results)
    shifts = sorted({s for r in results.runs for s in r.eval.fs or {}},
                    key=lambda s: (s not in PAPER_SHIFTS, s))
    fig, ax = plt.subplots(figsize=(max(5.5, 1.6 * len(shifts) + 3.5), 3.8), layout="constrained")
    width = 0.8 / max(1, len(by))
    for i, (c, runs) in enumerate(by.items()):
        stats = [spread([_fs(r, s) for r in runs]) for s in shifts]  # one seed: no error bar (std 0)
        ax.bar(np.arange(len(shifts)) + i * width, [s.mean for s in stats], width,
               yerr=[0.0 if s.n < 2 else s.std for s in stats],
               color=COLORS.get(c), label=LABELS.get(c, c))
    ax.set_xticks(np.arange(len(shifts)) + 0.4 - width / 2)
    ax.set_xticklabels(shifts, rotation=20 if len(shifts) > 3 else 0, fontsize=8)
    ax.set_ylabel("fragility score 1 - A_shift / A_clean")
    ax.set_title("Fragility per shift (mean over seeds)", fontsize=10)
    n = {len(runs) for runs in by.values()}
    ax.legend(fontsize=8, title="error bars: ± std over seeds" + (" (none with 1 seed)" if 1 in n else ""),
              title_fontsize=7)
    _save(fig, path)


def _sweep_order(alphas: list[float]) -> list[int]:
    """Indices that put a sweep's alphas in increasing order (every figure and table runs alpha upwards)."""
    return sorted(range(len(alphas)), key=lambda k: alphas[k])


def fig_alpha_sweep(results: StudyResults, path: Path) -> bool:
    """Against alpha (increasing), delta SSDC under RPI (left) and JPEG q5 FS (right), one line per swept
    condition: the mean over seeds with a ± std band; with one seed, FS's band is its paired-bootstrap 95%
    interval over images. Two panels, no twin axes."""
    plt = _plt()
    by = _by_condition(results)
    swept = [(c, [r.eval.alpha_sweep for r in runs if r.eval.alpha_sweep]) for c, runs in by.items()]
    swept = [(c, s) for c, s in swept if s]
    if not swept:
        return False
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.0), sharex=True, layout="constrained")
    notes = set()
    for c, sweeps in swept:
        order = _sweep_order(sweeps[0].alphas)
        alphas = np.asarray(sweeps[0].alphas, dtype=float)[order]
        color = COLORS.get(c)
        for ax, rows in ((left, [s.delta_ssdc for s in sweeps]), (right, [s.fs["jpeg:5"] for s in sweeps])):
            arr = np.array([_floats(row) for row in rows], dtype=float)[:, order]
            m = np.nanmean(arr, 0)
            ax.plot(alphas, m, "-o", color=color, ms=4, label=f"{LABELS.get(c, c)} ({len(sweeps)} seed"
                    f"{'s' if len(sweeps) > 1 else ''})")
            if len(sweeps) > 1:
                sd = np.nanstd(arr, 0, ddof=1)
                ax.fill_between(alphas, m - sd, m + sd, color=color, alpha=0.15, lw=0, label="_band")
                notes.add("band: ± std over seeds")
            elif ax is right and (sweeps[0].fs_interval or {}).get("jpeg:5"):
                ci = np.array([_floats(v) for v in sweeps[0].fs_interval["jpeg:5"]], dtype=float)[order]
                ax.fill_between(alphas, ci[:, 0], ci[:, 1], color=color, alpha=0.15, lw=0, label="_band")
                notes.add("FS band, 1 seed: paired bootstrap 95% interval")
    floor = no_pe_floor(results)
    if floor is not None and math.isfinite(floor[2].mean):  # the no-PE floor of delta SSDC under RPI
        left.axhline(floor[2].mean, color="0.3", lw=0.8, ls="--", label="no-PE floor")
    for ax in (left, right):
        ax.axhline(0, color="k", lw=0.5)
        ax.set_xlabel("alpha (PE scale)")
    left.set_ylabel("delta SSDC under RPI")
    left.set_title("delta SSDC under RPI against alpha", fontsize=10)
    right.set_ylabel("JPEG q5 fragility score")
    right.set_title("JPEG q5 FS against alpha", fontsize=10)
    handles = left.get_legend_handles_labels()[0] + [_proxy_band(n) for n in sorted(notes)]
    left.legend(handles=handles, fontsize=7)
    _save(fig, path)
    return True


def fig_similarity_maps(out: Path, results: StudyResults, path: Path) -> bool:
    """Mean token-similarity maps of each condition's first seed: layers 0 and 1, normal and under RPI;
    diagonal masked (as in every map of the package), one colour scale and colour bar per condition."""
    import torch

    from ..plotting import MAP_LABEL, show_map

    plt = _plt()
    by = _by_condition(results)
    rows = []
    for c, runs in by.items():
        maps_file = out / runs[0].run_dir / "maps.pt"
        if maps_file.is_file():
            rows.append((c, torch.load(maps_file, weights_only=True)))
    if not rows:
        return False
    fig, axes = plt.subplots(len(rows), 4, figsize=(9, 2.2 * len(rows) + 0.4), squeeze=False, layout="constrained")
    for r, (c, maps) in enumerate(rows):
        panels = [(maps["normal"][0], "layer 0"), (maps["normal"][1], "layer 1"),
                  (maps["rpi"][0], "layer 0, RPI"), (maps["rpi"][1], "layer 1, RPI")]
        imgs = [m.numpy().astype(float) for m, _ in panels]
        off = np.concatenate([img[~np.eye(len(img), dtype=bool)] for img in imgs])
        vmin, vmax = float(np.nanmin(off)), float(np.nanmax(off))
        for k, ((_, title), img) in enumerate(zip(panels, imgs)):
            ax = axes[r][k]
            im = show_map(ax, img, vmin=vmin, vmax=vmax, colorbar=False)
            if r == 0:
                ax.set_title(title, fontsize=8)
            if k == 0:
                ax.set_ylabel(LABELS.get(c, c), fontsize=8)
        bar = fig.colorbar(im, ax=list(axes[r]), shrink=0.9)
        bar.set_label(MAP_LABEL, fontsize=6)
        bar.ax.tick_params(labelsize=6)
    fig.suptitle("mean token-similarity maps (token slot order, row-major; diagonal masked)", fontsize=9)
    _save(fig, path, dpi=110)
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
    fig, axes = plt.subplots(1, len(curves), figsize=(3.4 * len(curves), 3.6), sharey=True, squeeze=False,
                             layout="constrained")
    cmap = plt.get_cmap("viridis")
    for ax, (c, (epochs, ssdc_l, top1, records)) in zip(axes[0], curves):
        L = ssdc_l.shape[1]
        ssdc_sd, top1_sd = _history_std(records)  # bands: mean ± std over seeds (none with one seed)
        for layer in range(L):
            color = cmap(layer / max(1, L - 1))
            ax.plot(epochs, ssdc_l[:, layer], color=color, lw=1.3,
                    label=f"layer {layer}" if layer in (0, L - 1) else None)
            ax.fill_between(epochs, ssdc_l[:, layer] - ssdc_sd[:, layer], ssdc_l[:, layer] + ssdc_sd[:, layer],
                            color=color, alpha=0.15, lw=0, label="_band")
        ax.plot(epochs, top1, "--", color="0.45", lw=1, label="val top-1")
        ax.fill_between(epochs, top1 - top1_sd, top1 + top1_sd, color="0.45", alpha=0.12, lw=0, label="_band")
        ax.axhline(SUBSTANTIAL, color="k", lw=0.5, ls=":")
        ax.axhline(0, color="k", lw=0.5)
        floor = no_pe_floor(results)
        if floor is not None:  # measured at the end by the study's RPI probe
            ax.axhline(floor[1].mean, color="0.3", lw=0.8, ls="--", label="no-PE floor (end)")
        ax.set_title(LABELS.get(c, c))
        ax.set_xlabel("epoch")
    axes[0][0].set_ylabel("SSDC under RPI (lines) / top-1")
    handles = axes[0][0].get_legend_handles_labels()[0] + [_proxy_band(_band_note(results))]
    axes[0][0].legend(handles=handles, fontsize=7)
    _save(fig, path)
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
            alphas = swept[0][1][0].alphas
            for i in _sweep_order(alphas):  # alpha upwards, as in the figure
                a = alphas[i]
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


def _architecture(recipe: dict[str, Any]) -> dict[str, Any]:
    """Width, depth, heads, patch and grid of a recipe's model, read off the model built on the meta device
    (no weights, no memory); what the recipe itself says when the model cannot be built that way."""
    kwargs = dict(recipe.get("model_kwargs") or {})
    if recipe.get("img_size"):
        kwargs["img_size"] = recipe["img_size"]
    out: dict[str, Any] = {"width": kwargs.get("embed_dim"), "depth": kwargs.get("depth"),
                           "heads": kwargs.get("num_heads"), "img_size": recipe.get("img_size")}
    try:
        import timm
        import torch

        from .. import models  # noqa: F401  (registers the package's models with timm)

        with torch.device("meta"):
            model = timm.create_model(recipe["model"], **kwargs)
        grid = tuple(model.patch_embed.grid_size)
        out.update(width=model.embed_dim, depth=len(model.blocks), heads=model.blocks[0].attn.num_heads,
                   patch=tuple(model.patch_embed.patch_size), grid=grid)
    except (AttributeError, KeyError, RuntimeError, TypeError, ValueError, NotImplementedError):
        pass  # not a ViT timm can build here: the recipe's values (or "not recorded") stand
    return out


def _one_or_each(values: dict[str, Any], fmt=str) -> str:
    """One value when every condition shares it, else each condition's."""
    distinct = {fmt(v) for v in values.values()}
    if len(distinct) == 1:
        return distinct.pop()
    return "; ".join(f"{LABELS.get(c, c)} {fmt(v)}" for c, v in values.items())


def _grid_text(arch: dict[str, Any]) -> str:
    grid = arch.get("grid")
    if not grid:
        return "not recorded"
    size = f"{arch['img_size']} px, " if arch.get("img_size") else ""
    patch = f"patch {arch['patch'][0]}" if arch.get("patch") else ""
    return f"{grid[0]} x {grid[1]} ({size}{patch})"


def _header(results: StudyResults) -> tuple[str, list[str]]:
    """The report's title (what the study varied: grid, width, depth, init) and the table under it: preset,
    init, model, width, depth, grid, overrides, seeds, training, data identity, what was measured."""
    cfg = results.config
    by = _by_condition(results)
    recipes = {c: results.recipes.get(c) or {} for c in cfg.get("conditions", by)}
    archs = {c: _architecture(r) for c, r in recipes.items() if r}
    inits = {c: (r.get("model_kwargs") or {}).get("init", "timm") for c, r in recipes.items() if r}
    init = cfg.get("init") or _one_or_each(inits) if inits else cfg.get("init") or "not recorded"
    na = "not recorded"
    width = _one_or_each({c: a.get("width") or na for c, a in archs.items()}) if archs else na
    depth = _one_or_each({c: a.get("depth") or na for c, a in archs.items()}) if archs else na
    heads = _one_or_each({c: a.get("heads") or na for c, a in archs.items()}) if archs else na
    grid = _one_or_each({c: _grid_text(a) for c, a in archs.items()}) if archs else na
    short_grid = _one_or_each({c: "x".join(map(str, a["grid"])) if a.get("grid") else na for c, a in archs.items()}) \
        if archs else na
    known = [part for part, value in ((f"{short_grid} grid", short_grid), (f"width {width}", width),
                                      (f"depth {depth}", depth), (f"{init} init", init)) if value != na]
    title = f"PE geometry study: {', '.join(known)} (preset `{cfg['preset']}`)" if known else \
        f"PE geometry study: preset `{cfg['preset']}`"
    overrides = cfg.get("train_overrides") or []
    seeds_run = "; ".join(f"{LABELS.get(c, c)} {', '.join(str(r.seed) for r in runs)}" for c, runs in by.items())
    epochs = _one_or_each({c: r.get("epochs", na) for c, r in recipes.items() if r}) if archs else na
    batch = _one_or_each({c: r.get("batch_size", na) for c, r in recipes.items() if r}) if archs else na
    models = _one_or_each({c: f"`{r.get('model', na)}`" for c, r in recipes.items() if r}) if archs else na
    data = results.eval_data or {}
    identity = data.get("identity") or {}
    ident = ", ".join(f"{k} `{identity[k]}`" for k in ("labels", "pixels") if identity.get(k))
    alphas = cfg.get("alphas")
    rows = [
        ("preset", f"`{cfg['preset']}`" + (f" (recipes `{cfg['recipe_prefix']}_<condition>`)"
                                            if cfg.get("recipe_prefix") else "")),
        ("conditions", ", ".join(LABELS.get(c, c) for c in cfg.get("conditions", by))),
        ("model", models),
        ("initialisation", f"{init}" + (" (`--init`, every run)" if cfg.get("init") else " (each recipe's own)")),
        ("width / depth / heads", f"{width} / {depth} / {heads}"),
        ("grid", grid),
        ("overrides", ", ".join(f"`{o}`" for o in overrides) if overrides else "none (the preset's recipes)"),
        ("seeds", f"{cfg.get('seeds', na)} per condition; measured: {seeds_run}"),
        ("training", f"{epochs} epochs, batch {batch}"),
        ("data", f"`{data.get('source', na)}`, {data.get('split', na)} split, {data.get('images', na)} images, "
                 f"{data.get('classes', na)} classes" + (f"; identity: {ident}" if ident else "")),
        ("measured", f"fragility under {', '.join(cfg.get('shifts') or []) or 'no shift'}; SSDC on "
                     f"{cfg.get('probe_images')} images (normal and under RPI)"
                     + (f"; alpha sweep at {', '.join(f'{a:g}' for a in sorted(alphas))}" if alphas else "")),
    ]
    table = ["## What this study varied", "", "| | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in rows]
    return title, table


def _slug(heading: str) -> str:
    """A heading's anchor as GitHub writes it (lower case, punctuation dropped, spaces to hyphens); the
    HTML page uses the same (:func:`render_html`), so the contents' links work in both."""
    import re

    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _contents(lines: list[str]) -> list[str]:
    """A table of contents: a link to every second-level heading in ``lines``."""
    heads = [line[3:].strip() for line in lines if line.startswith("## ")]
    return ["## Contents", ""] + [f"- [{h}](#{_slug(h)})" for h in heads] + [""]


def _place(lines: list[str], heading: str, block: list[str]) -> list[str]:
    """``block`` inserted at the end of the last section whose heading starts with ``heading`` (appended
    when there is none): a figure goes next to the table it illustrates."""
    starts = [i for i, line in enumerate(lines) if line.startswith("## " + heading)]
    if not starts:
        return lines + [""] + block
    end = next((j for j in range(starts[-1] + 1, len(lines)) if lines[j].startswith("## ")), len(lines))
    while end > 0 and lines[end - 1] == "":
        end -= 1
    while block and block[-1] == "":
        block = block[:-1]
    return lines[:end] + [""] + block + lines[end:]


def _figure(number: int, file: str, alt: str, caption: str) -> list[str]:
    return [f"![{alt}](figures/{file})", "", f"*Figure {number}. {caption}*", ""]


def write_report(out: str | os.PathLike) -> Path:
    """Write report.md, report.html and figures next to ``results.json`` in ``out``; return report.md.

    The page: a title and a table saying what the study varied (preset, init, width, depth, grid,
    overrides, seeds, data identity), a table of contents, the claims, then each table with the figure
    that illustrates it, captioned (what is drawn, what the bands are), and provenance last."""
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
    title, varied = _header(results)
    head = [f"# {title}", "",
            f"Data: `{results.eval_data['source']}` ({results.eval_data['split']}, "
            f"{results.eval_data['images']} images); conditions {', '.join(cfg['conditions'])}; "
            f"{cfg['seeds']} seed(s); SSDC on {probed_text} images; "
            f"{'complete' if results.complete else 'INCOMPLETE (resume with --resume)'}; "
            f"{results.elapsed_s:.0f} s (all invocations). Versions: {_versions_text(results)}.", "",
            "The paper's numbers are ViT-S/16 on ImageNet-100 at 224 px (docs/method.md in the timm-posgeom repository); this run's scale "
            "may differ, so compare orderings and shapes rather than values.", ""]
    body = _claims_table(claims) + _tables(results) + _training_table(results)
    seeds = "mean ± std over seeds (zero width with one seed)"
    n = 0

    def figure(file: str, alt: str, caption: str) -> list[str]:
        nonlocal n
        n += 1
        return _figure(n, file, alt, caption)

    body = _place(body, "Accuracy and fragility", figure(
        "fragility.png", "Fragility per shift",
        "Fragility score FS = 1 - A_shift / A_clean per shift and condition: bars the mean over seeds, error bars "
        "± std over seeds (none with one seed); the table gives the 95% intervals."))
    maps_caption = ("Mean token-similarity maps of each condition's first seed, layers 0 and 1, without and under "
                    "RPI (token slot order, row-major). The diagonal (each token with itself) is masked; each row "
                    "has its own colour scale and colour bar.")
    body = _place(body, "SSDC across depth", figure(
        "ssdc_depth.png", "SSDC across depth",
        f"SSDC of the mean similarity map per layer, without RPI (left) and under RPI against the index grid "
        f"(right): lines the mean over seeds, bands {seeds}; dotted, the same models untrained.")
        + (figure("similarity_maps.png", "Similarity maps", maps_caption) if has_maps else []))
    if has_sweep:
        body = _place(body, "Alpha sweep", figure(
            "alpha_sweep.png", "Alpha sweep",
            f"Delta SSDC under RPI (left) and JPEG q5 FS (right) against the PE scale alpha (increasing to the "
            f"right, as in the tables): lines the mean over seeds, bands {seeds}; with one seed the FS band is "
            f"the paired-bootstrap 95% interval over images."))
    if has_training:
        body = _place(body, "During training", figure(
            "training.png", "SSDC under RPI during training",
            f"SSDC under RPI per layer (colour: depth) and validation top-1 (dashed) across training, from "
            f"the training log: lines the mean over seeds, bands {seeds}; dotted line: the 'substantial' "
            f"threshold {SUBSTANTIAL}."))
    tail = ["", "## Provenance", "", f"Versions: {_versions_text(results)}.", "",
            "Every number above is in `results.json`; `posgeom report " + str(out) + "` rebuilds this page."]
    lines = head + varied + [""] + _contents(varied + body + tail) + body + tail
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
p > em:only-child { color: #57606a; font-size: .9em; }
.verdict-yes { color: #1a7f37; font-weight: 600; }
.verdict-undecided { color: #9a6700; }
"""


def render_html(md: str, figures: Path) -> str:
    """A self-contained page from the report's markdown: rendered with Python-Markdown (tables), styled,
    every ``figures/*.png`` it shows embedded as a data URI, the claims' verdicts coloured, the headings given
    the anchors the contents link to, the title taken from the report's first heading."""
    import html
    import re

    import markdown
    from markdown.extensions.toc import TocExtension

    toc = TocExtension(slugify=lambda value, separator: _slug(value))  # the anchors report.md links to
    body = markdown.markdown(md, extensions=["tables", "sane_lists", toc], output_format="html")
    title = next((line[2:].strip() for line in md.splitlines() if line.startswith("# ")), "timm-posgeom report")
    title = html.escape(title.replace("`", ""))

    def embed(match: re.Match) -> str:
        png = figures / Path(match.group(1)).name
        if not png.is_file():
            return match.group(0)
        return f'src="data:image/png;base64,{base64.b64encode(png.read_bytes()).decode()}"'

    body = re.sub(r'<h1 id="[^"]*">', "<h1>", body)  # the contents link to sections (h2) only
    body = re.sub(r'src="(figures/[^"]+\.png)"', embed, body)
    body = re.sub(r"<td>yes</td>", '<td class="verdict-yes">yes</td>', body)
    body = re.sub(r"<td>(undecided: [^<]*)</td>", r'<td class="verdict-undecided">\1</td>', body)
    return (f"<!doctype html>\n<html lang='en'><head><meta charset='utf-8'><title>{title}</title>"
            f"<style>{_CSS}</style></head>\n<body>\n{body}\n</body></html>\n")


def _write_html(out: Path, md: str) -> None:
    """``report.html``: :func:`render_html` of the report next to its figures."""
    (out / "report.html").write_text(render_html(md, out / "figures"))
