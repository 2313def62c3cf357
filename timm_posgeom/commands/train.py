"""``posgeom train``: train a model from a recipe (same flags as ``python -m timm_posgeom.train``)."""
from __future__ import annotations

import argparse


def add_parser(subparsers) -> None:
    from ..train import add_arguments

    p = subparsers.add_parser("train", help="train a model from a recipe with accelerate (exact resume, Hub export)")
    add_arguments(p)


def run(args: argparse.Namespace) -> int:
    from ..train import run_from_args

    return run_from_args(args)  # errors: one line each, reported by timm_posgeom.cli
