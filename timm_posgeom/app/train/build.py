"""Set-up of a training run: checks, data, model, optimisation, resume -> one :class:`Session`.

Everything here runs before the first training step, so a bad recipe, a missing data path, an
unknown model or an unwritable output folder fails in seconds, not after an epoch.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import yaml

from ...errors import one_line
from ...measuring.distributed import broadcast_object
from ...results.jsonio import dumps
from ..recipe import Recipe, RecipeError, upgrade_keys
from ..rundir import (
    OutputExistsError,
    RunDirError,
    check_fields,
    describe_changes,
    read_json_file,
    read_yaml_file,
    settings_changes,
)
from .checkpoints import TrainState, latest_checkpoint, list_checkpoints, remove_partial_saves
from .metrics import MetricsLog, check_tracker_project, check_trackers
from .monitor import build_monitor, carve_monitor

__all__ = ["Session", "build_session", "build_data", "build_optimizer", "build_scheduler", "check_model"]


@dataclass
class Session:
    """Everything one training run holds; the loop's functions read and update it."""

    accelerator: Any
    recipe: Recipe
    out: Path
    progress: bool
    model: nn.Module  # wrapped by accelerate (DDP, ...)
    raw_model: nn.Module
    optimizer: Any
    scheduler: Any
    ema: Any
    mixup: Any
    loss_fn: nn.Module
    classes: list[str]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    train_ds: Any
    train_sampler: Any
    val_size: int
    val_loader: Any
    rpi_loader: Any
    steps_per_epoch: int
    total_steps: int
    state: TrainState
    log: MetricsLog
    resumed_from: str | None
    started: float = field(default_factory=time.perf_counter)
    last_saved: int = -1
    last_eval: int = -1
    eval_result: dict[str, Any] = field(default_factory=dict)
    first_bad_step: Any = None  # (device int64 scalar) the first step whose loss was not finite, or -1
    step_lrs: dict[int, float] = field(default_factory=dict)  # learning rate of recent steps, for messages
    skipped_images: list[str] = field(default_factory=list)  # bad images left out (bad_images=skip)
    monitor: Any = None  # a held-out monitor split (monitor.Monitor), or None: monitored on the validation split

    @property
    def world(self) -> int:
        return self.accelerator.num_processes

    def elapsed(self) -> float:
        """Training seconds of this run, over every invocation that resumed it."""
        return self.state.elapsed + time.perf_counter() - self.started


def per_process_batch(accelerator: Any, recipe: Recipe) -> int:
    """The per-process batch, after checking the launch and the recipe agree."""
    world = accelerator.num_processes
    launched = int(os.environ.get("WORLD_SIZE", "1"))
    if world != launched:
        raise RuntimeError(
            f"{launched} processes were launched but accelerate set up {world}: every process would "
            "train alone into the same --out (for CPU processes set ACCELERATE_USE_CPU=1)"
        )
    if recipe.batch_size % (world * recipe.grad_accum):
        raise RecipeError(
            f"batch_size {recipe.batch_size} (global) is not divisible by processes x grad_accum "
            f"= {world} x {recipe.grad_accum}"
        )
    batch = recipe.batch_size // (world * recipe.grad_accum)
    if (recipe.mixup or recipe.cutmix) and batch % 2:
        raise RecipeError(f"mixup/cutmix need an even per-process batch, got {batch}")
    return batch


