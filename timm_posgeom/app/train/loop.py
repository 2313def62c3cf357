"""The training loop: plain functions over one :class:`~timm_posgeom.app.train.build.Session`.

session = build_session(...)          # build.py
run_epochs(session)                   # train, evaluate at epoch ends, checkpoint
summary = finish(session)             # final evaluation, export, summary.json
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn

from ...errors import PosgeomError
from ...interventions import eval_mode
from ...probes import pe_content_norm_ratio, pe_table_ssdc
from ...results.jsonio import to_jsonable
from ..records import RunSummary
from .build import Session
from .checkpoints import save_checkpoint
from .monitor import monitor_prefix

__all__ = ["evaluate_top1", "evaluate_now", "checkpoint_now", "run_epochs", "finish", "TrainingDiverged"]


class TrainingDiverged(PosgeomError, RuntimeError):
    """The loss or the weights became non-finite: the run stops, nothing diverged is saved or exported."""


def check_finite(s: Session) -> None:
    """Raise :class:`TrainingDiverged` if any step so far had a non-finite loss (tracked on the device,
    without a sync per step) or the weights are non-finite; called before anything is logged as a
    result, checkpointed, evaluated or exported."""
    first = s.accelerator.gather(s.first_bad_step.reshape(1)).max().item()
    weights_finite = torch.stack([torch.isfinite(p).all() for p in s.raw_model.parameters()]).all().item()  # one sync
    if first < 0 and weights_finite:
        s.step_lrs.clear()  # only the steps since the last check can be the first bad one
        return
    where = f"first at step {first}" if first >= 0 else f"in the weights at step {s.state.step}"
    lr = s.step_lrs.get(first, s.optimizer.param_groups[0]["lr"])
    raise TrainingDiverged(
        f"training diverged: non-finite loss {where} (learning rate {lr:.3g}; the recipe's lr is {s.recipe.lr:g}); "
        f"nothing of it was checkpointed or exported. Lower lr (--set lr=...), add warmup or clip_grad, and "
        f"start again in a new --out"
    )


@dataclass
class _Window:
    """Training loss and throughput since the last log record (the loss stays on the device)."""

    loss: Any = 0.0
    batches: int = 0
    images: int = 0
    last_images: Any = None  # the window's last batch (a reference): the content of the PE-to-content ratio
    start: float = field(default_factory=time.perf_counter)


@torch.no_grad()
def evaluate_top1(model: nn.Module, loader, accelerator) -> dict[str, float]:
    """Top-1 accuracy and mean loss over a sharded loader, counts reduced across processes; NaN where an
    image's logits are not finite (an arg-max of NaN logits is class 0, never a prediction)."""
    totals = torch.zeros(4, dtype=torch.float64, device=accelerator.device)  # correct, count, loss sum, not finite
    with eval_mode(model):
        for images, targets in loader:
            images, targets = images.to(accelerator.device), targets.to(accelerator.device)
            logits = model(images).float()
            finite = torch.isfinite(logits).all(-1)
            totals[0] += ((logits.argmax(-1) == targets) & finite).sum()
            totals[1] += targets.numel()
            totals[2] += nn.functional.cross_entropy(logits, targets, reduction="sum")
            totals[3] += (~finite).sum()
    totals = accelerator.reduce(totals, reduction="sum")
    count = max(totals[1].item(), 1.0)
    top1 = totals[0].item() / count if totals[3].item() == 0 else math.nan
    return {"top1": top1, "loss": totals[2].item() / count, "count": int(totals[1].item())}


def _rpi_ssdc(model: nn.Module, loader, max_images: int) -> dict[str, Any]:
    """SSDC per layer under RPI on the first ``max_images`` images: the mean over the protocol's 10 permutations
    (seeds 0 .. 9, the same at every evaluation), and delta SSDC."""
    from ...probes import probe_ssdc

    # the main process alone runs this probe: "off", for the other processes are not in it (with "auto"
    # its collectives met theirs, the next ones of training: a crash or a hang under a launch)
    result = probe_ssdc(model, loader, rpi=True, seed=0, max_images=max_images, progress=False, distributed="off")

    rounded = [round(float(v), 4) for v in result.per_layer]  # NaN stays NaN: written as None
    return to_jsonable({"rpi_ssdc": rounded, "rpi_delta_ssdc": round(float(result.delta), 4)})  # under RPI


