"""The one writer of the package: strict JSON, NaN written one way, files replaced atomically.

Every JSON file the package writes (probe, fragility and sweep results, run and study records) goes
through :func:`dumps` / :func:`write_json`:

* NaN and +-inf become ``null`` (strict JSON has no NaN; ``json.loads`` of our files never meets a
  bare ``NaN``); readers turn ``null`` back into NaN where a number is expected (:func:`nan_if_none`): the
  package's one pair of converters, one each way;
* tensors and numpy arrays / scalars become lists and numbers, tuples lists, mapping keys strings;
  anything else is an error (a silent ``str(obj)`` would write a value no reader can use);
* :func:`write_json` writes a temporary file in the same folder and renames it into place, so a
  kill never leaves a half-written file.

Every file is tagged with what it holds (:func:`tagged`): ``"schema": "timm-posgeom/<kind>"`` and
``"schema_version"``, the tags of the application's records (``timm_posgeom.app.records``) on the
library's results too (``ssdc-result``, ``measure-result``, ``fragility-result``, ``alpha-sweep-result``,
``imagenet-c-result``, each at version 1), so that a reader can tell any of our files apart.

That replacement is the package's one atomic write: :func:`write_atomic` for text or bytes (tables,
figures, JSON), :func:`replacing` for what another library writes to a path of its own (a tensor cache
by ``torch.save``, a Hub export folder by timm).
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import shutil
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = [
    "SCHEMA_PREFIX",
    "tagged",
    "to_jsonable",
    "dumps",
    "dump_json",
    "write_json",
    "write_atomic",
    "replacing",
    "nan_if_none",
    "write_errors",
]


def to_jsonable(value: Any) -> Any:
    """``value`` as plain JSON types (dict with str keys, list, str, int, float, bool, None),
    non-finite floats as None, recursively. Raises TypeError for a type with no JSON form."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if hasattr(value, "tolist"):  # torch.Tensor, numpy arrays and numpy scalars
        return to_jsonable(value.tolist())
    raise TypeError(f"no JSON form for {type(value).__name__}: {value!r}")


def dumps(value: Any, indent: int | None = 2) -> str:
    """Strict JSON text of ``value`` (see the module docstring)."""
    return json.dumps(to_jsonable(value), indent=indent, allow_nan=False)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


@contextmanager
def replacing(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path`` (``.<name>.tmp<pid>``, in the same folder); when the block
    ends without an exception, rename what was written there to ``path``, replacing what was there (a
    folder is removed first: a folder cannot replace one atomically, so a kill between the two leaves
    none; a file never leaves a half-written one). On an exception (KeyboardInterrupt too) the temporary
    path is removed, ``path`` is left as it was, and the exception propagates. OSError from the rename
    (no such folder, not writable) propagates."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    _remove(tmp)  # left by a killed process that had this pid
    try:
        yield tmp
        if tmp.is_dir() and path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        os.replace(tmp, path)
    except BaseException as e:
        _remove(tmp)
        if isinstance(e, OSError) and e.filename is None:  # a write that failed (a full disk): name the file
            e.filename = str(path)
        raise


@contextmanager
def write_errors(path: str | os.PathLike) -> Iterator[None]:
    """Turn what another library raises when a write fails (safetensors' ``SafetensorError: ... (os error 28)``,
    torch.save's ``RuntimeError: [enforce fail at inline_container.cc] ... unexpected pos``) into the OSError
    it is, naming ``path``: a full disk is a user's fault, said in one line (:func:`timm_posgeom.errors.io_error_line`),
    not a traceback. Any other exception passes unchanged."""
    try:
        yield
    except OSError as e:
        if e.filename is None:
            e.filename = str(path)
        raise
    except Exception as e:
        text = str(e)
        code = re.search(r"os error (\d+)", text)
        if code:
            raise OSError(int(code[1]), os.strerror(int(code[1])), str(path)) from e
        if "inline_container" in text or "file write failed" in text or "PytorchStreamWriter" in text:
            raise OSError(errno.EIO, "the write failed (a full disk or a write limit?)", str(path)) from e
        raise


def write_atomic(path: str | os.PathLike, data: str | bytes) -> Path:
    """Write ``data`` (text as UTF-8, or bytes) to ``path`` atomically: a temporary file in the same
    folder, renamed into place (:func:`replacing`), so a reader or a kill never meets a half-written
    file. Returns ``path``; OSError (missing folder, not writable) propagates and leaves ``path`` as it
    was."""
    with replacing(path) as tmp:
        if isinstance(data, bytes):
            tmp.write_bytes(data)
        else:
            tmp.write_text(data, encoding="utf-8")
    return Path(path)


def write_json(path: str | os.PathLike, value: Any, indent: int | None = 2) -> Path:
    """Write ``value`` as strict JSON (:func:`dumps`, then a newline) to ``path`` atomically
    (:func:`write_atomic`). Returns ``path``; TypeError for a value with no JSON form (nothing written),
    OSError as :func:`write_atomic`."""
    return write_atomic(path, dumps(value, indent=indent) + "\n")


SCHEMA_PREFIX = "timm-posgeom/"


def tagged(kind: str, body: Mapping[str, Any], version: int = 1) -> dict[str, Any]:
    """``body`` with the schema tags in front: ``{"schema": "timm-posgeom/<kind>", "schema_version":
    version, **body}`` (the form of every file the package writes)."""
    return {"schema": SCHEMA_PREFIX + kind, "schema_version": version, **body}


def dump_json(value: Any, path: str | os.PathLike | None = None, indent: int | None = 2) -> str:
    """Strict JSON text of ``value`` (:func:`dumps`); also written to ``path`` when given, with a final
    newline, atomically (:func:`write_atomic`): what the results' ``to_json(path)`` do. TypeError for a
    value with no JSON form (nothing written), OSError as :func:`write_atomic`."""
    text = dumps(value, indent=indent)
    if path is not None:
        write_atomic(path, text + "\n")
    return text


def nan_if_none(value: Any) -> Any:
    """The reader's side of the writer's NaN handling (:func:`to_jsonable` writes NaN as None): None -> NaN, in
    lists, tuples and mapping values too (made lists and dicts), anything else unchanged; e.g. a record's SSDC per
    layer or its intervals, ``nan_if_none([[0.1, None]]) == [[0.1, nan]]``. The package's one converter of None
    back to NaN (its one converter the other way: :func:`to_jsonable`)."""
    if value is None:
        return math.nan
    if isinstance(value, Mapping):
        return {k: nan_if_none(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [nan_if_none(v) for v in value]
    return value
