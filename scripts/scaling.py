"""The scaling answer (issue 16): delta SSDC under RPI and the APE alpha sweep across studies, next to the paper.

    python scripts/scaling.py "8x8 timm=experiments/scaling/8x8-timm" "8x8 paper=experiments/scaling/8x8-paper" \\
        "14x14 paper=experiments/scaling/14x14-paper" --figure docs/figures/scaling.png

Each argument is ``LABEL=STUDY_DIR`` (a ``posgeom study`` output with ``results.json``). Prints two markdown
tables: per study and condition, clean top-1, delta SSDC under RPI at alpha 1 (mean ± std over seeds, ± std
over RPI permutations and the 95% interval over both, as the claims decide it; with the seed and permutation
counts) and the training wall time per model; and the APE alpha sweep (delta SSDC and JPEG q5 FS per alpha), with the paper's
values as the last row. The figure draws the APE sweep of every study (mean line, band = min..max over
seeds) with the paper's points. A study still running is read as it stands (its finished runs only).

The width ladder (issue 32): with ``--width-figure PATH`` the studies are read as width ladders, each study at the
width its runs' recipes give (``model_kwargs.embed_dim``, else the model's own). A label ``NAME:...`` puts the
study on ladder NAME (e.g. ``cpu:`` and ``gpu:`` for two ways of training the same widths); without a colon
there is one ladder. It prints delta SSDC under RPI for APE and no PE per ladder and width and draws it against
width with the paper's point (ViT-S, width 384), beside the PE-to-content norm ratio and the position table's
own SSDC over training (APE runs that logged them).

    python scripts/scaling.py "cpu:w64=experiments/scaling/8x8-w64-paper" "cpu:w128=experiments/scaling/8x8-paper" \
        "cpu:w192=experiments/scaling/8x8-w192-paper" "gpu:w128=experiments/scaling/8x8-w128-paper-gpu" \
        "gpu:w192=experiments/scaling/8x8-w192-paper-gpu" "gpu:w256=experiments/scaling/8x8-w256-paper-gpu" \
        "gpu:w384=experiments/scaling/8x8-w384-paper-gpu" --width-figure docs/figures/width.png
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

from timm_posgeom.app.records import RecordError, StudyResults
from timm_posgeom.app.report.claims import LABELS, rpi_cube, spread, spread_sp

# The paper (arXiv 2606.00124), ViT-S/16 on ImageNet-100, 4 seeds: its APE alpha sweep as its appendix table
# gives it (delta SSDC under RPI, layer 1 - layer 0, mean over 4 seeds, at alpha 1.0 .9 ... .1; the paper has
# no alpha 0 point) and the JPEG q5 FS it reports (0.43, 0.48, 0.60, 0.63, rising to 0.65 at the smallest
# alpha), and sincos' delta SSDC at alpha 1 and 0.
PAPER_APE_DELTA = {
    1.0: 0.4725,
    0.9: 0.3850,
    0.8: 0.3125,
    0.7: 0.1845,
    0.6: 0.0975,
    0.5: 0.0475,
    0.4: 0.0,
    0.3: 0.0,
    0.2: 0.0,
    0.1: 0.0,
}
PAPER_APE_FS = {1.0: 0.43, 0.8: 0.48, 0.5: 0.60, 0.4: 0.63, 0.1: 0.65}
PAPER_SINCOS_DELTA = (0.29, 0.022)
SHIFT = "jpeg:5"


def _num(v) -> float:
    return math.nan if v is None else float(v)


def _cell(values: list[float], digits: int = 3) -> str:
    s = spread(values)
    if s.n == 0:
        return "n/a"
    return f"{s.mean:.{digits}f}" if s.n == 1 else f"{s.mean:.{digits}f} ± {s.std:.{digits}f}"


def rpi_delta_spread(runs: list) -> tuple[str, int]:
    """Delta SSDC under RPI over seeds x RPI permutations, as the claims decide it (``rpi_cube``: the
    permutations every run has; a run recorded before several were drawn counts as one): its text (mean ± std
    over seeds (permutations ± std over permutations) [95% interval]) and the permutation count."""
    cube = rpi_cube(runs)
    if cube.ndim != 3 or cube.shape[2] < 2:
        return "n/a", 0
    s = spread_sp(cube[:, :, 1] - cube[:, :, 0])
    return ("n/a" if s.n == 0 else s.text()), s.permutations


def load(spec: str) -> tuple[str, StudyResults]:
    label, _, where = spec.partition("=")
    if not where:
        raise SystemExit(f"expected LABEL=STUDY_DIR, got {spec!r}")
    path = Path(where) / "results.json"
    if not path.is_file():
        raise SystemExit(f"{path}: no results yet (run `posgeom study ... --out {where}` first)")
    try:
        return label, StudyResults.read(path)
    except RecordError as e:  # damaged or edited by hand: one line, exit 2, as the posgeom commands say it
        print(
            f"scaling.py: error: {e} (restore it, or run `posgeom study ... --resume` to write it again)",
            file=sys.stderr,
        )
        raise SystemExit(2) from None


def condition_table(studies: list[tuple[str, StudyResults]]) -> list[str]:
    rows = [
        "| study | condition | seeds | RPI permutations | clean top-1 | delta SSDC under RPI (alpha 1) "
        "| SSDC under RPI, layers 0..L | training min per model |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, res in studies:
        by: dict[str, list] = {}
        for run in res.runs:
            if run.eval.ssdc is not None:
                by.setdefault(run.condition, []).append(run)
        for cond, runs in by.items():
            layers = np.array([[_num(v) for v in r.eval.ssdc.rpi_per_layer] for r in runs])
            delta, perms = rpi_delta_spread(runs)
            rows.append(
                f"| {label} | {LABELS.get(cond, cond)} | {len(runs)} | {perms} | "
                f"{_cell([_num(r.eval.clean_accuracy) for r in runs])} | {delta} | "
                + " ".join(f"{m:.3f}" for m in np.nanmean(layers, 0))
                + " | "
                + _cell([_num(r.train.time_s) / 60 for r in runs], 0)
                + " |"
            )
    return rows


def _sweeps(res: StudyResults):
    return [r.eval.alpha_sweep for r in res.runs if r.condition == "ape" and r.eval.alpha_sweep]


def sweep_table(studies: list[tuple[str, StudyResults]]) -> list[str]:
    alphas = sorted({a for _, res in studies for s in _sweeps(res) for a in s.alphas}, reverse=True)
    head = ", ".join(f"{a:g}" for a in alphas)
    rows = [f"| APE, study | seeds | delta SSDC at alpha {head} | JPEG FS at alpha {head} |", "|---|---|---|---|"]
    for label, res in studies:
        sweeps = _sweeps(res)
        if not sweeps:
            continue
        delta = [_cell([_num(s.delta_ssdc[s.alphas.index(a)]) for s in sweeps if a in s.alphas]) for a in alphas]
        fs = [_cell([_num(s.fs[SHIFT][s.alphas.index(a)]) for s in sweeps if a in s.alphas]) for a in alphas]
        rows.append(f"| {label} | {len(sweeps)} | {' / '.join(delta)} | {' / '.join(fs)} |")
    rows.append(
        "| the paper (ViT-S/16, 14 x 14, IN-100) | 4 | "
        + " / ".join(_paper_cell(PAPER_APE_DELTA, a) for a in alphas)
        + " | "
        + " / ".join(_paper_cell(PAPER_APE_FS, a) for a in alphas)
        + " |"
    )
    return rows


def _paper_cell(values: dict[float, float], alpha: float) -> str:
    """The paper's value at ``alpha`` ('-' where its table has none, e.g. alpha 0)."""
    match = [v for a, v in values.items() if abs(a - alpha) < 1e-9]
    return f"{match[0]:g}" if match else "-"


