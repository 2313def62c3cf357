"""``posgeom study``: the whole study in one command (train, probe, stress, sweep, report)."""
from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path

from ._options import add_imagenet_c_jpeg_blur_arg, add_rpi_permutations_arg, imagenet_c_jpeg_blur


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "study", help="run the paper's full analysis and write a report (default: the embedded demo)",
        description="Train (or reuse) every condition x seed, probe SSDC (normal and under RPI), measure "
                    "fragility, sweep alpha, and write report.md + figures. Restartable with --resume.")
    p.add_argument("--preset", default="demo", choices=["demo", "imagenette-cpu", "imagenette-cpu-14", "in100"],
                   help="demo: synthetic data, CPU, minutes; imagenette-cpu: real images at 64 px (8 x 8 tokens), "
                        "CPU, about 90 minutes; imagenette-cpu-14: the same at 112 px (the paper's 14 x 14 tokens), "
                        "width 64, CPU, about 45 minutes a model; in100: the paper's protocol on GPUs")
    p.add_argument("--data", default=None, help="dataset: Hub id or local folder (overrides the preset)")
    p.add_argument("--seeds", type=int, default=None, help="seeds per condition (default 1)")
    p.add_argument("--conditions", default=None, help="comma-separated subset of nope,ape,sincos,rope,rpt")
    add_rpi_permutations_arg(p)
    add_imagenet_c_jpeg_blur_arg(p)
    p.add_argument("--out", type=Path, default=None, help="study directory (default: runs/study-<preset>)")
    p.add_argument("--resume", action="store_true", help="continue an interrupted study in --out")
    p.add_argument("--allow-changes", action="store_true",
                   help="with --resume: accept settings that differ from the study's; what they affect is recomputed")
    p.add_argument("--dry-run", action="store_true", help="validate recipes and print the plan; run nothing")
    p.add_argument("--set", dest="overrides", action="append", default=None, metavar="KEY=VALUE",
                   help="recipe override for every training run (repeatable), e.g. --set epochs=10; seed, data and "
                        "model_kwargs.init are the study's own: --seeds, --data, --init")
    p.add_argument("--init", default=None, choices=["timm", "paper"],
                   help="initialise every model with timm's init or the paper's (PyTorch defaults; sets "
                        "model_kwargs.init of every run, after --set). Default: what each recipe says "
                        "(in100 and demo: paper, imagenette-cpu: timm). Recorded: a resume with another is refused")


def _terminated(signum, frame) -> None:
    """SIGTERM as Ctrl-C: the running training subprocess is stopped, the study exits 130 with one line."""
    raise KeyboardInterrupt


def run(args: argparse.Namespace) -> int:
    from ..app.study import dry_run, preset_config, run_study

    conditions = tuple(c.strip() for c in args.conditions.split(",")) if args.conditions else None
    config = preset_config(args.preset, data=args.data, seeds=args.seeds, conditions=conditions,
                           imagenet_c=imagenet_c_jpeg_blur(args) or None, init=args.init,
                           rpi_permutations=args.rpi_permutations)
    owned = {"seed": "--seeds", "data": "--data", "model_kwargs.init": "--init"}  # the study sets these after --set
    for item in args.overrides or []:
        key = item.split("=", 1)[0].strip()
        if key in owned:
            raise ValueError(f"--set {key}=... would be replaced by the study's own {key}: use {owned[key]}")
    if args.overrides:
        config.train_overrides = list(config.train_overrides) + list(args.overrides)
    out = args.out or Path("runs") / f"study-{args.preset}"
    if args.dry_run:
        plan = dry_run(config, out)
        print(f"preset {args.preset}: {len(plan)} runs, every recipe valid")
        for item in plan:
            print(f"  {item['condition']:7s} seed {item['seed']}: {item['model']} on {item['data']}, "
                  f"{item['epochs']} epochs, batch {item['batch_size']}, {item['img_size']} px, {item['init']} init")
            print(f"    {item['command']}")
        return 0
    previous = signal.signal(signal.SIGTERM, _terminated)  # a scheduler's or `kill`'s stop ends the study cleanly
    try:
        results = run_study(config, out, resume=args.resume, allow_changes=args.allow_changes)
    except KeyboardInterrupt:
        print(f"\ninterrupted: what finished is kept in {out}; the same command with --resume continues",
              file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    print(f"\nstudy finished: {len(results.runs)} runs; report: {out / 'report.md'}")
    from ..app.report import evaluate_claims

    for i, c in enumerate(evaluate_claims(results), 1):
        status = {"held": "held", "not held": "did NOT hold"}.get(c["status"], c["status"])
        reason = f" ({c['reason'].split(':')[0]})" if c["reason"] else ""
        print(f"  claim {i}: {status}{reason}: {c['claim']}")
    print(json.dumps({"report": str(out / "report.md")}))
    return 0
