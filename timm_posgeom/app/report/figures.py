"""The figures of a study's report (PNG), drawn from its results: SSDC across depth, fragility, the alpha
sweep, the similarity maps, training curves and attention per head; and the no-PE floor, which the report's
tables state too. The runs are read through :mod:`.runs`, as the tables read them."""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from ...data.shifts import PAPER_SHIFTS
from ...results.jsonio import nan_if_none
from ..records import StudyResults
from .claims import LABELS, SUBSTANTIAL, Spread, rpi_cube, spread, spread_sp
from .runs import by_condition, layer_mean_std, run_fs, seed_history, seed_history_std, sweep_order

__all__ = [
    "COLORS",
    "no_pe_floor",
    "fig_ssdc_depth",
    "fig_fragility",
    "fig_alpha_sweep",
    "fig_similarity_maps",
    "fig_training",
    "fig_attention_heads",
]

COLORS = {"nope": "#7f7f7f", "ape": "#1f77b4", "sincos": "#2ca02c", "rope": "#d62728", "rpt": "#9467bd"}


def no_pe_floor(results: StudyResults) -> tuple[list[Spread], Spread, Spread] | None:
    """The no-PE floor under RPI (docs/method.md#rpi-and-rpt): the SSDC a permuted model shows by chance,
    measured on the study's no-PE runs under the same permutations as every other model. Per layer, the
    mean over layers and delta SSDC, each over seeds x permutations (:func:`~.claims.spread_sp`); None
    without a no-PE run."""
    runs = by_condition(results).get("nope", [])
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
    n = {len(runs) for runs in by_condition(results).values()}
    return "band: ± std over seeds" + (" (none with 1 seed)" if 1 in n else "")


def _proxy_band(label: str) -> Any:
    from matplotlib.patches import Patch

    return Patch(facecolor="0.6", alpha=0.35, label=label)


def _save(fig: Any, path: Path, dpi: int = 120) -> None:
    """Fit the titles to the canvas, save, close."""
    from ...results.plotting import fit_titles

    fit_titles(fig)
    fig.savefig(path, dpi=dpi)
    _plt().close(fig)


def fig_ssdc_depth(results: StudyResults, path: Path) -> None:
    """SSDC of the mean map per layer, normal (left) and under RPI (right): one line per condition, the mean
    over seeds with a ± std band; dotted, the untrained models."""
    from matplotlib.lines import Line2D

    plt = _plt()
    by = by_condition(results)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2), sharey=True, layout="constrained")
    for ax, key, title in ((axes[0], "per_layer", "SSDC across depth"), (axes[1], "rpi_per_layer", "under RPI")):
        for c, runs in by.items():
            m, s = layer_mean_std(runs, key)
            if m.size == 0:
                continue
            x = np.arange(len(m))
            ax.set_xticks(x)
            ax.plot(x, m, "-o", color=COLORS.get(c), label=LABELS.get(c, c), ms=4)
            ax.fill_between(x, m - s, m + s, color=COLORS.get(c), alpha=0.2, lw=0, label="_band")
            u, _ = layer_mean_std(runs, key, source="untrained")
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
    by = by_condition(results)
    shifts = sorted({s for r in results.runs for s in r.eval.fs or {}}, key=lambda s: (s not in PAPER_SHIFTS, s))
    fig, ax = plt.subplots(figsize=(max(5.5, 1.6 * len(shifts) + 3.5), 3.8), layout="constrained")
    width = 0.8 / max(1, len(by))
    for i, (c, runs) in enumerate(by.items()):
        stats = [spread([run_fs(r, s) for r in runs]) for s in shifts]  # one seed: no error bar (std 0)
        ax.bar(
            np.arange(len(shifts)) + i * width,
            [s.mean for s in stats],
            width,
            yerr=[0.0 if s.n < 2 else s.std for s in stats],
            color=COLORS.get(c),
            label=LABELS.get(c, c),
        )
    ax.set_xticks(np.arange(len(shifts)) + 0.4 - width / 2)
    ax.set_xticklabels(shifts, rotation=20 if len(shifts) > 3 else 0, fontsize=8)
    ax.set_ylabel("fragility score 1 - A_shift / A_clean")
    ax.set_title("Fragility per shift (mean over seeds)", fontsize=10)
    n = {len(runs) for runs in by.values()}
    ax.legend(
        fontsize=8, title="error bars: ± std over seeds" + (" (none with 1 seed)" if 1 in n else ""), title_fontsize=7
    )
    _save(fig, path)