def _load_splits(recipe: Recipe, accelerator: Any, progress: bool) -> tuple[Any, Any]:
    """(train split, validation split) of the recipe's data, each cut to its ``max_*_images`` and checked
    (``bad_images``); the main process first (a download or cache made once)."""
    from ... import data as D

    hub = D.HubOptions(config=recipe.data_config, revision=recipe.revision, streaming=recipe.streaming)
    with accelerator.main_process_first():
        # on synthetic data, max_*_images is the number of images generated (else 5000 and 1000)
        train_split = D.load_split(
            recipe.data,
            recipe.train_split,
            subset=recipe.max_train_images,
            img_size=recipe.img_size,
            seed=recipe.seed,
            synthetic_size=recipe.max_train_images,
            **hub,
        )
        val_split = D.load_split(
            recipe.data,
            recipe.val_split,
            subset=recipe.max_val_images,
            img_size=recipe.img_size,
            seed=recipe.seed,
            synthetic_size=recipe.max_val_images,
            **hub,
        )
        # every validation image decoded before the first epoch (a bad one found at the first evaluation
        # cost an epoch per try): by the uint8 cache, which decodes both splits before training (a cache
        # file exists only for splits that decoded), else here; to skip bad images, both are checked first
        show = progress and accelerator.is_main_process
        if recipe.bad_images == "skip" or not recipe.cache:
            val_split = D.check_images(val_split, recipe.bad_images, progress=show)
        if recipe.bad_images == "skip":
            train_split = D.check_images(train_split, "skip", progress=show)
    return train_split, val_split


def _datasets(
    recipe: Recipe, accelerator: Any, train_split: Any, val_split: Any, mean, std, progress: bool
) -> tuple[Any, Any]:
    """(train dataset, val dataset): the uint8 cache (``cache``) or timm's transforms."""
    from ... import data as D
    from ...data.transforms import eval_transform

    if recipe.cache:
        show = progress and accelerator.is_main_process
        cache_dir = D.default_cache_dir() if recipe.disk_cache else None
        with accelerator.main_process_first():
            train_cache = D.cache_uint8(
                train_split, recipe.img_size, recipe.interpolation, recipe.workers, cache_dir, progress=show
            )
            val_cache = D.cache_uint8(
                val_split, recipe.img_size, recipe.interpolation, recipe.workers, cache_dir, progress=show
            )
        return (
            D.CachedTrainDataset(
                train_cache, mean, std, recipe.crop_pad, recipe.hflip, recipe.seed, augment=recipe.augment
            ),
            D.CachedEvalDataset(val_cache, mean, std),
        )
    tf = D.train_transform(
        recipe.img_size,
        recipe.augment,
        mean,
        std,
        recipe.interpolation,
        recipe.crop_pad,
        recipe.hflip,
        auto_augment=recipe.auto_augment,
        color_jitter=recipe.color_jitter,
        reprob=recipe.reprob,
        scale=recipe.scale,
    )
    config = D.eval_config(recipe.img_size, mean, std, recipe.interpolation, recipe.crop_pct)
    return (
        D.TransformDataset(train_split, tf, seed=recipe.seed),
        D.TransformDataset(val_split, eval_transform(config, resize=recipe.eval_resize)),
    )


def build_data(recipe: Recipe, accelerator: Any, mean, std, batch: int, progress: bool = True):
    """(classes, train dataset, val dataset, train sampler, val sampler, skipped images, data identity, held-out
    monitor or None) of the recipe's data."""
    from ... import data as D

    world, rank = accelerator.num_processes, accelerator.process_index
    train_split, val_split = _load_splits(recipe, accelerator, progress)
    train_split, heldout, carving = carve_monitor(recipe, train_split)  # heldout_fraction 0: (split, None, None)
    train_ds, val_ds = _datasets(recipe, accelerator, train_split, val_split, mean, std, progress)
    train_sampler = D.EpochBatchSampler(len(train_ds), batch, world, rank, seed=recipe.seed)
    val_sampler = D.EpochBatchSampler(
        len(val_ds), recipe.eval_batch_size or batch, world, rank, shuffle=False, drop_last=False
    )
    skipped = list(getattr(train_split, "skipped", [])) + list(getattr(val_split, "skipped", []))
    identity = dict(train=D.data_identity(train_split), validation=D.data_identity(val_split))
    if carving is not None:
        identity["heldout"] = carving
    monitor = build_monitor(recipe, accelerator, heldout, carving, mean, std, batch, progress)
    return train_split.classes, train_ds, val_ds, train_sampler, val_sampler, skipped, identity, monitor


