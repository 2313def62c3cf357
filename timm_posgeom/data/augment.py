"""Training transforms, PIL -> normalised tensor (``augment``: ``none``, ``crop_flip`` or ``timm``; see
:mod:`timm_posgeom.data`), the crop-and-flip on tensors that the uint8 cache shares, and
:class:`TransformDataset`, which draws each item's randomness from ``(seed, epoch, index)``."""

from __future__ import annotations

import random
import sys
from collections.abc import Callable, Sequence
from typing import Any, TypedDict

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from ..errors import SettingError
from .synthetic import seed32
from .transforms import eval_transform, to_rgb

if sys.version_info >= (3, 11):
    from typing import Unpack
else:  # Python 3.10: typing_extensions, which torch requires
    from typing_extensions import Unpack

__all__ = ["AUGMENTATIONS", "TimmAugment", "crop_flip", "eval_config", "train_transform", "TransformDataset"]

AUGMENTATIONS = ("none", "crop_flip", "timm")


class TimmAugment(TypedDict, total=False):
    """The settings of timm's training pipeline (``augment="timm"``), :func:`train_transform`'s keywords:
    ``auto_augment`` (e.g. ``"rand-m9-mstd0.5-inc1"``; default None), ``color_jitter`` (default None),
    ``reprob`` (random erasing probability; default 0) and ``scale`` (RandomResizedCrop's area range;
    default (0.08, 1.0))."""

    auto_augment: str | None
    color_jitter: float | None
    reprob: float
    scale: Sequence[float]


def _pil_interp(name: str) -> int:
    modes = Image.Resampling
    return {
        "bicubic": modes.BICUBIC,
        "bilinear": modes.BILINEAR,
        "nearest": modes.NEAREST,
        "lanczos": modes.LANCZOS,
        "box": modes.BOX,
    }[name]


def resize_uint8(image: Image.Image, img_size: int, interpolation: str = "bicubic") -> torch.Tensor:
    """PIL image -> (3, img_size, img_size) uint8 tensor, resized straight (squashed) to the size."""
    image = to_rgb(image)
    if image.size != (img_size, img_size):
        image = image.resize((img_size, img_size), _pil_interp(interpolation))
    return torch.from_numpy(np.asarray(image, dtype=np.uint8).copy()).permute(2, 0, 1).contiguous()


def _reflect(index: torch.Tensor, n: int) -> torch.Tensor:
    """Map indices in [-(n-1), 2(n-1)] into [0, n) as reflect padding does (no edge repeat)."""
    index = index.abs()
    return torch.where(index > n - 1, 2 * (n - 1) - index, index)


