"""The one owner of run folders (app/rundir.py): the lock, the settings diff, set-aside; and --resume of nothing."""

from __future__ import annotations

import json
import os
import socket

import pytest
from conftest import lock_holder

from timm_posgeom.app.rundir import NEUTRAL_KEYS, RunDirError, RunLock, set_aside, settings_changes
from timm_posgeom.cli import main

TINY = [
    "model_kwargs.embed_dim=32",
    "model_kwargs.depth=1",
    "model_kwargs.num_heads=2",
    "img_size=32",
    "batch_size=16",
    "workers=0",
    "max_train_images=160",
    "max_val_images=32",
    "max_steps=1",
]


def _train_argv(out, *extra: str) -> list[str]:
    argv = ["train", "--out", str(out), "--no-progress", *extra]
    for item in TINY:
        argv += ["--set", item]
    return argv


@pytest.mark.parametrize("what", ["missing", "empty", "other files"])
def test_resume_of_a_folder_that_holds_no_run_is_refused(tmp_path, capsys, what):
    """Issue 31, item 4: `posgeom train --resume` on a folder that is not a run (or does not exist) silently
    started a fresh run of the whole recipe. Refused in one line that says to drop --resume; nothing written."""
    out = tmp_path / "run"
    if what != "missing":
        out.mkdir()
    if what == "other files":
        (out / "notes.txt").write_text("not a run")
    before = sorted(p.name for p in out.iterdir()) if out.exists() else None
    with pytest.raises(SystemExit) as e:
        main(_train_argv(out, "--resume"))
    err = capsys.readouterr().err
    assert e.value.code == 2 and "drop --resume" in err and len(err.strip().splitlines()) == 1
    assert (sorted(p.name for p in out.iterdir()) if out.exists() else None) == before  # no lock, no run started


def test_the_lock_is_filelocks_and_a_live_holder_is_refused_in_one_line(tmp_path):
    """Issue 49, item 3: the run lock is filelock's (the operating system's lock on .lock); another process holding
    it is refused, named; once it is released the folder is free and nothing of the lock is left."""
    import filelock

    lock = RunLock(tmp_path)
    assert isinstance(lock._lock, filelock.BaseFileLock) and lock._lock.lock_file == str(tmp_path / ".lock")
    holder = lock_holder(tmp_path)
    try:
        with pytest.raises(RunDirError) as refused:
            lock.acquire(say=print)
        text = str(refused.value)
        assert f"in use by process {holder.pid} on {socket.gethostname()}" in text and "\n" not in text
        assert not lock.held
    finally:
        holder.kill()
        holder.wait()
    said: list[str] = []
    lock.acquire(say=said.append)  # killed: its lock is free at once, its holder file says who it was
    assert lock.held and said == [f"taking over the lock of {tmp_path}: its holder process {holder.pid} is gone"]
    assert json.loads((tmp_path / ".holder.json").read_text())["pid"] == os.getpid()
    with pytest.raises(RunDirError, match=f"in use by process {os.getpid()}"):  # a second lock in this process too
        RunLock(tmp_path).acquire(say=said.append)
    lock.release()
    assert not lock.held and not list(tmp_path.iterdir())


def test_a_lock_released_while_another_process_waits_is_taken_by_it(tmp_path):
    """The zoo's shards wait for its folder's lock (``wait_s``): released, the waiter takes it (the lock file
    removed on release is never held by a waiter that had opened it: filelock checks)."""
    holder = lock_holder(tmp_path)
    lock = RunLock(tmp_path)
    try:
        with pytest.raises(RunDirError):
            lock.acquire(say=print, wait_s=0.2)
    finally:
        holder.kill()
        holder.wait()
    lock.acquire(say=lambda s: None, wait_s=5)
    assert lock.held
    lock.release()


def test_a_holder_on_another_host_is_refused_and_the_refusal_says_how_to_clear_it(tmp_path):
    """A shared disk's locks may not reach across hosts: a holder file naming another host is refused even when
    the lock looks free, and the refusal names the file to remove when that process is gone."""
    (tmp_path / ".holder.json").write_text(json.dumps({"pid": 1, "host": "node-elsewhere-17", "started": "x"}))
    lock = RunLock(tmp_path)
    with pytest.raises(RunDirError, match="another host, node-elsewhere-17") as refused:
        lock.acquire(say=print)
    assert f"remove {tmp_path / '.holder.json'}" in str(refused.value) and not lock.held
    (tmp_path / ".holder.json").unlink()
    lock.acquire(say=print)
    assert lock.held


def test_settings_changes_ignore_the_neutral_keys_and_compare_as_json():
    saved = {"lr": 1e-3, "workers": 2, "img_size": [32, 32], "log_every": 10}
    asked = {"lr": 2e-3, "workers": 8, "img_size": (32, 32), "log_every": 1, "epochs": 5}
    assert settings_changes("recipe", saved, asked) == {"epochs": (None, 5), "lr": (1e-3, 2e-3)}
    assert settings_changes("study", {"batch_size": 64, "seeds": 1}, {"batch_size": 8, "seeds": 3}) == {}
    assert settings_changes("zoo", {"device": "cpu", "images": 8}, {"device": "cuda", "images": 9}) == {
        "images": (8, 9)
    }
    assert set(NEUTRAL_KEYS) == {"recipe", "study", "zoo", "extrapolate"}
    assert settings_changes("extrapolate", {"device": "cpu", "data": "a"}, {"device": "cuda", "data": "b"}) == {
        "data": ("a", "b")
    }
    # a recipe saved before wd_exclude_model existed ran with the model's no_weight_decay() list excluded
    assert settings_changes("recipe", {"lr": 1e-3}, {"lr": 1e-3, "wd_exclude_model": True}) == {}
    assert settings_changes("recipe", {"lr": 1e-3}, {"lr": 1e-3, "wd_exclude_model": False}) == {
        "wd_exclude_model": (True, False)
    }
    with pytest.raises(KeyError):
        settings_changes("nothing", {}, {})


def test_set_aside_keeps_every_former_version(tmp_path):
    path = tmp_path / "eval.json"
    said = []
    for text in ("one", "two"):
        path.write_text(text)
        moved = set_aside(path, said.append)
        assert moved.read_text() == text and not path.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["eval.json.replaced-1", "eval.json.replaced-2"]
    assert said == [
        "kept the former eval.json as eval.json.replaced-1",
        "kept the former eval.json as eval.json.replaced-2",
    ]
    folder = tmp_path / "run"
    folder.mkdir()
    assert set_aside(folder).name == "run.replaced-1"  # folders too; no log: nothing said