def evaluate_now(s: Session) -> dict[str, Any]:
    """Evaluate on the monitor split (and EMA, PE-table SSDC, SSDC under RPI), log one ``eval`` record, return it.
    Its numbers are named for the split (``val_top1``, or ``heldout_top1`` with a held-out monitor), and
    ``monitor`` names it too."""
    check_finite(s)
    prefix, loader = monitor_prefix(s.monitor), s.val_loader if s.monitor is None else s.monitor.loader
    result: dict[str, Any] = {f"{prefix}_{k}": v for k, v in evaluate_top1(s.model, loader, s.accelerator).items()}
    if s.ema is not None:
        result.update({f"ema_{prefix}_{k}": v for k, v in evaluate_top1(s.ema.module, loader, s.accelerator).items()})
    result.update(
        kind="eval",
        monitor="validation" if s.monitor is None else "heldout",
        step=s.state.step,
        epoch=s.state.step / s.steps_per_epoch,
        pe_ssdc=pe_table_ssdc(s.raw_model),
    )
    if s.rpi_loader is not None and s.accelerator.is_main_process:
        result.update(_rpi_ssdc(s.raw_model, s.rpi_loader, s.recipe.probe_images))
    result["time_s"] = round(s.elapsed(), 1)
    s.log.log(result)
    s.accelerator.print(
        f"step {s.state.step}: {'val' if s.monitor is None else 'held-out'} top-1 "
        f"{result[prefix + '_top1']:.4f}"
        + (f", EMA {result['ema_' + prefix + '_top1']:.4f}" if s.ema is not None else "")
        + (f", PE-table SSDC {result['pe_ssdc']:.3f}" if result["pe_ssdc"] is not None else "")
        + (f", SSDC under RPI {result['rpi_ssdc']}" if "rpi_ssdc" in result else "")
    )
    s.last_eval = s.state.step
    s.eval_result = result
    return result


def validate_at_end(s: Session) -> dict[str, Any]:
    """The final numbers on the validation split: the last ``eval`` record with a validation monitor; with a
    held-out monitor, measured now, once, and logged as a ``validation`` record."""
    if s.monitor is None:
        return s.eval_result
    result: dict[str, Any] = {f"val_{k}": v for k, v in evaluate_top1(s.model, s.val_loader, s.accelerator).items()}
    if s.ema is not None:
        result.update({f"ema_val_{k}": v for k, v in evaluate_top1(s.ema.module, s.val_loader, s.accelerator).items()})
    result.update(
        kind="validation", step=s.state.step, epoch=s.state.step / s.steps_per_epoch, time_s=round(s.elapsed(), 1)
    )
    s.log.log(result)
    return result


def checkpoint_now(s: Session) -> None:
    """Save a checkpoint of the current step (once per step); its elapsed time is the run's so far."""
    if s.last_saved == s.state.step:
        return
    check_finite(s)
    before, s.state.elapsed = s.state.elapsed, s.elapsed()
    save_checkpoint(s.accelerator, s.out, s.state.step, s.recipe.keep_checkpoints)
    s.state.elapsed = before
    s.last_saved = s.state.step


def _paused(window: _Window, work, *args) -> Any:
    """Run ``work`` without counting its time as training time (images/s)."""
    begin = time.perf_counter()
    try:
        return work(*args)
    finally:
        window.start += time.perf_counter() - begin


def _log_train(s: Session, window: _Window, bar) -> _Window:
    """Log one ``train`` record for the window since the last one; return a fresh window."""
    check_finite(s)
    seconds = time.perf_counter() - window.start
    mean_loss = s.accelerator.reduce(window.loss / window.batches, reduction="mean").item()
    record = dict(
        kind="train",
        step=s.state.step,
        epoch=s.state.step / s.steps_per_epoch,
        loss=mean_loss,
        lr=s.optimizer.param_groups[0]["lr"],
        images_per_s=window.images / max(seconds, 1e-9),
        pe_ssdc=pe_table_ssdc(s.raw_model),
        time_s=round(s.elapsed(), 1),
    )
    if window.last_images is not None:
        record["pe_norm_ratio"] = pe_content_norm_ratio(s.raw_model, window.last_images)
    s.log.log(record)
    bar.set_postfix(loss=f"{mean_loss:.3f}", lr=f"{record['lr']:.2e}", img_s=f"{record['images_per_s']:.0f}")
    return _Window()