def fig_alpha_sweep(results: StudyResults, path: Path) -> bool:
    """Against alpha (increasing), delta SSDC under RPI (left) and JPEG q5 FS (right), one line per swept
    condition: the mean over seeds with a ± std band; with one seed, FS's band is its paired-bootstrap 95%
    interval over images. Two panels, no twin axes."""
    plt = _plt()
    by = by_condition(results)
    swept = [(c, [r.eval.alpha_sweep for r in runs if r.eval.alpha_sweep]) for c, runs in by.items()]
    swept = [(c, s) for c, s in swept if s]
    if not swept:
        return False
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.0), sharex=True, layout="constrained")
    notes = set()
    for c, sweeps in swept:
        order = sweep_order(sweeps[0].alphas)
        alphas = np.asarray(sweeps[0].alphas, dtype=float)[order]
        color = COLORS.get(c)
        for ax, rows in ((left, [s.delta_ssdc for s in sweeps]), (right, [s.fs["jpeg:5"] for s in sweeps])):
            arr = np.array(nan_if_none(rows), dtype=float)[:, order]
            m = np.nanmean(arr, 0)
            ax.plot(
                alphas,
                m,
                "-o",
                color=color,
                ms=4,
                label=f"{LABELS.get(c, c)} ({len(sweeps)} seed{'s' if len(sweeps) > 1 else ''})",
            )
            if len(sweeps) > 1:
                sd = np.nanstd(arr, 0, ddof=1)
                ax.fill_between(alphas, m - sd, m + sd, color=color, alpha=0.15, lw=0, label="_band")
                notes.add("band: ± std over seeds")
            elif ax is right and (band := (sweeps[0].fs_interval or {}).get("jpeg:5")):
                ci = np.array(nan_if_none(band), dtype=float)[order]
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


def _read_maps(path: Path) -> dict[str, Any] | None:
    """A run's ``maps.pt`` (mean maps of layers 0 and 1, normal and under RPI), or None with a warning when it is
    damaged (truncated, not a tensor file, other contents): the figure then leaves that run out."""
    import torch

    try:
        maps = torch.load(path, weights_only=True)
        ok = isinstance(maps, dict) and all(
            isinstance(maps.get(k), torch.Tensor) and maps[k].ndim == 3 and len(maps[k]) >= 2 for k in ("normal", "rpi")
        )
    except Exception as e:  # noqa: BLE001  a damaged file fed to the unpickler raises anything (EOFError, ...)
        ok, why = False, f"{type(e).__name__}"
    else:
        why = "not the mean maps of layers 0 and 1"
    if not ok:
        warnings.warn(
            f"{path} is damaged ({why}): its similarity maps are left out of the figure", RuntimeWarning, stacklevel=3
        )
        return None
    return maps


def fig_similarity_maps(out: Path, results: StudyResults, path: Path) -> bool:
    """Mean token-similarity maps of each condition's first seed: layers 0 and 1, normal and under RPI;
    diagonal masked (as in every map of the package), one colour scale and colour bar per condition."""
    from ...results.plotting import MAP_LABEL, show_map

    plt = _plt()
    by = by_condition(results)
    rows = []
    for c, runs in by.items():
        maps_file = out / runs[0].run_dir / "maps.pt"
        maps = _read_maps(maps_file) if maps_file.is_file() else None
        if maps is not None:
            rows.append((c, maps))
    if not rows:
        return False
    fig, axes = plt.subplots(len(rows), 4, figsize=(9, 2.2 * len(rows) + 0.4), squeeze=False, layout="constrained")
    for r, (c, maps) in enumerate(rows):
        panels = [
            (maps["normal"][0], "layer 0"),
            (maps["normal"][1], "layer 1"),
            (maps["rpi"][0], "layer 0, RPI"),
            (maps["rpi"][1], "layer 1, RPI"),
        ]
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


