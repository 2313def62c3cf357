"""Zoo throughput on this machine: models per hour, with the images decoded once for the zoo (and resized
once per input configuration) against decoding them again for every model.

Usage::

    python benchmarks/bench_zoo.py [--data DATASET_FOLDER_OR_HUB_ID] [--images 200] [--models M1,M2,...]

Each way runs ``posgeom zoo`` on the same random-init timm models (no weights needed) into a fresh folder,
in one process, one after the other, twice, alternating (shared, per-model, shared, per-model), and keeps
each way's faster run. The zoo measures SSDC, SSDC under RPI and JPEG/blur fragility per model, so each
image is read by 3 loaders a model (4 with an alpha sweep). Both ways give the same zoo.csv (checked).
The data defaults to the Imagenette validation split beside the checkout (JPEGs at 224 px, ImageNet's
are larger and decode slower).
"""

from __future__ import annotations

import argparse
import csv
import os
import tempfile
import time
from pathlib import Path

import torch

from timm_posgeom.cli import main

HERE = Path(__file__).resolve().parent
DEFAULT_DATA = HERE.parent.parent / "shared" / "data" / "imagenette"
MODELS = "vit_tiny_patch16_224,deit_tiny_patch16_224,vit_small_patch16_224"


def _zoo(models: list[str], data: str, images: int, out: Path, per_model: bool, workers: int) -> float:
    args = [
        "zoo",
        *models,
        "--data",
        data,
        "--out",
        str(out),
        "--no-pretrained",
        "--max-images",
        str(images),
        "--batch-size",
        "50",
        "--num-workers",
        str(workers),
        "--no-progress",
    ]
    started = time.perf_counter()
    code = main(args + (["--decode-per-model"] if per_model else []))
    assert code == 0, f"posgeom zoo exited {code}"
    return time.perf_counter() - started


def _table(out: Path) -> list[dict[str, str]]:
    with open(out / "zoo.csv", newline="") as f:
        return [{k: v for k, v in row.items() if k != "elapsed_s"} for row in csv.DictReader(f)]


def run() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=str(DEFAULT_DATA))
    parser.add_argument("--images", type=int, default=200)
    parser.add_argument("--models", default=MODELS)
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args()
    models = args.models.split(",")
    print(
        f"{len(models)} models ({', '.join(models)}), {args.images} images of {args.data}, "
        f"{torch.get_num_threads()} torch threads, {args.workers} loader worker(s), {os.cpu_count()} cpus"
    )
    best: dict[bool, float] = {}
    tables: dict[bool, list[dict[str, str]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for k, per_model in enumerate((False, True, False, True)):
            out = Path(tmp) / f"zoo{k}"
            seconds = _zoo(models, args.data, args.images, out, per_model, args.workers)
            best[per_model] = min(best.get(per_model, float("inf")), seconds)
            tables[per_model] = _table(out)
            print(f"  {'decode per model' if per_model else 'shared decode   '}: {seconds:7.1f} s")
    assert tables[False] == tables[True], "the two ways gave different zoo.csv"
    for per_model, label in ((False, "shared decode (default)"), (True, "decode per model")):
        print(f"{label:>24}: {best[per_model]:7.1f} s, {3600 * len(models) / best[per_model]:7.1f} models/hour")
    print(f"{'speed-up':>24}: {best[True] / best[False]:.2f}x (same zoo.csv)")


if __name__ == "__main__":
    run()