def paper_sweep_lines() -> list[str]:
    """The paper's APE sweep in full, as its table gives it."""
    alphas = sorted(PAPER_APE_DELTA, reverse=True)
    return [
        "the paper's APE sweep (ViT-S/16, IN-100, 4 seeds): alpha "
        + " ".join(f"{a:g}" for a in alphas)
        + " -> delta SSDC "
        + " ".join(f"{PAPER_APE_DELTA[a]:g}" for a in alphas)
        + "; JPEG q5 FS "
        + ", ".join(f"{PAPER_APE_FS[a]:g} at {a:g}" for a in sorted(PAPER_APE_FS, reverse=True))
    ]


def figure(studies: list[tuple[str, StudyResults]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for label, res in studies:
        sweeps = _sweeps(res)
        if not sweeps:
            continue
        alphas = np.array(sweeps[0].alphas, dtype=float)
        for ax, values in ((axes[0], [s.delta_ssdc for s in sweeps]), (axes[1], [s.fs[SHIFT] for s in sweeps])):
            arr = np.array([[_num(v) for v in vals] for vals in values])
            line = ax.plot(alphas, np.nanmean(arr, 0), marker="o", label=f"{label} ({len(sweeps)} seeds)")[0]
            if len(sweeps) > 1:
                ax.fill_between(alphas, np.nanmin(arr, 0), np.nanmax(arr, 0), color=line.get_color(), alpha=0.2)
    for ax, paper in ((axes[0], PAPER_APE_DELTA), (axes[1], PAPER_APE_FS)):
        pa = sorted(paper)
        ax.plot(pa, [paper[a] for a in pa], "k--s", label="the paper (ViT-S/16, IN-100)")
        ax.set_xlabel("alpha (PE scale at inference)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("delta SSDC under RPI (layer 1 - layer 0)")
    axes[1].set_ylabel("JPEG q5 fragility score")
    axes[0].set_title("APE: delta SSDC against alpha")
    axes[1].set_title("APE: fragility against alpha")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    print(f"figure: {path}")


def width_of(run_dir: Path) -> int:
    """The embedding width of a study run: its recipe's ``model_kwargs.embed_dim``, else the model's own."""
    from timm_posgeom.app.rundir import RunFileError, read_yaml_file

    try:
        recipe = read_yaml_file(run_dir / "recipe.yaml", "restore the run's recipe")
    except RunFileError as e:  # one line, exit 2, as the posgeom commands say it
        print(f"scaling.py: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    kwargs = recipe.get("model_kwargs") if isinstance(recipe.get("model_kwargs"), dict) else {}
    width = kwargs.get("embed_dim")
    if width is None:
        import timm

        import timm_posgeom  # noqa: F401  (registers the models)

        width = timm.create_model(recipe["model"], pretrained=False).embed_dim
    return int(width)


def ladder(studies: list[tuple[str, StudyResults]], dirs: list[Path]) -> dict[int, dict[str, list]]:
    """width -> condition -> [(delta SSDC under RPI, run dir), ...] over the APE and no-PE runs measured."""
    out: dict[int, dict[str, list]] = {}
    for (_, res), where in zip(studies, dirs):
        for run in res.runs:
            if run.condition in ("ape", "nope") and run.eval.ssdc is not None:
                run_dir = where / "runs" / f"{run.condition}_s{run.seed}"
                out.setdefault(width_of(run_dir), {}).setdefault(run.condition, []).append(
                    (_num(run.eval.ssdc.rpi_delta), run_dir)
                )
    return dict(sorted(out.items()))


def ladders(studies: list[tuple[str, StudyResults]], dirs: list[Path]) -> dict[str, dict[int, dict[str, list]]]:
    """ladder name (a label's part before ``:``; ``""`` without one) -> its :func:`ladder`, in the order given."""
    groups: dict[str, list[int]] = {}
    for i, (label, _) in enumerate(studies):
        groups.setdefault(label.split(":", 1)[0] if ":" in label else "", []).append(i)
    return {name: ladder([studies[i] for i in idx], [dirs[i] for i in idx]) for name, idx in groups.items()}


def width_table(by_ladder: dict[str, dict[int, dict[str, list]]]) -> list[str]:
    rows = [
        "| ladder | width | heads | APE delta SSDC under RPI | no PE (the floor) | seeds (APE / no PE) |",
        "|---|---|---|---|---|---|",
    ]
    for name, widths in by_ladder.items():
        for width, by in widths.items():
            ape, nope = by.get("ape", []), by.get("nope", [])
            rows.append(
                f"| {name or '-'} | {width} | {width // 32} | {_cell([d for d, _ in ape])} "
                f"| {_cell([d for d, _ in nope])} | {len(ape)} / {len(nope)} |"
            )
    rows.append(f"| the paper (ViT-S/16, IN-100, 14 x 14) | 384 | 8 (size 48) | {PAPER_APE_DELTA[1.0]} | - | 4 / - |")
    return rows


def _history(run_dir: Path, key: str) -> tuple[list[int], list[float]]:
    from timm_posgeom.app.train import read_metrics

    steps, values = [], []
    path = run_dir / "metrics.jsonl"
    for row in read_metrics(path) if path.is_file() else []:  # damaged lines skipped, said
        if row.get("kind") == "train" and isinstance(row.get(key), (int, float)):
            steps.append(row["step"])
            values.append(float(row[key]))
    return steps, values


def width_figure(by_ladder: dict[str, dict[int, dict[str, list]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    styles = ["-", "--", "-.", ":"]
    every = sorted({w for widths in by_ladder.values() for w in widths})
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    ax = axes[0]
    for k, (name, widths) in enumerate(by_ladder.items()):
        for cond, marker in (("ape", "o"), ("nope", "s")):
            xs = [w for w in widths if widths[w].get(cond)]
            means = [np.mean([d for d, _ in widths[w][cond]]) for w in xs]
            label = f"{LABELS.get(cond, cond)}{f' ({name})' if name else ''}: mean over seeds"
            ax.plot(
                xs,
                means,
                marker=marker,
                linestyle=styles[k % len(styles)],
                label=label,
                color="C0" if cond == "ape" else "C1",
            )
            for w in xs:
                ax.scatter([w] * len(widths[w][cond]), [d for d, _ in widths[w][cond]], s=12, color="grey", zorder=3)
    ax.scatter([384], [PAPER_APE_DELTA[1.0]], marker="*", s=160, color="k", label="the paper (ViT-S/16, IN-100)")
    ax.set_xlabel("width (embedding dimension; head size 32, depth 4, 8 x 8 tokens)")
    ax.set_ylabel("delta SSDC under RPI (layer 1 - layer 0)")
    ax.set_title("delta SSDC against width (grey: each seed)")
    ax.legend(fontsize=7)
    for ax, key, label in (
        (axes[1], "pe_norm_ratio", "PE-to-content norm ratio"),
        (axes[2], "pe_ssdc", "the position table's own SSDC"),
    ):
        for k, (name, widths) in enumerate(by_ladder.items()):
            for width, by in widths.items():
                labelled = False  # the first run that logged the key names the width (earlier seeds may not have)
                for _, run_dir in by.get("ape", []):
                    steps, values = _history(run_dir, key)
                    if steps:
                        ax.plot(
                            steps,
                            values,
                            linestyle=styles[k % len(styles)],
                            label=None if labelled else f"width {width}{f' ({name})' if name else ''}",
                            color=plt.cm.viridis(every.index(width) / max(1, len(every) - 1)),
                        )
                        labelled = True
        ax.set_xlabel("training step")
        ax.set_ylabel(label)
        ax.set_title(f"APE: {label} over training")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "not logged by these runs", ha="center", transform=ax.transAxes)
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    print(f"figure: {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("studies", nargs="+", help="LABEL=STUDY_DIR")
    parser.add_argument("--figure", type=Path, default=None, help="PNG of the APE sweeps against the paper's")
    parser.add_argument(
        "--width-figure",
        type=Path,
        default=None,
        help="read the studies as a width ladder: print its table and draw this PNG",
    )
    args = parser.parse_args()
    studies = [load(s) for s in args.studies]
    if args.width_figure:
        by_ladder = ladders(studies, [Path(s.partition("=")[2]) for s in args.studies])
        print("\n".join(width_table(by_ladder)))
        width_figure(by_ladder, args.width_figure)
        return
    print("\n".join(condition_table(studies)))
    print()
    print("\n".join(sweep_table(studies)))
    print("\n".join(["", *paper_sweep_lines()]))
    print(f"\n(the paper's sincos delta SSDC: {PAPER_SINCOS_DELTA[0]} at alpha 1, {PAPER_SINCOS_DELTA[1]} at 0)")
    if args.figure:
        figure(studies, args.figure)


if __name__ == "__main__":
    main()
