"""What the permutation protocol costs: SSDC under RPI with K = 10 permutations against K = 1, wall time.

Two cases, measured in one run, each from real images (Imagenette's 224 px JPEGs, decoded and resized by the
loader, as ``posgeom probe`` reads them):

(a) the micro model (``posgeom_vit_micro_patch8_64_ape``, 64 px, 8 x 8 patches) on ``--micro-images`` images;
(b) ViT-S/16 at 224 px (``vit_small_patch16_224``, random init: the cost does not depend on the weights) on
    ``--vits-images`` images.

For each: K = 1, K = 10 with the permutations of a batch stacked into one forward (the default), and K = 10
one permutation per forward (``forward_size`` = the batch size), interleaved, the minimum over ``--repeats``.
Printed: seconds and the ratios K=10 / K=1. The images are read once per probe in every case: what K adds
is the forward passes and the sums. Run: ``python benchmarks/bench_rpi.py --data PATH`` (a few minutes on 2
CPU cores).
"""

from __future__ import annotations

import argparse
import os
import time

import timm
import torch

import timm_posgeom  # noqa: F401
from timm_posgeom import eval_loader, load_split
from timm_posgeom.probes import probe_ssdc


def _time(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bench(model_name: str, data_path: str, images: int, batch: int, repeats: int, **model_kwargs) -> dict:
    torch.manual_seed(0)
    model = timm.create_model(model_name, **model_kwargs).eval()
    split = load_split(data_path, "validation", subset=images)

    def probe(k: int, forward_size: int | None = None):
        loader = eval_loader(model, split, batch_size=batch, num_workers=0)
        return lambda: probe_ssdc(
            model, loader, rpi=True, rpi_permutations=k, forward_size=forward_size, progress=False
        )

    cases = {"K=1": probe(1), "K=10 stacked": probe(10), "K=10 one per forward": probe(10, batch)}
    cases["K=1"]()  # warm up (allocator, caches, thread pool)
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeats):
        for name, fn in cases.items():
            times[name].append(_time(fn))
    best = {name: min(ts) for name, ts in times.items()}
    return {
        "model": model_name,
        "images": images,
        "batch": batch,
        **best,
        "ratio stacked": best["K=10 stacked"] / best["K=1"],
        "ratio one per forward": best["K=10 one per forward"] / best["K=1"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--data",
        default=os.environ.get("POSGEOM_IMAGENETTE", "../shared/data/imagenette"),
        help="a parquet folder or ImageFolder tree with a validation split (Imagenette)",
    )
    parser.add_argument("--micro-images", type=int, default=512)
    parser.add_argument("--vits-images", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, load average {os.getloadavg()[0]:.1f}")
    rows = [
        bench("posgeom_vit_micro_patch8_64_ape", args.data, args.micro_images, 64, args.repeats, num_classes=10),
        bench("vit_small_patch16_224", args.data, args.vits_images, 32, args.repeats, num_classes=10),
    ]
    print(
        "| model | images | K=1 s | K=10 stacked s | K=10 one per forward s | ratio stacked | ratio one per forward |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['model']} | {r['images']} | {r['K=1']:.2f} | {r['K=10 stacked']:.2f} | "
            f"{r['K=10 one per forward']:.2f} | {r['ratio stacked']:.2f}x | {r['ratio one per forward']:.2f}x |"
        )
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
