"""Evaluation images: the one path from a data split to the batches a probe or an evaluation reads.

Every command and the study turn a split into probe batches through :func:`eval_loader`, so the
same model gets the same preprocessing everywhere: :func:`~timm_posgeom.data.transforms.eval_transform`
of the model's data config (``resize="paper"``: straight to the input size, as the paper; ``"timm"``:
timm's resize + centre crop).

A split is anything indexable with a length whose items are ``(PIL image, label)`` pairs or dicts
with ``image``/``img`` and ``label``/``labels`` keys: a :class:`~timm_posgeom.data.ImageSplit`
(:func:`~timm_posgeom.data.load_split`), a Hugging Face dataset split, a list. A stream (an iterable
without a length: ``datasets.load_dataset(..., streaming=True)``, a generator) is read as its first
``max_images`` items (:func:`first_items`).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Mapping
from typing import Any

import PIL.Image
import torch
import torch.nn as nn
import torchvision.transforms as T
from torch.utils.data import DataLoader, Dataset

from ..errors import DataError, SettingError
from . import ImageSplit, RelabeledSplit
from .transforms import class_index, resize_transform, resolve_config

__all__ = [
    "split_item",
    "first_items",
    "check_split",
    "EvalImages",
    "eval_loader",
    "default_workers",
    "DecodedImages",
    "resized_item",
    "prepare_shared",
]


def split_item(item: Any) -> tuple[PIL.Image.Image, int]:
    """(image, label) from a (PIL, label) pair or a dict with image/img and label/labels keys."""
    if isinstance(item, Mapping):
        image = next((item[k] for k in ("image", "img") if k in item), None)
        label = next((item[k] for k in ("label", "labels") if k in item), None)
        if image is None or label is None:
            raise DataError(f"a data item dict needs 'image' and 'label' keys, got {sorted(item)}")
    elif isinstance(item, (tuple, list)) and len(item) >= 2:
        image, label = item[0], item[1]
    else:
        raise TypeError(f"a data item must be (PIL image, label) or {{'image', 'label'}}, got {type(item).__name__}")
    if not isinstance(image, PIL.Image.Image):
        raise TypeError(f"data images must be PIL images, got {type(image).__name__}")
    return image, class_index(label)


def first_items(data: Any, max_images: int | None) -> Any:
    """``data`` itself when it is indexable with a length; else (a stream: a ``datasets.IterableDataset``,
    a generator) its first ``max_images`` items, read into memory, which a stream needs to be given (it has no
    length). A Hugging Face stream becomes a ``datasets.Dataset`` of those rows with the stream's features
    (its class names stay, for the label check), its images as stored (not decoded and encoded again)."""
    if (
        (hasattr(data, "__len__") and hasattr(data, "__getitem__"))
        or isinstance(data, Mapping)
        or not hasattr(data, "__iter__")
    ):
        return data
    if max_images is None:
        raise SettingError(
            "data is a stream (an iterable without a length): give max_images, the number of its first images to read"
        )
    if max_images < 1:
        raise SettingError(f"max_images must be >= 1, got {max_images}")
    if getattr(data, "features", None) is not None and hasattr(data, "take") and hasattr(data, "cast_column"):
        from .hub import take_stream

        return take_stream(data, max_images)
    return list(itertools.islice(data, max_images))


def check_split(data: Any, max_images: int | None = None) -> int:
    """Number of images to use: ``len(data)``, capped by ``max_images``; clear errors otherwise."""
    if not hasattr(data, "__len__") or not hasattr(data, "__getitem__"):
        raise TypeError(
            "data must be indexable with a length: a Hugging Face dataset or a sequence of "
            f"(PIL image, label) / {{'image', 'label'}}; got {type(data).__name__}"
        )
    if isinstance(data, Mapping):
        raise TypeError(f"data is a mapping (keys {list(data)[:5]}): pass one split, e.g. data['validation']")
    n = len(data)
    if max_images is not None:
        if max_images < 1:
            raise SettingError(f"max_images must be >= 1, got {max_images}")
        n = min(n, int(max_images))
    if n == 0:
        raise DataError("data is empty: no images to evaluate")
    return n


class DecodedImages(ImageSplit):
    """The first ``n`` images of a split decoded once, and resized once per input configuration, for
    every model measured on them (a zoo measures hundreds of models on the same 1,000 images).

    Items are ``(PIL image, label)`` like the split's; ``classes``, ``labels`` and ``num_classes`` are
    the split's. :func:`eval_loader` and :func:`~timm_posgeom.robustness.fragility` read the resized image
    of a configuration from here (:func:`resized_item`), computed once, in this process, by the same
    transform a model would apply: the batches are the same, bit for bit, as from the split itself.
    The resized images of the ``keep`` most recent configurations are kept (each is n x H x W x 3 bytes).
    """

    def __init__(self, data: Any, n: int | None = None, *, keep: int = 2, progress: bool = False):
        from tqdm.auto import tqdm

        n = check_split(data, n)
        images, labels = [], []
        for index in tqdm(range(n), desc="decoding", unit="image", disable=not progress):
            image, label = split_item(data[index])
            image.load()  # decoded now, not at first use
            images.append(image)
            labels.append(label)
        classes = list(getattr(data, "classes", None) or []) or [str(i) for i in range(max(labels) + 1)]
        fingerprint = f"{getattr(data, 'fingerprint', 'data')}-decoded-{n}"
        super().__init__(
            images,
            classes,
            labels,
            fingerprint,
            lambda items, index: (items[index], labels[index]),
            getattr(data, "where", None),
        )
        self.images = images
        self.keep = keep
        self._resized: dict[str, list[PIL.Image.Image]] = {}

    def resized(self, resize: Any) -> list[PIL.Image.Image]:
        """Every image through ``resize`` (a PIL -> PIL transform), computed at the first call for that
        transform (keyed by its ``repr``: sizes, interpolation, crop), then kept."""
        key = repr(resize)
        if key not in self._resized:
            while len(self._resized) >= self.keep:
                self._resized.pop(next(iter(self._resized)))
            self._resized[key] = [resize(image) for image in self.images]
        return self._resized[key]


def resized_item(data: Any, index: int, resize: Any) -> tuple[PIL.Image.Image, int]:
    """Item ``index`` of ``data`` through ``resize``: from the :class:`DecodedImages` cache when ``data``
    is one (or relabels one, item for item), else decoded and resized now."""
    if isinstance(data, DecodedImages):
        return data.resized(resize)[index], data.labels[index]
    if isinstance(data, RelabeledSplit) and isinstance(data.split, DecodedImages):
        return data.split.resized(resize)[index], data.labels[index]
    image, label = split_item(data[index])
    return resize(image), label


def prepare_shared(data: Any, resize: Any) -> None:
    """Fill the shared resized images of ``data`` (a :class:`DecodedImages`, or a relabelling of one) in
    this process: filled in a DataLoader worker, they would die with it."""
    base = data.split if isinstance(data, RelabeledSplit) else data
    if isinstance(base, DecodedImages):
        base.resized(resize)


class EvalImages(Dataset):
    """Item i of the first ``n`` of ``data`` -> (normalised (3, H, W) float image, label): ``resize``
    (PIL -> PIL), then ``to_tensor`` (the rest of the eval transform)."""

    def __init__(self, data: Any, n: int, resize: Any, to_tensor: Any):
        self.data, self.n, self.resize, self.to_tensor = data, n, resize, to_tensor
        prepare_shared(data, resize)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if not 0 <= index < self.n:
            raise IndexError(index)
        image, label = resized_item(self.data, index, self.resize)
        return self.to_tensor(image), label


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
    :func:`~timm_posgeom.data.transforms.resolve_config`).

    ``probe_ssdc`` reads these batches directly (it takes the images of an ``(images, labels)`` pair).
    """
    if batch_size < 1:
        raise SettingError(f"batch_size must be >= 1, got {batch_size}")
    data = first_items(data, max_images)
    n = check_split(data, max_images)
    workers = default_workers() if num_workers is None else int(num_workers)
    cfg = resolve_config(model, img_size)
    # eval_transform's steps in two parts: the geometry (PIL -> PIL, shareable across models) and the rest
    to_tensor = T.Compose([T.ToTensor(), T.Normalize(mean=cfg["mean"], std=cfg["std"])])
    return DataLoader(
        EvalImages(data, n, resize_transform(cfg, resize), to_tensor),
        batch_size=batch_size,
        shuffle=False,
        num_workers=workers,
        pin_memory=pin_memory,
    )
