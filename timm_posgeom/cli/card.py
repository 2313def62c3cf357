"""``posgeom card RUN_DIR``: render a run's model card from its recorded results."""

from __future__ import annotations

import argparse
from pathlib import Path

from ._options import add_renamed_arg


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("card", help="render the model card (README.md) of a training or study run")
    p.add_argument("run_dir", type=Path)
    p.add_argument("--repo-id", default="ORG/NAME", help="the Hub repo the card will live in")
    p.add_argument(
        "--export",
        default="export",
        metavar="DIR",
        help="the run's export folder to use: export (default) or export_ema, or a path",
    )
    add_renamed_arg(p, "--weights", "--export")
    p.add_argument("--out", type=Path, default=None, help="write here (default: print)")


def run(args: argparse.Namespace) -> int:
    from ..app.hub import render_card

    card = render_card(args.run_dir, repo_id=args.repo_id, weights=args.export)
    if args.out is None:
        print(card)
    else:
        args.out.write_text(card)
        print(f"wrote {args.out}")
    return 0