def _check_data(out: Path, identity: dict[str, Any], resuming: bool, data: str | None, is_main: bool) -> None:
    """``out/data.json``: the identity of the data the run trains on (:func:`timm_posgeom.data.data_identity`).
    A resume on other data (the same path, other content) is refused, even with allowed changes: the
    checkpoint's steps were taken on the former data. A run without the file (older) gains it."""
    from ...data import identity_change

    path = out / "data.json"
    if resuming and path.is_file():
        hint = "restore it, or remove it (the resume then writes it again, without comparing the data)"
        saved = read_json_file(path, hint)
        check_fields(path, saved, {"train": dict, "validation": dict, "heldout": dict}, hint)
        for split in ("train", "validation"):
            what = identity_change(saved[split], identity[split]) if saved.get(split) else None
            if what:
                raise RunDirError(
                    f"{out} was trained on other data: {data or 'synthetic'} now has other {what} in "
                    f"its {split} split than when the run started; point data at that data, or "
                    "choose another --out"
                )
    if is_main:
        out.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(identity, indent=2) + "\n")


def check_model(recipe: Recipe) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """What the recipe passes through to timm's constructors, checked before any work (no folder, no data): the
    model built on the meta device with the recipe's ``model_kwargs`` (no memory, no init) and one forward pass
    of its shapes, then its optimizer (:func:`build_optimizer`: ``opt``, its betas, eps, momentum, weight-decay
    groups) and its scheduler (:func:`build_scheduler`: ``sched``, warmup) made over it, as the run makes them;
    and the trackers of ``log_with``. A keyword the model does not take, a width its heads do not divide, an
    optimizer or a scheduler timm does not know, a tracker accelerate cannot log with, ... is a user error in one
    line (:class:`RecipeError`, ValueError), the same in ``posgeom train`` and in a study's plan (and its dry run).
    Returns the model's normalisation (mean, std)."""
    from timm.data import resolve_data_config

    check_trackers(recipe.log_with)  # accelerate's trackers, and where they would write
    check_tracker_project(recipe.tracker_project)
    probe = _meta_model(recipe)
    try:
        optimizer = build_optimizer(recipe, probe)
    except Exception as e:  # noqa: BLE001  timm's factory and the optimizers' constructors: ValueError, TypeError
        raise RecipeError(
            f"opt {recipe.opt!r} cannot be made ({one_line(e, first_line=True)}): {_known_optimizers(recipe.opt)}"
        ) from None
    try:
        build_scheduler(recipe, optimizer, total_steps=100 * recipe.epochs, steps_per_epoch=100)
    except Exception as e:  # noqa: BLE001
        raise RecipeError(
            f"sched {recipe.sched!r} cannot be made ({one_line(e, first_line=True)}): timm's schedulers are cosine, "
            "tanh, step, multistep, poly, wsd, rsqrt, constant, plateau, or none (a constant lr)"
        ) from None
    cfg = resolve_data_config({}, model=probe)
    return tuple(cfg["mean"]), tuple(cfg["std"])


def _meta_model(recipe: Recipe) -> nn.Module:
    """The recipe's model on the meta device, after one forward pass of its shapes; RecipeError (one line) when
    its constructor or that pass refuses the recipe's ``model_kwargs`` or ``img_size``. An operation without a
    meta kernel leaves the check to the run itself (the model is then built on the CPU, the pass skipped)."""
    import timm

    def build(device: str) -> nn.Module:
        with torch.device(device):
            return timm.create_model(
                recipe.model, pretrained=False, num_classes=2, img_size=recipe.img_size, **recipe.model_kwargs
            )

    try:
        try:
            model = build("meta")
        except NotImplementedError:
            return build("cpu")
        with torch.device("meta"), torch.no_grad():  # shapes only: a width its heads do not divide fails here
            model.eval()(torch.empty(2, 3, recipe.img_size, recipe.img_size))
    except NotImplementedError:
        return model.train()
    except Exception as e:  # noqa: BLE001  a constructor refuses a keyword or a value with any exception
        kwargs = ", ".join(f"{k}={v!r}" for k, v in recipe.model_kwargs.items()) or "no model_kwargs"
        raise RecipeError(
            f"{recipe.model} cannot be built with {kwargs} at img_size {recipe.img_size} "
            f"({type(e).__name__}: {one_line(e, first_line=True)}): fix model_kwargs (or img_size)"
        ) from None
    return model.train()


