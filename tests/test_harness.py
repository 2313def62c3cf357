"""The test harness itself (tests/conftest.py): every test starts alike, and the run reports its durations."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch
from conftest import SESSION_THREADS, SLOW_SECONDS, write_durations


@pytest.mark.parametrize("step", [0, 1])
def test_each_test_starts_from_seed_0_and_the_thread_count_is_not_left_to_the_next(step):
    assert torch.initial_seed() == 0
    assert torch.get_num_threads() == SESSION_THREADS  # run alone, the second step sees what the first changed
    torch.manual_seed(5)
    torch.set_num_threads(SESSION_THREADS + 1)


def test_the_durations_report(tmp_path, pytestconfig):
    seconds = {"tests/a.py::t1": 0.2, "tests/a.py::t2": 12.5, "tests/b.py::t3": 1.25}
    write_durations(tmp_path / "d.txt", seconds, {"tests/a.py::t2"}, pytestconfig)
    lines = (tmp_path / "d.txt").read_text().splitlines()
    assert lines[0].startswith("# python -m pytest -q with ") and "3 tests, 14 s of test time" in lines[0]
    assert lines[1:] == ["  12.50s tests/a.py::t2  slow", "   1.25s tests/b.py::t3"]
    assert SLOW_SECONDS == 5.0  # CONTRIBUTING.md: a test over 5 s is marked slow


def test_an_xdist_group_stays_on_one_worker(tmp_path):
    """CI runs `-n 2 --dist loadgroup`: the tests of an `xdist_group` (a module sharing a fixture built once, the
    launches that must not overlap) run on one worker. With pytest 9.2, pytest-xdist 3.8 kept no group together
    and said nothing (the study's fixture was built on both workers): pyproject.toml pins pytest below it."""
    (tmp_path / "test_grouped.py").write_text(
        "import os, pytest\n"
        "pytestmark = pytest.mark.xdist_group('g')\n"
        + "".join(f"def test_{i}():\n    print('WORKER', os.environ['PYTEST_XDIST_WORKER'])\n" for i in range(6))
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup", "-v", "-s"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"},
    )
    assert done.returncode == 0, done.stdout[-2000:]
    workers = re.findall(r"^\[(gw\d)\].*PASSED", done.stdout, re.M)
    assert len(workers) == 6 and len(set(workers)) == 1, done.stdout[-2000:]
