"""The one JSON writer of the package: strict JSON, NaN written one way, files replaced atomically.

Every file the package writes (probe, fragility and sweep results, run and study records) goes
through :func:`dumps` / :func:`write_json`:

* NaN and +-inf become ``null`` (strict JSON has no NaN; ``json.loads`` of our files never meets a
  bare ``NaN``); readers turn ``null`` back into NaN where a number is expected (:func:`nan_if_none`);
* tensors and numpy arrays / scalars become lists and numbers, tuples lists, mapping keys strings;
  anything else is an error (a silent ``str(obj)`` would write a value no reader can use);
* :func:`write_json` writes a temporary file in the same folder and renames it into place, so a
  kill never leaves a half-written file.
"""
from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["to_jsonable", "dumps", "write_json", "nan_if_none"]


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


def write_json(path: str | os.PathLike, value: Any, indent: int | None = 2) -> Path:
    """Write ``value`` as strict JSON to ``path`` atomically (temporary file, then rename)."""
    path = Path(path)
    text = dumps(value, indent=indent) + "\n"
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)
    return path


def nan_if_none(value: Any) -> Any:
    """The inverse of the writer's NaN handling for one number: None -> NaN, else unchanged."""
    return math.nan if value is None else value