def _known_optimizers(asked: str) -> str:
    """What to write instead of ``asked``: timm's closest optimizer names."""
    import difflib

    from timm.optim import list_optimizers

    close = difflib.get_close_matches(str(asked).lower(), list_optimizers(), n=3, cutoff=0.5)
    return (
        f"did you mean {', '.join(map(str, close))}? " if close else ""
    ) + "timm.optim.list_optimizers() lists timm's optimizers"


def _groups_without_model_list(recipe: Recipe):
    """A timm ``param_group_fn`` that ignores the model's ``no_weight_decay()`` (which timm's optimizer factory
    honours whatever ``filter_bias_and_bn`` says): with ``wd_exclude_1d`` false, one group, every trainable
    parameter at the recipe's weight decay; with it true, biases and norms (1-d) at 0 and the rest decayed."""
    from timm.optim import param_groups_weight_decay

    def groups(model: nn.Module):
        return param_groups_weight_decay(
            model,
            weight_decay=recipe.weight_decay,
            weight_decay_exclude_1d=recipe.wd_exclude_1d,
            no_weight_decay_list=(),
        )

    return groups


def build_optimizer(recipe: Recipe, model: nn.Module) -> torch.optim.Optimizer:
    """The recipe's optimizer over ``model``'s parameters (timm's ``create_optimizer_v2``), with the recipe's
    weight-decay groups (``wd_exclude_1d``, ``wd_exclude_model``)."""
    from timm.optim import create_optimizer_v2

    opt_kwargs: dict[str, Any] = {  # the optimizer's own arguments, passed on by timm
        k: v
        for k, v in (("betas", recipe.opt_betas and tuple(recipe.opt_betas)), ("eps", recipe.opt_eps))
        if v is not None
    }
    return create_optimizer_v2(
        model,
        opt=recipe.opt,
        lr=recipe.lr,
        weight_decay=recipe.weight_decay,
        momentum=recipe.momentum,
        filter_bias_and_bn=recipe.wd_exclude_1d,
        param_group_fn=None if recipe.wd_exclude_model else _groups_without_model_list(recipe),
        **opt_kwargs,
    )


def build_scheduler(recipe: Recipe, optimizer: torch.optim.Optimizer, total_steps: int, steps_per_epoch: int):
    """The recipe's learning-rate schedule (timm's ``create_scheduler_v2``; None for ``sched: none``), stepped per
    optimizer update: one timm scheduler "epoch" is one update."""
    from timm.scheduler import create_scheduler_v2

    scheduler, _ = create_scheduler_v2(
        optimizer,
        sched=recipe.sched,
        num_epochs=total_steps,
        warmup_epochs=round(recipe.warmup_epochs * steps_per_epoch),
        warmup_lr=recipe.warmup_lr,
        min_lr=recipe.min_lr,
    )
    return scheduler


def _optimisation(recipe: Recipe, model: nn.Module, num_classes: int, total_steps: int, steps_per_epoch: int):
    """(optimizer, scheduler, mixup, loss) from timm's factories; the schedule is stepped per update."""
    from timm.data import Mixup
    from timm.loss import SoftTargetCrossEntropy

    optimizer = build_optimizer(recipe, model)
    scheduler = build_scheduler(recipe, optimizer, total_steps, steps_per_epoch)
    if recipe.mixup > 0 or recipe.cutmix > 0:
        mixup = Mixup(
            mixup_alpha=recipe.mixup,
            cutmix_alpha=recipe.cutmix,
            prob=recipe.mixup_prob,
            switch_prob=recipe.mixup_switch_prob,
            label_smoothing=recipe.label_smoothing,
            num_classes=num_classes,
        )
        return optimizer, scheduler, mixup, SoftTargetCrossEntropy()
    return optimizer, scheduler, None, nn.CrossEntropyLoss(label_smoothing=recipe.label_smoothing)


