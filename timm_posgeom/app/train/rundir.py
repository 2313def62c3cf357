"""Who owns a run directory, and whether what is asked matches what it holds.

* :class:`RunLock`: ``<out>/.lock`` names the process writing the run (pid, host, start time). A second
  training into the same directory is refused while the holder lives; the lock of a dead process (a
  killed run) is taken over with a message.
* :func:`recipe_changes`: the recipe keys whose change alters the results, between the recipe a run
  was started with and the one asked for now (a resume onto another model, learning rate or batch
  size is refused unless allowed explicitly).
"""
from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from ...errors import PosgeomError

__all__ = ["RunLock", "RunDirError", "changed_keys", "recipe_changes", "describe_changes", "NEUTRAL_KEYS"]

# Recipe keys that change how a run is logged, saved or loaded, never its weights or its numbers.
NEUTRAL_KEYS = frozenset({"checkpoint_every", "keep_checkpoints", "log_every", "workers", "notes", "disk_cache",
                          "eval_batch_size", "log_with", "tracker_project"})


class RunDirError(PosgeomError, RuntimeError):
    """A run directory that cannot be used as asked (locked, finished, or holding another recipe)."""


def changed_keys(saved: dict[str, Any], asked: dict[str, Any], neutral: frozenset[str]) -> dict[str, tuple[Any, Any]]:
    """``{key: (saved, asked)}`` for every key outside ``neutral`` whose value differs."""
    keys = (set(saved) | set(asked)) - neutral
    return {k: (saved.get(k), asked.get(k)) for k in sorted(keys) if saved.get(k) != asked.get(k)}


def recipe_changes(saved: dict[str, Any], asked: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """``{key: (saved, asked)}`` for every result-changing recipe key that differs."""
    return changed_keys(saved, asked, NEUTRAL_KEYS)


def describe_changes(changes: dict[str, tuple[Any, Any]]) -> str:
    """``key: old -> new; ...`` for a message."""
    return "; ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in changes.items())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


class RunLock:
    """An exclusive lock on a run directory, held by one process (the main one of a launch)."""

    def __init__(self, out: Path):
        self.file = Path(out) / ".lock"
        self.held = False

    def _holder(self) -> dict[str, Any] | None:
        try:
            return json.loads(self.file.read_text())
        except (OSError, json.JSONDecodeError):
            return None

    def acquire(self, say=print) -> None:
        """Take the lock, or raise :class:`RunDirError` naming the live process that holds it."""
        me = dict(pid=os.getpid(), host=socket.gethostname(), started=time.strftime("%Y-%m-%d %H:%M:%S"))
        for _ in range(2):
            try:
                fd = os.open(self.file, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder = self._holder()
                if holder is None or (holder.get("host") == me["host"] and not _alive(int(holder.get("pid", -1)))):
                    say(f"taking over the lock of {self.file.parent}: its holder "
                        f"{'(unreadable)' if holder is None else 'process ' + str(holder.get('pid'))} is gone")
                    self.file.unlink(missing_ok=True)
                    continue
                raise RunDirError(f"{self.file.parent} is in use by process {holder.get('pid')} on {holder.get('host')} "
                                  f"(since {holder.get('started')}): wait for it, or choose another --out") from None
            with os.fdopen(fd, "w") as f:
                json.dump(me, f)
            self.held = True
            return
        raise RunDirError(f"could not lock {self.file.parent}")

    def release(self) -> None:
        if self.held:
            holder = self._holder()
            if holder is not None and holder.get("pid") == os.getpid():
                self.file.unlink(missing_ok=True)
            self.held = False
