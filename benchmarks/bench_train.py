"""Training throughput on CPU at 64 px: our micro ViTs against stock timm, and the data pipeline
against what a training step consumes.

    python benchmarks/bench_train.py                 # all variants, batch 128, 6 timed steps each
    python benchmarks/bench_train.py --variants ape rope --steps 10 --data synthetic

Part 1 runs the same training step (forward, label-smoothed cross-entropy, backward, AdamW) on
each ``posgeom_vit_micro_patch8_64_<variant>`` and on its stock timm equivalent of the same size
(``vit_small_patch16_224`` / ``vit_small_patch16_rope_224`` with img_size=64, patch_size=8,
embed_dim=128, depth=4, num_heads=4), interleaving the two so that load on a shared machine
affects both alike, and prints images/s and the ratio ours / stock.

Part 3 (``--speedups``) measures what the CPU training options give on the micro APE model at 64 and
112 px (8 x 8 and 14 x 14 tokens), each against eager float32 with torch's default threads in the
same run: ``torch.compile``, channels-last memory format, 1 thread instead of the default, and, for
evaluation, one forward of 512 images against four of 128.

Part 2 iterates the training loader alone (uint8 cache + reflect-pad crop + flip, as the
``imagenette_cpu_*`` recipes use; and, for contrast, JPEG decoding + resizing every image) and
prints its images/s against the training step's: the loader must be well above 1x.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import timm
import torch
import torch.nn as nn

import timm_posgeom  # noqa: F401  (registers our models)
from timm_posgeom import data as D

IMAGENETTE = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "imagenette"
MICRO = dict(img_size=64, patch_size=8, embed_dim=128, depth=4, num_heads=4)
STOCK = {  # our variant -> (stock timm model, extra kwargs)
    "nope": ("vit_small_patch16_224", dict(pos_embed="none")),
    "ape": ("vit_small_patch16_224", {}),
    "sincos": ("vit_small_patch16_224", {}),  # timm has no fixed-sincos ViT: compare with its learned APE
    "rope": ("vit_small_patch16_rope_224", {}),
    "ape_rpt": ("vit_small_patch16_224", {}),
}


def _step_fn(model: nn.Module, batch_size: int, num_classes: int = 10):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    loss_fn = nn.CrossEntropyLoss(label_smoothing=0.1)
    images = torch.randn(batch_size, 3, 64, 64)
    targets = torch.randint(0, num_classes, (batch_size,))
    model.train()

    def step() -> None:
        loss = loss_fn(model(images), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def bench_models(variants: list[str], batch_size: int, steps: int, warmup: int = 2) -> dict[str, tuple[float, float]]:
    """images/s of ours and stock for each variant (interleaved, best of the timed steps' medians)."""
    results = {}
    for variant in variants:
        name, extra = STOCK[variant]
        ours = timm.create_model(f"posgeom_vit_micro_patch8_64_{variant}", num_classes=10, drop_path_rate=0.1)
        stock = timm.create_model(name, num_classes=10, drop_path_rate=0.1, **MICRO, **extra)
        steps_fn = {"ours": _step_fn(ours, batch_size), "stock": _step_fn(stock, batch_size)}
        times: dict[str, list[float]] = {"ours": [], "stock": []}
        for i in range(warmup + steps):
            for key, step in steps_fn.items():
                start = time.perf_counter()
                step()
                if i >= warmup:
                    times[key].append(time.perf_counter() - start)
        median = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
        results[variant] = (batch_size / median["ours"], batch_size / median["stock"])
        print(
            f"  {variant:8s} ours {results[variant][0]:7.1f} img/s   stock {name} {results[variant][1]:7.1f} img/s   "
            f"ours/stock {results[variant][0] / results[variant][1]:.3f}",
            flush=True,
        )
    return results


def _median_step(step, steps: int, warmup: int) -> float:
    for _ in range(warmup):
        step()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def _train_step(img: int, batch_size: int, compiled: bool = False, channels_last: bool = False):
    torch.manual_seed(0)
    model = timm.create_model("posgeom_vit_micro_patch8_64_ape", num_classes=10, img_size=img, drop_path_rate=0.1)
    images = torch.randn(batch_size, 3, img, img)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
        images = images.contiguous(memory_format=torch.channels_last)
    forward = torch.compile(model) if compiled else model
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    loss_fn = nn.CrossEntropyLoss(label_smoothing=0.1)
    targets = torch.randint(0, 10, (batch_size,))
    model.train()

    def step() -> None:
        loss_fn(forward(images), targets).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def bench_speedups(batch_size: int, steps: int) -> None:
    """Speed-up of each CPU option over eager float32 at the default thread count, per image size."""
    threads = torch.get_num_threads()
    for img in (64, 112):
        base = _median_step(_train_step(img, batch_size), steps, 2)
        print(f"  {img} px ({(img // 8) ** 2} tokens): eager {batch_size / base:6.1f} img/s", flush=True)
        for name, kwargs, warmup in (
            ("torch.compile", dict(compiled=True), 3),
            ("channels_last", dict(channels_last=True), 2),
        ):
            try:
                t = _median_step(_train_step(img, batch_size, **kwargs), steps, warmup)
                print(f"    {name:14s} {batch_size / t:6.1f} img/s  speed-up {base / t:5.2f}x", flush=True)
            except Exception as e:  # noqa: BLE001  (a backend that cannot compile here is a result too)
                print(f"    {name:14s} failed: {type(e).__name__}: {str(e)[:120]}")
        torch.set_num_threads(1)
        t = _median_step(_train_step(img, batch_size), steps, 2)
        torch.set_num_threads(threads)
        print(f"    {'1 thread':14s} {batch_size / t:6.1f} img/s  speed-up {base / t:5.2f}x (vs {threads})", flush=True)
        model = timm.create_model("posgeom_vit_micro_patch8_64_ape", num_classes=10, img_size=img).eval()
        x = torch.randn(512, 3, img, img)
        with torch.inference_mode():
            small = _median_step(lambda m=model, x=x: [m(c) for c in x.split(128)], max(3, steps // 2), 1)
            large = _median_step(lambda m=model, x=x: m(x), max(3, steps // 2), 1)
        print(
            f"    {'eval batch 512':14s} {512 / large:6.1f} img/s  vs batch 128 {512 / small:6.1f} img/s: "
            f"{small / large:5.2f}x",
            flush=True,
        )


def bench_loader(loader, max_batches: int) -> float:
    """images/s of iterating ``loader`` for up to ``max_batches`` batches (after the first)."""
    it = iter(loader)
    next(it)
    count, start = 0, time.perf_counter()
    for i, (images, _) in enumerate(it):
        count += images.shape[0]
        if i + 1 >= max_batches:
            break
    return count / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variants", nargs="+", default=list(STOCK), choices=list(STOCK))
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--steps", type=int, default=6, help="timed steps per model")
    parser.add_argument(
        "--data",
        default=str(IMAGENETTE) if IMAGENETTE.is_dir() else "synthetic",
        help="data for part 2 (default: ../shared/data/imagenette when present, else synthetic)",
    )
    parser.add_argument("--loader-batches", type=int, default=20)
    parser.add_argument("--speedups", action="store_true", help="only part 3: the CPU training options")
    args = parser.parse_args()
    if args.speedups:
        print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, batch {args.batch_size}")
        print("3. CPU training options on the micro APE model (speed-up over eager, default threads):")
        bench_speedups(args.batch_size, args.steps)
        return
    print(
        f"torch {torch.__version__}, timm {timm.__version__}, {torch.get_num_threads()} threads, "
        f"batch {args.batch_size}, 64 px"
    )

    print("1. training step, ours vs stock timm (same loop, same size):")
    results = bench_models(args.variants, args.batch_size, args.steps)
    consumed = max(ours for ours, _ in results.values())

    print(f"2. data pipeline vs the training step's consumption ({consumed:.1f} img/s, the fastest variant):")
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    n = args.batch_size * (args.loader_batches + 1)
    split = D.load_split(args.data, "train", subset=n, img_size=64)
    start = time.perf_counter()
    cache = D.cache_uint8(split, 64, workers=2)
    print(f"  one-off uint8 cache of {len(split)} images: {len(split) / (time.perf_counter() - start):.0f} img/s")
    for workers in (0, 2):
        ds = D.CachedTrainDataset(cache, mean, std, crop_pad=4, seed=0)
        sampler = D.EpochBatchSampler(len(ds), args.batch_size, seed=0)
        rate = bench_loader(D.make_loader(ds, sampler, workers), args.loader_batches)
        print(f"  cached uint8 + crop/flip, workers={workers}: {rate:8.0f} img/s  = {rate / consumed:6.1f}x the step")
    tf = D.train_transform(64, "crop_flip", mean, std)
    ds = D.TransformDataset(split, tf, seed=0)
    sampler = D.EpochBatchSampler(len(ds), args.batch_size, seed=0)
    rate = bench_loader(D.make_loader(ds, sampler, 2), min(args.loader_batches, 6))
    print(f"  decode + resize every image, workers=2: {rate:8.0f} img/s  = {rate / consumed:6.1f}x the step")


if __name__ == "__main__":
    main()