def _loaders(recipe: Recipe, val_ds, val_sampler, pin: bool):
    """The validation loader and, with ``probe_images``, the loader of the first validation images
    on which SSDC under RPI is logged at each evaluation (main process only)."""
    from ...data import EpochBatchSampler, make_loader

    val_loader = make_loader(val_ds, val_sampler, recipe.workers, pin_memory=pin)
    rpi_loader = None
    if recipe.probe_images:
        first = EpochBatchSampler(
            min(recipe.probe_images, len(val_ds)), val_sampler.batch_size, shuffle=False, drop_last=False
        )
        rpi_loader = make_loader(val_ds, first, 0)
    return val_loader, rpi_loader


def check_resumable(out: Path) -> None:
    """Raise :class:`RunDirError` (one line) unless ``out`` holds a training run to resume: its recipe
    (``recipe.yaml``), a checkpoint or a summary. Without one, ``--resume`` would silently start a new
    run. Reads only; writes nothing."""
    if not out.is_dir():
        raise RunDirError(f"{out} does not exist, so there is no run to resume: drop --resume to start a new run there")
    if not ((out / "recipe.yaml").is_file() or (out / "summary.json").is_file() or list_checkpoints(out)):
        raise RunDirError(
            f"{out} holds no training run to resume (no recipe.yaml, checkpoint or summary.json): "
            "drop --resume to start a new run there, or point --out at the run"
        )


def _check_run_dir(
    out: Path, recipe: Recipe, resume: bool, allow_changes: bool, say
) -> tuple[Path | None, dict[str, tuple[Any, Any]]]:
    """What ``out`` holds against what is asked: the newest checkpoint to resume from (or None) and the
    recipe changes of a resume (``{key: (saved, asked)}``).

    Refused: checkpoints or a finished run without ``--resume``; a finished run whose checkpoints are
    gone (nothing to continue from: it is never retrained over); a resume whose recipe changes a
    result-changing key (unless ``allow_changes``: then the changes are recorded)."""
    checkpoint = latest_checkpoint(out)
    finished = (out / "summary.json").is_file()
    exports = [n for n in ("export", "export_ema") if (out / n).exists()]
    if exports and not finished and checkpoint is None:  # weights from elsewhere (a download, a copy): not ours
        raise OutputExistsError(
            f"{out} holds {' and '.join(exports)} but no training run (no summary.json or "
            "checkpoint): a run would overwrite it; choose another --out"
        )
    if (checkpoint is not None or finished) and not resume:
        what = f"checkpoints ({checkpoint.name})" if checkpoint is not None else "a finished run (summary.json)"
        raise OutputExistsError(
            f"{out} already holds {what}: pass --resume to continue that run, or choose another --out"
        )
    if resume and finished and checkpoint is None:
        raise RunDirError(
            f"{out} holds a finished run whose checkpoints were removed: there is nothing to continue "
            "from, and it is not retrained over; choose another --out"
        )
    saved = out / "recipe.yaml"
    changes: dict[str, tuple[Any, Any]] = {}
    if resume and checkpoint is not None and saved.is_file():
        hint = "restore the run's recipe, or start the run again in another --out"
        saved_values = upgrade_keys(read_yaml_file(saved, hint), warn=False)  # old key names: their new ones
        changes = settings_changes("recipe", saved_values, recipe.to_dict())
        listed = describe_changes(changes)
        if changes and not allow_changes:
            raise RunDirError(
                f"{out} was started with another recipe ({listed}): resuming would mix two runs; "
                "choose another --out, or pass --allow-changes to continue with the new values "
                "(recorded in recipe_changes.jsonl)"
            )
        if changes:
            say(f"continuing {out} with changed settings: {listed}")
    return checkpoint, changes


def _load_newest_intact(accelerator, out: Path, say) -> str:
    """Load the newest checkpoint that loads; a damaged one (e.g. truncated) is skipped with a message."""
    candidates = list_checkpoints(out)[::-1]
    for checkpoint in candidates:
        try:
            accelerator.load_state(str(checkpoint))
            return checkpoint.name
        except ValueError as e:
            if "parameter groups" not in str(e):
                say(
                    f"checkpoint {checkpoint.name} is damaged ({type(e).__name__}: {str(e)[:120]}); trying an older one"
                )
                continue
            raise RunDirError(
                f"{out}: the checkpoint's optimizer has other parameter groups than this recipe's "
                f"({str(e)[:80]}; weight_decay 0 against > 0, or wd_exclude_1d, change them): it cannot "
                "continue with these settings; choose another --out"
            ) from None
        except Exception as e:  # what a damaged file raises depends on the format and the library version
            say(f"checkpoint {checkpoint.name} is damaged ({type(e).__name__}: {str(e)[:120]}); trying an older one")
    raise RunDirError(
        f"no intact checkpoint in {out / 'checkpoints'} ({len(candidates)} damaged): cannot resume; choose another --out"
    )


