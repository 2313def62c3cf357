#!/usr/bin/env python3
"""What a lent GPU machine would take: the tracked tree plus the GPU plan's data, against 60 MiB.

A lease copies the working tree (tracked files, untracked files git does not ignore, and carried paths) up to
64 MiB in all (experiments/gpu/README.md). The GPU plan carries the 64-px Imagenette copy with it, so the tracked
tree plus that data must stay under 60 MiB (4 MiB kept for what a session writes).

    python .ci/check_travel_size.py                         the tree, and data/imagenette64* if it is here
    python .ci/check_travel_size.py --data PATH             the tree plus PATH (a folder or an archive)
    python .ci/check_travel_size.py --make ../shared/data/imagenette
                                                            make the packed 64-px copy in a temporary folder
                                                            (experiments/scaling/make_imagenette64.py), then count it
    python .ci/check_travel_size.py --report                print the verdict, exit 0 whatever it is

Exit 1 above the limit (unless --report), 0 under it, 2 for a --data path that is not there. A weights file
listed in experiments/weights.json that is tracked again is named: `git rm --cached` it (`posgeom weights restore`
brings it back from the history, docs/guide.md).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MIB = 1 << 20
LIMIT_MIB = 60


def tracked_bytes(root: Path) -> dict[str, int]:
    """Size of every tracked file (a link counts as the link itself, as a copy of the tree carries it)."""
    out = subprocess.run(["git", "-C", str(root), "ls-files", "-z"], check=True, capture_output=True).stdout
    sizes = {}
    for name in filter(None, out.decode().split("\0")):
        path = root / name
        if path.is_symlink() or path.is_file():
            sizes[name] = os.lstat(path).st_size
    return sizes


def data_bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def make_data(source: str, folder: Path) -> Path:
    """The packed 64-px copy of ``source`` (what the GPU plan carries), made in ``folder``."""
    tree = folder / "imagenette64"
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_DATASETS_DISABLE_PROGRESS_BARS="1")  # a log of lines, not bars
    subprocess.run(
        [sys.executable, str(ROOT / "experiments" / "scaling" / "make_imagenette64.py"), source, str(tree)],
        check=True,
        env=env,
        stdout=subprocess.DEVNULL,
    )
    archive = folder / "imagenette64.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(tree, arcname="imagenette64")
    return archive


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=None, help="the data that travels with the tree")
    parser.add_argument("--make", default=None, metavar="IMAGENETTE", help="make the packed 64-px copy from this set")
    parser.add_argument("--report", action="store_true", help="print the verdict and exit 0")
    parser.add_argument("--limit-mib", type=float, default=LIMIT_MIB)
    parser.add_argument("--root", type=Path, default=ROOT, help="the repository (default: this one)")
    args = parser.parse_args(argv)
    root = args.root
    sizes = tracked_bytes(root)
    manifest = root / "experiments" / "weights.json"
    listed = {e["path"] for e in json.loads(manifest.read_text())["files"]} if manifest.is_file() else set()
    weights = {n: s for n, s in sizes.items() if n in listed}
    tree = sum(sizes.values())
    print(f"tracked tree: {tree / MIB:.1f} MiB in {len(sizes)} files", end="")
    print(f" ({len(weights)} weights files still tracked: {sum(weights.values()) / MIB:.1f} MiB)" if weights else "")
    with tempfile.TemporaryDirectory() as tmp:
        data = args.data
        if data is not None and not data.exists():
            print(f"--data {data}: no such file or folder (make it: --make IMAGENETTE)", file=sys.stderr)
            return 2
        if args.make:
            data = make_data(args.make, Path(tmp))
        elif data is None:
            data = next(
                (p for p in (ROOT / "data" / "imagenette64.tar.gz", ROOT / "data" / "imagenette64") if p.exists()), None
            )
        extra = data_bytes(data) if data is not None else 0
        if data is not None:
            print(f"the GPU plan's data ({data.name}): {extra / MIB:.1f} MiB")
        else:
            print("the GPU plan's data: not here (--data PATH, or --make IMAGENETTE to make it): counted as 0")
    total = (tree + extra) / MIB
    over = total > args.limit_mib
    verdict = "over" if over else "under"
    print(f"what a lease would take: {total:.1f} MiB, {verdict} the {args.limit_mib:g} MiB limit")
    if over and weights:
        print(
            f"  of it, {sum(weights.values()) / MIB:.1f} MiB are weights experiments/weights.json lists: `git rm` them"
        )
    return 1 if over and not args.report else 0


if __name__ == "__main__":
    sys.exit(main())