def _forward_backward(s: Session, images: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """One micro-batch: forward, backward and (when accumulation is complete) the optimizer step."""
    images = images.to(s.accelerator.device, non_blocking=True)
    targets = targets.to(s.accelerator.device, non_blocking=True)
    if s.mixup is not None:
        images, targets = s.mixup(images, targets)
    with s.accelerator.accumulate(s.model):
        loss = s.loss_fn(s.model(images), targets)
        s.accelerator.backward(loss)
        if s.recipe.clip_grad and s.accelerator.sync_gradients:
            s.accelerator.clip_grad_norm_(s.model.parameters(), s.recipe.clip_grad)
        s.optimizer.step()
        s.optimizer.zero_grad(set_to_none=True)
    return loss.detach().float()


def _train_epoch(s: Session, bar, window: _Window) -> _Window:
    """Train from ``state.batch`` to the end of the current epoch (or to the last step)."""
    from ...data import make_loader

    batches_per_epoch = s.steps_per_epoch * s.recipe.grad_accum
    s.train_sampler.set_epoch(s.state.epoch, start_batch=s.state.batch)
    s.train_ds.set_epoch(s.state.epoch)
    pin = s.accelerator.device.type == "cuda"
    for images, targets in make_loader(s.train_ds, s.train_sampler, s.recipe.workers, pin_memory=pin):
        if s.state.batch >= batches_per_epoch:
            break
        loss = _forward_backward(s, images, targets)
        window.loss = window.loss + loss  # no device sync per step, for the loss nor the divergence check
        s.first_bad_step = torch.where(
            ~torch.isfinite(loss) & (s.first_bad_step < 0),
            torch.full_like(s.first_bad_step, s.state.step + 1),
            s.first_bad_step,
        )
        window.batches += 1
        window.images += images.shape[0] * s.world
        window.last_images = images
        s.state.batch += 1
        if not s.accelerator.sync_gradients:
            continue
        s.step_lrs[s.state.step + 1] = s.optimizer.param_groups[0]["lr"]
        s.state.step += 1
        if s.scheduler is not None:
            s.scheduler.step(s.state.step)
        if s.ema is not None:
            s.ema.update(s.raw_model, step=s.state.step)
        bar.update(1)
        if s.state.step % s.recipe.log_every == 0 or s.state.step == s.total_steps:
            window = _log_train(s, window, bar)
        if s.state.step >= s.total_steps:
            break
        if s.state.step % s.recipe.checkpoint_every == 0 and s.state.batch < batches_per_epoch:
            _paused(window, checkpoint_now, s)
    return window


def run_epochs(s: Session) -> None:
    """Train until ``total_steps``: evaluate every ``eval_every`` epochs, checkpoint at epoch ends."""
    from tqdm.auto import tqdm

    batches_per_epoch = s.steps_per_epoch * s.recipe.grad_accum
    bar = tqdm(
        total=s.total_steps,
        initial=s.state.step,
        unit="step",
        dynamic_ncols=True,
        disable=not (s.progress and s.accelerator.is_main_process),
    )
    s.model.train()
    window = _Window()
    while s.state.step < s.total_steps:
        epoch = s.state.epoch
        window = _train_epoch(s, bar, window)
        if s.state.batch >= batches_per_epoch:  # the epoch is complete
            s.state.epoch, s.state.batch = epoch + 1, 0
            if s.state.epoch % s.recipe.eval_every == 0 or s.state.step >= s.total_steps:
                _paused(window, evaluate_now, s)
        _paused(window, checkpoint_now, s)
    bar.close()


def finish(s: Session) -> RunSummary:
    """Final evaluation (unless the last step was evaluated), export, ``summary.json``; the summary."""
    from ...models.pretrained import weights_sha1
    from ..hub import export_for_hub
    from ..provenance import package_versions

    if s.last_eval != s.state.step:
        evaluate_now(s)
    check_finite(s)
    r, ev, val = s.recipe, s.eval_result, validate_at_end(s)
    prefix = monitor_prefix(s.monitor)
    summary = RunSummary(
        model=r.model,
        steps=s.state.step,
        epochs=s.state.step / s.steps_per_epoch,
        train_images=len(s.train_ds),
        val_images=s.val_size,
        processes=s.world,
        time_s=round(s.elapsed(), 1),
        val_top1=val.get("val_top1"),
        ema_val_top1=val.get("ema_val_top1"),
        pe_ssdc=ev.get("pe_ssdc"),
        resumed_from=s.resumed_from,
        skipped_images=s.skipped_images or None,
        versions=package_versions(),
        monitor="validation" if s.monitor is None else "heldout",
        monitor_top1=ev.get(f"{prefix}_top1"),
        monitor_images=s.val_size if s.monitor is None else s.monitor.images,
    )
    if s.accelerator.is_main_process:
        model_args = dict(r.model_kwargs, img_size=r.img_size, num_classes=len(s.classes))
        paper = r.eval_resize == "paper"
        cfg = dict(
            input_size=(3, r.img_size, r.img_size),
            num_classes=len(s.classes),
            label_names=s.classes,
            mean=s.mean,
            std=s.std,
            interpolation=r.interpolation,
            crop_pct=1.0 if paper else r.crop_pct,
            crop_mode="squash" if paper else "center",
        )
        summary.export = str(export_for_hub(s.raw_model, s.out / "export", model_args, cfg))
        summary.export_sha1 = weights_sha1(s.out / "export" / "model.safetensors")  # what val_top1 is of
        if s.ema is not None:
            summary.export_ema = str(export_for_hub(s.ema.module, s.out / "export_ema", model_args, cfg))
            summary.export_ema_sha1 = weights_sha1(s.out / "export_ema" / "model.safetensors")
        s.log.log(dict(summary.to_dict(tagged=False), kind="final"))
        summary.write(s.out / "summary.json")
        s.accelerator.print(
            f"done: {s.state.step} steps in {summary.time_s:.0f}s, val top-1 "
            f"{summary.val_top1:.4f}; exported to {summary.export}"
        )
    s.log.close()
    s.accelerator.wait_for_everyone()
    s.accelerator.end_training()
    return summary
