"""Command line of a training run: ``python -m timm_posgeom.train`` and ``posgeom train`` share these flags."""
from __future__ import annotations

import argparse
import sys

from ..recipe import RecipeError, load_recipe

__all__ = ["add_arguments", "run_from_args", "main"]


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The flags shared by ``python -m timm_posgeom.train`` and ``posgeom train``."""
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
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def run_from_args(args: argparse.Namespace) -> int:
    """Load the recipe named by ``args`` and train it; 0 on success."""
    from . import train

    overrides = list(args.overrides) + ([f"data={args.data}"] if args.data else [])
    recipe = load_recipe(args.recipe, overrides)
    train(recipe, args.out, resume=args.resume, progress=not args.no_progress, allow_changes=args.allow_changes)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m timm_posgeom.train``; errors before training exit with status 2."""
    parser = add_arguments(argparse.ArgumentParser(prog="python -m timm_posgeom.train",
                                                   description="Train a timm ViT from a recipe, with accelerate."))
    args = parser.parse_args(argv)
    from ..cli import one_line
    from .loop import TrainingDiverged
    from .rundir import RunDirError

    try:
        return run_from_args(args)
    except (RecipeError, ValueError, FileNotFoundError, FileExistsError, PermissionError, TrainingDiverged,
            RunDirError) as e:
        print(f"error: {one_line(e)}", file=sys.stderr)
        return 2
