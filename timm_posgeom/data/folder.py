"""ImageFolder trees (``root/<split>/<class>/<image>``) as a split: one class numbering for every split
folder, a fixed order mixed across classes, and a fingerprint that changes when any file does."""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

from PIL import Image

from ..results.fingerprints import fingerprint
from .splits import SPLIT_ALIASES, ImageSplit, split_name

__all__ = ["is_image_folder", "load_folder_split", "LeftOutFilesWarning"]


def _open_image(path: str) -> Image.Image:
    """An image file decoded in its own mode (torchvision's default loader converts to RGB itself, which
    clips 16-bit images at 255: :func:`~timm_posgeom.data.transforms.to_rgb` converts it later, correctly)."""
    with open(path, "rb") as f:
        image = Image.open(f)
        image.load()
    return image


def _folder_getter(ds, index):
    return ds[int(index)]


def file_key(path: str) -> str:
    """``path|size|mtime_ns``: what identifies a file's content for the on-disk cache (no read needed)."""
    stat = os.stat(path)
    return f"{path}|{stat.st_size}|{stat.st_mtime_ns}"


class LeftOutFilesWarning(UserWarning):
    """Files of an ImageFolder tree that are not read: not an image by their extension (GIFs, text files),
    or reached through a symbolic link loop or a link into another class's folder (never read twice, never
    under a wrong label)."""


def _class_files(top: str, others: list[str], extensions: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """(the image files under the class folder ``top``, what was left out and why). Linked folders are
    followed, but a folder is read once (a link back to an ancestor, a loop, is left out) and never one
    inside another class's folder (``others``: their real paths)."""
    files, left, seen, stack = [], [], set(), [top]
    home = os.path.realpath(top)
    while stack:
        folder = stack.pop()
        real = os.path.realpath(folder)
        loop = real in seen or home.startswith(real + os.sep)  # read already, or an ancestor of the class folder
        if loop or any(real == o or real.startswith(o + os.sep) for o in others):
            left.append(f"{folder} ({'a symlink loop' if loop else 'a link into another class'})")
            continue
        seen.add(real)
        for entry in sorted(os.scandir(folder), key=lambda e: e.name, reverse=True):
            path = os.path.join(folder, entry.name)
            if entry.is_dir():  # follows links: checked when popped
                stack.append(path)
            elif entry.is_file() and entry.name.lower().endswith(extensions):
                files.append(path)
            else:
                left.append(f"{path} ({'not an image by its extension' if entry.is_file() else 'not a file'})")
    return files, left


def _image_folder(root: str) -> Any:
    """torchvision's ImageFolder over ``root`` (class folders, then the images under each), walked by
    :func:`_class_files`: ``left_out`` says what it did not read."""
    from torchvision.datasets import ImageFolder
    from torchvision.datasets.folder import IMG_EXTENSIONS

    class Folder(ImageFolder):
        def make_dataset(self, directory, class_to_idx, extensions=None, is_valid_file=None, allow_empty=False):
            tops = {c: os.path.join(directory, c) for c in class_to_idx}
            real = {c: os.path.realpath(t) for c, t in tops.items()}
            samples, self.left_out = [], []
            for c in sorted(class_to_idx):
                files, left = _class_files(tops[c], [r for k, r in real.items() if k != c], IMG_EXTENSIONS)
                samples += [(f, class_to_idx[c]) for f in sorted(files)]
                self.left_out += left
            return samples

    # allow_empty: a class folder without images (in this split) is a class with no images here, not an error
    return Folder(root, loader=_open_image, allow_empty=True)


def is_image_folder(root: Path) -> bool:
    """Whether ``root`` is an ImageFolder tree: folders of class folders, and no parquet set."""
    if any(root.glob("*.parquet")) or any(root.glob("*/*.parquet")) or (root / "dataset_info.json").exists():
        return False
    return any(p.is_dir() and any(q.is_dir() for q in p.iterdir()) for p in root.iterdir())


def _folder_classes(root: Path, split_dir: str) -> list[str]:
    """The classes of an ImageFolder tree, sorted: the union of the class folders of every split folder
    (``train`` / ``validation`` and their aliases, and ``split_dir``), so an index means one class in all."""
    splits = {a for group in SPLIT_ALIASES.values() for a in group} | {split_dir}
    return sorted(
        {c.name for d in root.iterdir() if d.is_dir() and d.name in splits for c in d.iterdir() if c.is_dir()}
    )


def load_folder_split(root: Path, split: str, subset: int | None) -> ImageSplit:
    """The ``split`` folder of the ImageFolder tree ``root`` (or its alias), its first ``subset`` items."""
    name = split_name([p.name for p in root.iterdir() if p.is_dir()], split)
    folder = _image_folder(str(root / name))
    if folder.left_out:
        shown = "; ".join(folder.left_out[:5]) + (" ..." if len(folder.left_out) > 5 else "")
        warnings.warn(
            f"left out {len(folder.left_out)} file(s) or folder(s) of {root / name}: {shown}",
            LeftOutFilesWarning,
            stacklevel=3,
        )
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
    folder.samples.sort(key=lambda item: fingerprint(os.path.relpath(item[0], root / name)))
    n = min(len(folder), subset) if subset else len(folder)
    folder.samples = folder.samples[:n]
    folder.imgs = folder.samples
    folder.targets = [t for _, t in folder.samples]
    # the cache key must change when any file changes (path, size and modification time of each) and
    # when the class numbering does
    digest = fingerprint("\n".join([file_key(p) for p, _ in folder.samples] + ["classes:"] + classes))
    return ImageSplit(
        folder,
        folder.classes,
        folder.targets,
        f"folder-{digest}-{n}",
        _folder_getter,
        lambda index: folder.samples[index][0],
        lambda index: Path(folder.samples[index][0]).read_bytes(),
    )
