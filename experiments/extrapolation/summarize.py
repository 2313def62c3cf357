"""The summary of experiments/extrapolation (run.sh): per variant, mode and input size, the mean over seeds.

Reads every runs/<variant>_s<seed>/extrapolate.json and writes beside run.sh:

* summary.csv: per (variant, mode, size) the seeds measured, then for top-1, delta SSDC under RPI, the last layer's
  SSDC (clean and under RPI), attention entropy over log T and mean attention distance (patches): the mean over the
  seeds and its Student t 95% interval (with one seed: that seed's own interval where the row has one);
* summary.md: the same as a markdown table (docs/results.md quotes it);
* the figure: top-1, delta SSDC and attention entropy against the scale, one line per variant and mode, written
  to ``--figure`` (default docs/figures/extrapolation.png, where docs/results.md shows it).

Run from the repository root: ``python experiments/extrapolation/summarize.py``.
"""

from __future__ import annotations

import argparse
import csv
import io
import math
from pathlib import Path

import numpy as np

from timm_posgeom.resolution import ExtrapolationResult, extrapolation_figure
from timm_posgeom.results.intervals import t_interval
from timm_posgeom.results.jsonio import write_atomic

HERE = Path(__file__).resolve().parent
FIGURE = HERE.parents[1] / "docs" / "figures" / "extrapolation.png"
MEASURES = {  # column -> (the row's value, its own interval or None)
    "top1": (lambda r: r.top1, lambda r: r.top1_ci),
    "delta_ssdc": (lambda r: r.delta_ssdc, lambda r: r.delta_ssdc_ci),
    "ssdc_last": (lambda r: r.ssdc[-1], lambda r: r.ssdc_ci[-1]),
    "rpi_ssdc_last": (lambda r: r.rpi_ssdc[-1], lambda r: r.rpi_ssdc_ci[-1]),
    "entropy_ratio_last": (lambda r: r.entropy[-1] / r.uniform_entropy, None),
    "mean_distance_last": (lambda r: r.mean_distance[-1], None),
}
ORDER = ("nope", "ape", "rpt", "sincos", "rope")


def _summary(results: dict[str, list[ExtrapolationResult]]) -> list[dict]:
    lines = []
    for variant in sorted(results, key=ORDER.index):
        group = results[variant]
        keys = dict.fromkeys(r.key for res in group for r in res.rows)
        for mode in dict.fromkeys(m for _, m in keys):
            for size in sorted(s for s, m in keys if m == mode):
                rows = [res.row(size, mode) for res in group if (size, mode) in {r.key for r in res.rows}]
                line = {"variant": variant, "mode": mode, "size": size, "scale": rows[0].scale, "seeds": len(rows)}
                for name, (value, interval) in MEASURES.items():
                    values = np.array([value(r) for r in rows], dtype=float)
                    mean, low, high = (float(v) for v in t_interval(values))
                    if len(rows) == 1:
                        low, high = interval(rows[0]) if interval is not None else (math.nan, math.nan)
                    line.update({name: mean, f"{name}_low": low, f"{name}_high": high})
                lines.append(line)
    return lines


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return "nan" if not math.isfinite(value) else f"{value:.4g}"
    return str(value)


def _markdown(lines: list[dict]) -> str:
    def ci(line: dict, name: str) -> str:
        return f"{line[name]:.3f} [{line[name + '_low']:.3f}, {line[name + '_high']:.3f}]"

    out = [
        "| variant | mode | size | scale | seeds | top-1 [95% CI] | delta SSDC under RPI [95% CI] | RPI SSDC last "
        "| SSDC last | entropy / log T last | mean distance last |",
        "|" + "---|" * 11,
    ]
    for line in lines:
        out.append(
            f"| {line['variant']} | {line['mode']} | {line['size']} | {line['scale']:g} | {line['seeds']} "
            f"| {ci(line, 'top1')} | {ci(line, 'delta_ssdc')} | {line['rpi_ssdc_last']:.3f} | {line['ssdc_last']:.3f} "
            f"| {line['entropy_ratio_last']:.3f} | {line['mean_distance_last']:.2f} |"
        )
    return "\n".join(out).replace("nan", "n/a") + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--figure", type=Path, default=FIGURE, help="where the figure goes (default: %(default)s)")
    figure = parser.parse_args().figure
    paths = sorted((HERE / "runs").glob("*_s*/extrapolate.json"))
    results: dict[str, list[ExtrapolationResult]] = {}
    for path in paths:
        results.setdefault(path.parent.name.rsplit("_s", 1)[0], []).append(ExtrapolationResult.read(path))
    lines = _summary(results)
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(lines[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows([{k: _fmt(v) for k, v in line.items()} for line in lines])
    write_atomic(HERE / "summary.csv", buffer.getvalue())
    write_atomic(HERE / "summary.md", _markdown(lines))
    flat = [res for variant in sorted(results, key=ORDER.index) for res in results[variant]]
    labels = [variant for variant in sorted(results, key=ORDER.index) for _ in results[variant]]
    title = f"8x8-paper variants, {len(paths)} runs: mean over seeds, 95% intervals"
    extrapolation_figure(flat, labels, path=figure, title=title)
    print(f"{len(paths)} runs: wrote summary.csv and summary.md in {HERE}, and {figure}")


if __name__ == "__main__":
    main()