def fig_training(results: StudyResults, path: Path) -> bool:
    """SSDC under RPI per layer across training (one panel per condition), with top-1 on the monitor split."""
    plt = _plt()
    curves = [(c, seed_history(runs)) for c, runs in by_condition(results).items()]
    curves = [(c, h) for c, h in curves if h[0].size]
    if not curves:
        return False
    fig, axes = plt.subplots(
        1, len(curves), figsize=(3.4 * len(curves), 3.6), sharey=True, squeeze=False, layout="constrained"
    )
    cmap = plt.get_cmap("viridis")
    for ax, (c, (epochs, ssdc_l, top1, records)) in zip(axes[0], curves):
        L = ssdc_l.shape[1]
        ssdc_sd, top1_sd = seed_history_std(records)  # bands: mean ± std over seeds (none with one seed)
        for layer in range(L):
            color = cmap(layer / max(1, L - 1))
            ax.plot(
                epochs, ssdc_l[:, layer], color=color, lw=1.3, label=f"layer {layer}" if layer in (0, L - 1) else None
            )
            ax.fill_between(
                epochs,
                ssdc_l[:, layer] - ssdc_sd[:, layer],
                ssdc_l[:, layer] + ssdc_sd[:, layer],
                color=color,
                alpha=0.15,
                lw=0,
                label="_band",
            )
        held = any(rec.monitor == "heldout" for recs in records for rec in recs)
        ax.plot(epochs, top1, "--", color="0.45", lw=1, label="held-out top-1" if held else "val top-1")
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


def uniform_distance(grid: tuple[int, int] | list[int]) -> float:
    """The mean attention distance (patch units) of uniform attention over the patch keys of a ``grid``: the
    mean Euclidean distance between two patches, a patch with itself included (docs/attention.md#the-measures)."""
    rows, cols = np.meshgrid(np.arange(grid[0]), np.arange(grid[1]), indexing="ij")
    pos = np.stack([rows.ravel(), cols.ravel()], 1).astype(float)
    return float(np.sqrt(((pos[:, None, :] - pos[None, :, :]) ** 2).sum(-1)).mean())


def fig_attention_heads(results: StudyResults, path: Path) -> bool:
    """Mean attention distance per head across the measured layers, one panel per condition: each head of
    every seed a dot (filled without RPI, open under RPI, shifted apart), the mean over heads and seeds a
    line; dotted, uniform attention over the grid. False (nothing drawn) when no run has attention per head
    (results recorded before it was measured)."""
    plt = _plt()
    panels = [
        (c, [r.eval.attention for r in runs if r.eval.attention is not None])
        for c, runs in by_condition(results).items()
    ]
    panels = [(c, a) for c, a in panels if a]
    if not panels:
        return False
    fig, axes = plt.subplots(
        1, len(panels), figsize=(3.2 * len(panels) + 0.6, 3.6), sharey=True, squeeze=False, layout="constrained"
    )
    for ax, (c, summaries) in zip(axes[0], panels):
        color = COLORS.get(c)
        for key, shift, style in (
            ("mean_distance", -0.08, dict(color=color)),
            ("rpi_mean_distance", 0.08, dict(facecolors="none", edgecolors=color)),
        ):
            rows = [np.array(nan_if_none(getattr(a, key)), dtype=float) for a in summaries if getattr(a, key)]
            if not rows:
                continue
            x = np.asarray(summaries[0].layers, dtype=float)
            for v in rows:  # (layers, heads)
                ax.scatter(np.repeat(x + shift, v.shape[1]), v.ravel(), s=14, alpha=0.8, lw=0.8, **style)
            ax.plot(
                x + shift,
                np.nanmean(np.concatenate(rows, 1), 1),
                "-" if shift < 0 else "--",
                color=color,
                lw=1,
                label="without RPI" if shift < 0 else "under RPI",
            )
        ax.axhline(uniform_distance(summaries[0].grid), color="0.4", lw=0.8, ls=":", label="uniform attention")
        ax.set_xticks(summaries[0].layers)
        ax.set_title(LABELS.get(c, c))
        ax.set_xlabel("layer")
    axes[0][0].set_ylabel("mean attention distance (patches)")
    axes[0][0].legend(fontsize=7)
    _save(fig, path)
    return True
