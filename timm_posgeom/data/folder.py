"""ImageFolder trees (``root/<split>/<class>/<image>``) as a split: one class numbering for every split
folder, a fixed order mixed across classes, and a fingerprint that changes when any file does."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

from PIL import Image

from .splits import SPLIT_ALIASES, ImageSplit, split_name

__all__ = ["is_image_folder", "load_folder_split"]


def _open_image(path: str) -> Image.Image:
    """An image file decoded in its own mode (torchvision's default loader converts to RGB itself, which
    clips 16-bit images at 255: :func:`~timm_posgeom.transforms.to_rgb` converts it later, correctly)."""
    with open(path, "rb") as f:
        image = Image.open(f)
        image.load()
    return image


def _folder_getter(ds, index):
    return ds[int(index)]


def _file_key(path: str) -> str:
    """``path|size|mtime_ns``: what identifies a file's content for the on-disk cache (no read needed)."""
    stat = os.stat(path)
    return f"{path}|{stat.st_size}|{stat.st_mtime_ns}"


def is_image_folder(root: Path) -> bool:
    """Whether ``root`` is an ImageFolder tree: folders of class folders, and no parquet set."""
    if any(root.glob("*.parquet")) or any(root.glob("*/*.parquet")) or (root / "dataset_info.json").exists():
        return False
    return any(
        p.is_dir() and any(q.is_dir() for q in p.iterdir()) for p in root.iterdir())


def _folder_classes(root: Path, split_dir: str) -> list[str]:
    """The classes of an ImageFolder tree, sorted: the union of the class folders of every split folder
    (``train`` / ``validation`` and their aliases, and ``split_dir``), so an index means one class in all."""
    splits = {a for group in SPLIT_ALIASES.values() for a in group} | {split_dir}
    return sorted({c.name for d in root.iterdir() if d.is_dir() and d.name in splits
                   for c in d.iterdir() if c.is_dir()})


def load_folder_split(root: Path, split: str, subset: int | None) -> ImageSplit:
    """The ``split`` folder of the ImageFolder tree ``root`` (or its alias), its first ``subset`` items."""
    from torchvision.datasets import ImageFolder

    name = split_name([p.name for p in root.iterdir() if p.is_dir()], split)
    # allow_empty: a class folder without images (in this split) is a class with no images here, not an error
    folder = ImageFolder(str(root / name), loader=_open_image, allow_empty=True)
    # One class numbering for every split: ImageFolder numbers each split's own class folders, so a
    # class missing from one split would shift the labels of every class after it (silently wrong).
    classes = _folder_classes(root, name)
    if folder.classes != classes:
        index = {c: i for i, c in enumerate(classes)}
        folder.samples = [(path, index[folder.classes[t]]) for path, t in folder.samples]
        folder.classes, folder.class_to_idx = classes, index
    # A fixed, class-mixed order (by a hash of each file's path in the split), as the parquet sets'
    # rows are pre-shuffled: ImageFolder's is sorted by class, so "the first n" (subset, max_images,
    # the study's probe and eval images) would be the first classes only.
    folder.samples.sort(key=lambda item: hashlib.sha1(
        os.path.relpath(item[0], root / name).encode()).hexdigest())
    n = min(len(folder), subset) if subset else len(folder)
    folder.samples = folder.samples[:n]
    folder.imgs = folder.samples
    folder.targets = [t for _, t in folder.samples]
    # the cache key must change when any file changes (path, size and modification time of each) and
    # when the class numbering does
    digest = hashlib.sha1("\n".join([_file_key(p) for p, _ in folder.samples] + ["classes:"] + classes)
                          .encode()).hexdigest()[:16]
    return ImageSplit(folder, folder.classes, folder.targets, f"folder-{digest}-{n}", _folder_getter,
                      lambda index: folder.samples[index][0])
