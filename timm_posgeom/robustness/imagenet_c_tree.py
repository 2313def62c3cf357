"""The released ImageNet-C images: their folder tree ``ROOT/CORRUPTION/SEVERITY/CLASS/IMAGE`` checked against
the clean split's classes (:func:`check_imagenet_c_tree`), read as a dataset, and the clean images framed as
the release framed the ones it corrupted (:func:`frame_like_imagenet_c`). Definitions: docs/method.md#imagenet-c;
:func:`~timm_posgeom.robustness.imagenet_c.imagenet_c_released` measures on them.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import PIL.Image
from torch.utils.data import Dataset

from ..data.eval_data import split_item
from ..data.shifts import check_severity, corruption_list
from ..data.transforms import to_rgb
from ..errors import PosgeomError, SettingError

__all__ = [
    "check_imagenet_c_tree",
    "ImageNetCTreeError",
    "SEVERITIES",
    "IMAGE_EXTENSIONS",
    "CLEAN_FRAMINGS",
    "frame_like_imagenet_c",
]

SEVERITIES = (1, 2, 3, 4, 5)
IMAGE_EXTENSIONS = (".jpeg", ".jpg", ".png")
"""The files read in a released tree (case-insensitive); ImageNet-C's are ``.JPEG``."""


class ImageNetCTreeError(PosgeomError, ValueError):
    """A released ImageNet-C tree that does not match what was asked (one line: what and where)."""


def _some(items: Sequence[Any], k: int = 5) -> str:
    items = list(items)
    return ", ".join(map(str, items[:k])) + (f" ... ({len(items)} in all)" if len(items) > k else "")


def _image_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS)


def check_imagenet_c_tree(
    root: str | os.PathLike,
    classes: Sequence[str],
    corruptions: str | Sequence[str] = "all",
    severities: Sequence[int] = SEVERITIES,
    *,
    class_folders: Sequence[str] | None = None,
    extra_classes: str = "error",
) -> list[tuple[str, int]]:
    """Check a released ImageNet-C tree ``ROOT/CORRUPTION/SEVERITY/CLASS/IMAGE`` and list its images.

    Args:
        root: the tree's root (holding ``gaussian_noise/``, ``fog/``, ...).
        classes: the clean split's class names, in label order (label i is ``classes[i]``).
        corruptions: the corruptions that must be there (as :func:`imagenet_c_fragility`).
        severities: the severities that must be there (as :func:`imagenet_c_fragility`).
        class_folders: the folder name of each class, in the same order (e.g. ImageNet wnids
            ``n01440764`` for class names such as ``tench``); default the class names themselves.
        extra_classes: ``"error"`` (default): a class folder that is no class is refused; ``"ignore"``:
            such folders are skipped (e.g. the released 1,000 classes for a 100-class model).

    Returns:
        [(``CLASS/IMAGE``, label)] in label order, then by file name: the images that every
        ``ROOT/CORRUPTION/SEVERITY`` folder holds (checked), listed once.

    Raises:
        ImageNetCTreeError: (a ValueError) one line, when: the root is not a folder; a corruption or
            severity folder is missing; a class has no folder, or (``extra_classes="error"``) a folder is
            no class; a class folder holds no image (``.JPEG``, ``.jpg``, ``.png``); or two
            corruption/severity folders do not hold the same files (an incomplete download or extraction).
    """
    root = Path(root)
    if not root.is_dir():
        raise ImageNetCTreeError(f"ImageNet-C root {str(root)!r} is not a folder")
    if extra_classes not in ("error", "ignore"):
        raise SettingError(f"extra_classes must be 'error' or 'ignore', got {extra_classes!r}")
    names = corruption_list(corruptions)
    levels = [check_severity(s) for s in severities]
    folders = list(classes if class_folders is None else class_folders)
    if len(folders) != len(classes):
        raise SettingError(f"class_folders names {len(folders)} folders for {len(classes)} classes")
    if len(set(folders)) != len(folders):
        raise SettingError(f"class folder names repeat: {_some([f for f, k in Counter(folders).items() if k > 1])}")
    label_of = {f: i for i, f in enumerate(folders)}
    _check_layout(root, names, levels)
    reference: tuple[str, dict[str, list[str]]] | None = None
    for c in names:
        for s in levels:
            files = _folder_files(root / c / str(s), folders, label_of, extra_classes)
            if reference is None:
                reference = (f"{c}/{s}", files)
            elif files != reference[1]:
                _refuse_different(root / c / str(s), f"{c}/{s}", files, reference, folders)
    assert reference is not None
    return [(f"{f}/{name}", label_of[f]) for f in folders for name in reference[1][f]]