def _resume(
    accelerator,
    recipe: Recipe,
    out: Path,
    checkpoint: Path | None,
    changes: dict[str, tuple[Any, Any]],
    state: TrainState,
    optimizer=None,
) -> str | None:
    """Load the newest intact checkpoint when there is one (else start, recording the recipe); its name or None.
    A resume with changed settings (``changes``, allowed) records them in ``recipe_changes.jsonl`` and the
    new recipe."""
    if accelerator.is_main_process:
        remove_partial_saves(out)
    fresh = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups] if optimizer else []
    resumed_from = _load_newest_intact(accelerator, out, accelerator.print) if checkpoint is not None else None
    if resumed_from and changes and optimizer is not None:
        # load_state restored the checkpoint's hyperparameters (lr, weight decay, betas, eps, momentum) in
        # every parameter group: the new recipe's, allowed and recorded, must be the ones used from here on
        # (the scheduler, stepped to the resumed step next, then sets the lr of a scheduled run)
        for group, new in zip(optimizer.param_groups, fresh):
            group.update(new)
    if accelerator.is_main_process:
        if resumed_from and changes:
            with (out / "recipe_changes.jsonl").open("a") as f:
                f.write(
                    dumps(dict(step=state.step, changes={k: list(v) for k, v in changes.items()}), indent=None) + "\n"
                )
        (out / "recipe.yaml").write_text(yaml.safe_dump(recipe.to_dict(), sort_keys=False))
    return resumed_from


def _session_data(accelerator, recipe: Recipe, out: Path, mean, std, batch: int, progress: bool, resuming: bool):
    """The run's data (:func:`build_data`), checked against what a resumed run trained on; the images left
    out said."""
    classes, train_ds, val_ds, train_sampler, val_sampler, skipped, identity, monitor = build_data(
        recipe, accelerator, mean, std, batch, progress
    )
    _check_data(out, identity, resuming, recipe.data, accelerator.is_main_process)
    if skipped:
        accelerator.print(
            f"left out {len(skipped)} image(s) that cannot be decoded (bad_images=skip): "
            f"{'; '.join(skipped[:3])}{' ...' if len(skipped) > 3 else ''}"
        )
    return classes, train_ds, val_ds, train_sampler, val_sampler, skipped, monitor


def _steps(recipe: Recipe, train_sampler: Any, train_size: int) -> tuple[int, int]:
    """(optimizer steps per epoch, total steps of the run)."""
    steps_per_epoch = train_sampler.batches_per_epoch // recipe.grad_accum
    if steps_per_epoch == 0:
        raise RecipeError(
            f"the training split ({train_size} items) is smaller than one global batch ({recipe.batch_size})"
        )
    total_steps = steps_per_epoch * recipe.epochs
    return steps_per_epoch, min(total_steps, recipe.max_steps) if recipe.max_steps else total_steps


def _model_and_state(accelerator, recipe: Recipe, num_classes: int, total_steps: int, steps_per_epoch: int):
    """(model, raw model, optimizer, scheduler, mixup, loss, EMA or None, TrainState): built from the seed,
    prepared by accelerate, and the state and EMA registered for checkpointing."""
    import timm
    from accelerate.utils import set_seed
    from timm.utils import ModelEmaV3

    set_seed(recipe.seed, device_specific=True)
    model = timm.create_model(
        recipe.model, pretrained=False, num_classes=num_classes, img_size=recipe.img_size, **recipe.model_kwargs
    )
    optimizer, scheduler, mixup, loss_fn = _optimisation(recipe, model, num_classes, total_steps, steps_per_epoch)
    model, optimizer = accelerator.prepare(model, optimizer)
    raw_model = accelerator.unwrap_model(model)
    ema = ModelEmaV3(raw_model, decay=recipe.ema_decay) if recipe.ema else None
    state = TrainState()
    accelerator.register_for_checkpointing(state)
    if ema is not None:
        accelerator.register_for_checkpointing(ema)
    return model, raw_model, optimizer, scheduler, mixup, loss_fn, ema, state


