"""Write ``docs/support.md``: what timm_posgeom measures on one small model of every timm family.

    python scripts/support_matrix.py            # run every row, write docs/support.md
    python scripts/support_matrix.py --check    # run every row, exit 1 if docs/support.md differs

Each row is measured by :func:`timm_posgeom.probes.support.check_support` on a random-weight model at a small
test size (see ``timm_posgeom.probes.support.MATRIX``); ``tests/test_support.py`` runs the same rows in CI and
compares them with the file, so the page cannot drift from the code.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import timm

import timm_posgeom
from timm_posgeom.probes.support import MATRIX, build_matrix_model, check_support, support_page

DOC = Path(__file__).resolve().parents[1] / "docs" / "support.md"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare with docs/support.md instead of writing it")
    parser.add_argument("--out", type=Path, default=DOC)
    args = parser.parse_args(argv)
    rows, start = [], time.perf_counter()
    for entry in MATRIX:
        t = time.perf_counter()
        model = build_matrix_model(entry)
        rows.append(check_support(model, entry.model, img_size=(entry.img_size, entry.img_size), family=entry.family))
        print(f"{entry.family:22s} {entry.model:32s} {time.perf_counter() - t:5.1f}s", file=sys.stderr)
    text = support_page(rows, timm_version=timm.__version__, package_version=timm_posgeom.__version__)
    print(f"{len(rows)} models in {time.perf_counter() - start:.0f}s", file=sys.stderr)
    if args.check:
        same = args.out.is_file() and args.out.read_text() == text
        print("docs/support.md is current" if same else "docs/support.md differs from this run", file=sys.stderr)
        return 0 if same else 1
    args.out.write_text(text)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