def _check_layout(root: Path, names: Sequence[str], levels: Sequence[int]) -> None:
    """Every corruption folder and every severity folder of each is there."""
    layout = "expected ROOT/CORRUPTION/SEVERITY/CLASS/IMAGE, the released ImageNet-C layout"
    missing = [c for c in names if not (root / c).is_dir()]
    if missing:
        raise ImageNetCTreeError(f"{root} lacks the corruption folder(s) {_some(missing)} ({layout})")
    missing = [f"{c}/{s}" for c in names for s in levels if not (root / c / str(s)).is_dir()]
    if missing:
        raise ImageNetCTreeError(f"{root} lacks the severity folder(s) {_some(missing)} ({layout})")


def _folder_files(
    here: Path, folders: Sequence[str], label_of: dict[str, int], extra_classes: str
) -> dict[str, list[str]]:
    """Class folder -> its image files (sorted) in one ``CORRUPTION/SEVERITY`` folder, checked: a folder
    for every class, no other (unless ``extra_classes="ignore"``), an image in each."""
    present = sorted(p.name for p in here.iterdir() if p.is_dir())
    present_set = set(present)
    absent = [f for f in folders if f not in present_set]
    if absent:
        hint = (
            f"; its folders are {_some(present, 3)}: pass the class folders (e.g. wnids) if they are named otherwise"
            if present
            else ""
        )
        raise ImageNetCTreeError(
            f"{here} has no folder for {len(absent)} of the {len(folders)} classes ({_some(absent, 3)}){hint}"
        )
    extra = [f for f in present if f not in label_of]
    if extra and extra_classes == "error":
        raise ImageNetCTreeError(
            f"{here} has {len(extra)} folder(s) that are none of the classes "
            f"({_some(extra, 3)}); pass extra_classes='ignore' (posgeom: "
            "--imagenet-c-extra-classes ignore) to read only the model's classes"
        )
    files = {}
    for f in folders:
        files[f] = _image_files(here / f)
        if not files[f]:
            raise ImageNetCTreeError(f"{here / f} holds no image ({', '.join(IMAGE_EXTENSIONS)})")
    return files


def _refuse_different(
    here: Path,
    where: str,
    files: dict[str, list[str]],
    reference: tuple[str, dict[str, list[str]]],
    folders: Sequence[str],
) -> None:
    """Raise: ``here`` and the first folder checked hold different images (named, a few of each)."""
    f = next(f for f in folders if files[f] != reference[1][f])
    only_here = sorted(set(files[f]) - set(reference[1][f]))
    only_there = sorted(set(reference[1][f]) - set(files[f]))
    raise ImageNetCTreeError(
        f"{here / f} and {reference[0]}/{f} hold different images ({len(files[f])} vs "
        f"{len(reference[1][f])}; only in {where}: {_some(only_here, 2) or 'none'}; only in "
        f"{reference[0]}: {_some(only_there, 2) or 'none'}): an incomplete download or extraction?"
    )


class TreeImages(Dataset):
    """Item j * m + k -> (RGB image ``root/CORRUPTION/SEVERITY/files[k]`` of folder j of ``folders``,
    label), m = len(files): every folder's images, folder after folder, without a list per folder."""

    def __init__(self, root: Path, folders: Sequence[tuple[str, int]], files: Sequence[tuple[str, int]]):
        self.root, self.folders, self.files = root, list(folders), list(files)

    def __len__(self) -> int:
        return len(self.folders) * len(self.files)

    def __getitem__(self, index: int) -> tuple[PIL.Image.Image, int]:
        if not 0 <= index < len(self):
            raise IndexError(index)
        j, k = divmod(index, len(self.files))
        (corruption, severity), (relative, label) = self.folders[j], self.files[k]
        with PIL.Image.open(self.root / corruption / str(severity) / relative) as image:
            rgb = to_rgb(image)
            return (rgb.copy() if rgb is image else rgb), label  # the file is closed on leaving: a copy of RGB


def split_labels(data: Any, n: int) -> list[int]:
    labels = getattr(data, "labels", None)
    if labels is not None and len(labels) >= n:
        return [int(v) for v in list(labels)[:n]]
    return [split_item(data[i])[1] for i in range(n)]


CLEAN_FRAMINGS = ("imagenet-c", "as-is")


def frame_like_imagenet_c(image: PIL.Image.Image) -> PIL.Image.Image:
    """An image framed as ImageNet-C's release framed ImageNet's validation images before corrupting
    them: short side resized to 256 (bilinear), centre 224 x 224 crop. An image already 224 x 224 is
    taken as framed and returned as it is."""
    if image.size == (224, 224):
        return image
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms import functional as TF

    return TF.center_crop(TF.resize(to_rgb(image), 256, interpolation=InterpolationMode.BILINEAR), 224)


class Framed(Dataset):
    """The clean split with :func:`frame_like_imagenet_c` applied to each image (labels and classes kept)."""

    def __init__(self, data: Any):
        self.data = data
        self.classes = getattr(data, "classes", None)
        labels = getattr(data, "labels", None)
        if labels is not None:
            self.labels = labels

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> tuple[PIL.Image.Image, int]:
        image, label = split_item(self.data[index])
        return frame_like_imagenet_c(image), label