def _setup_line(s: Session, batch: int) -> str:
    """What the run is, in one line."""
    return (
        f"{s.recipe.model}: {sum(p.numel() for p in s.raw_model.parameters()) / 1e6:.2f}M params, "
        f"{len(s.classes)} classes, {len(s.train_ds)} train / {s.val_size} val images"
        + (f" / {s.monitor.images} held out to monitor" if s.monitor else "")
        + f", {s.world} process(es) x "
        f"batch {batch} x accum {s.recipe.grad_accum}, {s.steps_per_epoch} steps/epoch, {s.total_steps} steps"
        + (f", resumed from {s.resumed_from}" if s.resumed_from else "")
    )


def _log_and_evaluated(accelerator, recipe: Recipe, out: Path, resume_step: int | None):
    """The run's metrics log, and the evaluation it ends with when the run resumes right after one (a kill
    after the final checkpoint): that one is not evaluated and logged again (the main process read the log;
    the others learn the step from it)."""
    log = MetricsLog(
        out, accelerator.is_main_process, resume_step=resume_step, tracker=accelerator.log if recipe.log_with else None
    )
    return log, broadcast_object(log.resumed_eval if accelerator.is_main_process else None)


def build_session(
    accelerator, recipe: Recipe, out: Path, resume: bool, progress: bool, allow_changes: bool = False
) -> Session:
    """Check, then build data, model and optimisation, and resume: the :class:`Session` of a run."""
    batch = per_process_batch(accelerator, recipe)
    checkpoint, changes = _check_run_dir(out, recipe, resume, allow_changes, accelerator.print)
    mean, std = check_model(recipe)
    classes, train_ds, val_ds, train_sampler, val_sampler, skipped, monitor = _session_data(
        accelerator, recipe, out, mean, std, batch, progress, resuming=checkpoint is not None
    )
    steps_per_epoch, total_steps = _steps(recipe, train_sampler, len(train_ds))

    model, raw_model, optimizer, scheduler, mixup, loss_fn, ema, state = _model_and_state(
        accelerator, recipe, len(classes), total_steps, steps_per_epoch
    )
    resumed_from = _resume(accelerator, recipe, out, checkpoint, changes, state, optimizer)
    if scheduler is not None:
        scheduler.step(state.step)
    log, evaluated = _log_and_evaluated(accelerator, recipe, out, state.step if resumed_from else None)
    val_loader, rpi_loader = _loaders(recipe, val_ds, val_sampler, pin=accelerator.device.type == "cuda")
    rpi_loader = rpi_loader if monitor is None else monitor.rpi_loader  # SSDC under RPI: on the monitor split
    first_bad_step = torch.full((), -1, dtype=torch.int64, device=accelerator.device)
    session = Session(
        last_eval=evaluated["step"] if evaluated else -1,
        eval_result=dict(evaluated or {}),
        first_bad_step=first_bad_step,
        skipped_images=skipped,
        accelerator=accelerator,
        recipe=recipe,
        out=out,
        progress=progress,
        model=model,
        raw_model=raw_model,
        optimizer=optimizer,
        scheduler=scheduler,
        ema=ema,
        mixup=mixup,
        loss_fn=loss_fn,
        classes=list(classes),
        mean=mean,
        std=std,
        train_ds=train_ds,
        train_sampler=train_sampler,
        val_size=len(val_ds),
        val_loader=val_loader,
        rpi_loader=rpi_loader,
        steps_per_epoch=steps_per_epoch,
        total_steps=total_steps,
        state=state,
        log=log,
        resumed_from=resumed_from,
        monitor=monitor,
    )
    accelerator.print(_setup_line(session, batch))
    return session
