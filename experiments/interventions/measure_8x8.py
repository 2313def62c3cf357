"""PE shuffle against RPI, the PE-shift curve and the image-grid curve on the committed 8 x 8 models.

The 20 runs of ``experiments/scaling/8x8-paper`` (no PE, APE, sincos, RoPE, RPT; seeds 0-3; micro ViTs at 64 px,
patch 8), each read as ``local-dir:experiments/scaling/8x8-paper/runs/<cond>_s<seed>/export``, on the first
``--max-images`` Imagenette validation images (top-1) and the first ``--probe-images`` of them (SSDC), with
``--permutations`` permutations per condition (seeds 0 .. K-1):

* ``measure_pe_shuffle`` (not for no PE: it has no encoding to move);
* ``measure_pe_shift`` at ``--shifts`` patches along both axes, edges clamped (not for no PE);
* ``measure_tile_shuffle`` at ``--grids`` tiles per side.

Every row goes to ``OUT/8x8-paper.csv`` as soon as its model is measured (a rerun skips the models there: nothing
is lost on an interruption); then ``OUT/summary.md`` (means over the seeds with their Student t intervals) and
two figures, ``FIGURES/interventions_tile_grid.png`` and ``FIGURES/interventions_pe_shift.png``. Definitions: docs/method.md#pe-shuffle-and-pe-shift
and docs/method.md#image-grid-shuffle; the results: docs/results.md#the-encoding-moved-pe-shuffle-pe-shift-and-the-image-grid.

    python experiments/interventions/measure_8x8.py --data imagenette2-320
"""

from __future__ import annotations

import argparse
import csv
import math
import time
from pathlib import Path

import numpy as np

CONDITIONS = ("nope", "ape", "sincos", "rope", "rpt")
FIELDS = (
    "cond",
    "seed",
    "measure",
    "condition",
    "value",
    "top1",
    "top1_low",
    "top1_high",
    "ssdc_content",
    "ssdc_content_low",
    "ssdc_content_high",
    "ssdc_encoding",
    "ssdc_encoding_low",
    "ssdc_encoding_high",
    "permutations",
    "ssdc_content_per_layer",
    "ssdc_encoding_per_layer",
)


def _rows(cond: str, seed: int, result) -> list[dict]:
    """The CSV rows of one :class:`~timm_posgeom.robustness.InterventionResult`."""
    out = []
    for r in result.rows:
        out.append(
            {
                "cond": cond,
                "seed": seed,
                "measure": result.measure,
                "condition": r.condition,
                "value": "" if r.value is None else r.value,
                "top1": r.top1,
                "top1_low": r.top1_ci[0],
                "top1_high": r.top1_ci[1],
                "ssdc_content": r.mean_content,
                "ssdc_content_low": r.mean_content_ci[0],
                "ssdc_content_high": r.mean_content_ci[1],
                "ssdc_encoding": r.mean_encoding,
                "ssdc_encoding_low": r.mean_encoding_ci[0],
                "ssdc_encoding_high": r.mean_encoding_ci[1],
                "permutations": r.replicates,
                "ssdc_content_per_layer": " ".join(f"{v:.4f}" for v in r.ssdc_content),
                "ssdc_encoding_per_layer": " ".join(f"{v:.4f}" for v in r.ssdc_encoding or []),
            }
        )
    return out


def measure_model(path: Path, cond: str, data, args) -> list:
    """The three measures of one run (two for no PE), as InterventionResults."""
    from timm_posgeom import create_model
    from timm_posgeom.robustness import measure_pe_shift, measure_pe_shuffle, measure_tile_shuffle

    model = create_model(f"local-dir:{path}").eval()
    kw = dict(
        max_images=args.max_images,
        probe_images=args.probe_images,
        rpi_permutations=args.permutations,
        batch_size=100,
        num_workers=0,
        seed=0,
        progress=False,
    )
    results = []
    if cond != "nope":
        results.append(measure_pe_shuffle(model, data, **kw))
        results.append(measure_pe_shift(model, data, args.shifts, direction="xy", **kw))
    results.append(measure_tile_shuffle(model, data, args.grids, **kw))
    return results


def _done(path: Path) -> set[tuple[str, int]]:
    if not path.exists():
        return set()
    with path.open() as f:
        return {(row["cond"], int(row["seed"])) for row in csv.DictReader(f)}


