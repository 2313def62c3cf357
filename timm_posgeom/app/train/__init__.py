"""Train a timm ViT from a recipe, with accelerate: one readable loop (a client of the library).

    posgeom train --recipe imagenette_cpu_ape --out runs/ape
    accelerate launch -m timm_posgeom.cli train --recipe in100_paper_ape --out runs/in100_ape
    posgeom train --recipe recipes/in100_deit_rope.yaml --out runs/x --set epochs=100 --resume

    from timm_posgeom.app.recipe import load_recipe
    from timm_posgeom.app.train import train
    summary = train(load_recipe("imagenette_cpu_ape"), "runs/ape")

What a run writes under ``--out``:

* ``recipe.yaml``       the resolved recipe;
* ``data.json``         the identity of both splits (classes, size, hashes of the labels and of the
                        first images' pixels): a resume on other data under the same path is refused;
* ``metrics.jsonl``     one JSON record per log step (``kind: train``: step, epoch, loss, lr,
                        images/s, and ``pe_ssdc``, the learned position table's own SSDC), per
                        evaluation (``kind: eval``: val top-1 / loss, EMA top-1) and at the end;
                        the same numbers go to the accelerate trackers named by the recipe's
                        ``log_with`` (TensorBoard event files under ``<out>/<tracker_project>``,
                        W&B, trackio, MLflow...), as ``train/loss``, ``eval/val_top1``...;
* ``checkpoints/step_XXXXXXXX``  ``accelerator.save_state`` every ``checkpoint_every`` steps and
                        at every epoch end, written to a temporary folder and renamed into place
                        (a kill never leaves a broken checkpoint), the last ``keep_checkpoints`` kept;
* ``export/`` (and ``export_ema/``)  the final weights in timm's Hub layout (``config.json`` with
                        every architecture argument in ``model_args``, ``model.safetensors``):
                        ``timm.create_model("local-dir:<out>/export", pretrained=True)`` after
                        ``import timm_posgeom`` (without pretrained=True: the architecture only);
* ``summary.json``      final accuracy, steps, time.

Exact resumption (``--resume``): the checkpoint holds model, optimizer, grad scaler, EMA, the
step / epoch / batch counters and every process's python, numpy and torch RNG states. The data
order of an epoch is a function of ``seed + epoch`` (:class:`~timm_posgeom.data.EpochBatchSampler`,
which skips the batches already seen) and the augmentation of an item a function of
``(seed, epoch, index)``, so a resumed run repeats the uninterrupted one exactly.

The package: :mod:`.build` (checks, data, model, optimisation, resume -> one ``Session``),
:mod:`.loop` (the loop as plain functions over the session), :mod:`.checkpoints`, :mod:`.metrics`
(the training log); the run folder's lock and settings diff are :mod:`timm_posgeom.app.rundir`'s. Its flags
are in :mod:`timm_posgeom.cli.train`.
Nothing in the library imports it.
"""

from __future__ import annotations

import os
from pathlib import Path

from ...errors import SettingError
from ..recipe import Recipe
from ..records import RunSummary
from ..rundir import RunDirError, RunLock
from .checkpoints import TrainState, check_writable, latest_checkpoint
from .metrics import MetricsLog, check_tracker_project, check_trackers, read_metrics, tracker_config

__all__ = ["train", "latest_checkpoint", "read_metrics", "MetricsLog", "TrainState", "RunDirError"]


