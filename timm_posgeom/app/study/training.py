"""The study's training step: each run trained (or reused, or resumed) by ``posgeom train`` in a subprocess,
so that each model starts from fresh memory; and the run's training log read back."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..records import HistoryPoint
from ..rundir import RunFileError, describe_changes, read_yaml_file, set_aside, settings_changes
from .config import StudyConfig, StudyError
from .plan import PlannedRun

__all__ = ["is_trained", "train_run", "training_history"]


def is_trained(run: PlannedRun) -> bool:
    """A finished training: its summary and its export are there (reused unless its recipe changed). The export's
    ``config.json`` marks it (an export is written whole or not at all); its weights may live outside git
    (``posgeom weights restore`` brings them back when a measurement needs them)."""
    return (run.run_dir / "summary.json").is_file() and (run.run_dir / "export" / "config.json").is_file()


def train_run(run: PlannedRun, config: StudyConfig, log: Callable[[str], None], allow_changes: bool = False) -> None:
    """Train ``run`` into its folder: reused when trained with its recipe, resumed from its last checkpoint,
    trained again (the former run kept) with ``allow_changes`` when its recipe changed; StudyError otherwise
    or when the training fails."""
    from ..train import latest_checkpoint

    check_recipe(run, log, allow_changes)
    if is_trained(run):
        log(f"[{run.label}] trained run found, reused")
        return
    resume = latest_checkpoint(run.run_dir) is not None
    log(f"[{run.label}] {'resuming' if resume else 'training'}: {run.run_dir}")
    cmd = run.train_command(config, resume=resume)
    proc = subprocess.Popen(cmd, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        returncode = proc.wait()
    except BaseException:  # interrupted (Ctrl-C, or SIGTERM turned into an exception by the command): the
        _stop(proc)  # training run must not go on writing into run_dir after the study has stopped
        raise
    if returncode != 0:
        raise StudyError(
            f"training {run.condition} seed {run.seed} failed (exit {returncode}; its error is above): {' '.join(cmd)}"
        )


def recipe_changes(run: PlannedRun) -> dict[str, Any]:
    """What differs between the recipe the run's folder was trained (or started) with and the run's own
    (``{key: (saved, asked)}``; {} without a ``recipe.yaml``). Reads only."""
    path = run.run_dir / "recipe.yaml"
    if not path.is_file():
        return {}
    from ..recipe import upgrade_keys

    hint = "restore it, or pass --allow-changes to train the run again (its folder is kept beside)"
    saved = upgrade_keys(read_yaml_file(path, hint), warn=False)  # old key names: their new ones
    return settings_changes("recipe", saved, run.recipe.to_dict())


def check_recipe(run: PlannedRun, log: Callable[[str], None], allow_changes: bool) -> None:
    """What exists in the run's folder was trained (or started) with its recipe; set aside when not and
    ``allow_changes``, StudyError when not otherwise."""
    try:
        changes = recipe_changes(run)
    except RunFileError as e:  # damaged: what the folder was trained with cannot be told, so it counts as changed
        if not allow_changes:
            raise
        log(f"{run.label}: {e}")
        changes = {"recipe.yaml": ("unreadable", "the run's recipe")}
    if changes and not allow_changes:
        raise StudyError(
            f"{run.run_dir} was trained with another recipe ({describe_changes(changes)}); pass "
            "--allow-changes to train it again with the new one (the former run is kept), or choose "
            "another --out"
        )
    if changes:
        set_aside(run.run_dir, log)


def _stop(proc: subprocess.Popen, grace_s: float = 30.0) -> None:
    """Terminate a training subprocess and wait for it (killed after ``grace_s``); its last checkpoint stays."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def training_history(run_dir: Path) -> list[HistoryPoint]:
    """The evaluation records of a run's training log (``metrics.jsonl``), one per evaluation, in order.

    Each: step, epoch, val_top1 (or heldout_top1), rpi_ssdc (SSDC per layer under RPI on the recipe's
    ``probe_images`` first images of the monitor split, or None), pe_ssdc (the learned table's own SSDC, or
    None) and monitor (the split evaluated: validation or heldout; None in logs from before it was recorded).
    A resumed run has already dropped the records logged after its checkpoint (``MetricsLog``).
    """
    from ..train import read_metrics

    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    return [
        HistoryPoint(
            step=int(r["step"]),
            epoch=round(float(r["epoch"]), 3),
            val_top1=_number(r.get("val_top1")),
            rpi_ssdc=r.get("rpi_ssdc") if isinstance(r.get("rpi_ssdc"), list) else None,
            pe_ssdc=_number(r.get("pe_ssdc")),
            monitor=r.get("monitor") if isinstance(r.get("monitor"), str) else None,
            heldout_top1=_number(r.get("heldout_top1")),
        )
        for r in read_metrics(path)  # damaged lines skipped, said
        if r.get("kind") == "eval" and _number(r.get("step")) is not None and _number(r.get("epoch")) is not None
    ]


def _number(value: Any) -> float | int | None:
    """``value`` when it is a number (a log edited by hand may hold anything), else None."""
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
