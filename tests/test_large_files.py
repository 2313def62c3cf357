"""No weights added to git: ``.ci/check_large_files.py`` refuses a file over 1 MB that the allow-list does not
name, and ``.gitignore`` leaves new runs' exports, checkpoints and probe maps under ``experiments/`` out."""

from __future__ import annotations

import json
import os
import runpy
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / ".ci" / "check_large_files.py"
MB = 1_000_000


def need_checkout() -> None:
    if not SCRIPT.is_file() or not (ROOT / ".git").exists() or shutil.which("git") is None:
        pytest.skip("needs the git checkout (.ci/ and .git are not in the sdist)")


def git(repo: Path, *args: str) -> str:
    cmd = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.org", *args]
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def check(repo: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(SCRIPT), "--root", str(repo), "--allowed", str(repo / "allowed.txt"), *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=repo)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A git repository with a small record and a committed 3-MB export that the allow-list names."""
    need_checkout()
    git(tmp_path, "init", "-q")
    (tmp_path / "allowed.txt").write_text("# old exports\nexperiments/*/export/model.safetensors  1\n")
    (tmp_path / "experiments" / "old" / "export").mkdir(parents=True)
    (tmp_path / "experiments" / "old" / "export" / "model.safetensors").write_bytes(b"\0" * (3 * MB))
    (tmp_path / "experiments" / "old" / "summary.json").write_text("{}")
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-q", "-m", "base")
    return tmp_path


def test_the_allowed_files_pass(repo: Path) -> None:
    run = check(repo)
    assert run.returncode == 0, run.stderr
    assert "(3 files checked)" in run.stdout  # allowed.txt, the export, summary.json


def test_a_2_mb_file_added_to_experiments_fails(repo: Path) -> None:
    (repo / "experiments" / "new").mkdir()
    (repo / "experiments" / "new" / "weights.bin").write_bytes(b"\1" * (2 * MB))
    (repo / "experiments" / "new" / "small.json").write_text("{}")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "add weights")
    for args in ((), ("--base", "HEAD~1"), ("experiments",)):  # the whole tree, since a base, given paths
        run = check(repo, *args)
        assert run.returncode == 1, (args, run.stdout)
        refused = [line for line in run.stderr.splitlines() if line.startswith("large file:")]
        assert refused == [
            "large file: experiments/new/weights.bin: 2.0 MB, over 1 MB and not on large-files-allowed.txt"
        ], (args, run.stderr)
    since = check(repo, "--base", "HEAD")  # nothing added since the last commit: nothing to refuse
    assert since.returncode == 0 and "(0 files checked)" in since.stdout, since.stderr


def test_one_more_file_under_an_allowed_pattern_fails(repo: Path) -> None:
    """The allow-list counts the files over 1 MB in the whole tree, also when only the added ones are checked."""
    (repo / "experiments" / "newer" / "export").mkdir(parents=True)
    (repo / "experiments" / "newer" / "export" / "model.safetensors").write_bytes(b"\2" * (2 * MB))
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "one more export")
    for args in ((), ("--base", "HEAD~1")):
        run = check(repo, *args)
        assert run.returncode == 1, args
        assert run.stderr.splitlines()[0] == (
            "large file: experiments/*/export/model.safetensors: 2 files over 1 MB, large-files-allowed.txt allows 1 "
            "(experiments/newer/export/model.safetensors, experiments/old/export/model.safetensors)"
        ), run.stderr


def test_a_file_of_exactly_1_mb_passes_and_one_byte_more_fails(repo: Path) -> None:
    (repo / "a.bin").write_bytes(b"\0" * MB)
    (repo / "b.bin").write_bytes(b"\0" * (MB + 1))
    run = check(repo, "a.bin", "b.bin")
    assert run.returncode == 1 and run.stderr.count("large file:") == 1 and "b.bin" in run.stderr


def test_this_repository_passes() -> None:
    need_checkout()
    run = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 0, run.stderr


@pytest.mark.parametrize(
    "path",
    [
        "experiments/scaling/8x8-paper/runs/ape_s9/export/model.safetensors",
        "experiments/new-study/runs/rope_s0/export_ema/model.safetensors",
        "experiments/new-study/runs/rope_s0/checkpoints/step_100/model.safetensors",
        "experiments/new-study/runs/rope_s0/maps.pt",
    ],
)
def test_new_weights_under_experiments_are_ignored(path: str) -> None:
    need_checkout()
    assert subprocess.run(["git", "-C", str(ROOT), "check-ignore", "-q", "--no-index", path]).returncode == 0, path


@pytest.mark.parametrize(
    "path",
    [
        "experiments/new-study/runs/rope_s0/export/config.json",
        "experiments/new-study/runs/rope_s0/eval.json",
        "experiments/new-study/results.json",
    ],
)
def test_the_records_are_not_ignored(path: str) -> None:
    need_checkout()
    assert subprocess.run(["git", "-C", str(ROOT), "check-ignore", "-q", "--no-index", path]).returncode == 1, path


TRAVEL = ROOT / ".ci" / "check_travel_size.py"


def test_travel_size_counts_the_tree_and_the_data_and_names_tracked_weights(tmp_path):
    """`.ci/check_travel_size.py`: the tracked tree plus the GPU plan's data against the limit; above it, exit 1
    and the weights still tracked named, or exit 0 with --report."""
    repo = tmp_path / "repo"
    (repo / "experiments" / "runs" / "a" / "export").mkdir(parents=True)
    git(repo, "init", "-q")
    weights = "experiments/runs/a/export/model.safetensors"
    (repo / weights).write_bytes(os.urandom(3 << 20))
    (repo / "experiments" / "weights.json").write_text(json.dumps({"files": [{"path": weights}]}))
    git(repo, "add", "-A")
    data = tmp_path / "data.tar.gz"
    data.write_bytes(os.urandom(1 << 20))

    def check(*args: str) -> subprocess.CompletedProcess:
        cmd = [sys.executable, str(TRAVEL), "--root", str(repo), "--data", str(data), "--limit-mib", "3.5", *args]
        return subprocess.run(cmd, capture_output=True, text=True)

    over = check()
    assert over.returncode == 1 and "over the 3.5 MiB limit" in over.stdout
    assert (
        "1 weights files still tracked: 3.0 MiB" in over.stdout
        and "the GPU plan's data (data.tar.gz): 1.0 MiB" in over.stdout
    )
    assert check("--report").returncode == 0
    git(repo, "rm", "-q", "--cached", weights)
    under = check()
    assert under.returncode == 0 and "under the 3.5 MiB limit" in under.stdout, under.stdout
    gone = subprocess.run(
        [sys.executable, str(TRAVEL), "--root", str(repo), "--data", str(tmp_path / "nowhere.tar.gz")],
        capture_output=True,
        text=True,
    )
    assert gone.returncode == 2 and "nowhere.tar.gz: no such file or folder" in gone.stderr  # never counted as 0


def test_the_project_tracks_no_weights_and_travels():
    """Issue 53's bound on this repository itself: no safetensors or probe maps are tracked, and the tracked tree
    (what a lease copies besides the carried data, as `.ci/check_travel_size.py` counts it) is at most 25 MB."""
    sizes = runpy.run_path(str(TRAVEL))["tracked_bytes"](ROOT)
    assert not [n for n in sizes if n.endswith((".safetensors", "maps.pt"))]
    assert sum(sizes.values()) <= 25_000_000
