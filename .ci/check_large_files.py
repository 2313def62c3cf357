#!/usr/bin/env python3
"""No weights, checkpoints or other large files added to git: refuse every file over 1 MB that the
allow-list (.ci/large-files-allowed.txt) does not name.

    python .ci/check_large_files.py                  every file git tracks (CI, on a clean checkout)
    python .ci/check_large_files.py --base REF       the files added or changed since REF
    python .ci/check_large_files.py PATH ...         these files, and the files under these folders

An allow-list line is a glob pattern (``*`` stays within one folder) and the number of files over 1 MB it may
match in the tree (``experiments/scaling/*/report.html 4``): one more under an allowed pattern fails too. Run from the
repository root (or give --root); exit 1 with one line per refused file, 0 when there is none.
"""

from __future__ import annotations

import argparse
import fnmatch
import subprocess
import sys
from pathlib import Path

LIMIT = 1_000_000  # bytes
ALLOWED = Path(__file__).with_name("large-files-allowed.txt")


def read_allowed(path: Path) -> list[tuple[str, int]]:
    """(pattern, how many files it may match) per line; ``#`` comments and blank lines skipped."""
    rules = []
    for line in path.read_text().splitlines():
        text = line.split("#", 1)[0].strip()
        if text:
            pattern, count = text.rsplit(None, 1)
            rules.append((pattern, int(count)))
    return rules


def _matches(pattern: str, name: str) -> bool:
    parts, names = pattern.split("/"), name.split("/")
    return len(parts) == len(names) and all(fnmatch.fnmatchcase(n, p) for p, n in zip(parts, names))


def _git(root: Path, *args: str) -> list[str]:
    out = subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True, text=True).stdout
    return [line for line in out.split("\0") if line]


def candidates(root: Path, base: str | None, paths: list[str]) -> list[str]:
    """Repository-relative names of the files to check."""
    if paths:
        found = []
        for p in map(Path, paths):
            p = p if p.is_absolute() else root / p
            found += sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p]
        return [f.resolve().relative_to(root.resolve()).as_posix() for f in found]
    if base:
        return _git(root, "diff", "-z", "--name-only", "--diff-filter=AMCR", base, "--")
    return _git(root, "ls-files", "-z")


def _large(root: Path, names: list[str], limit: int) -> list[str]:
    return sorted(n for n in names if (root / n).is_file() and (root / n).stat().st_size > limit)


def check(
    root: Path, names: list[str], rules: list[tuple[str, int]], tree: list[str] | None = None, limit: int = LIMIT
) -> list[str]:
    """One line per refusal: a file of ``names`` over ``limit`` bytes that no rule names, or a rule that matches
    more files over the limit in ``tree`` (the whole tracked tree; default ``names``) than its count."""
    refused = []
    for name in _large(root, names, limit):
        if not any(_matches(pattern, name) for pattern, _ in rules):
            size = (root / name).stat().st_size / 1e6
            refused.append(f"{name}: {size:.1f} MB, over {limit / 1e6:g} MB and not on {ALLOWED.name}")
    large = _large(root, names if tree is None else tree, limit)
    for pattern, count in rules:
        matched = [n for n in large if _matches(pattern, n)]
        if len(matched) > count:
            refused.append(
                f"{pattern}: {len(matched)} files over {limit / 1e6:g} MB, {ALLOWED.name} allows "
                f"{count} ({', '.join(matched)})"
            )
    return refused


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", help="files or folders to check (default: what git tracks)")
    parser.add_argument("--base", help="check only the files added or changed since this git ref")
    parser.add_argument("--root", type=Path, default=Path.cwd(), help="the repository root (default: here)")
    parser.add_argument("--allowed", type=Path, default=ALLOWED, help="the allow-list")
    args = parser.parse_args(argv)
    names = candidates(args.root, args.base, args.paths)
    tree = _git(args.root, "ls-files", "-z") if args.base else None  # an allow-list count is of the whole tree
    refused = check(args.root, names, read_allowed(args.allowed), tree)
    for line in refused:
        print(f"large file: {line}", file=sys.stderr)
    if refused:
        print(
            "weights go to the Hub (experiments/README.md), not into git; new runs' exports, checkpoints and "
            "maps.pt are ignored (.gitignore)",
            file=sys.stderr,
        )
        return 1
    print(f"large files: none over {LIMIT / 1e6:g} MB beyond the allow-list ({len(names)} files checked)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
