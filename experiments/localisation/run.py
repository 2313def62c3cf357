"""Causal localisation on the committed 8 x 8 models of ``experiments/scaling/8x8-paper`` (docs/results.md).

    python experiments/localisation/run.py --data imagenette2-320            # every condition, seeds 0-3
    python experiments/localisation/run.py --data imagenette2-320 --conditions ape,rope --seeds 0
    python experiments/localisation/run.py --data imagenette2-320 --conditions ape,rope --measures patching \
        --patch update --out experiments/localisation/8x8-paper-update   # each block's own update patched

For each run ``<cond>_s<seed>`` (no PE, APE, sincos, RoPE, RPT): activation patching (residual stream, the first
``--images`` validation images, ``--permutations`` RPI permutations), the PE imprint (8 constant colours),
the position probe's directions ablated per block (probe fitted on the first ``--images`` training images,
measured on the validation images) and the CKA of each block at alpha 1 against alpha 0. Each model's numbers
go to ``8x8-paper/models/<run>.json`` as it finishes, every number with its interval (a rerun skips the models
done); then ``by_condition.csv`` (the mean over seeds of each number, with a Student t 95% interval over seeds)
and, when the four measures ran, the figure ``docs/figures/localisation_8x8.png``.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
STUDY = ROOT / "experiments" / "scaling" / "8x8-paper"
OUT = HERE / "8x8-paper"
FIGURE = ROOT / "docs" / "figures" / "localisation_8x8.png"
CONDITIONS = ("nope", "ape", "sincos", "rope", "rpt")
# the per-layer fields kept in the records (the interval beside each)
FIELDS = {
    "patching": ("top1_restored", "ssdc_restored", "top1_patched", "ssdc_patched"),
    "imprint": ("ssdc",),
    "ablation": ("top1_drop", "top1_drop_control", "ssdc_drop", "ssdc_drop_control"),
    "cka": ("cka",),
}
SCALARS = {"patching": ("top1_clean", "top1_rpi", "ssdc_clean", "ssdc_rpi"), "ablation": ("top1_clean", "ssdc_clean")}


def _compact(result) -> dict:
    """The record of one model: per measure, its layers, the kept fields with their intervals, its settings."""
    out = {"settings": result.settings}
    for name, r in result.measures().items():
        entry = {"layers": r.layers, "settings": r.settings}
        for key in FIELDS[name] + SCALARS.get(name, ()):
            low, high = r.intervals.get(key, (np.nan, np.nan))
            entry[key] = [np.asarray(v, dtype=float).tolist() for v in (r.values[key], low, high)]
        out[name] = entry
    return _rounded(json.loads(json.dumps(out, default=float).replace("NaN", "null")))


def _dump(record: dict) -> str:
    """JSON with one line per measure (small, and a diff shows which measure changed)."""
    return "{\n" + ",\n".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in record.items()) + "\n}\n"


def _rounded(value):
    """Floats to 5 significant digits (the records stay small; every number is far less precise than that)."""
    if isinstance(value, float):
        return float(f"{value:.5g}")
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    return value


def measure(run: str, args: argparse.Namespace, validation, train) -> dict:
    from timm_posgeom.data.eval_data import eval_loader
    from timm_posgeom.data.labels import match_labels
    from timm_posgeom.localisation import localise
    from timm_posgeom.measuring.settings import MeasureSettings
    from timm_posgeom.models.factory import create_model

    model = create_model(f"local-dir:{STUDY / 'runs' / run / 'export'}").eval()
    loader = eval_loader(model, match_labels(model, validation, "by-name"), max_images=args.images, num_workers=0)
    fit = eval_loader(model, train, max_images=args.images, num_workers=0)
    settings = MeasureSettings(seed=0, rpi_permutations=args.permutations, progress=False)
    start = time.perf_counter()
    result = localise(model, loader, settings, fit=fit, measures=tuple(args.measures.split(",")), patch=args.patch)
    result.settings.update(run=run, images=args.images, elapsed_s=round(time.perf_counter() - start, 1))
    return _compact(result)


def _rows(records: dict[str, dict]) -> list[dict]:
    rows = []
    for run, rec in sorted(records.items()):
        for name, entry in rec.items():
            if name == "settings":
                continue
            for key in FIELDS[name]:
                for layer, value, low, high in zip(entry["layers"], *entry[key]):
                    rows.append(dict(run=run, measure=name, field=key, layer=layer, value=value, low=low, high=high))
            for key in SCALARS.get(name, ()):
                value, low, high = entry[key]
                rows.append(dict(run=run, measure=name, field=key, layer="", value=value, low=low, high=high))
    return rows


def _by_condition(rows: list[dict]) -> list[dict]:
    from timm_posgeom.results.intervals import t_interval

    groups: dict[tuple, list[float]] = {}
    for r in rows:
        cond = r["run"].rsplit("_s", 1)[0]
        groups.setdefault((cond, r["measure"], r["field"], r["layer"]), []).append(
            np.nan if r["value"] is None else float(r["value"])
        )
    out = []
    for (cond, name, key, layer), values in groups.items():
        mean, low, high = (float(v) for v in t_interval(np.array(values)))
        out.append(
            dict(condition=cond, measure=name, field=key, layer=layer, seeds=len(values), mean=mean, low=low, high=high)
        )
    return out


def _write_csv(path: Path, rows: list[dict]) -> None:
    def fmt(v):
        return (
            ""
            if v is None or (isinstance(v, float) and not np.isfinite(v))
            else (f"{v:.4g}" if isinstance(v, float) else v)
        )

    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows({k: fmt(v) for k, v in r.items()} for r in rows)


def _figure(summary: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        ("patching", "top1_restored", "top-1 gap restored by patching"),
        ("imprint", "ssdc", "PE imprint: SSDC of constant images"),
        ("ablation", "ssdc_drop", "SSDC drop, probe directions ablated"),
        ("cka", "cka", "CKA, alpha 1 vs 0"),
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(13, 3.0), layout="constrained")
    for ax, (name, key, title) in zip(axes, panels):
        if not any(r["measure"] == name for r in summary):
            ax.set_visible(False)
            continue
        for cond in CONDITIONS:
            pts = [r for r in summary if r["condition"] == cond and r["measure"] == name and r["field"] == key]
            if not pts:
                continue
            x = np.array([int(r["layer"]) for r in pts])
            y, lo, hi = (np.array([r[k] for r in pts], dtype=float) for k in ("mean", "low", "high"))
            err = np.nan_to_num(np.abs(np.stack([y - lo, hi - y])))
            ax.errorbar(x, y, yerr=err, marker="o", ms=3, capsize=2, lw=1, label=cond)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("block (-1: the embedding)", fontsize=8)
        ax.axhline(0, color="0.7", lw=0.6)
    axes[0].legend(fontsize=7)
    fig.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="Imagenette: a parquet folder or the imagenette2-320 tree")
    parser.add_argument("--conditions", default=",".join(CONDITIONS))
    parser.add_argument("--seeds", default="0,1,2,3")
    parser.add_argument("--images", type=int, default=256, help="validation images measured, training images fitted")
    parser.add_argument("--permutations", type=int, default=5, help="RPI permutations of the patching")
    parser.add_argument("--out", type=Path, default=OUT, help="where the records go (default: beside this script)")
    parser.add_argument("--measures", default="patching,imprint,ablation,cka", help="which measures (default all)")
    parser.add_argument("--patch", default="residual", choices=("residual", "update"), help="the patching's mode")
    parser.add_argument("--figure", type=Path, default=FIGURE, help="where the figure goes (docs/results.md shows it)")
    args = parser.parse_args(argv)
    out = args.out
    from timm_posgeom.app.weights import ensure_restored
    from timm_posgeom.data import load_split

    ensure_restored(["8x8-paper"], ROOT)  # the committed runs' weights live outside git
    torch.set_num_threads(max(1, torch.get_num_threads()))
    validation = load_split(args.data, "validation", subset=args.images)
    train = load_split(args.data, "train", subset=args.images)
    (out / "models").mkdir(parents=True, exist_ok=True)
    runs = [f"{c}_s{s}" for c in args.conditions.split(",") for s in args.seeds.split(",")]
    for run in runs:
        path = out / "models" / f"{run}.json"
        if path.is_file():
            continue
        record = measure(run, args, validation, train)
        path.write_text(_dump(record))
        print(f"{run}: {record['settings']['elapsed_s']} s", file=sys.stderr)
    records = {p.stem: json.loads(p.read_text()) for p in sorted((out / "models").glob("*.json"))}
    rows = _rows(records)
    summary = _by_condition(rows)
    _write_csv(out / "by_condition.csv", summary)
    if set(args.measures.split(",")) == set(FIELDS):  # the figure of all four measures
        _figure(summary, args.figure)
    print(f"{len(records)} models: {out / 'models'}, {out / 'by_condition.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
