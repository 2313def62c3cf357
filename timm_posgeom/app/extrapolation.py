"""The folder ``posgeom extrapolate`` writes: one model's rows per input size and mode, resumable like the zoo.

``extrapolate.json`` (the :class:`~timm_posgeom.resolution.ExtrapolationResult`, with the run's own settings: the
model as named, its weights, the data), ``extrapolate.csv`` and ``extrapolate.md`` are written again, atomically,
as soon as each row is measured, so an interrupted run keeps every row it measured; ``extrapolate.png`` (the
figure) at the end. A rerun into the same folder keeps the rows measured with the same settings and measures only
the missing ones; a run with other settings is refused, or with ``allow_changes`` the former files are kept as
``.replaced-N`` and every row is measured again: rows of two settings are never mixed. One process writes a
folder at a time (:class:`~timm_posgeom.app.rundir.RunLock`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import PosgeomError
from ..results.jsonio import write_atomic
from .rundir import RunLock, describe_changes, set_aside, settings_changes

__all__ = ["extrapolate_into", "FILES", "ExtrapolationRecordError"]

FILES = ("extrapolate.json", "extrapolate.csv", "extrapolate.md", "extrapolate.png")

Measure = Callable[[Any, Callable[[Any], None]], Any]
"""``measure(resume, on_row) -> ExtrapolationResult``: :func:`~timm_posgeom.resolution.extrapolate` with the run's
arguments, given the rows to resume (or None) and the writer of each partial result."""


class ExtrapolationRecordError(PosgeomError, ValueError):
    """A folder holding rows measured with other settings (refused unless changes are allowed)."""


def extrapolate_into(
    out: Path,
    measure: Measure,
    run_settings: dict[str, Any],
    *,
    allow_changes: bool = False,
    write: bool = True,
    log: Callable[[str], None] = print,
) -> Any:
    """Measure into ``out`` (see the module docstring) and return the whole result.

    Args:
        out: the folder (made when missing).
        measure: runs the measure (:data:`Measure`).
        run_settings: what the run measures beyond the library's settings (model as named, weights, data, split):
            compared with the folder's before anything is measured.
        allow_changes: measure everything again when the settings differ (the former files kept), instead of
            refusing.
        write: whether this process writes (the main one of several measures too, and writes alone).
    """
    from ..resolution import SettingsChangedError

    out = Path(out)
    lock = RunLock(out)
    if write:
        out.mkdir(parents=True, exist_ok=True)
        lock.acquire(say=log)
    try:
        saved = _saved(out, run_settings, allow_changes, log)

        def keep(partial: Any) -> None:
            if write:
                _write(out, partial, run_settings, figure=False)

        try:
            result = measure(saved, keep)
        except SettingsChangedError as e:
            if not allow_changes:
                raise ExtrapolationRecordError(f"{out}: {e}; {_REMEDY}") from None
            _set_aside(out, log)
            result = measure(None, keep)
        if write:
            _write(out, result, run_settings, figure=True)
        kept = 0 if saved is None else sum(1 for r in result.rows if r.key in {s.key for s in saved.rows})
        log(f"{out}: {len(result.rows) - kept} row(s) measured now, {kept} kept from before")
        return result
    finally:
        lock.release()


_REMEDY = "--allow-changes measures every row again (the former files kept as .replaced-N), or choose another --out"


def _saved(out: Path, run_settings: dict[str, Any], allow_changes: bool, log: Callable[[str], None]) -> Any:
    """The result to resume from ``out`` (None when there is none, or when it is set aside for other settings)."""
    from ..resolution import ExtrapolationResult

    path = out / FILES[0]
    if not path.is_file():
        return None
    saved = ExtrapolationResult.read(path)
    ran = {k: saved.settings.get(k) for k in run_settings}
    changes = settings_changes("extrapolate", ran, run_settings)
    if changes and not allow_changes:
        raise ExtrapolationRecordError(f"{out} holds rows of other settings ({describe_changes(changes)}); {_REMEDY}")
    if changes:
        _set_aside(out, log)
        return None
    return saved


def _set_aside(out: Path, log: Callable[[str], None]) -> None:
    for name in FILES:
        if (out / name).is_file():
            set_aside(out / name, log)


def _write(out: Path, result: Any, run_settings: dict[str, Any], figure: bool) -> None:
    """The record, the table and the CSV of ``result`` (with the run's settings); the figure when ``figure``."""
    result.settings.update(run_settings)
    result.to_json(out / FILES[0])
    result.to_csv(out / FILES[1])
    write_atomic(out / FILES[2], result.table() + "\n")
    if figure and result.rows:
        result.plot(out / FILES[3])
