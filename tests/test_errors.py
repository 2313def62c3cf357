"""Errors that keep bugs visible (issue 49, item 4): a user error is one of the package's own classes (or what a file
system says about the user's paths) and ends the command in one line, exit 2; a builtin ValueError from our code or
a dependency is a bug: its traceback, then a last line saying so and where to report it."""

from __future__ import annotations

import errno
import subprocess
import sys

import pytest

from timm_posgeom import errors
from timm_posgeom.errors import USER_ERRORS, PosgeomError, user_error_line


def test_the_user_errors_are_the_packages_own_classes_and_no_bare_builtin():
    assert ValueError not in USER_ERRORS and all(issubclass(c, PosgeomError) for c in USER_ERRORS)
    for name in ("SettingError", "DataError", "ResultFileError"):  # each refines the builtin code caught before
        assert issubclass(getattr(errors, name), ValueError)
    assert issubclass(errors.PathNotFoundError, FileNotFoundError)
    assert user_error_line(ValueError("a bug's message")) is None  # a builtin: a bug, never one line
    assert user_error_line(FileNotFoundError("no errno: raised by code, not by a file system")) is None
    assert user_error_line(errors.SettingError("batch_size must be >= 1,\n got 0")) == "batch_size must be >= 1, got 0"
    disk = OSError(errno.ENOSPC, "No space left on device", "/some/out/eval.json")
    assert (
        user_error_line(disk)
        == "No space left on device: /some/out/eval.json (the disk is full: free some space or write elsewhere)"
    )


def _posgeom(code: str) -> subprocess.CompletedProcess:
    """``python -c CODE`` with the package importable (CODE ends by running the command line, as the console does)."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_a_bugs_value_error_shows_its_traceback_and_a_last_line_to_report_it():
    """A ValueError from our code (here `posgeom models`' run, made to raise one) is no user error: the command
    ends with its traceback (exit 1), and its last line says it is a bug, how to report it and the versions."""
    run = _posgeom(
        "import sys\n"
        "from timm_posgeom.cli import main, models\n"
        "def run(args):\n"
        "    raise ValueError('an index out of its range: a bug')\n"
        "models.run = run\n"
        "sys.exit(main(['models']))\n"
    )
    lines = run.stderr.strip().splitlines()
    assert run.returncode == 1 and lines[0] == "Traceback (most recent call last):", run.stderr
    assert lines[-2] == "ValueError: an index out of its range: a bug"
    assert lines[-1].startswith("posgeom models: this is a bug in timm-posgeom or a library it uses")
    assert "please report it" in lines[-1] and "with the command, the traceback above and posgeom " in lines[-1]


def test_a_user_error_stays_one_line_and_from_python_main_raises_the_exception_itself(monkeypatch):
    """The same command with a user error: one line, exit 2, no traceback. Called from Python, main() raises what it
    raised (the bug hook only adds the line when the exception ends the program)."""
    run = _posgeom(
        "import sys\n"
        "from timm_posgeom.cli import main, models\n"
        "from timm_posgeom.errors import SettingError\n"
        "def run(args):\n"
        "    raise SettingError('--colours must be >= 1, got 0')\n"
        "models.run = run\n"
        "sys.exit(main(['models']))\n"
    )
    assert (run.returncode, run.stderr) == (2, "posgeom models: error: --colours must be >= 1, got 0\n")
    from timm_posgeom.cli import main, models

    def bug(args):
        raise ValueError("a bug")

    monkeypatch.setattr(models, "run", bug)
    with pytest.raises(ValueError, match="a bug"):
        main(["models"])
