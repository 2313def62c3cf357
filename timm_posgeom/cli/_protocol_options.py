"""Flags of where the protocol reads its images, shared by the commands that take them: the held-out monitor of
training (``train``, ``study``) and the resolution a shift is applied at (``fragility``, ``study``). One help text
each, whatever the command (``tests/test_package.py`` compares them). Imports neither torch nor timm."""

from __future__ import annotations

import argparse

from ..errors import SettingError

__all__ = ["add_heldout_arg", "add_shift_size_arg", "shift_size"]

HELDOUT_HELP = (
    "monitor training (the per-epoch top-1, loss and SSDC under RPI) on this class-stratified fraction "
    "of the training split, held out from training (drawn by the recipe's heldout_seed; recorded); 0: on "
    "the validation split. The final numbers are on the validation split either way. Default: the "
    "recipe's (train; shortcut for --set heldout_fraction=F) or the preset's (study)"
)
SHIFT_SIZE_HELP = (
    "apply each shift at PX x PX px, the image resized straight to it first, then resize to the "
    "model's input (the paper's 224 px, for a model that reads fewer); 0: at the model's input. "
    "fragility: default 0; study: measured beside the model-input numbers, default the preset's "
    "(224 for imagenette-cpu and imagenette-cpu-14)"
)


def add_heldout_arg(p: argparse.ArgumentParser) -> None:
    """--heldout F: the held-out monitor fraction (recipe key ``heldout_fraction``)."""
    p.add_argument("--heldout", type=float, default=None, metavar="F", help=HELDOUT_HELP)


def add_shift_size_arg(p: argparse.ArgumentParser) -> None:
    """--shift-size PX: apply the shifts at PX x PX before the resize to the model's input."""
    p.add_argument("--shift-size", type=int, default=None, metavar="PX", help=SHIFT_SIZE_HELP)


def shift_size(args: argparse.Namespace) -> int | None:
    """``--shift-size`` as a size in px, or None (absent or 0: at the model's input); ValueError below 0."""
    if args.shift_size is None or args.shift_size == 0:
        return None
    if args.shift_size < 0:
        raise SettingError(
            f"--shift-size must be a size in px >= 1, or 0 (at the model's input), got {args.shift_size}"
        )
    return int(args.shift_size)
