"""``posgeom probe MODEL --data D``: SSDC per layer of any timm ViT (per stage of a hierarchical ViT or CNN).

Prints a per-layer table and writes ``ssdc.json`` and ``ssdc.png`` under ``--out``.
MODEL is any timm name (this package's models included), ``hf-hub:org/name`` or ``local-dir:PATH``.
"""
from __future__ import annotations

import argparse
import contextlib
from pathlib import Path
from typing import Any

from ._options import add_data_args, add_model_args, add_run_args, add_site_arg, load_model_and_data


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("probe", help="SSDC per layer (ViTs) or per stage (hierarchical ViTs, CNNs) of a timm model on a dataset")
    add_model_args(p)
    add_data_args(p, max_images_help="probe at most N images")
    add_site_arg(p)
    p.add_argument("--rpi", action="store_true", help="random permutation of patch tokens at inference")
    p.add_argument("--alpha", type=float, default=None, help="scale the positional encoding by alpha")
    p.add_argument("--reduction", default="both", choices=("mean_map", "per_image", "both"))
    p.add_argument("--distance", default="manhattan", choices=("manhattan", "euclidean", "chebyshev"))
    add_run_args(p, out="probe_out",
                 seed_help="seeds torch before the model is built (random init) and the RPI permutation (default 0)")


def run(args: argparse.Namespace) -> int:
    from ..eval_data import eval_loader
    from ..interventions import pe_scale
    from ..probes import probe_ssdc

    model, data, device = load_model_and_data(args)
    loader = eval_loader(model, data, max_images=args.max_images, batch_size=args.batch_size, resize=args.resize,
                         num_workers=args.num_workers, img_size=args.img_size)
    scale = pe_scale(model, args.alpha) if args.alpha is not None else contextlib.nullcontext()
    with scale:
        result = probe_ssdc(model, loader, site=args.site, rpi=args.rpi, seed=args.seed, reduction=args.reduction,
                            distance=args.distance, device=device, progress=not args.no_progress)
    result.metadata.update(model=args.model, data=args.data, split=args.split, alpha=args.alpha, resize=args.resize,
                           checkpoint=args.checkpoint)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result.to_json(out / "ssdc.json")
    result.plot(out / "ssdc.png")
    grids = sorted({tuple(g) for g in result.metadata["grid_sizes"]}, reverse=True)
    print(f"{args.model}  site={result.metadata['site']}  rpi={args.rpi}  alpha={args.alpha}  "
          f"images={result.metadata['n_images']}  grid={', '.join('x'.join(map(str, g)) for g in grids)}")
    print(result.table())
    print(f"wrote {out / 'ssdc.json'} and {out / 'ssdc.png'}")
    return 0