def train(
    recipe: Recipe,
    out: str | os.PathLike,
    resume: bool = False,
    progress: bool = True,
    allow_changes: bool = False,
    device: str | None = None,
) -> RunSummary:
    """Run ``recipe`` into ``out`` (see the package docstring); returns the run summary.

    Raises RecipeError / ValueError, FileNotFoundError or PermissionError before any training
    step for a bad recipe, a missing data path, an unknown model or an unwritable ``out``;
    FileExistsError / RunDirError for a run directory in use, finished, started with another
    recipe (``allow_changes`` continues it with the new values, recorded in ``recipe_changes.jsonl``),
    or, with ``resume``, holding no run (nothing is created then).

    ``device``: ``"cpu"`` trains on the CPU though a GPU is there; ``"cuda"`` (or ``"mps"``) requires it;
    None: accelerate's choice (the GPU of each process when there is one). Which GPU is accelerate's
    (``CUDA_VISIBLE_DEVICES``, ``accelerate launch --gpu_ids``).
    """
    import torch
    from accelerate import Accelerator

    from ...measuring.distributed import check_port
    from .build import build_session
    from .loop import finish, run_epochs

    out = Path(out)
    recipe = _checked(recipe, out, resume)
    check_port()  # a launch with --main_process_port 0 would hang in Accelerator() below (accelerate < 1.7)
    launched = int(os.environ.get("WORLD_SIZE", "1"))
    # several processes on a machine without CUDA (`accelerate launch --multi_gpu` or torchrun there): gloo on CPU
    cpu = launched > 1 and not torch.cuda.is_available() and not torch.backends.mps.is_available()
    cpu = cpu or _wants_cpu(device)
    trackers = check_trackers(recipe.log_with)
    check_tracker_project(recipe.tracker_project)  # a path would write outside out
    accelerator = Accelerator(
        mixed_precision=recipe.mixed_precision,
        gradient_accumulation_steps=recipe.grad_accum,
        cpu=cpu or None,
        log_with=trackers or None,
        project_dir=str(out) if trackers else None,
    )
    fresh, had_identity = not out.exists(), (out / "data.json").is_file()
    check_writable(out)
    lock = RunLock(out)
    try:
        if accelerator.is_main_process:
            lock.acquire(say=accelerator.print)
        try:
            session = build_session(accelerator, recipe, out, resume, progress, allow_changes=allow_changes)
        except Exception:  # refused before the first step (too small a split, a bad held-out fraction, ...)
            _undo_setup(accelerator, out, fresh, had_identity, lock)
            raise
        if trackers:  # after every check of the run folder: a refused run leaves no tracker files behind
            accelerator.init_trackers(
                recipe.tracker_project or out.resolve().name, config=tracker_config(recipe.to_dict())
            )
        run_epochs(session)
        return finish(session)
    finally:  # let a later train() in this process choose another precision / accumulation
        lock.release()
        _reset_accelerate_state()


def _checked(recipe: Recipe, out: Path, resume: bool) -> Recipe:
    """The recipe validated, before any folder or data: its model known to timm, what it hands to timm's
    constructors (``check_model``: model_kwargs, opt, sched, trackers), its data source found; with ``resume``
    a run in ``out`` to resume (a resume of nothing must not start a new run)."""
    import timm

    from ... import models  # noqa: F401  (registers our models with timm)
    from ...data import resolve_source
    from ...models.factory import unknown_model_message
    from ..recipe import RecipeError
    from .build import check_model, check_resumable

    recipe = recipe.validate()
    if not timm.is_model(recipe.model):
        raise RecipeError(unknown_model_message(recipe.model))
    check_model(recipe)
    resolve_source(recipe.data)
    if resume:
        check_resumable(out)
    return recipe


def _undo_setup(accelerator, out: Path, fresh: bool, had_identity: bool, lock: RunLock) -> None:
    """What a run refused during its set-up wrote, removed by the main process: the folder it created (data.json,
    recipe.yaml, the lock: no training step was taken), or in a folder that was there the ``data.json`` it added."""
    import shutil

    if not (accelerator.is_main_process and lock.held):
        return
    lock.release()
    if fresh:
        shutil.rmtree(out, ignore_errors=True)
    elif not had_identity:
        (out / "data.json").unlink(missing_ok=True)


def _wants_cpu(device: str | None) -> bool:
    """Whether ``device`` (--device) asks for the CPU; ValueError for one that accelerate cannot give."""
    import torch

    if device is None:
        return False
    if device == "cpu":
        return True
    available = {"cuda": torch.cuda.is_available(), "mps": torch.backends.mps.is_available()}
    if device not in available:
        raise SettingError(
            f"a training run takes --device cpu, cuda or mps, got {device!r} (choose the GPU with "
            "CUDA_VISIBLE_DEVICES or accelerate launch --gpu_ids)"
        )
    if not available[device]:
        raise SettingError(f"--device {device}: no {device} device here")
    return False


def _reset_accelerate_state() -> None:
    """Forget accelerate's process-wide singletons (a private API: tests/test_package.py guards its shape)."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state()
    GradientState._reset_state()
