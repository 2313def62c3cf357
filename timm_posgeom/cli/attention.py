"""``posgeom attention MODEL --data D``: attention measures per block and head of a flat timm ViT.

Mean attention distance, attention entropy and attention SSDC per block and head (definitions:
docs/attention.md), optionally under RPI (``--rpi``) and PE scaling (``--alpha``). Prints a per-layer
table (mean over heads and the range over heads) and writes ``attention.json`` and the per-head figure
``attention.png`` under ``--out``. Launched as several processes, each measures its share of the batches
and the sums are reduced; the main process alone writes and prints.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ._options import add_data_args, add_model_args, add_run_args, load_model_and_data


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("attention", help="mean attention distance, entropy and SSDC per block and head of a "
                                                "flat timm ViT on a dataset")
    add_model_args(p)
    add_data_args(p, max_images_help="measure at most N images")
    p.add_argument("--rpi", action="store_true", help="random permutation of patch tokens at inference")
    p.add_argument("--alpha", type=float, default=None, help="scale the positional encoding by alpha")
    p.add_argument("--distance", default="manhattan", choices=("manhattan", "euclidean", "chebyshev"),
                   help="grid distance of the attention SSDC (the mean attention distance is always Euclidean)")
    add_run_args(p, out="attention_out",
                 seed_help="seeds torch before the model is built (random init) and the RPI permutation (default 0)")


def run(args: argparse.Namespace) -> int:
    from .. import distributed
    from ..eval_data import eval_loader
    from ..probes import attention_measures

    world = distributed.setup()
    if args.device is None and world > 1:
        args.device = distributed.default_device()
    with distributed.main_process_first():
        model, data, device = load_model_and_data(args)
    loader = eval_loader(model, data, max_images=args.max_images, batch_size=args.batch_size, resize=args.resize,
                         num_workers=args.num_workers, img_size=args.img_size)
    result = attention_measures(model, loader, rpi=args.rpi, seed=args.seed, alpha=args.alpha,
                                distance=args.distance, device=device, progress=not args.no_progress)
    if not distributed.is_main():
        return 0
    result.metadata.update(model=args.model, data=args.data, split=args.split, resize=args.resize,
                           checkpoint=args.checkpoint)
    if world > 1:
        result.metadata["processes"] = world
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result.to_json(out / "attention.json")
    result.plot(out / "attention.png")
    md = result.metadata
    print(f"{args.model}  rpi={args.rpi}  alpha={args.alpha}  images={md['n_images']}  "
          f"grid={'x'.join(map(str, md['grid_size']))}  heads={md['num_heads']}")
    print(result.table())
    print(f"wrote {out / 'attention.json'} and {out / 'attention.png'}")
    return 0
