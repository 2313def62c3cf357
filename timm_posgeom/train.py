"""Train a timm ViT from a recipe, with accelerate: one readable loop.

    python -m timm_posgeom.train --recipe imagenette_cpu_ape --out runs/ape
    accelerate launch -m timm_posgeom.train --recipe in100_paper_ape --out runs/in100_ape
    posgeom train --recipe recipes/in100_deit_rope.yaml --out runs/x --set epochs=100 --resume

What a run writes under ``--out``:

* ``recipe.yaml``       the resolved recipe;
* ``metrics.jsonl``     one JSON record per log step (``kind: train``: step, epoch, loss, lr,
                        images/s, and ``pe_ssdc``, the learned position table's own SSDC), per
                        evaluation (``kind: eval``: val top-1 / loss, EMA top-1) and at the end;
                        TensorBoard event files too when ``tensorboard`` is installed;
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

This module is a client of the library (models, data); nothing in the library imports it.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import yaml

from .hub import export_for_hub
from .interventions import eval_mode
from .recipe import Recipe, RecipeError, load_recipe

__all__ = ["train", "main", "add_arguments", "run_from_args", "pe_table_ssdc", "latest_checkpoint"]

_CKPT = re.compile(r"^step_(\d{8,})$")


# --------------------------------------------------------------------------------------------
# small pure helpers
# --------------------------------------------------------------------------------------------
def pe_table_ssdc(model: nn.Module) -> float | None:
    """SSDC of a learned absolute position table: Spearman correlation between the cosine
    similarity of its patch rows and minus their Manhattan distance on the patch grid (pairs
    i < j, row-major). None when the model has no learned ``pos_embed`` table."""
    from .probes import ssdc

    table = getattr(model, "pos_embed", None)
    patch_embed = getattr(model, "patch_embed", None)
    if not isinstance(table, nn.Parameter) or not table.requires_grad or patch_embed is None:
        return None
    grid = tuple(patch_embed.grid_size)
    n = grid[0] * grid[1]
    rows = table.detach().float().reshape(-1, table.shape[-1])[-n:]  # (N, C) patch rows; prefix rows come first
    rows = nn.functional.normalize(rows, dim=-1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a constant (e.g. all-zero) table: NaN, reported as None
        rho = float(ssdc((rows @ rows.T).cpu(), grid, distance="manhattan"))
    return rho if math.isfinite(rho) else None


def _rpi_ssdc(model: nn.Module, loader, max_images: int) -> dict[str, Any]:
    """SSDC per layer under RPI (one fixed permutation, seed 0) on the first ``max_images`` images."""
    from .probes import probe_ssdc

    result = probe_ssdc(model, loader, rpi=True, seed=0, max_images=max_images, progress=False)
    def clean(v: float) -> float | None:
        return round(float(v), 4) if math.isfinite(v) else None

    return {"rpi_ssdc": [clean(v) for v in result.per_layer], "rpi_delta_ssdc": clean(result.delta)}


def latest_checkpoint(out: str | os.PathLike) -> Path | None:
    """The newest complete checkpoint folder under ``<out>/checkpoints``, or None."""
    root = Path(out) / "checkpoints"
    if not root.is_dir():
        return None
    found = sorted((int(m.group(1)), p) for p in root.iterdir() if (m := _CKPT.match(p.name)) and p.is_dir())
    return found[-1][1] if found else None


def _check_writable(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".write_test_{os.getpid()}"
        probe.write_text("ok")
        probe.unlink()
    except OSError as e:
        raise PermissionError(f"output directory {str(out)!r} is not writable: {e.strerror or e}") from None


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
    """metrics.jsonl (+ TensorBoard when installed), written by the main process only."""

    def __init__(self, out: Path, enabled: bool, resume_step: int | None = None):
        self.enabled = enabled
        self.file = out / "metrics.jsonl"
        self.writer = None
        if not enabled:
            return
        if resume_step is not None and self.file.exists():
            # keep what the interrupted run logged up to its checkpoint; drop later records and a torn last line
            kept = [r for r in read_metrics(self.file) if r.get("step", 0) <= resume_step and r.get("kind") != "final"]
            self.file.write_text("".join(json.dumps(r) + "\n" for r in kept))
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
            f.write(json.dumps(record) + "\n")
        if self.writer is not None:
            for key, value in record.items():
                if isinstance(value, (int, float)) and key not in ("step",):
                    self.writer.add_scalar(f"{record.get('kind', 'train')}/{key}", value, record.get("step", 0))

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


# --------------------------------------------------------------------------------------------
# export
# --------------------------------------------------------------------------------------------
def _model_args(recipe: Recipe, num_classes: int) -> dict[str, Any]:
    """The run's own model arguments; :func:`timm_posgeom.hub.export_for_hub` adds every argument
    that defines a PosGeomViT's architecture (PE, alpha, token shuffle, width, depth, heads...)."""
    return dict(recipe.model_kwargs, img_size=recipe.img_size, num_classes=num_classes)


