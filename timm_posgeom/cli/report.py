"""``posgeom report RUN_DIR``: regenerate a study's report and figures from its results.json."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("report", help="rebuild report.md, report.html and figures from results.json")
    p.add_argument("run_dir", type=Path, help="a study directory (holds results.json)")


def run(args: argparse.Namespace) -> int:
    from ..app.report import write_report

    print(f"wrote {write_report(args.run_dir)}")
    return 0
