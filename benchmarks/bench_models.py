"""Training-step time of our PE variants relative to the equivalent stock timm models.

Pairs (ours vs timm), measured interleaved in one run so machine noise hits both sides alike:
  ape   vs vit_small_patch16_224
  nope  vs vit_small_patch16_224 with pos_embed="none"
  rope  vs vit_small_patch16_rope_224 (timm's RoPE-axial ViT, Eva-based)
  sincos has no stock timm ViT-S equivalent; it is compared with vit_small_patch16_224 too.

A step is forward + cross-entropy + backward + AdamW step. Prints the median step time of each and
the ratio ours / timm (target: <= 1.03, RoPE <= 1.05).

    python benchmarks/bench_models.py [--batch-size 16] [--img-size 224] [--reps 10]
"""

from __future__ import annotations

import argparse
import statistics
import time

import timm
import torch
import torch.nn.functional as F

import timm_posgeom  # noqa: F401

PAIRS = [
    ("posgeom_vit_small_patch16_224_ape", {}, "vit_small_patch16_224", {}),
    ("posgeom_vit_small_patch16_224_nope", {}, "vit_small_patch16_224", {"pos_embed": "none"}),
    ("posgeom_vit_small_patch16_224_rope", {}, "vit_small_patch16_rope_224", {}),
    ("posgeom_vit_small_patch16_224_sincos", {}, "vit_small_patch16_224", {}),
]


def make_step(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model.train()

    def step() -> float:
        t0 = time.perf_counter()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return time.perf_counter() - t0

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--img-size", type=int, default=224)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args()
    torch.manual_seed(0)
    x = torch.randn(args.batch_size, 3, args.img_size, args.img_size)
    y = torch.randint(0, 100, (args.batch_size,))
    print(
        f"torch {torch.__version__}, timm {timm.__version__}, threads {torch.get_num_threads()}, "
        f"batch {args.batch_size}, {args.img_size}px, {args.reps} interleaved reps"
    )
    print(f"{'ours':32s} {'timm':44s} {'ours s':>8s} {'timm s':>8s} {'ratio':>6s}")
    for ours_name, ours_kw, ref_name, ref_kw in PAIRS:
        kw = dict(num_classes=100, img_size=args.img_size)
        steps = [
            make_step(timm.create_model(ours_name, **kw, **ours_kw), x, y),
            make_step(timm.create_model(ref_name, **kw, **ref_kw), x, y),
        ]
        for _ in range(args.warmup):
            for s in steps:
                s()
        times: list[list[float]] = [[], []]
        for rep in range(args.reps):
            order = (0, 1) if rep % 2 == 0 else (1, 0)  # alternate who goes first
            for i in order:
                times[i].append(steps[i]())
        ours_t, ref_t = statistics.median(times[0]), statistics.median(times[1])
        ref_label = ref_name + (f" {ref_kw}" if ref_kw else "")
        print(f"{ours_name:32s} {ref_label:44s} {ours_t:8.3f} {ref_t:8.3f} {ours_t / ref_t:6.3f}", flush=True)


if __name__ == "__main__":
    main()