def run(args: argparse.Namespace) -> None:
    from timm_posgeom import load_split
    from timm_posgeom.app.weights import ensure_restored
    from timm_posgeom.data.eval_data import DecodedImages

    ensure_restored(["8x8-paper"], Path(__file__).resolve().parents[2])  # the weights live outside git
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    table = out / "8x8-paper.csv"
    done = _done(table)
    data = DecodedImages(load_split(args.data, "validation"), max(args.max_images, args.probe_images))
    for cond in CONDITIONS:
        for seed in range(4):
            if (cond, seed) in done:
                continue
            start = time.time()
            rows = [
                row
                for r in measure_model(Path(args.runs) / f"{cond}_s{seed}" / "export", cond, data, args)
                for row in _rows(cond, seed, r)
            ]
            new = not table.exists()
            with table.open("a", newline="") as f:
                writer = csv.DictWriter(f, FIELDS)
                if new:
                    writer.writeheader()
                writer.writerows(rows)
            print(f"{cond}_s{seed}: {time.time() - start:.0f} s", flush=True)
    summarise(table, out, Path(args.figures))


def _over_seeds(values: list[float]) -> tuple[float, float, float]:
    from timm_posgeom.results.intervals import t_interval

    mean, low, high = t_interval(np.asarray(values, dtype=float))
    return float(mean), float(low), float(high)


def _cell(values: list[float]) -> str:
    mean, low, high = _over_seeds(values)
    return "n/a" if not math.isfinite(mean) else f"{mean:.3f} [{low:.3f}, {high:.3f}]"


def _grouped(table: Path) -> dict[tuple[str, str, str], list[dict]]:
    groups: dict[tuple[str, str, str], list[dict]] = {}
    with table.open() as f:
        for row in csv.DictReader(f):
            groups.setdefault((row["measure"], row["condition"], row["cond"]), []).append(row)
    return groups


def summarise(table: Path, out: Path, figures: Path) -> None:
    """``summary.md``: per measure, condition and model kind, the mean over the 4 seeds with its t interval."""
    groups = _grouped(table)
    lines = ["| measure | condition | model | top-1 | SSDC content | SSDC encoding |", "|---|---|---|---|---|---|"]
    for (measure, condition, cond), rows in groups.items():
        cells = [_cell([float(r[k] or "nan") for r in rows]) for k in ("top1", "ssdc_content", "ssdc_encoding")]
        lines.append(f"| {measure} | {condition} | {cond} | " + " | ".join(cells) + " |")
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    _figure(groups, "tile_shuffle", "tiles per side (g x g grid)", figures / "interventions_tile_grid.png")
    _figure(groups, "pe_shift", "shift of the encoding (patches, both axes)", figures / "interventions_pe_shift.png")


def _figure(groups: dict, measure: str, xlabel: str, path: Path) -> None:
    """Top-1 and SSDC (content grid; dashed: the encoding grid) against the amount swept, mean over seeds."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.2, 3.2), layout="constrained")
    top1_ax, ssdc_ax = fig.subplots(1, 2)
    for i, cond in enumerate(CONDITIONS):
        keys = sorted(
            (k for k in groups if k[0] == measure and k[2] == cond), key=lambda k: float(groups[k][0]["value"])
        )
        if not keys:
            continue
        x = [float(groups[k][0]["value"]) for k in keys]
        for ax, field, style in (
            (top1_ax, "top1", "-"),
            (ssdc_ax, "ssdc_content", "-"),
            (ssdc_ax, "ssdc_encoding", "--"),
        ):
            stats = np.asarray([_over_seeds([float(r[field] or "nan") for r in groups[k]]) for k in keys])
            if np.isfinite(stats[:, 0]).any():
                ax.plot(x, stats[:, 0], style, marker="o", ms=3, color=f"C{i}", label=cond if style == "-" else None)
                ax.fill_between(x, stats[:, 1], stats[:, 2], color=f"C{i}", alpha=0.12, lw=0)
    top1_ax.set(xlabel=xlabel, ylabel="top-1", title="top-1 (mean of 4 seeds, 95% band)")
    ssdc_ax.set(xlabel=xlabel, ylabel="SSDC (mean over layers)", title="SSDC: content grid; dashed: encoding grid")
    for ax in (top1_ax, ssdc_ax):
        ax.title.set_fontsize(8)
        if measure == "tile_shuffle":
            ax.set_xscale("log", base=2)
            ax.set_xticks([1, 2, 4, 8], ["1", "2", "4", "8"])
    ssdc_ax.axhline(0, color="0.6", lw=0.5)
    top1_ax.legend(fontsize=7)
    fig.savefig(path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="Imagenette: a parquet folder, an ImageFolder tree or a Hub id")
    p.add_argument("--runs", default="experiments/scaling/8x8-paper/runs")
    p.add_argument("--out", default="experiments/interventions")
    p.add_argument("--figures", default="docs/figures")
    p.add_argument("--max-images", type=int, default=500)
    p.add_argument("--probe-images", type=int, default=100)
    p.add_argument("--permutations", type=int, default=5)
    p.add_argument("--shifts", type=lambda t: [float(v) for v in t.split(",")], default=[0, 0.25, 0.5, 1, 2, 3])
    p.add_argument("--grids", type=lambda t: [int(v) for v in t.split(",")], default=[1, 2, 4, 8])
    run(p.parse_args())


if __name__ == "__main__":
    main()
