"""``posgeom push RUN_DIR --repo-id ORG/NAME``: upload weights, config and card to the Hub."""

from __future__ import annotations

import argparse
from pathlib import Path

from ._options import add_renamed_arg


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("push", help="upload a run's config.json, model.safetensors and card to the Hub")
    p.add_argument("run_dir", type=Path)
    p.add_argument("--repo-id", required=True, help="ORG/NAME")
    p.add_argument("--private", action="store_true")
    p.add_argument(
        "--export",
        default="export",
        metavar="DIR",
        help="the run's export folder to use: export (default) or export_ema, or a path",
    )
    add_renamed_arg(p, "--weights", "--export")
    p.add_argument("--dry-run", action="store_true", help="list exactly what would be uploaded; send nothing")


def run(args: argparse.Namespace) -> int:
    from ..app.hub import push_run

    files = push_run(args.run_dir, args.repo_id, private=args.private, dry_run=args.dry_run, weights=args.export)
    verb = "would upload" if args.dry_run else "uploaded"
    print(f"{verb} to {args.repo_id}{' (private)' if args.private else ''}:")
    for f in files:
        print(f"  {f}")
    return 0
