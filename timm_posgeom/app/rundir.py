"""The one owner of the folders the application writes into: training runs, studies and zoos.

* :class:`RunLock`: one process writes a folder. The lock is :mod:`filelock`'s (``<out>/.lock``, held by the
  operating system while its holder lives, free once it ends); ``<out>/.holder.json`` names the holder (pid,
  host, start time). A second writer into the same folder is refused with one line naming the holder; the lock
  of a dead process (a killed run) is taken, with a message.
* :data:`NEUTRAL_KEYS` and :func:`settings_changes`: the settings that change how a folder is made
  (logged, saved, how fast), never a number in it, for each kind of folder; and the others that
  differ between what a folder was made with and what is asked now (a resume onto another model,
  learning rate or data is refused unless allowed explicitly).
* :func:`set_aside`: a file or folder about to be made again is renamed ``<name>.replaced-N``, kept.
* :func:`read_json_file` and :func:`read_yaml_file`: the one reader of the files a command reads back (a
  training run's recipe and data identity, a study's plan, an export's configuration): a file that is not
  text, not JSON / YAML or not a mapping (damaged, truncated, edited by hand) is :class:`RunFileError`, one
  line naming the file and what to do, never a parser's traceback.

Files are written with :func:`timm_posgeom.results.jsonio.write_atomic` (the one atomic writer).
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import PosgeomError, one_line
from ..results.jsonio import to_jsonable, write_atomic

__all__ = [
    "RunLock",
    "RunDirError",
    "RunFileError",
    "OutputExistsError",
    "NotWritableError",
    "NEUTRAL_KEYS",
    "LEGACY_KEYS",
    "settings_changes",
    "describe_changes",
    "set_aside",
    "read_json_file",
    "read_yaml_file",
    "check_fields",
]

# For each kind of folder, the settings that change how it is made (logged, saved, loaded, how fast, which
# runs a study holds), never its weights or its numbers; a change of any other setting is a change of result.
NEUTRAL_KEYS: dict[str, frozenset[str]] = {
    # the recipe of a training run (recipe.yaml)
    "recipe": frozenset(
        {
            "checkpoint_every",
            "keep_checkpoints",
            "log_every",
            "workers",
            "notes",
            "disk_cache",
            "eval_batch_size",
            "log_with",
            "tracker_project",
        }
    ),
    # the StudyConfig of a study (plan.json) and the evaluation settings of its runs (eval.json)
    # (``workers``: the former name of ``num_workers``, in studies started before the protocol's names)
    "study": frozenset({"batch_size", "num_workers", "workers", "device", "seeds", "conditions", "accelerate_config"}),
    # the ZooConfig of a zoo (zoo.json and each model's record): these are not even recorded
    "zoo": frozenset({"batch_size", "num_workers", "device", "shared_decode", "streaming"}),
    # the settings of a `posgeom extrapolate` folder (extrapolate.json)
    "extrapolate": frozenset({"batch_size", "num_workers", "device", "progress"}),
}


# Settings added to a kind of folder since folders of that kind were first made, with the value a folder that
# did not record them was made with: a recipe.yaml written before ``wd_exclude_model`` existed excluded the
# model's no_weight_decay() parameters (timm's behaviour), so resuming it is no change; one written before
# ``heldout_fraction`` existed monitored on the validation split (fraction 0).
LEGACY_KEYS: dict[str, dict[str, Any]] = {
    "recipe": {
        "wd_exclude_model": True,
        "data_config": None,
        "revision": None,
        "streaming": False,
        "heldout_fraction": 0.0,
        "heldout_seed": 0,
    },
    # a zoo measured before --labels and --bad-images matched labels by name and refused bad images; one measured
    # before its settings were the protocol's (timm_posgeom.protocol.Protocol) reduced SSDC to the mean map, swept
    # alpha on max_images, and measured attention at every block on every probe image
    "zoo": {
        "labels": "by-name",
        "bad_images": "error",
        "reduction": "mean_map",
        "sweep_images": None,
        "attention_layers": None,
        "attention_images": None,
    },
}


class RunDirError(PosgeomError, RuntimeError):
    """A run directory that cannot be used as asked (locked, finished, not a run, or holding another recipe)."""


class OutputExistsError(PosgeomError, FileExistsError):
    """An output folder that already holds what a command would write (a training run, a study, weights from
    elsewhere): ``--resume`` continues it, or another ``--out`` starts afresh."""


class NotWritableError(PosgeomError, PermissionError):
    """An output folder that cannot be created or written to."""


class RunFileError(PosgeomError, ValueError):
    """A file a command reads back (a recipe, a plan, a data identity, an export's configuration) that cannot be
    read: not text, not JSON or YAML, not a mapping, or holding values of the wrong type (damaged, truncated,
    edited by hand). Its one line names the file and what to do."""


def _file_text(path: Path, hint: str) -> str:
    """The text of ``path``; RunFileError when it is not UTF-8 text (binary, or cut inside a character)."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise RunFileError(f"{path} is not text (damaged?): {hint}") from None


def read_json_file(path: str | os.PathLike, hint: str) -> dict[str, Any]:
    """The JSON object in ``path``; :class:`RunFileError` (``<path> <what is wrong>: <hint>``) when it is not
    text, not JSON (empty, truncated, edited by hand) or not an object. ``hint`` says what to do, e.g. "restore
    it, or start the run again in another --out". FileNotFoundError when it is missing."""
    path = Path(path)
    try:
        value = json.loads(_file_text(path, hint))
    except json.JSONDecodeError as e:
        raise RunFileError(f"{path} is not valid JSON (damaged or truncated? {e}): {hint}") from None
    if not isinstance(value, dict):
        raise RunFileError(f"{path} holds a JSON {type(value).__name__}, not an object (edited?): {hint}")
    return value


def read_yaml_file(path: str | os.PathLike, hint: str) -> dict[str, Any]:
    """The YAML mapping in ``path`` (an empty file: RunFileError too, it holds no settings), as
    :func:`read_json_file` reads JSON."""
    import yaml

    path = Path(path)
    try:
        value = yaml.safe_load(_file_text(path, hint))
    except yaml.YAMLError as e:
        raise RunFileError(f"{path} is not valid YAML (damaged or truncated? {one_line(e)}): {hint}") from None
    if not isinstance(value, dict) or not value:
        what = "nothing" if value is None or value == {} else f"a YAML {type(value).__name__}"
        raise RunFileError(f"{path} holds {what}, not a mapping of settings (damaged or edited?): {hint}")
    return value


def check_fields(path: str | os.PathLike, values: dict[str, Any], types: dict[str, Any], hint: str) -> None:
    """RunFileError when a key of ``types`` present in ``values`` (read from ``path``) does not hold a value of
    its type (a type or a tuple of them; a bool is no number)."""
    for key, tp in types.items():
        if key not in values:
            continue
        value = values[key]
        numeric = tp in (int, float) or (isinstance(tp, tuple) and set(tp) & {int, float})
        if not isinstance(value, tp) or (numeric and isinstance(value, bool)):
            raise RunFileError(f"{path}: {key} holds {value!r}, which is not what it records (edited?): {hint}")


def settings_changes(kind: str, saved: dict[str, Any], asked: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """``{key: (saved, asked)}`` for every key outside ``NEUTRAL_KEYS[kind]`` whose value differs, the
    values compared as JSON (a tuple equals the list it was written as), in key order. KeyError for an
    unknown ``kind``; TypeError for a value with no JSON form. A key a non-empty side predates
    (``LEGACY_KEYS``) counts as the value it was made with."""
    neutral = NEUTRAL_KEYS[kind]
    legacy = LEGACY_KEYS.get(kind, {})
    saved, asked = ({**legacy, **side} if side else side for side in (saved, asked))
    saved, asked = to_jsonable(saved), to_jsonable(asked)
    keys = (set(saved) | set(asked)) - neutral
    return {k: (saved.get(k), asked.get(k)) for k in sorted(keys) if saved.get(k) != asked.get(k)}


def describe_changes(changes: dict[str, tuple[Any, Any]]) -> str:
    """``key: old -> new; ...`` for a message."""
    return "; ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in changes.items())


def set_aside(path: Path, log: Callable[[str], None] | None = None) -> Path:
    """Rename ``path`` (a file or folder about to be made again) to ``<name>.replaced-N``, the first N
    not taken: it is kept, never deleted. Returns the new path; says so through ``log`` when given.
    OSError (``path`` missing, folder not writable) propagates."""
    n = 1
    while path.with_name(f"{path.name}.replaced-{n}").exists():
        n += 1
    target = path.with_name(f"{path.name}.replaced-{n}")
    path.rename(target)
    if log is not None:
        log(f"kept the former {path.name} as {target.name}")
    return target


class RunLock:
    """An exclusive lock on a folder (a run, a study, a zoo), held by one process (the main one of a launch).

    The lock is :mod:`filelock`'s on ``<out>/.lock`` (the operating system's ``flock``): it lasts while its holder
    lives and is free as soon as the holder ends, killed or not, so a dead process's lock is simply taken.
    ``<out>/.holder.json`` names the holder (pid, host, start time), written once the lock is held: a refusal
    names it, and a holder file left by a process that is gone is said when its lock is taken. A holder on another
    host is refused even when its lock looks free (a shared disk's locks may not reach across hosts): the refusal
    says how to clear it.
    """

    def __init__(self, out: str | os.PathLike):
        from filelock import FileLock

        self.file = Path(out) / ".lock"
        self.holder_file = Path(out) / ".holder.json"
        self._lock = FileLock(self.file, timeout=0)
        self.held = False

    def _holder(self) -> dict[str, Any] | None:
        """Who holds (or last held) the lock, from ``.holder.json``; None when there is none or it is unreadable
        (being written, or damaged)."""
        try:
            holder = json.loads(self.holder_file.read_text())
        except (OSError, ValueError):
            return None
        return holder if isinstance(holder, dict) else None

    def _refusal(self, holder: dict[str, Any] | None, here: str) -> RunDirError:
        if holder is None:
            return RunDirError(f"{self.file.parent} is in use by another process: wait for it, or choose another --out")
        elsewhere = holder.get("host") != here
        return RunDirError(
            f"{self.file.parent} is in use by process {holder.get('pid')} on "
            f"{'another host, ' if elsewhere else ''}{holder.get('host')} (since {holder.get('started')}"
            f"{'; whether it still runs cannot be told from here' if elsewhere else ''}): wait for it, "
            f"or choose another --out"
            + (f"; if that process is gone, remove {self.holder_file} and run again" if elsewhere else "")
        )

    def acquire(self, say: Callable[[str], None] = print, wait_s: float = 0.0) -> None:
        """Take the lock (waiting up to ``wait_s`` seconds for its holder to release it) and name this process in
        ``.holder.json``, or raise :class:`RunDirError` naming the process that holds it. A holder file left by a
        process that is gone is said through ``say``. OSError when ``out`` is not writable."""
        from filelock import Timeout

        host = socket.gethostname()
        me = dict(pid=os.getpid(), host=host, started=time.strftime("%Y-%m-%d %H:%M:%S"))
        try:
            self._lock.acquire(timeout=wait_s)
        except Timeout:
            raise self._refusal(self._holder(), host) from None
        former = self._holder()
        if former is not None and former.get("host") != host:
            self._lock.release()
            raise self._refusal(former, host)
        if former is not None:
            say(f"taking over the lock of {self.file.parent}: its holder process {former.get('pid')} is gone")
        try:
            write_atomic(self.holder_file, json.dumps(me))
        except BaseException:
            self._lock.release()
            raise
        self.held = True

    def release(self) -> None:
        """Remove ``.holder.json`` and ``.lock`` and release the lock, if this process holds it. The lock file is
        removed while the lock is held: a process that opened it meanwhile finds it gone once it has the lock, and
        takes a new one (filelock checks this)."""
        if self.held:
            self.holder_file.unlink(missing_ok=True)
            self.file.unlink(missing_ok=True)
            self._lock.release()
            self.held = False
