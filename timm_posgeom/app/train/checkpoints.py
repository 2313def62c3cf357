"""Checkpoints of a training run: counters saved with the state, atomic saves, discovery for resume."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

from ...results.jsonio import write_errors
from ..rundir import NotWritableError

__all__ = [
    "TrainState",
    "list_checkpoints",
    "latest_checkpoint",
    "save_checkpoint",
    "check_writable",
    "CHECKPOINT_NAME",
]

CHECKPOINT_NAME = re.compile(r"^step_(\d{8,})$")


class TrainState:
    """Counters saved with every checkpoint (registered with the Accelerator)."""

    def __init__(self) -> None:
        self.step = 0  # optimizer steps done
        self.epoch = 0  # current epoch
        self.batch = 0  # per-process batches done in the current epoch
        self.elapsed = 0.0  # training seconds before this process started

    def state_dict(self) -> dict[str, Any]:
        return dict(step=self.step, epoch=self.epoch, batch=self.batch, elapsed=self.elapsed)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step, self.epoch, self.batch = int(state["step"]), int(state["epoch"]), int(state["batch"])
        self.elapsed = float(state.get("elapsed", 0.0))


def list_checkpoints(out: str | os.PathLike) -> list[Path]:
    """The complete checkpoint folders under ``<out>/checkpoints``, oldest first (by step)."""
    root = Path(out) / "checkpoints"
    if not root.is_dir():
        return []
    found = sorted((int(m.group(1)), p) for p in root.iterdir() if (m := CHECKPOINT_NAME.match(p.name)) and p.is_dir())
    return [p for _, p in found]


def latest_checkpoint(out: str | os.PathLike) -> Path | None:
    """The newest complete checkpoint folder under ``<out>/checkpoints``, or None."""
    found = list_checkpoints(out)
    return found[-1] if found else None


def check_writable(out: Path) -> None:
    """Create ``out`` and write a file into it, or raise PermissionError with one clear line."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".write_test_{os.getpid()}"
        probe.write_text("ok")
        probe.unlink()
    except OSError as e:
        raise NotWritableError(f"output directory {str(out)!r} is not writable: {e.strerror or e}") from None


def save_checkpoint(accelerator: Any, out: Path, step: int, keep: int) -> Path:
    """``accelerator.save_state`` into a temporary folder, then rename it into place (a kill never
    leaves a broken checkpoint); keep the newest ``keep``."""
    root = out / "checkpoints"
    final, tmp = root / f"step_{step:08d}", root / f".tmp_step_{step:08d}"
    if accelerator.is_main_process:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
    accelerator.wait_for_everyone()
    try:
        with write_errors(tmp):  # a full disk: one line, not safetensors' or torch's traceback
            accelerator.save_state(str(tmp))
    except BaseException:
        if accelerator.is_main_process:  # no half-written checkpoint left behind
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        for old in list_checkpoints(out)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


def remove_partial_saves(out: Path) -> None:
    """Delete temporary checkpoint folders an interrupted save left behind."""
    for stale in (out / "checkpoints").glob(".tmp_step_*"):
        shutil.rmtree(stale, ignore_errors=True)
