"""``posgeom models [PATTERN]``: list the models this plugin registers with timm."""

from __future__ import annotations

import argparse


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("models", help="list the models this plugin registers with timm")
    p.add_argument("pattern", nargs="?", default="*", help="fnmatch pattern, e.g. '*micro*'")


def run(args: argparse.Namespace) -> int:
    from ..models import list_models

    print("\n".join(list_models(args.pattern)))
    return 0
