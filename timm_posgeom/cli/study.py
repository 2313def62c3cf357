"""``posgeom study``: the whole study in one command (train, probe, stress, sweep, report)."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path
from typing import Any

from ..errors import SettingError
from ._options import (
    DEVICE_HELP,
    add_imagenet_c_jpeg_blur_arg,
    add_renamed_arg,
    add_rpi_permutations_arg,
    protocol_options,
)
from ._protocol_options import add_heldout_arg, add_shift_size_arg, shift_size
from .train import add_recipe_data_args, recipe_flag_overrides

# the recipe keys the flags of a study set in every training run (--probe-images is the study's own SSDC count)
RECIPE_FLAGS = ("train_split", "val_split", "data_config", "revision", "streaming", "max_images", "bad_images")


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "study",
        help="run the paper's full analysis and write a report (default: the embedded demo)",
        description="Train (or reuse) every condition x seed, probe SSDC (normal and under RPI), measure "
        "fragility, sweep alpha, and write report.md + figures. Restartable with --resume.",
    )
    p.add_argument(
        "--preset",
        default="demo",
        choices=["demo", "imagenette-cpu", "imagenette-cpu-14", "in100"],
        help="demo: synthetic data, CPU, minutes; imagenette-cpu: real images at 64 px (8 x 8 tokens), "
        "CPU, about 90 minutes; imagenette-cpu-14: the same at 112 px (the paper's 14 x 14 tokens), "
        "width 64, CPU, about 45 minutes a model; in100: the paper's protocol on GPUs",
    )
    p.add_argument("--data", default=None, help="dataset: Hub id or local folder (overrides the preset)")
    _add_data_args(p)
    p.add_argument(
        "--num-seeds",
        type=int,
        default=None,
        metavar="N",
        help="training runs per condition, seeds 0 .. N-1 (default 1)",
    )
    add_renamed_arg(p, "--seeds", "--num-seeds", type=int)
    p.add_argument("--conditions", default=None, help="comma-separated subset of nope,ape,sincos,rope,rpt")
    add_rpi_permutations_arg(p)
    add_imagenet_c_jpeg_blur_arg(p)
    add_heldout_arg(p)
    add_shift_size_arg(p)
    p.add_argument("--device", default=None, help=DEVICE_HELP)
    p.add_argument("--out", type=Path, default=None, help="study directory (default: runs/study-<preset>)")
    p.add_argument("--resume", action="store_true", help="continue an interrupted study in --out")
    p.add_argument(
        "--allow-changes",
        action="store_true",
        help="with --resume: accept settings that differ from the study's; what they affect is recomputed",
    )
    p.add_argument("--dry-run", action="store_true", help="validate recipes and print the plan; run nothing")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=None,
        metavar="KEY=VALUE",
        help="recipe override for every training run (repeatable), e.g. --set epochs=10; seed, data and "
        "model_kwargs.init are the study's own: --num-seeds, --data, --init",
    )
    p.add_argument(
        "--init",
        default=None,
        choices=["timm", "paper"],
        help="initialise every model with timm's init or the paper's (PyTorch defaults; sets "
        "model_kwargs.init of every run, after --set). Default: what each recipe says "
        "(in100 and demo: paper, imagenette-cpu: timm). Recorded: a resume with another is refused",
    )


def _add_data_args(p: argparse.ArgumentParser) -> None:
    """The data flags: the training runs' (:func:`add_recipe_data_args`) and the SSDC probe's count."""
    add_recipe_data_args(
        p,
        max_images_help="use at most the first N images of each split, for all the work: the "
        "training runs' (recipe keys max_train_images and max_val_images) and "
        "every measurement; default: the preset's",
    )
    p.add_argument(
        "--probe-images",
        type=int,
        default=None,
        metavar="N",
        help="images of each SSDC probe (default: the preset's, at most --max-images)",
    )


def _terminated(signum, frame) -> None:
    """SIGTERM as Ctrl-C: the running training subprocess is stopped, the study exits 130 with one line."""
    raise KeyboardInterrupt


def _measuring(args: argparse.Namespace) -> dict[str, Any]:
    """The study's measuring settings from its flags, by their protocol names
    (:func:`~timm_posgeom.cli._options.protocol_options`): ``--max-images`` bounds every measurement (the probe and
    the sweep within it, below the preset's counts), ``--imagenet-c-jpeg-blur`` is recorded as ``imagenet_c``."""
    from ..app.study import PRESETS

    measuring = protocol_options(args)
    measuring.pop("shift_size", None)  # 0 (none) must replace the preset's: set after the preset, by run's study_config
    if measuring.pop("shifts", None):
        measuring["imagenet_c"] = True
    if args.max_images is not None:  # all the work: the training runs' splits and every measurement
        preset = PRESETS.get(args.preset, {})
        probe = args.probe_images or preset.get("probe_images") or 1000
        measuring.update(
            probe_images=min(probe, args.max_images),
            sweep_images=min(preset.get("sweep_images") or args.max_images, args.max_images),
        )
    return measuring


def study_config(args: argparse.Namespace) -> Any:
    """The :class:`~timm_posgeom.app.study.StudyConfig` of the preset and the flags."""
    from ..app.study import preset_config

    if args.heldout is not None and not 0 <= args.heldout < 1:
        raise SettingError(f"--heldout must be in [0, 1), got {args.heldout}")
    conditions = tuple(c.strip() for c in args.conditions.split(",")) if args.conditions else None
    config = preset_config(
        args.preset,
        data=args.data,
        seeds=args.num_seeds,
        conditions=conditions,
        init=args.init,
        heldout_fraction=args.heldout,
        **_measuring(args),
    )
    if args.shift_size is not None:  # 0: none, replacing the preset's
        config.shift_size = shift_size(args)
        config.protocol()
    # the study sets these after --set
    owned = {"seed": "--num-seeds", "data": "--data", "model_kwargs.init": "--init", "heldout_fraction": "--heldout"}
    for item in args.overrides or []:
        key = item.split("=", 1)[0].strip()
        if key in owned:
            raise SettingError(f"--set {key}=... would be replaced by the study's own {key}: use {owned[key]}")
    flags = recipe_flag_overrides(args, args.overrides, RECIPE_FLAGS)
    if args.overrides or flags:
        config.train_overrides = list(config.train_overrides) + list(args.overrides or []) + flags
    return config


def run(args: argparse.Namespace) -> int:
    from ..app.study import dry_run, run_study

    config = study_config(args)
    out = args.out or Path("runs") / f"study-{args.preset}"
    if args.dry_run:
        plan = dry_run(config, out)
        print(f"preset {args.preset}: {len(plan)} runs, every recipe valid")
        for item in plan:
            print(
                f"  {item['condition']:7s} seed {item['seed']}: {item['model']} on {item['data']}, "
                f"{item['epochs']} epochs, batch {item['batch_size']}, {item['img_size']} px, {item['init']} init"
            )
            print(f"    {item['command']}")
        return 0
    previous = signal.signal(signal.SIGTERM, _terminated)  # a scheduler's or `kill`'s stop ends the study cleanly
    try:
        results = run_study(config, out, resume=args.resume, allow_changes=args.allow_changes)
    except KeyboardInterrupt:
        print(
            f"\ninterrupted: what finished is kept in {out}; the same command with --resume continues", file=sys.stderr
        )
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
