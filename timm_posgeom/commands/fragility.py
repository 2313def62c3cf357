"""``posgeom fragility MODEL --data PATH_OR_HUB_ID``: top-1 accuracy and fragility scores under shifts.

FS = 1 - A_shift / A_clean, counted exactly over every image; Wilson 95% intervals for the
accuracies, paired bootstrap for FS. Writes ``fragility.json`` and ``fragility.png`` under ``--out``.
MODEL is any timm name (this package's models included), ``hf-hub:org/name`` or ``local-dir:PATH``.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..shifts import PAPER_SHIFTS, SPEC_FORMS


def add_model_data_args(p: argparse.ArgumentParser) -> None:
    """Arguments shared by ``fragility`` and ``sweep``: model, data, loader, device."""
    p.add_argument("model", help="timm model name, hf-hub:ORG/NAME or local-dir:PATH")
    p.add_argument("--data", required=True, help="dataset folder or Hugging Face Hub id")
    p.add_argument("--split", default="validation", help="dataset split (default: validation)")
    p.add_argument("--checkpoint", default=None, help="a checkpoint file to load into the model")
    p.add_argument("--pretrained", action="store_true",
                   help="load the timm name's pretrained weights (always on for hf-hub: / local-dir:)")
    p.add_argument("--num-classes", type=int, default=None,
                   help="classifier size (default with --checkpoint: the dataset's number of classes)")
    p.add_argument("--img-size", type=int, default=None, help="input size S (model built for S x S)")
    p.add_argument("--shift", action="append", default=None, metavar="SPEC",
                   help="a shift, repeatable; forms: " + "; ".join(SPEC_FORMS))
    p.add_argument("--resize", default="paper", choices=("paper", "timm"),
                   help="paper: straight to the input size (default); timm: timm's resize + centre crop")
    p.add_argument("--max-images", type=int, default=None, help="evaluate only the first N images")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--num-workers", type=int, default=None, help="DataLoader workers (default min(4, cpus - 1))")
    p.add_argument("--seed", type=int, default=0, help="seed of RPI permutations and bootstrap (default 0)")
    p.add_argument("--device", default=None, help="cpu, cuda, ... (default: cuda when available)")
    p.add_argument("--no-progress", action="store_true")


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("fragility", help="accuracy and fragility score (FS) of a model under JPEG / blur shifts")
    add_model_data_args(p)
    p.add_argument("--rpi", action="store_true", help="random permutation of patch tokens at inference")
    p.add_argument("--alpha", type=float, default=None, help="scale the positional encoding by alpha")
    p.add_argument("--blur-on-device", action="store_true", help="run blur shifts batched on the device")
    p.add_argument("--out", default="fragility_out", help="output folder for fragility.json and fragility.png")


def load_model_and_data(args: argparse.Namespace) -> tuple[Any, Any, str]:
    """(model on its device, the data split, device) from the shared arguments."""
    import torch

    from ..data import load_split
    from .probe import create_model

    if args.max_images is not None and args.max_images < 1:
        raise ValueError(f"--max-images must be >= 1, got {args.max_images}")
    data = load_split(args.data, args.split, subset=args.max_images)
    if len(data) == 0:
        raise ValueError(f"the {args.split!r} split of {args.data} is empty")
    num_classes = args.num_classes
    if num_classes is None and args.checkpoint is not None:
        num_classes = data.num_classes
    model = create_model(args.model, args.pretrained, args.checkpoint, args.img_size, num_classes)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    model.to(device)
    return model, data, device


def _fmt_interval(lo: float, hi: float) -> str:
    return f"[{lo:.3f}, {hi:.3f}]"


def run(args: argparse.Namespace) -> int:
    from ..robustness import fragility
    from ..shifts import parse_shift

    shifts = args.shift or list(PAPER_SHIFTS)
    for spec in shifts:
        parse_shift(spec)  # fail on a bad spec before loading anything
    model, data, device = load_model_and_data(args)
    result = fragility(model, data, shifts, resize=args.resize, batch_size=args.batch_size,
                       num_workers=args.num_workers, rpi=args.rpi, alpha=args.alpha, seed=args.seed,
                       blur_on_device=args.blur_on_device, device=device, progress=not args.no_progress)
    result.settings.update(model=args.model, data=args.data, split=args.split, checkpoint=args.checkpoint)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result.to_json(out / "fragility.json")
    result.plot(out / "fragility.png")
    print(f"{args.model}  images={result.num_images}  resize={args.resize}  rpi={args.rpi}  alpha={args.alpha}")
    w = max(12, *(len(s) for s in result.shifts))
    print(f"{'':{w}s} {'top-1':>7s} {'95% CI (Wilson)':>17s} {'FS':>7s} {'95% CI (bootstrap)':>19s}")
    print(f"{'clean':{w}s} {result.clean_accuracy:7.3f} {_fmt_interval(*result.clean_interval):>17s}")
    for s in result.shifts:
        print(f"{s:{w}s} {result.accuracy[s]:7.3f} {_fmt_interval(*result.accuracy_interval[s]):>17s} "
              f"{result.fs[s]:7.3f} {_fmt_interval(*result.fs_interval[s]):>19s}")
    print(f"wrote {out / 'fragility.json'} and {out / 'fragility.png'}")
    return 0
