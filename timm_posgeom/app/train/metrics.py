"""The training log: ``metrics.jsonl`` (one JSON record per line, the record) and the accelerate trackers the
recipe names in ``log_with`` (TensorBoard, W&B, trackio, MLflow...)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

from ...errors import SettingError
from ...results.jsonio import dumps

__all__ = ["MetricsLog", "read_metrics", "check_trackers", "check_tracker_project", "tracker_config"]


def check_trackers(names: list[str]) -> list[str]:
    """``names`` if accelerate can log with each of them here; else a ValueError naming the missing one and
    its remedy (accelerate itself would leave an uninstalled tracker out without a word)."""
    if not names:
        return []
    from accelerate.tracking import get_available_trackers
    from accelerate.utils import LoggerType

    known = [str(t) for t in LoggerType.list() if t != "all"]
    available = {str(t) for t in get_available_trackers()}
    for name in names:
        if name not in known:
            raise SettingError(f"log_with: unknown tracker {name!r}; accelerate here knows {', '.join(known)}")
        if name not in available:
            raise SettingError(
                f"log_with: {name} is not installed here (pip install {name.replace('_', '-')}); "
                "metrics.jsonl is written without it, or drop it from log_with"
            )
    return list(names)


def check_tracker_project(project: str | None) -> None:
    """ValueError unless ``project`` (a recipe's ``tracker_project``) is a plain name: the trackers write under
    ``<out>/<project>`` (TensorBoard), so a path (``/tmp/x``, ``../x``, ``a/b``) would write outside the run."""
    if project is None:
        return
    text = str(project)
    if not text.strip() or "/" in text or "\\" in text or text in (".", "..") or Path(text).is_absolute():
        raise SettingError(
            f"tracker_project must be a plain name (the trackers write under <out>/<name>), got "
            f"{project!r}: a path would write outside --out"
        )


def tracker_config(recipe: dict[str, Any]) -> dict[str, Any]:
    """The recipe as the trackers' run config: scalars as they are, anything else as its text (TensorBoard's
    hyper-parameters take only numbers, strings and booleans)."""
    return {k: v if isinstance(v, (int, float, str, bool)) else str(v) for k, v in recipe.items()}


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl``, in file order; a torn line (an interrupted write) is skipped, and
    a step logged more than once under one kind (a log of a version that repeated the last evaluation on
    resume) counts once, its last record in the place of its first: no reader counts a step twice. A damaged
    line elsewhere (not text, not a JSON object, a step that is not a number) is skipped with a warning."""
    records: list[dict[str, Any]] = []
    where: dict[tuple[Any, Any], int] = {}
    lines = path.read_bytes().decode("utf-8", errors="replace").splitlines()
    damaged = 0
    for i, line in enumerate(lines):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            record = None
        if not isinstance(record, dict) or not isinstance(record.get("step", 0), (int, float)):
            damaged += i < len(lines) - 1 and bool(line.strip())  # the last line torn by a kill: expected
            continue
        key = (record.get("kind"), record.get("step"))
        if key[1] is not None and key in where:
            records[where[key]] = record
            continue
        where[key] = len(records)
        records.append(record)
    if damaged:
        warnings.warn(f"{path}: skipped {damaged} damaged line(s) (not a JSON record)", RuntimeWarning, stacklevel=2)
    return records


class MetricsLog:
    """metrics.jsonl, written by the main process only, and every number of each record sent to the
    accelerate trackers (``tracker``: ``accelerator.log``, or None) as ``<kind>/<key>`` at its step.

    On resume (``resume_step`` given) the records an interrupted run logged after its checkpoint,
    and a torn last line, are dropped, so the log reads as if the run had never stopped.
    """

    def __init__(self, out: Path, enabled: bool, resume_step: int | None = None, tracker: Any = None):
        self.enabled = enabled
        self.file = out / "metrics.jsonl"
        self.tracker = tracker
        self.resumed_eval: dict[str, Any] | None = None  # the evaluation logged at the resume step, if any
        if not enabled:
            return
        if resume_step is not None and self.file.exists():
            kept = [r for r in read_metrics(self.file) if r.get("step", 0) <= resume_step and r.get("kind") != "final"]
            # the checkpoint at this step was saved after its evaluation: the session need not evaluate again
            self.resumed_eval = next(
                (r for r in reversed(kept) if r.get("kind") == "eval" and r.get("step") == resume_step), None
            )
            self.file.write_text("".join(dumps(r, indent=None) + "\n" for r in kept))
        elif resume_step is None and self.file.exists():
            self.file.unlink()

    def log(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        with self.file.open("a") as f:
            f.write(dumps(record, indent=None) + "\n")
        if self.tracker is not None:
            kind = record.get("kind", "train")
            numbers = {
                f"{kind}/{key}": value
                for key, value in record.items()
                if isinstance(value, (int, float)) and not isinstance(value, bool) and key != "step"
            }
            if numbers:
                self.tracker(numbers, step=record.get("step", 0))

    def close(self) -> None:
        """Nothing to close: the trackers end with ``accelerator.end_training()``."""
