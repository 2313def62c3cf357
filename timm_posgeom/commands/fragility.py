"""``posgeom fragility MODEL --data PATH_OR_HUB_ID``: top-1 accuracy and fragility scores under shifts.

FS = 1 - A_shift / A_clean, counted exactly over every image; Wilson 95% intervals for the
accuracies, paired bootstrap for FS. Writes ``fragility.json`` and ``fragility.png`` under ``--out``.
Launched as several processes (``accelerate launch ... -m timm_posgeom.cli fragility ...``), each evaluates
its share of the batches and the main process alone writes and prints the (identical) result.
MODEL is any timm name (this package's models included), ``hf-hub:org/name`` or ``local-dir:PATH``.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from ..shifts import PAPER_SHIFTS
from ._options import (
    add_data_args,
    add_labels_arg,
    add_model_args,
    add_run_args,
    add_shift_arg,
    load_model_and_data,
    match_labels,
)


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("fragility", help="accuracy and fragility score (FS) of a model under JPEG / blur shifts")
    add_model_args(p)
    add_labels_arg(p)
    add_data_args(p, max_images_help="evaluate only the first N images")
    add_shift_arg(p, default_help=" and ".join(PAPER_SHIFTS))
    p.add_argument("--rpi", action="store_true", help="random permutation of patch tokens at inference")
    p.add_argument("--alpha", type=float, default=None, help="scale the positional encoding by alpha")
    p.add_argument("--blur-on-device", action="store_true", help="run blur shifts batched on the device")
    add_run_args(p, out="fragility_out", seed_help="seed of RPI permutations and the bootstrap (default 0)")


def _fmt_interval(lo: float, hi: float) -> str:
    return f"[{lo:.3f}, {hi:.3f}]"


def run(args: argparse.Namespace) -> int:
    from .. import distributed
    from ..robustness import fragility
    from ..shifts import parse_shift

    shifts = args.shift or list(PAPER_SHIFTS)
    for spec in shifts:
        parse_shift(spec)  # fail on a bad spec before loading anything
    world = distributed.setup()  # launched as several processes: each evaluates its share of the batches
    if args.device is None and world > 1:
        args.device = distributed.default_device()
    with distributed.main_process_first():  # a download or cache made once, by the main process
        model, data, device = load_model_and_data(args)
    data = match_labels(model, data, args.labels)
    result = fragility(model, data, shifts, resize=args.resize, batch_size=args.batch_size,
                       num_workers=args.num_workers, rpi=args.rpi, alpha=args.alpha, seed=args.seed,
                       blur_on_device=args.blur_on_device, device=device, progress=not args.no_progress,
                       img_size=args.img_size)
    if not distributed.is_main():  # the same result everywhere: the main process writes and prints it
        return 0
    result.settings.update(model=args.model, data=args.data, split=args.split, checkpoint=args.checkpoint)
    if world > 1:
        result.settings["processes"] = world
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
