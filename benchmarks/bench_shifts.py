"""Throughput of each shift at 224 px next to ViT-S/16 forward throughput on this machine's CPU.

Usage::

    python benchmarks/bench_shifts.py [--data DATASET_FOLDER_OR_HUB_ID] [--images 48] [--batch 32]

Shifts are timed the way ``fragility`` runs them: per image, in a DataLoader worker (one torch
thread per worker, as PyTorch sets in workers). The forward pass uses torch's default threads.
With the default loader settings (``min(4, cpus - 1)`` workers), each worker decodes, resizes and
applies every shift to each image while the model forwards ``1 + len(shifts)`` copies of it, so
the loader is the bottleneck when ``workers / (t_load + sum t_shift) < forward_rate / (1 + S)``.
Without ``--data`` the images are synthetic 256 x 256 textures stored as JPEG (decode included).
"""

from __future__ import annotations

import argparse
import io
import os
import time

import numpy as np
import PIL.Image
import torch

import timm_posgeom  # noqa: F401  (registers the models)
from timm_posgeom.data.eval_data import default_workers
from timm_posgeom.data.shifts import parse_shift
from timm_posgeom.data.transforms import resize_transform

SHIFTS = (
    "jpeg:5",
    "blur:2.5:5",
    "imagenet-c:jpeg_compression:5",
    "imagenet-c:gaussian_blur:1",
    "imagenet-c:gaussian_blur:3",
    "imagenet-c:gaussian_blur:5",
)
PAPER = ("jpeg:5", "blur:2.5:5")


def _synthetic_jpegs(n: int) -> list[bytes]:
    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        yy, xx = np.mgrid[0:256, 0:256]
        base = np.stack([128 + 90 * np.sin(xx / (4 + i % 7) + c) * np.cos(yy / 6 - c) for c in range(3)], -1)
        img = PIL.Image.fromarray(np.clip(base + rng.normal(0, 20, base.shape), 0, 255).astype(np.uint8))
        buf = io.BytesIO()
        img.save(buf, format="JPEG", quality=90)
        out.append(buf.getvalue())
    return out


def _dataset_jpegs(source: str, split: str, n: int) -> list[bytes]:
    import datasets

    ds = datasets.load_dataset(source, split=split).cast_column("image", datasets.Image(decode=False))
    return [ds[i]["image"]["bytes"] for i in range(min(n, len(ds)))]


def _rate(fn, items, repeat: int = 1) -> float:
    fn(items[0])  # warm-up
    start = time.perf_counter()
    for _ in range(repeat):
        for item in items:
            fn(item)
    return repeat * len(items) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default=None, help="dataset folder or Hub id (default: synthetic images)")
    parser.add_argument("--split", default="validation")
    parser.add_argument("--images", type=int, default=48, help="images to time each shift on")
    parser.add_argument("--batch", type=int, default=32, help="forward batch size")
    parser.add_argument("--model", default="posgeom_vit_small_patch16_224_ape")
    args = parser.parse_args()

    import timm

    raw = _dataset_jpegs(args.data, args.split, args.images) if args.data else _synthetic_jpegs(args.images)
    model = timm.create_model(args.model, num_classes=100).eval()
    resize = resize_transform(model, "paper")

    def load(data: bytes) -> PIL.Image.Image:  # what a worker does before any shift
        image = PIL.Image.open(io.BytesIO(data))
        image.load()  # decode now: Resize returns an image already at the input size untouched (lazy)
        return resize(image)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in a DataLoader worker
    resized = [load(b) for b in raw]
    load_rate = _rate(load, raw)
    shift_rates = {spec: _rate(parse_shift(spec), resized) for spec in SHIFTS}
    torch.set_num_threads(threads)

    x = torch.randn(args.batch, 3, 224, 224)
    with torch.inference_mode():
        model(x[:4])
        start = time.perf_counter()
        reps = 2
        for _ in range(reps):
            model(x)
        forward_rate = reps * args.batch / (time.perf_counter() - start)

    workers = default_workers()
    print(
        f"CPU: {os.cpu_count()} cores, torch {torch.__version__}, forward threads {threads}; "
        f"images: {'synthetic 256 px JPEG' if not args.data else args.data} ({len(raw)})"
    )
    print(f"default loader: {workers} worker(s), 1 torch thread each")
    print(f"{'step (224 x 224, one thread)':34s} {'images/s':>10s}")
    print(f"{'decode + resize (every pass)':34s} {load_rate:10.1f}")
    for spec, rate in shift_rates.items():
        print(f"{spec:34s} {rate:10.1f}")
    print(f"{args.model + ' forward (batch ' + str(args.batch) + ')':34s} {forward_rate:10.1f}")
    print()
    print("bottleneck check (images/s through fragility with one shift, or the paper's two):")
    for shifts in [*((s,) for s in SHIFTS), PAPER]:
        per_image_s = 1 / load_rate + sum(1 / shift_rates[s] for s in shifts)
        loader = max(workers, 1) / per_image_s
        model_rate = forward_rate / (1 + len(shifts))
        verdict = "LOADER (shift) is the bottleneck" if loader < model_rate else "model is the bottleneck"
        label = " + ".join(shifts)
        print(f"  {label:34s} loader {loader:8.1f}  model {model_rate:7.1f}  -> {verdict}")


if __name__ == "__main__":
    main()