def crop_flip(
    image: torch.Tensor, pad: int = 4, hflip: float = 0.5, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Random crop of the original size after ``pad``-pixel reflect padding, then a random flip.

    image: (C, H, W) tensor of any dtype; the result has the same shape and dtype. Equal to
    ``F.pad(image, (pad,) * 4, mode="reflect")`` cropped at a random offset, but done by indexing
    (no float copy, and no intra-op threads for a tiny tensor, which on a busy CPU cost milliseconds).
    """
    C, H, W = image.shape
    rows, cols = torch.arange(H), torch.arange(W)
    if pad > 0:
        top, left = torch.randint(0, 2 * pad + 1, (2,), generator=generator).tolist()
        rows, cols = _reflect(rows + top - pad, H), _reflect(cols + left - pad, W)
    if hflip > 0 and torch.rand((), generator=generator).item() < hflip:
        cols = cols.flip(0)
    return image.index_select(1, rows).index_select(2, cols)


def normalize_uint8(image_u8: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    return (image_u8.float().div_(255) - mean) / std


def mean_std_tensors(mean: Sequence[float], std: Sequence[float]) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.tensor(mean, dtype=torch.float32).view(3, 1, 1), torch.tensor(std, dtype=torch.float32).view(3, 1, 1)


class _CropFlipTransform:
    """PIL -> resize straight to img_size -> reflect-pad crop + flip -> normalised tensor."""

    def __init__(self, img_size, mean, std, interpolation, pad, hflip):
        self.img_size, self.interpolation, self.pad, self.hflip = img_size, interpolation, pad, hflip
        self.mean, self.std = mean_std_tensors(mean, std)

    def __call__(self, image: Image.Image) -> torch.Tensor:
        u8 = crop_flip(resize_uint8(image, self.img_size, self.interpolation), self.pad, self.hflip)
        return normalize_uint8(u8, self.mean, self.std)


def eval_config(
    img_size: int,
    mean: Sequence[float] = (0.485, 0.456, 0.406),
    std: Sequence[float] = (0.229, 0.224, 0.225),
    interpolation: str = "bicubic",
    crop_pct: float = 0.875,
) -> dict[str, Any]:
    """A timm data config for square ``img_size`` inputs, for :func:`timm_posgeom.data.transforms.eval_transform`
    (the one owner of evaluation transforms): ``eval_transform(eval_config(64), resize="paper")``."""
    return dict(
        input_size=(3, img_size, img_size),
        interpolation=interpolation,
        mean=tuple(mean),
        std=tuple(std),
        crop_pct=crop_pct,
        crop_mode="center",
    )


def train_transform(
    img_size: int,
    augment: str = "crop_flip",
    mean: Sequence[float] = (0.485, 0.456, 0.406),
    std: Sequence[float] = (0.229, 0.224, 0.225),
    interpolation: str = "bicubic",
    crop_pad: int = 4,
    hflip: float = 0.5,
    **timm: Unpack[TimmAugment],
) -> Callable[[Image.Image], torch.Tensor]:
    """PIL -> normalised tensor for training (see :mod:`timm_posgeom.data` for ``augment``); ``timm``: the
    settings of timm's pipeline (:class:`TimmAugment`), used by ``augment="timm"`` only."""
    unknown = sorted(set(timm) - set(TimmAugment.__annotations__))
    if unknown:
        raise TypeError(f"train_transform() got an unexpected keyword argument {unknown[0]!r}")
    if augment not in AUGMENTATIONS:
        raise SettingError(f"unknown augment {augment!r}; expected one of {', '.join(AUGMENTATIONS)}")
    if augment == "none":  # the paper: no augmentation, resized straight to the input
        return eval_transform(eval_config(img_size, mean, std, interpolation), resize="paper")
    if augment == "crop_flip":
        return _CropFlipTransform(img_size, mean, std, interpolation, crop_pad, hflip)
    from timm.data import create_transform

    low, high = timm.get("scale", (0.08, 1.0))
    return create_transform(
        (3, img_size, img_size),
        is_training=True,
        scale=(float(low), float(high)),
        hflip=hflip,
        color_jitter=timm.get("color_jitter") or None,  # type: ignore[arg-type]  # None: no jitter (timm's annotation omits it)
        auto_augment=timm.get("auto_augment"),
        interpolation=interpolation,
        mean=tuple(mean),
        std=tuple(std),
        re_prob=timm.get("reprob", 0.0),
    )


def sample_seed(seed: int, epoch: int, index: int) -> int:
    return seed32(seed, epoch, index)


class TransformDataset(Dataset):
    """``(PIL, label)`` split + transform -> ``(tensor, label)``.

    With ``seed`` set, each item's randomness (python ``random``, numpy, torch) is seeded from
    ``(seed, epoch, index)`` and the process RNG states are restored afterwards, so augmentation
    does not depend on workers, batch composition or resumption. Call :meth:`set_epoch` before
    each epoch (loaders must not use persistent workers).
    """

    def __init__(self, split: Any, transform: Callable, seed: int | None = None):  # split: len(), [i] -> (PIL, label)
        self.split, self.transform, self.seed, self.epoch = split, transform, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return len(self.split)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        image, label = self.split[index]
        if self.seed is None:
            return self.transform(image), label
        key = sample_seed(self.seed, self.epoch, index)
        states = random.getstate(), np.random.get_state(), torch.get_rng_state()
        try:
            random.seed(key)
            np.random.seed(key)
            torch.manual_seed(key)
            return self.transform(image), label
        finally:
            random.setstate(states[0])
            np.random.set_state(states[1])
            torch.set_rng_state(states[2])
