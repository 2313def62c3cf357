"""The images and labels the localisation measures read, and where the model runs while it reads them.

The streaming probes read images alone (:mod:`timm_posgeom.probes.streaming`); patching and ablation also
score top-1, so they read the labels beside the images: ``(images, labels)`` batches as
:func:`~timm_posgeom.data.eval_data.eval_loader` yields them, dicts with ``image`` / ``pixel_values`` and
``label`` / ``labels``, or one image tensor (no labels: top-1 is NaN, with a warning, never a number).
One process reads all the data (the measures keep per-batch state across several forward passes).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

import torch
import torch.nn as nn
from tqdm.auto import tqdm

from ..errors import DataError
from ..measuring.settings import MeasureSettings

__all__ = ["labelled_batches", "placed", "model_device"]


def _split(batch: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(images (B, C, H, W), labels (B,) or None) of one batch."""
    if isinstance(batch, torch.Tensor):
        return (batch[None] if batch.ndim == 3 else batch), None
    if isinstance(batch, (tuple, list)) and batch and isinstance(batch[0], torch.Tensor):
        labels = batch[1] if len(batch) > 1 and isinstance(batch[1], torch.Tensor) else None
        return batch[0], labels
    if isinstance(batch, dict):
        images = next(
            (batch[k] for k in ("image", "pixel_values", "images") if isinstance(batch.get(k), torch.Tensor)), None
        )
        if images is None:
            raise TypeError(f"a dict batch needs an 'image' or 'pixel_values' tensor, got keys {sorted(batch)}")
        labels = next((batch[k] for k in ("label", "labels") if isinstance(batch.get(k), torch.Tensor)), None)
        return images, labels
    raise TypeError(
        "each batch must be an image tensor (B, C, H, W), an (images, labels) tuple or a dict with 'image' and "
        f"'label'; got {type(batch).__name__}"
    )


def labelled_batches(
    data: Any, settings: MeasureSettings, what: str, labels: torch.Tensor | None = None
) -> Iterator[tuple[torch.Tensor, torch.Tensor | None, int]]:
    """(images on the settings' device, labels (B,) int64 on the CPU or None, index of the first image) per batch.

    Args:
        data: one (n, C, H, W) tensor (cut into ``settings.batch_size`` chunks), or an iterable of batches.
        settings: ``max_images``, ``batch_size``, ``device`` and ``progress`` are read.
        what: the progress bar's name.
        labels: (n,) labels of a tensor ``data`` (ignored for batches, which carry their own).
    """
    if isinstance(data, torch.Tensor):
        whole = data[None] if data.ndim == 3 else data
        step = settings.batch_size or max(len(whole), 1)
        batches: Iterable[Any] = (
            (whole[i : i + step], None if labels is None else labels[i : i + step]) for i in range(0, len(whole), step)
        )
        total: int | None = len(whole) if settings.max_images is None else min(len(whole), settings.max_images)
    elif isinstance(data, Iterable):
        batches, total = data, settings.max_images
    else:
        raise TypeError(f"data must be a tensor or an iterable of batches, got {type(data).__name__}")
    seen = 0
    with tqdm(total=total, unit="img", desc=what, disable=not settings.progress, leave=False) as bar:
        for batch in batches:
            images, batch_labels = _split(batch)
            if images.ndim != 4:
                raise ValueError(f"expected an image batch (B, C, H, W), got shape {tuple(images.shape)}")
            if settings.max_images is not None:
                images = images[: settings.max_images - seen]
                batch_labels = None if batch_labels is None else batch_labels[: len(images)]
            if len(images) == 0:
                break
            yield images, None if batch_labels is None else batch_labels.long().cpu(), seen
            seen += len(images)
            bar.update(len(images))
            if settings.max_images is not None and seen >= settings.max_images:
                break
    if seen == 0:
        raise DataError("data yielded no images")


def model_device(model: nn.Module) -> tuple[torch.device, torch.dtype]:
    """(the device of the model's first floating parameter, its dtype); CPU float32 for a model without one."""
    param = next((p for p in model.parameters() if p.is_floating_point()), None)
    return (param.device, param.dtype) if param is not None else (torch.device("cpu"), torch.float32)


@contextlib.contextmanager
def placed(model: nn.Module, device: Any) -> Iterator[tuple[torch.device, torch.dtype]]:
    """The model on ``device`` inside the block (None: where it is), moved back after it, errors included;
    yields (the device it runs on, its dtype: the images' dtype)."""
    home, dtype = model_device(model)
    target = torch.device(device) if device is not None else home
    try:
        if target != home:
            model.to(target)
        yield target, dtype
    finally:
        if target != home:
            model.to(home)
