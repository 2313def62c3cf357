"""Evaluation images: the one path from a data split to the batches a probe or an evaluation reads.

Every command and the study turn a split into probe batches through :func:`eval_loader`, so the
same model gets the same preprocessing everywhere: :func:`~timm_posgeom.transforms.eval_transform`
of the model's data config (``resize="paper"``: straight to the input size, as the paper; ``"timm"``:
timm's resize + centre crop).

A split is anything indexable with a length whose items are ``(PIL image, label)`` pairs or dicts
with ``image``/``img`` and ``label``/``labels`` keys: a :class:`~timm_posgeom.data.ImageSplit`
(:func:`~timm_posgeom.data.load_split`), a Hugging Face dataset split, a list.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import PIL.Image
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset

from .transforms import class_index, eval_transform, resolve_config

__all__ = ["split_item", "check_split", "EvalImages", "eval_loader", "default_workers"]


def split_item(item: Any) -> tuple[PIL.Image.Image, int]:
    """(image, label) from a (PIL, label) pair or a dict with image/img and label/labels keys."""
    if isinstance(item, Mapping):
        image = next((item[k] for k in ("image", "img") if k in item), None)
        label = next((item[k] for k in ("label", "labels") if k in item), None)
        if image is None or label is None:
            raise ValueError(f"a data item dict needs 'image' and 'label' keys, got {sorted(item)}")
    elif isinstance(item, (tuple, list)) and len(item) >= 2:
        image, label = item[0], item[1]
    else:
        raise TypeError(f"a data item must be (PIL image, label) or {{'image', 'label'}}, got {type(item).__name__}")
    if not isinstance(image, PIL.Image.Image):
        raise TypeError(f"data images must be PIL images, got {type(image).__name__}")
    return image, class_index(label)


def check_split(data: Any, max_images: int | None = None) -> int:
    """Number of images to use: ``len(data)``, capped by ``max_images``; clear errors otherwise."""
    if not hasattr(data, "__len__") or not hasattr(data, "__getitem__"):
        raise TypeError("data must be indexable with a length: a Hugging Face dataset or a sequence of "
                        f"(PIL image, label) / {{'image', 'label'}}; got {type(data).__name__}")
    if isinstance(data, Mapping):
        raise TypeError(f"data is a mapping (keys {list(data)[:5]}): pass one split, e.g. data['validation']")
    n = len(data)
    if max_images is not None:
        if max_images < 1:
            raise ValueError(f"max_images must be >= 1, got {max_images}")
        n = min(n, int(max_images))
    if n == 0:
        raise ValueError("data is empty: no images to evaluate")
    return n


class EvalImages(Dataset):
    """Item i of the first ``n`` of ``data`` -> (normalised (3, H, W) float image, label)."""

    def __init__(self, data: Any, n: int, transform: Any):
        self.data, self.n, self.transform = data, n, transform

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if not 0 <= index < self.n:
            raise IndexError(index)
        image, label = split_item(self.data[index])
        return self.transform(image), label


def default_workers() -> int:
    """DataLoader workers when none are asked for: ``min(4, cpu_count - 1)``."""
    return min(4, max(0, (os.cpu_count() or 1) - 1))


def eval_loader(
        model: nn.Module,
        data: Any,
        *,
        max_images: int | None = None,
        batch_size: int = 64,
        resize: str = "paper",
        num_workers: int | None = None,
        pin_memory: bool = False,
        img_size: int | tuple[int, int] | None = None,
) -> DataLoader:
    """Batches ``(images (B, 3, H, W) float, labels (B,) int64)`` of the first ``max_images`` items of
    ``data`` in order, under the model's clean eval transform (``resize`` = paper or timm).

    ``img_size`` (S or (H, W)): the input size, for models that take any size (default: the model's
    own, from its config); a model with one fixed other size is refused (see
    :func:`~timm_posgeom.transforms.resolve_config`).

    ``probe_ssdc`` reads these batches directly (it takes the images of an ``(images, labels)`` pair).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    n = check_split(data, max_images)
    workers = default_workers() if num_workers is None else int(num_workers)
    transform = eval_transform(resolve_config(model, img_size), resize=resize)
    return DataLoader(EvalImages(data, n, transform), batch_size=batch_size,
                      shuffle=False, num_workers=workers, pin_memory=pin_memory)
