"""``posgeom train``: train a model from a recipe with accelerate (exact resume, Hub export).

    posgeom train --recipe imagenette_cpu_ape --out runs/ape
    posgeom train --recipe imagenette_cpu_ape --data ORG/SET --data-config full --streaming --max-images 2000 --out runs/x
    accelerate launch -m timm_posgeom.cli train --recipe in100_paper_ape --out runs/in100_ape

The data flags are the measuring commands' (``--data-config``, ``--revision``, ``--streaming``,
``--max-images``, ``--bad-images``), each a shortcut for the recipe key of its name (:data:`FLAG_KEYS`);
the two splits are ``--train-split`` and ``--val-split``.
"""

from __future__ import annotations

import argparse
from typing import Any

from ..errors import SettingError
from ._options import DEVICE_HELP, add_bad_images_arg, add_hub_data_args
from ._protocol_options import add_heldout_arg

__all__ = ["add_parser", "add_arguments", "add_recipe_data_args", "recipe_flag_overrides", "FLAG_KEYS", "run"]

# flag dest -> the recipe keys it sets (after --set: a key given both ways is refused)
FLAG_KEYS: dict[str, tuple[str, ...]] = {
    "data": ("data",),
    "train_split": ("train_split",),
    "val_split": ("val_split",),
    "data_config": ("data_config",),
    "revision": ("revision",),
    "streaming": ("streaming",),
    "max_images": ("max_train_images", "max_val_images"),
    "probe_images": ("probe_images",),
    "bad_images": ("bad_images",),
    "seed": ("seed",),
    "heldout": ("heldout_fraction",),
}


TRAIN_MAX_IMAGES_HELP = (
    "use at most the first N images of each split, training and validation (recipe keys "
    "max_train_images and max_val_images); default: the recipe's"
)


def add_recipe_data_args(p: argparse.ArgumentParser, max_images_help: str = TRAIN_MAX_IMAGES_HELP) -> None:
    """The data flags of a training run (train, study): each sets recipe keys (:data:`FLAG_KEYS`)."""
    p.add_argument("--train-split", default=None, metavar="NAME", help="the training split (default: the recipe's)")
    p.add_argument("--val-split", default=None, metavar="NAME", help="the validation split (default: the recipe's)")
    add_hub_data_args(p)
    p.add_argument("--max-images", type=int, default=None, metavar="N", help=max_images_help)
    add_bad_images_arg(p, default=None, default_help="the recipe's (bad_images)")


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The flags of a training run."""
    parser.add_argument(
        "--recipe",
        default=None,
        help="recipe YAML file, or the name of a shipped recipe (posgeom recipes lists them, e.g. "
        "imagenette_cpu_ape); default: the built-in defaults (a small run on synthetic data)",
    )
    parser.add_argument("--out", required=True, help="run directory (checkpoints, metrics, exports)")
    parser.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --out")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a recipe key (repeatable), e.g. --set epochs=5 --set model_kwargs.alpha=0.5",
    )
    parser.add_argument(
        "--allow-changes",
        action="store_true",
        help="with --resume: continue although the recipe changed (the changes are recorded)",
    )
    parser.add_argument("--data", default=None, help="shortcut for --set data=PATH_OR_HUB_ID")
    add_recipe_data_args(parser)
    parser.add_argument(
        "--probe-images",
        type=int,
        default=None,
        metavar="N",
        help="at each evaluation, SSDC per layer under RPI on the first N validation images (0: "
        "none; recipe key probe_images); default: the recipe's",
    )
    parser.add_argument(
        "--seed", type=int, default=None, help="seed of the run (recipe key seed); default: the recipe's"
    )
    parser.add_argument(
        "--log-with",
        default=None,
        metavar="TRACKERS",
        help="comma-separated accelerate trackers to log to besides metrics.jsonl, e.g. tensorboard or "
        "wandb,tensorboard (shortcut for --set log_with=[...])",
    )
    parser.add_argument("--device", default=None, help=DEVICE_HELP)
    add_heldout_arg(parser)
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("train", help="train a model from a recipe with accelerate (exact resume, Hub export)")
    add_arguments(p)


def recipe_flag_overrides(
    args: argparse.Namespace, overrides: list[str] | None, dests: tuple[str, ...] = tuple(FLAG_KEYS)
) -> list[str]:
    """``key=value`` overrides of the flags given among ``dests`` (:data:`FLAG_KEYS`); ValueError for a key that
    ``overrides`` (--set) sets too."""
    given = {(item.split("=", 1)[0].strip()) for item in overrides or []}
    out = []
    for dest in dests:
        keys = FLAG_KEYS[dest]
        value: Any = getattr(args, dest, None)
        if value is None or value is False:  # not given: the recipe's
            continue
        flag = "--" + dest.replace("_", "-")
        for key in keys:
            if key in given:
                raise SettingError(f"--set {key}=... and {flag} both set {key}: give one")
            out.append(f"{key}={str(value).lower() if isinstance(value, bool) else value}")
    return out


def run(args: argparse.Namespace) -> int:
    """Load the recipe named by ``args`` and train it; 0 on success (errors: one line each, exit 2, by
    :func:`timm_posgeom.cli.main`)."""
    from ..app.recipe import load_recipe
    from ..app.train import train

    overrides = list(args.overrides) + recipe_flag_overrides(args, args.overrides)
    if args.log_with:
        overrides.append(f"log_with=[{','.join(t.strip() for t in args.log_with.split(',') if t.strip())}]")
    recipe = load_recipe(args.recipe, overrides)
    train(
        recipe,
        args.out,
        resume=args.resume,
        progress=not args.no_progress,
        allow_changes=args.allow_changes,
        device=args.device,
    )
    return 0
