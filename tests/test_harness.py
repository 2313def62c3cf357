"""The test harness itself (tests/conftest.py): every test starts alike, and the run reports its durations."""

from __future__ import annotations

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
