"""The one owner of run folders (app/rundir.py): the lock, the settings diff, set-aside; and --resume of nothing."""

from __future__ import annotations

import json
import os
import socket

import pytest

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


def test_lock_is_never_free_while_its_holder_is_written(tmp_path, monkeypatch):
    """Issue 31, item 4: the lock was created empty and written after; a second process that read it in
    between took it for a dead holder's, removed it and took the lock too: two writers in one run folder.
    Here a second acquire runs while the first writes its holder's line: exactly one of them may hold."""
    first, second = RunLock(tmp_path), RunLock(tmp_path)
    real_dump = json.dump
    outcome = {}

    def dump_and_race(obj, f, *args, **kwargs):  # the first acquire is writing its holder: the second comes now
        monkeypatch.setattr(json, "dump", real_dump)
        try:
            second.acquire(say=lambda s: outcome.setdefault("said", s))
        except RunDirError as e:
            outcome["second"] = e
        return real_dump(obj, f, *args, **kwargs)

    monkeypatch.setattr(json, "dump", dump_and_race)
    try:
        first.acquire(say=lambda s: outcome.setdefault("said", s))
    except RunDirError as e:
        outcome["first"] = e
    assert first.held != second.held  # exactly one holds the lock; the other was refused
    assert ("first" in outcome) == second.held and ("second" in outcome) == first.held
    assert "said" not in outcome  # nobody "took over" a lock whose holder is alive
    holder = json.loads((tmp_path / ".lock").read_text())
    assert holder["pid"] == os.getpid() and holder["host"] == socket.gethostname()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lock"]  # no temporary file left


def test_a_dead_holders_lock_is_taken_over_and_a_live_ones_refused(tmp_path):
    lock_file = tmp_path / ".lock"
    lock_file.write_text(json.dumps({"pid": 2**22 + 7, "host": socket.gethostname(), "started": "x"}))
    said = []
    lock = RunLock(tmp_path)
    lock.acquire(say=said.append)
    assert lock.held and "its holder process 4194311 is gone" in said[0]
    assert json.loads(lock_file.read_text())["pid"] == os.getpid()
    with pytest.raises(RunDirError, match=f"in use by process {os.getpid()}"):
        RunLock(tmp_path).acquire(say=said.append)
    lock.release()
    assert not lock_file.exists() and not list(tmp_path.iterdir())


def test_a_stale_lock_replaced_meanwhile_is_put_back_not_removed(tmp_path):
    """Two processes taking over the same dead holder's lock: the second must not remove the lock the
    first has just taken."""
    lock_file = tmp_path / ".lock"
    live = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": "now"})
    lock_file.write_text(live)
    RunLock(tmp_path)._remove_stale('{"pid": 1, "host": "dead"}')  # what this taker read before
    assert lock_file.read_text() == live
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lock"]


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
