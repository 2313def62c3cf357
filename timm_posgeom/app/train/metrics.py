"""The training log: ``metrics.jsonl`` (one JSON record per line) and TensorBoard when installed."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ...jsonio import dumps

__all__ = ["MetricsLog", "read_metrics"]


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl``, in file order; a torn line (an interrupted write) is skipped."""
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


class MetricsLog:
    """metrics.jsonl (+ TensorBoard when installed), written by the main process only.

    On resume (``resume_step`` given) the records an interrupted run logged after its checkpoint,
    and a torn last line, are dropped, so the log reads as if the run had never stopped.
    """

    def __init__(self, out: Path, enabled: bool, resume_step: int | None = None):
        self.enabled = enabled
        self.file = out / "metrics.jsonl"
        self.writer = None
        if not enabled:
            return
        if resume_step is not None and self.file.exists():
            kept = [r for r in read_metrics(self.file) if r.get("step", 0) <= resume_step and r.get("kind") != "final"]
            self.file.write_text("".join(dumps(r, indent=None) + "\n" for r in kept))
        elif resume_step is None and self.file.exists():
            self.file.unlink()
        try:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(out / "tensorboard"))
        except ImportError:
            self.writer = None

    def log(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        with self.file.open("a") as f:
            f.write(dumps(record, indent=None) + "\n")
        if self.writer is not None:
            for key, value in record.items():
                if isinstance(value, (int, float)) and key not in ("step",):
                    self.writer.add_scalar(f"{record.get('kind', 'train')}/{key}", value, record.get("step", 0))

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