# --------------------------------------------------------------------------------------------
# the run
# --------------------------------------------------------------------------------------------
def _build_data(recipe: Recipe, accelerator, mean, std, world: int, rank: int, per_process_batch: int,
                progress: bool = True):
    from . import data as D

    with accelerator.main_process_first():
        train_split = D.load_split(recipe.data, recipe.train_split, subset=recipe.train_subset,
                                   img_size=recipe.img_size, seed=recipe.seed, synthetic_size=recipe.synthetic_size)
        val_size = max(1, recipe.synthetic_size // 5) if recipe.synthetic_size else None
        val_split = D.load_split(recipe.data, recipe.val_split, subset=recipe.val_subset,
                                 img_size=recipe.img_size, seed=recipe.seed, synthetic_size=val_size)
        if recipe.cache:
            cache_dir = D.default_cache_dir() if recipe.disk_cache else None
            show = progress and accelerator.is_main_process
            train_cache = D.cache_uint8(train_split, recipe.img_size, recipe.interpolation, recipe.workers,
                                        cache_dir, progress=show)
            val_cache = D.cache_uint8(val_split, recipe.img_size, recipe.interpolation, recipe.workers,
                                      cache_dir, progress=show)
    if recipe.cache:
        train_ds = D.CachedTrainDataset(train_cache, mean, std, recipe.crop_pad, recipe.hflip, recipe.seed,
                                        augment=recipe.augment)
        val_ds = D.CachedEvalDataset(val_cache, mean, std)
    else:
        tf = D.train_transform(recipe.img_size, recipe.augment, mean, std, recipe.interpolation, recipe.crop_pad,
                               recipe.hflip, recipe.auto_augment, recipe.color_jitter, recipe.reprob, recipe.scale)
        train_ds = D.TransformDataset(train_split, tf, seed=recipe.seed)
        val_ds = D.TransformDataset(val_split, D.eval_transform(
            recipe.img_size, recipe.eval_resize, mean, std, recipe.interpolation, recipe.crop_pct))
    train_sampler = D.EpochBatchSampler(len(train_ds), per_process_batch, world, rank, seed=recipe.seed)
    val_sampler = D.EpochBatchSampler(len(val_ds), recipe.eval_batch_size or per_process_batch, world, rank,
                                      shuffle=False, drop_last=False)
    return train_split.classes, train_ds, val_ds, train_sampler, val_sampler


@torch.no_grad()
def _evaluate(model: nn.Module, loader, accelerator) -> dict[str, float]:
    totals = torch.zeros(3, dtype=torch.float64, device=accelerator.device)  # correct, count, loss sum
    with eval_mode(model):
        for images, targets in loader:
            images, targets = images.to(accelerator.device), targets.to(accelerator.device)
            logits = model(images).float()
            totals[0] += (logits.argmax(-1) == targets).sum()
            totals[1] += targets.numel()
            totals[2] += nn.functional.cross_entropy(logits, targets, reduction="sum")
    totals = accelerator.reduce(totals, reduction="sum")
    count = max(totals[1].item(), 1.0)
    return {"top1": totals[0].item() / count, "loss": totals[2].item() / count, "count": int(totals[1].item())}


def _save_checkpoint(accelerator, out: Path, step: int, keep: int) -> Path:
    """save_state into a temporary folder, then rename it into place; keep the newest ``keep``."""
    root = out / "checkpoints"
    final, tmp = root / f"step_{step:08d}", root / f".tmp_step_{step:08d}"
    if accelerator.is_main_process:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        done = sorted((int(m.group(1)), p) for p in root.iterdir() if (m := _CKPT.match(p.name)))
        for _, old in done[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


def train(recipe: Recipe, out: str | os.PathLike, resume: bool = False, progress: bool = True) -> dict[str, Any]:
    """Run ``recipe`` into ``out`` (see the module docstring); returns the run summary.

    Raises RecipeError / ValueError, FileNotFoundError or PermissionError before any training
    step for a bad recipe, a missing data path, an unknown model or an unwritable ``out``.
    """
    import timm
    from accelerate import Accelerator

    from . import models  # noqa: F401  (registers our models with timm)
    from .data import resolve_source

    # ---- checks that need no work: fail before anything is built ----------------------------
    recipe = recipe.validate()
    out = Path(out)
    if not timm.is_model(recipe.model):
        raise RecipeError(f"unknown model {recipe.model!r}: not a timm model name (see `posgeom models` or timm.list_models)")
    resolve_source(recipe.data)
    launched = int(os.environ.get("WORLD_SIZE", "1"))
    # several processes on a machine without CUDA (`accelerate launch --multi_gpu` or torchrun there): gloo on CPU
    cpu = launched > 1 and not torch.cuda.is_available() and not torch.backends.mps.is_available()
    accelerator = Accelerator(mixed_precision=recipe.mixed_precision, gradient_accumulation_steps=recipe.grad_accum,
                              cpu=cpu or None)
    try:
        return _run(accelerator, recipe, out, resume, progress)
    finally:  # let a later train() in this process choose another precision / accumulation
        from accelerate.state import AcceleratorState, GradientState

        AcceleratorState._reset_state()
        GradientState._reset_state()


def _run(accelerator, recipe: Recipe, out: Path, resume: bool, progress: bool) -> dict[str, Any]:
    """The body of :func:`train` once the Accelerator exists: more checks, then build, loop, export."""
    import timm
    from accelerate.utils import set_seed
    from timm.data import Mixup, resolve_data_config
    from timm.loss import SoftTargetCrossEntropy
    from timm.optim import create_optimizer_v2
    from timm.scheduler import create_scheduler_v2
    from timm.utils import ModelEmaV3

    from .data import make_loader

    world, rank = accelerator.num_processes, accelerator.process_index
    launched = int(os.environ.get("WORLD_SIZE", "1"))
    if world != launched:
        raise RuntimeError(f"{launched} processes were launched but accelerate set up {world}: every process would "
                           "train alone into the same --out (for CPU processes set ACCELERATE_USE_CPU=1)")
    if recipe.batch_size % (world * recipe.grad_accum):
        raise RecipeError(f"batch_size {recipe.batch_size} (global) is not divisible by processes x grad_accum "
                          f"= {world} x {recipe.grad_accum}")
    per_process_batch = recipe.batch_size // (world * recipe.grad_accum)
    if (recipe.mixup or recipe.cutmix) and per_process_batch % 2:
        raise RecipeError(f"mixup/cutmix need an even per-process batch, got {per_process_batch}")
    _check_writable(out)
    checkpoint = latest_checkpoint(out)
    if checkpoint is not None and not resume:
        raise FileExistsError(f"{out} already holds checkpoints ({checkpoint.name}): pass --resume to continue "
                              f"that run, or choose another --out")

    # ---- model, data, optimisation ------------------------------------------------------------
    with torch.device("meta"):  # no memory, no init: bad model kwargs surface before any data is loaded
        model_probe = timm.create_model(recipe.model, pretrained=False, num_classes=0, img_size=recipe.img_size,
                                        **recipe.model_kwargs)
    data_cfg = resolve_data_config({}, model=model_probe)
    del model_probe
    mean, std = data_cfg["mean"], data_cfg["std"]
    classes, train_ds, val_ds, train_sampler, val_sampler = _build_data(
        recipe, accelerator, mean, std, world, rank, per_process_batch, progress)
    num_classes = len(classes)
    steps_per_epoch = train_sampler.batches_per_epoch // recipe.grad_accum
    if steps_per_epoch == 0:
        raise RecipeError(f"the training split ({len(train_ds)} items) is smaller than one global batch "
                          f"({recipe.batch_size})")
    total_steps = steps_per_epoch * recipe.epochs
    total_steps = min(total_steps, recipe.max_steps) if recipe.max_steps else total_steps

    set_seed(recipe.seed, device_specific=True)
    model = timm.create_model(recipe.model, pretrained=False, num_classes=num_classes, img_size=recipe.img_size,
                              **recipe.model_kwargs)
    opt_kwargs = {k: v for k, v in (("betas", recipe.opt_betas and tuple(recipe.opt_betas)), ("eps", recipe.opt_eps))
                  if v is not None}
    optimizer = create_optimizer_v2(model, opt=recipe.opt, lr=recipe.lr, weight_decay=recipe.weight_decay,
                                    momentum=recipe.momentum, filter_bias_and_bn=recipe.wd_exclude_1d, **opt_kwargs)
    # the schedule is stepped per optimizer update: one timm "epoch" = one update
    scheduler, _ = create_scheduler_v2(
        optimizer, sched=recipe.sched, num_epochs=total_steps, warmup_epochs=round(recipe.warmup_epochs * steps_per_epoch),
        warmup_lr=recipe.warmup_lr, min_lr=recipe.min_lr)
    mixup = None
    if recipe.mixup > 0 or recipe.cutmix > 0:
        mixup = Mixup(mixup_alpha=recipe.mixup, cutmix_alpha=recipe.cutmix, prob=recipe.mixup_prob,
                      switch_prob=recipe.mixup_switch_prob, label_smoothing=recipe.label_smoothing,
                      num_classes=num_classes)
        loss_fn: nn.Module = SoftTargetCrossEntropy()
    else:
        loss_fn = nn.CrossEntropyLoss(label_smoothing=recipe.label_smoothing)

    model, optimizer = accelerator.prepare(model, optimizer)
    raw_model = accelerator.unwrap_model(model)
    ema = ModelEmaV3(raw_model, decay=recipe.ema_decay) if recipe.ema else None
    state = TrainState()
    accelerator.register_for_checkpointing(state)
    if ema is not None:
        accelerator.register_for_checkpointing(ema)

    # ---- resume ------------------------------------------------------------------------------
    if accelerator.is_main_process:
        for stale in (out / "checkpoints").glob(".tmp_step_*"):
            shutil.rmtree(stale, ignore_errors=True)
    resumed_from = None
    if resume and checkpoint is not None:
        accelerator.load_state(str(checkpoint))
        resumed_from = checkpoint.name
        saved = out / "recipe.yaml"
        if saved.exists() and yaml.safe_load(saved.read_text()) != recipe.to_dict():
            accelerator.print(f"warning: the recipe differs from the one {out} was started with")
    elif accelerator.is_main_process:
        (out / "recipe.yaml").write_text(yaml.safe_dump(recipe.to_dict(), sort_keys=False))
    if scheduler is not None:
        scheduler.step(state.step)
    log = MetricsLog(out, accelerator.is_main_process, resume_step=state.step if resumed_from else None)
    accelerator.print(
        f"{recipe.model}: {sum(p.numel() for p in raw_model.parameters()) / 1e6:.2f}M params, {num_classes} classes, "
        f"{len(train_ds)} train / {len(val_ds)} val images, {world} process(es) x batch {per_process_batch} x "
        f"accum {recipe.grad_accum}, {steps_per_epoch} steps/epoch, {total_steps} steps"
        + (f", resumed from {resumed_from}" if resumed_from else ""))

    # ---- the loop ----------------------------------------------------------------------------
    from tqdm.auto import tqdm

    batches_per_epoch = steps_per_epoch * recipe.grad_accum
    bar = tqdm(total=total_steps, initial=state.step, unit="step", dynamic_ncols=True,
               disable=not (progress and accelerator.is_main_process))
    pin = accelerator.device.type == "cuda"
    val_loader = make_loader(val_ds, val_sampler, recipe.workers, pin_memory=pin)
    rpi_loader = None
    if recipe.rpi_ssdc_images:  # the first images of the validation split, main process only
        from .data import EpochBatchSampler

        first = EpochBatchSampler(min(recipe.rpi_ssdc_images, len(val_ds)), val_sampler.batch_size,
                                  shuffle=False, drop_last=False)
        rpi_loader = make_loader(val_ds, first, 0)
    last_saved, last_eval, eval_result = -1, -1, {}
    started = time.perf_counter()
    window_loss, window_batches, window_images, window_start = 0.0, 0, 0, time.perf_counter()

    def elapsed() -> float:
        return state.elapsed + time.perf_counter() - started

    def checkpoint_now() -> None:
        nonlocal last_saved, window_start
        if last_saved != state.step:
            begin = time.perf_counter()
            state_elapsed, state.elapsed = state.elapsed, elapsed()
            _save_checkpoint(accelerator, out, state.step, recipe.keep_checkpoints)
            state.elapsed = state_elapsed
            last_saved = state.step
            window_start += time.perf_counter() - begin  # images/s counts training time only

    def evaluate_now() -> dict[str, Any]:
        nonlocal last_eval, window_start
        begin = time.perf_counter()
        result = {f"val_{k}": v for k, v in _evaluate(model, val_loader, accelerator).items()}
        if ema is not None:
            result.update({f"ema_val_{k}": v for k, v in _evaluate(ema.module, val_loader, accelerator).items()})
        result.update(kind="eval", step=state.step, epoch=state.step / steps_per_epoch, pe_ssdc=pe_table_ssdc(raw_model))
        if rpi_loader is not None and accelerator.is_main_process:
            result.update(_rpi_ssdc(raw_model, rpi_loader, recipe.rpi_ssdc_images))
        result["time_s"] = round(elapsed(), 1)
        log.log(result)
        accelerator.print(f"step {state.step}: val top-1 {result['val_top1']:.4f}"
                          + (f", EMA {result['ema_val_top1']:.4f}" if ema is not None else "")
                          + (f", PE-table SSDC {result['pe_ssdc']:.3f}" if result["pe_ssdc"] is not None else "")
                          + (f", SSDC under RPI {result['rpi_ssdc']}" if "rpi_ssdc" in result else ""))
        last_eval = state.step
        window_start += time.perf_counter() - begin
        return result

    model.train()
    while state.step < total_steps:
        epoch = state.epoch
        train_sampler.set_epoch(epoch, start_batch=state.batch)
        train_ds.set_epoch(epoch)
        for images, targets in make_loader(train_ds, train_sampler, recipe.workers, pin_memory=pin):
            if state.batch >= batches_per_epoch:
                break
            images = images.to(accelerator.device, non_blocking=True)
            targets = targets.to(accelerator.device, non_blocking=True)
            if mixup is not None:
                images, targets = mixup(images, targets)
            with accelerator.accumulate(model):
                loss = loss_fn(model(images), targets)
                accelerator.backward(loss)
                if recipe.clip_grad and accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), recipe.clip_grad)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            state.batch += 1
            window_loss = window_loss + loss.detach().float()  # stays on the device: no sync per step
            window_batches += 1
            window_images += images.shape[0] * world
            if not accelerator.sync_gradients:
                continue
            state.step += 1
            if scheduler is not None:
                scheduler.step(state.step)
            if ema is not None:
                ema.update(raw_model, step=state.step)
            bar.update(1)
            if state.step % recipe.log_every == 0 or state.step == total_steps:
                seconds = time.perf_counter() - window_start
                mean_loss = accelerator.reduce(window_loss / window_batches, reduction="mean").item()
                record = dict(kind="train", step=state.step, epoch=state.step / steps_per_epoch, loss=mean_loss,
                              lr=optimizer.param_groups[0]["lr"], images_per_s=window_images / max(seconds, 1e-9),
                              pe_ssdc=pe_table_ssdc(raw_model), time_s=round(elapsed(), 1))
                log.log(record)
                bar.set_postfix(loss=f"{mean_loss:.3f}", lr=f"{record['lr']:.2e}",
                                img_s=f"{record['images_per_s']:.0f}")
                window_loss, window_batches, window_images, window_start = 0.0, 0, 0, time.perf_counter()
            if state.step >= total_steps:
                break
            if state.step % recipe.checkpoint_every == 0 and state.batch < batches_per_epoch:
                checkpoint_now()
        if state.batch >= batches_per_epoch:  # the epoch is complete
            state.epoch, state.batch = epoch + 1, 0
            if state.epoch % recipe.eval_every == 0 or state.step >= total_steps:
                eval_result = evaluate_now()
        checkpoint_now()
    bar.close()

    # ---- final evaluation and export -------------------------------------------------------
    if last_eval != state.step:
        eval_result = evaluate_now()
    summary: dict[str, Any] = dict(
        model=recipe.model, steps=state.step, epochs=state.step / steps_per_epoch, train_images=len(train_ds),
        val_images=len(val_ds), processes=world, time_s=round(elapsed(), 1),
        val_top1=eval_result.get("val_top1"), ema_val_top1=eval_result.get("ema_val_top1"),
        pe_ssdc=eval_result.get("pe_ssdc"), resumed_from=resumed_from,
    )
    if accelerator.is_main_process:
        model_args = _model_args(recipe, num_classes)
        cfg = dict(input_size=(3, recipe.img_size, recipe.img_size), num_classes=num_classes, label_names=list(classes),
                   mean=tuple(mean), std=tuple(std), interpolation=recipe.interpolation,
                   crop_pct=1.0 if recipe.eval_resize == "paper" else recipe.crop_pct,
                   crop_mode="squash" if recipe.eval_resize == "paper" else "center")
        summary["export"] = str(export_for_hub(raw_model, out / "export", model_args, cfg))
        if ema is not None:
            summary["export_ema"] = str(export_for_hub(ema.module, out / "export_ema", model_args, cfg))
        log.log(dict(summary, kind="final"))
        (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        accelerator.print(f"done: {state.step} steps in {summary['time_s']:.0f}s, val top-1 {summary['val_top1']:.4f}; "
                          f"exported to {summary['export']}")
    log.close()
    accelerator.wait_for_everyone()
    accelerator.end_training()
    return summary


# --------------------------------------------------------------------------------------------
# command line
# --------------------------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The flags shared by ``python -m timm_posgeom.train`` and ``posgeom train``."""
    parser.add_argument("--recipe", default=None,
                        help="recipe YAML file, or a name from the repository's recipes/ (e.g. imagenette_cpu_ape); "
                             "default: the built-in defaults (a small run on synthetic data)")
    parser.add_argument("--out", required=True, help="run directory (checkpoints, metrics, exports)")
    parser.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --out")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a recipe key (repeatable), e.g. --set epochs=5 --set model_kwargs.alpha=0.5")
    parser.add_argument("--data", default=None, help="shortcut for --set data=PATH_OR_HUB_ID")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def run_from_args(args: argparse.Namespace) -> int:
    """Load the recipe named by ``args`` and train it; 0 on success."""
    overrides = list(args.overrides) + ([f"data={args.data}"] if args.data else [])
    recipe = load_recipe(args.recipe, overrides)
    train(recipe, args.out, resume=args.resume, progress=not args.no_progress)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m timm_posgeom.train``; errors before training exit with status 2."""
    parser = add_arguments(argparse.ArgumentParser(prog="python -m timm_posgeom.train", description=__doc__.split("\n")[0]))
    args = parser.parse_args(argv)
    try:
        return run_from_args(args)
    except (RecipeError, ValueError, FileNotFoundError, FileExistsError, PermissionError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
