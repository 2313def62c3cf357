"""``posgeom train``: train a model from a recipe with accelerate (exact resume, Hub export).

    posgeom train --recipe imagenette_cpu_ape --out runs/ape
    accelerate launch -m timm_posgeom.cli train --recipe in100_paper_ape --out runs/in100_ape
"""
from __future__ import annotations

import argparse

__all__ = ["add_parser", "add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The flags of a training run."""
    parser.add_argument("--recipe", default=None,
                        help="recipe YAML file, or the name of a shipped recipe (posgeom recipes lists them, e.g. "
                             "imagenette_cpu_ape); default: the built-in defaults (a small run on synthetic data)")
    parser.add_argument("--out", required=True, help="run directory (checkpoints, metrics, exports)")
    parser.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --out")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a recipe key (repeatable), e.g. --set epochs=5 --set model_kwargs.alpha=0.5")
    parser.add_argument("--allow-changes", action="store_true",
                        help="with --resume: continue although the recipe changed (the changes are recorded)")
    parser.add_argument("--data", default=None, help="shortcut for --set data=PATH_OR_HUB_ID")
    parser.add_argument("--log-with", default=None, metavar="TRACKERS",
                        help="comma-separated accelerate trackers to log to besides metrics.jsonl, e.g. tensorboard or "
                             "wandb,tensorboard (shortcut for --set log_with=[...])")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("train", help="train a model from a recipe with accelerate (exact resume, Hub export)")
    add_arguments(p)


def run(args: argparse.Namespace) -> int:
    """Load the recipe named by ``args`` and train it; 0 on success (errors: one line each, exit 2, by
    :func:`timm_posgeom.cli.main`)."""
    from ..app.recipe import load_recipe
    from ..app.train import train

    overrides = list(args.overrides) + ([f"data={args.data}"] if args.data else [])
    if args.log_with:
        overrides.append(f"log_with=[{','.join(t.strip() for t in args.log_with.split(',') if t.strip())}]")
    recipe = load_recipe(args.recipe, overrides)
    train(recipe, args.out, resume=args.resume, progress=not args.no_progress, allow_changes=args.allow_changes)
    return 0
