"""What a training run is monitored on: the validation split (``heldout_fraction: 0``, the default) or a
seeded, class-stratified part of the training split held out from training
(:func:`timm_posgeom.data.carve_heldout`; docs/method.md#how-this-implementation-differs-from-the-papers-code).

The per-epoch evaluations (top-1, loss, EMA top-1, SSDC under RPI) read the monitor split; with a held-out
monitor, the run's final numbers (``summary.json``'s ``val_top1``) are measured on the validation split once,
at the end, so the validation split decides nothing during training. Every ``eval`` record and the summary say
which split monitored (``monitor``: ``validation`` or ``heldout``), and ``data.json`` holds the carving.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..recipe import Recipe

if TYPE_CHECKING:
    from torch.utils.data import Dataset

__all__ = ["Monitor", "carve_monitor", "build_monitor", "monitor_prefix"]


@dataclass
class Monitor:
    """A held-out monitor split, ready to evaluate on: its loader (sharded over the processes), the loader of
    its first ``probe_images`` images (main process; None when off), its size and the carving's record."""

    loader: Any
    rpi_loader: Any
    images: int
    record: dict[str, Any]
    split: str = "heldout"


def monitor_prefix(monitor: Monitor | None) -> str:
    """The prefix of the monitor's numbers in the training log: ``val`` (the validation split) or ``heldout``."""
    return "val" if monitor is None else "heldout"


def carve_monitor(recipe: Recipe, train_split: Any) -> tuple[Any, Any, dict[str, Any] | None]:
    """(the split to train on, the held-out split or None, the carving's record or None) of ``train_split``
    under the recipe's ``heldout_fraction`` and ``heldout_seed``."""
    if not recipe.heldout_fraction:
        return train_split, None, None
    from ...data import carve_heldout

    return carve_heldout(train_split, recipe.heldout_fraction, recipe.heldout_seed)


def build_monitor(
    recipe: Recipe,
    accelerator: Any,
    heldout: Any,
    record: dict[str, Any] | None,
    mean,
    std,
    batch: int,
    progress: bool = True,
) -> Monitor | None:
    """The :class:`Monitor` of the held-out split (None without one), preprocessed as the validation split is:
    through the uint8 cache with ``cache``, else the recipe's eval transform; bad images as ``bad_images`` says."""
    if heldout is None or record is None:
        return None
    from ... import data as D
    from ...data.transforms import eval_transform

    show = progress and accelerator.is_main_process
    with accelerator.main_process_first():
        if recipe.bad_images == "skip" or not recipe.cache:
            heldout = D.check_images(heldout, recipe.bad_images, progress=show)
        if recipe.cache:
            cache_dir = D.default_cache_dir() if recipe.disk_cache else None
            cached = D.cache_uint8(
                heldout, recipe.img_size, recipe.interpolation, recipe.workers, cache_dir, progress=show
            )
    ds: Dataset
    if recipe.cache:
        ds = D.CachedEvalDataset(cached, mean, std)
    else:
        config = D.eval_config(recipe.img_size, mean, std, recipe.interpolation, recipe.crop_pct)
        ds = D.TransformDataset(heldout, eval_transform(config, resize=recipe.eval_resize))
    size = recipe.eval_batch_size or batch
    sampler = D.EpochBatchSampler(
        len(ds), size, accelerator.num_processes, accelerator.process_index, shuffle=False, drop_last=False
    )
    loader = D.make_loader(ds, sampler, recipe.workers, pin_memory=accelerator.device.type == "cuda")
    rpi_loader = None
    if recipe.probe_images:
        first = D.EpochBatchSampler(min(recipe.probe_images, len(ds)), size, shuffle=False, drop_last=False)
        rpi_loader = D.make_loader(ds, first, 0)
    skipped = list(getattr(heldout, "skipped", []))
    return Monitor(loader=loader, rpi_loader=rpi_loader, images=len(ds), record=dict(record, skipped=len(skipped)))
