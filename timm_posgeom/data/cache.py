"""The uint8 cache for small-resolution CPU runs: a split decoded and resized once into an
``(N, 3, S, S)`` uint8 tensor (optionally kept on disk, keyed by the split's fingerprint), and datasets that
augment and normalise those tensors directly, so training is not bound by JPEG decoding."""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset

from ..errors import SettingError
from ..results.fingerprints import fingerprint
from ..results.jsonio import replacing, write_errors
from .augment import crop_flip, mean_std_tensors, normalize_uint8, resize_uint8, sample_seed
from .splits import ImageSplit, SubsetSplit
from .synthetic import SyntheticShapes

__all__ = ["CachedSplit", "cache_uint8", "CachedTrainDataset", "CachedEvalDataset", "default_cache_dir"]


class CachedSplit:
    """A split pre-resized to ``img_size``: ``images`` (N, 3, S, S) uint8, ``labels`` (N,) int64."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, classes: Sequence[str]):
        self.images, self.labels, self.classes = images, labels, list(classes)

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def __len__(self) -> int:
        return len(self.labels)


class _ResizeItems(Dataset):
    def __init__(self, split, img_size, interpolation):
        self.split, self.img_size, self.interpolation = split, img_size, interpolation

    def __len__(self):
        return len(self.split)

    def __getitem__(self, index):
        items, item = self.split.items, index
        source = self.split
        while isinstance(source, SubsetSplit):  # a subset's item i is its parent's item indices[i]
            item = source.indices[item]
            source = source.split
        if isinstance(items, SyntheticShapes) and items.img_size == self.img_size:
            return items.render(item)
        image, _ = self.split[index]
        return resize_uint8(image, self.img_size, self.interpolation)


def default_cache_dir() -> Path:
    """``$TIMM_POSGEOM_CACHE``, else ``~/.cache/timm_posgeom``."""
    return Path(os.environ.get("TIMM_POSGEOM_CACHE", Path.home() / ".cache" / "timm_posgeom"))


def cache_uint8(
    split: ImageSplit,
    img_size: int,
    interpolation: str = "bicubic",
    workers: int = 0,
    cache_dir: str | os.PathLike | None = None,
    progress: bool = False,
) -> CachedSplit:
    """Decode and resize ``split`` once (straight to ``img_size``) into a uint8 tensor.

    With ``cache_dir``, the tensor is also stored there (keyed by the split's fingerprint, the size
    and the interpolation; written atomically) and reused by later runs.
    """
    file = None
    if cache_dir is not None:
        key = fingerprint(f"{split.fingerprint}|{img_size}|{interpolation}")
        file = Path(cache_dir) / f"uint8-{img_size}px-{key}.pt"
        if file.is_file():
            try:
                blob = torch.load(file, weights_only=True)
                if len(blob["labels"]) == len(blob["images"]) == len(split):
                    return CachedSplit(blob["images"], blob["labels"], split.classes)
                raise ValueError(f"it holds {len(blob['images'])} images, the split {len(split)}")
            except Exception as e:  # a damaged cache file (cut by a full disk, written by hand): made again
                warnings.warn(
                    f"the image cache {file} cannot be read ({type(e).__name__}: {' '.join(str(e).split())[:200]}): "
                    "decoding the images again",
                    RuntimeWarning,
                    stacklevel=2,
                )
    loader = DataLoader(
        _ResizeItems(split, img_size, interpolation), batch_size=256, num_workers=workers, generator=torch.Generator()
    )
    chunks = loader
    if progress:
        from tqdm.auto import tqdm

        chunks = tqdm(loader, desc=f"caching {len(split)} images at {img_size}px", unit="batch")
    images = torch.cat([c for c in chunks]) if len(split) else torch.empty(0, 3, img_size, img_size, dtype=torch.uint8)
    labels = torch.tensor(split.labels, dtype=torch.int64)
    if file is not None:
        file.parent.mkdir(parents=True, exist_ok=True)
        with replacing(file) as tmp, write_errors(file):  # a full disk: one line
            torch.save({"images": images, "labels": labels}, tmp)
    return CachedSplit(images, labels, split.classes)


class CachedTrainDataset(Dataset):
    """Training items from a :class:`CachedSplit`: reflect-pad crop + flip on the uint8 tensor,
    then normalisation. The randomness of item ``i`` in epoch ``e`` comes from a generator seeded
    with ``(seed, e, i)``. Call :meth:`set_epoch` before each epoch."""

    def __init__(
        self,
        cache: CachedSplit,
        mean: Sequence[float],
        std: Sequence[float],
        crop_pad: int = 4,
        hflip: float = 0.5,
        seed: int = 0,
        augment: str = "crop_flip",
    ):
        if augment not in ("none", "crop_flip"):
            raise SettingError(f"the uint8 cache supports augment 'none' or 'crop_flip', not {augment!r}")
        self.cache, self.crop_pad, self.hflip, self.seed, self.epoch = cache, crop_pad, hflip, seed, 0
        self.augment = augment
        self.mean, self.std = mean_std_tensors(mean, std)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return len(self.cache)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        image = self.cache.images[index]
        if self.augment == "crop_flip":
            g = torch.Generator().manual_seed(sample_seed(self.seed, self.epoch, index))
            image = crop_flip(image, self.crop_pad, self.hflip, generator=g)
        return normalize_uint8(image, self.mean, self.std), int(self.cache.labels[index])


class CachedEvalDataset(Dataset):
    """Evaluation items from a :class:`CachedSplit` (normalised, no randomness)."""

    def __init__(self, cache: CachedSplit, mean: Sequence[float], std: Sequence[float]):
        self.cache = cache
        self.mean, self.std = mean_std_tensors(mean, std)

    def __len__(self) -> int:
        return len(self.cache)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return normalize_uint8(self.cache.images[index], self.mean, self.std), int(self.cache.labels[index])
