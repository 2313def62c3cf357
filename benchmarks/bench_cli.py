"""How long the ``posgeom`` command takes to answer ``--help`` and an argument error, next to ``import torch``.

Usage::

    python benchmarks/bench_cli.py [--repeat 5]

Each case runs as a fresh process (``python -m timm_posgeom.cli ...``, what the ``posgeom`` script runs),
``--repeat`` times, in one run of this script, so that every figure shares the machine's load. Printed per
case: the best and the median wall time, the best CPU time (user + system of the child), and the ratio of
the best wall time to ``python -c "import torch"``'s. The command line parses before it imports torch or
timm, so these cases should cost a fraction of one torch import (``tests/test_package.py`` checks that no
torch or timm module is loaded; no wall-clock limit is asserted anywhere).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time

CASES: tuple[tuple[str, list[str], int], ...] = (
    ('python -c "import torch"', ["-c", "import torch"], 0),
    ('python -c "import timm_posgeom"', ["-c", "import timm_posgeom"], 0),
    ("posgeom --help", ["-m", "timm_posgeom.cli", "--help"], 0),
    ("posgeom probe --help", ["-m", "timm_posgeom.cli", "probe", "--help"], 0),
    ("posgeom zoo --help", ["-m", "timm_posgeom.cli", "zoo", "--help"], 0),
    ("posgeom fragility MODEL (no --data)", ["-m", "timm_posgeom.cli", "fragility", "MODEL"], 2),
    (
        "posgeom sweep MODEL --data synthetic --max-images 0",
        ["-m", "timm_posgeom.cli", "sweep", "MODEL", "--data", "synthetic", "--max-images", "0"],
        2,
    ),
)


def _run_once(args: list[str], expected: int) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the child) of one ``python ARGS`` process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")},
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != expected:
        raise SystemExit(f"python {' '.join(args)}: exit {done.returncode}, expected {expected}\n{done.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="runs per case (default 5)")
    args = parser.parse_args()
    _run_once(["-c", "import torch, timm"], 0)  # warm the file cache: the first import reads every file from disk
    rows = []
    for name, argv, expected in CASES:
        times = [_run_once(argv, expected) for _ in range(args.repeat)]
        walls, cpus = [t[0] for t in times], [t[1] for t in times]
        rows.append((name, min(walls), statistics.median(walls), min(cpus)))
    torch_wall = rows[0][1]
    width = max(len(r[0]) for r in rows)
    print(f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]}, {args.repeat} runs per case")
    print(f"{'case':{width}s}  {'best s':>7s}  {'median s':>8s}  {'CPU s':>6s}  {'/ import torch':>14s}")
    for name, best, median, cpu in rows:
        print(f"{name:{width}s}  {best:7.3f}  {median:8.3f}  {cpu:6.3f}  {best / torch_wall:14.2f}")


if __name__ == "__main__":
    main()
