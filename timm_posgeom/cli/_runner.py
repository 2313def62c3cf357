"""The one way a measuring command runs (``probe``, ``attention``, ``fragility``, ``sweep``): set up, measure on
every process, and the main process alone records and writes.

:func:`run_measurement`: launched as several processes (``accelerate launch ... -m timm_posgeom.cli COMMAND``),
each process takes a device, the main process loads the model and the data first (a download or cache made
once), every process measures its share with the same :class:`~timm_posgeom.measuring.MeasureSettings`
(:func:`measure_settings`: from the shared flags), and only the main process adds the run's own settings
(model, data, split, checkpoint, processes) to the result's ``settings`` and writes it (the result's
``to_json`` and ``plot`` write atomically, tables through :func:`~timm_posgeom.results.jsonio.write_atomic`).
Like every ``cli/`` module, nothing heavy is imported before :func:`run_measurement` runs.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ._options import load_model_and_data

__all__ = ["run_measurement", "measure_settings", "eval_batches"]


def measure_settings(args: argparse.Namespace, device: Any) -> Any:
    """The :class:`~timm_posgeom.measuring.MeasureSettings` of the shared flags (``--batch-size``, ``--resize``,
    ``--img-size``, ``--num-workers``, ``--seed``, ``--rpi-permutations``, ``--no-progress``) on ``device``. ``--max-images`` is not
    among them: the loaded split is cut to it already (a command that cuts it itself adds it)."""
    from ..measuring.settings import MeasureSettings

    return MeasureSettings(
        batch_size=args.batch_size,
        resize=args.resize,
        img_size=args.img_size,
        device=device,
        num_workers=args.num_workers,
        seed=args.seed,
        progress=not args.no_progress,
        rpi_permutations=getattr(args, "rpi_permutations", None),
    )


def eval_batches(args: argparse.Namespace, model: Any, data: Any) -> Any:
    """The probe batches of the loader flags (:func:`~timm_posgeom.data.eval_data.eval_loader`), for the commands
    that read transformed batches (``probe``, ``attention``)."""
    from ..data.eval_data import eval_loader

    return eval_loader(
        model,
        data,
        max_images=args.max_images,
        batch_size=args.batch_size,
        resize=args.resize,
        num_workers=args.num_workers,
        img_size=args.img_size,
    )


def run_measurement(
    args: argparse.Namespace,
    measure: Callable[[Any, Any, Any], Any],
    report: Callable[[argparse.Namespace, Any, Path], None],
    *,
    subset: bool = True,
) -> int:
    """Set up, ``measure(model, data, settings)`` on every process, then on the main process only: the run's
    settings recorded in ``result.settings`` and ``report(args, result, out)`` (writes and prints) with the
    ``--out`` folder made. ``subset``: the split cut to ``--max-images`` on loading (False: the command's
    measurement applies it). Returns the exit status."""
    from ..measuring import distributed

    world = distributed.setup()  # launched as several processes: each measures its share of the batches
    if args.device is None and world > 1:
        args.device = distributed.default_device()
    with distributed.main_process_first():  # a download or cache made once, by the main process
        model, data, device = load_model_and_data(args, subset=subset)
    result = measure(model, data, measure_settings(args, device))
    if not distributed.is_main():  # the same result everywhere: the main process writes and prints it
        return 0
    result.settings.update(model=args.model, data=args.data, split=args.split, checkpoint=args.checkpoint)
    if world > 1:
        result.settings["processes"] = world
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report(args, result, out)
    return 0
