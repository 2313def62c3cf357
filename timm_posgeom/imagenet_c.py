"""ImageNet-C in full: every corruption at every severity, a mean fragility score like mCE, and the
released ImageNet-C images.

Definitions (docs/method.md#imagenet-c), for corruption c at severity s = 1..5:

* ``FS[c][s] = 1 - A[c][s] / A_clean`` (:func:`~timm_posgeom.robustness.fragility_score`), top-1
  accuracies counted exactly over every image;
* ``FS_c = mean over the severities s of FS[c][s]`` (:attr:`ImageNetCResult.corruption_fs`);
* ``mean FS = mean over the corruptions c of FS_c`` (:attr:`ImageNetCResult.mean_fs`): over ImageNet-C's
  15 corruptions and severities 1-5 it is this package's counterpart of mCE (Hendrycks & Dietterich,
  2019), which averages the corruption error ``CE_c`` the same way;
* normalised like mCE, given a reference model's result: ``rFS_c = sum_s FS[c][s] / sum_s FS_ref[c][s]``
  and ``mean rFS = mean over c of rFS_c`` (:meth:`ImageNetCResult.relative_fs`; mCE divides the
  corruption errors by AlexNet's, here the fragility scores by the reference's). NaN, with a warning,
  where the reference's sum is not positive.

Two sources of corrupted images:

* :func:`imagenet_c_fragility` generates them on the fly from the clean split (each image resized to
  the model's input, then corrupted; :func:`~timm_posgeom.shifts.imagenet_c`), all corruptions and
  severities in one pass over the clean images with one model (one :func:`~timm_posgeom.robustness.fragility`
  call), seeded per image;
* :func:`imagenet_c_released` reads the released images from a folder tree
  ``ROOT/CORRUPTION/SEVERITY/CLASS/IMAGE`` (e.g. ``gaussian_noise/3/n01440764/ILSVRC2012_val_00000293.JPEG``)
  after :func:`check_imagenet_c_tree` has checked it against the clean split's classes; the clean
  accuracy comes from the clean split. The tree must hold the same number of images per class as the
  clean split (the released images are corrupted copies of the clean ones): otherwise FS would compare
  two different sets of images, and the run is refused.
"""
from __future__ import annotations

import contextlib
import math
import os
import warnings
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import PIL.Image
import torch
import torch.nn as nn
from torch.utils.data import Dataset

from .errors import PosgeomError
from .eval_data import check_split, eval_loader, split_item
from .interventions import eval_mode, pe_scale, token_permutation
from .jsonio import dump_json, to_jsonable
from .labels import match_labels
from .robustness import (
    FragilityResult,
    _model_device,
    check_labels,
    fragility,
    fragility_score,
    wilson_interval,
)
from .shifts import IMAGENET_C_CORRUPTIONS, _check_severity, _corruption_list, imagenet_c, imagenet_c_shifts
from .transforms import to_rgb

__all__ = [
    "ImageNetCResult",
    "imagenet_c_fragility",
    "imagenet_c_released",
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


def _spec(name: str, severity: int) -> str:
    return f"imagenet-c:{name}:{severity}"


def _nanmean(values: Sequence[float]) -> float:
    """The mean, NaN when any value is NaN (a missing number is not averaged away)."""
    values = list(values)
    return float(np.mean(values)) if values and not any(math.isnan(v) for v in values) else math.nan


# --------------------------------------------------------------------------------------------
# result
# --------------------------------------------------------------------------------------------
@dataclass
class ImageNetCResult:
    """Accuracy and fragility score per ImageNet-C corruption and severity, and their means.

    Attributes:
        corruptions: corruption names, in order.
        severities: severities, in order (1-5).
        num_images: n, the number of clean images.
        clean_accuracy: A_clean on the clean images.
        accuracy: corruption -> severity -> ``A[c][s]``.
        fs: corruption -> severity -> ``FS[c][s] = 1 - A[c][s] / A_clean`` (NaN when A_clean = 0).
        counts: ``"clean"`` and corruption -> severity -> ``{"correct": k, "total": n}``.
        source: ``"generated"`` (corrupted on the fly) or ``"released"`` (read from a tree).
        fragility: the underlying :class:`~timm_posgeom.robustness.FragilityResult` of a generated run
            (intervals, per-image correctness, shifts keyed ``imagenet-c:NAME:SEVERITY``); None when
            released (its images are not paired with the clean ones, so there is no paired interval).
        settings: how the numbers were made (model, resize, seed, root, ...).
    """

    corruptions: list[str]
    severities: list[int]
    num_images: int
    clean_accuracy: float
    accuracy: dict[str, dict[int, float]]
    fs: dict[str, dict[int, float]]
    counts: dict[str, Any]
    source: str
    fragility: FragilityResult | None = field(default=None, repr=False)
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def corruption_fs(self) -> dict[str, float]:
        """corruption -> FS_c, the mean of ``FS[c][s]`` over the severities."""
        return {c: _nanmean([self.fs[c][s] for s in self.severities]) for c in self.corruptions}

    @property
    def corruption_accuracy(self) -> dict[str, float]:
        """corruption -> the mean of ``A[c][s]`` over the severities."""
        return {c: _nanmean([self.accuracy[c][s] for s in self.severities]) for c in self.corruptions}

    @property
    def mean_fs(self) -> float:
        """The mean over the corruptions of FS_c (mCE's average, of fragility scores)."""
        return _nanmean(list(self.corruption_fs.values()))

    @property
    def complete(self) -> bool:
        """True when the result covers ImageNet-C's 15 corruptions at severities 1-5 (what mCE averages)."""
        return sorted(self.corruptions) == sorted(IMAGENET_C_CORRUPTIONS) and sorted(self.severities) == list(SEVERITIES)

    def relative_fs(self, reference: ImageNetCResult | Mapping[str, Mapping[int, float]]) -> dict[str, float]:
        """corruption -> ``rFS_c = sum_s FS[c][s] / sum_s FS_ref[c][s]`` (normalised like mCE's CE_c).

        ``reference``: another result, or its ``fs`` table (corruption -> severity -> FS). It must hold
        every corruption and severity of this one (ValueError otherwise). NaN with a RuntimeWarning for a
        corruption whose reference sum is not positive (a model the corruption does not hurt cannot be a
        yardstick).
        """
        table = reference.fs if isinstance(reference, ImageNetCResult) else reference
        missing = [_spec(c, s) for c in self.corruptions for s in self.severities
                   if c not in table or s not in table[c]]
        if missing:
            raise ValueError(f"the reference lacks {len(missing)} of this result's corruptions and severities "
                             f"({', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''})")
        out = {}
        for c in self.corruptions:
            own = sum(self.fs[c][s] for s in self.severities)
            ref = sum(float(table[c][s]) for s in self.severities)
            if math.isnan(ref) or ref <= 0:
                warnings.warn(f"the reference's FS of {c} sums to {ref:.4g} over the severities: rFS is undefined "
                              "(NaN)", RuntimeWarning, stacklevel=2)
                out[c] = math.nan
            else:
                out[c] = own / ref
        return out

    def mean_relative_fs(self, reference: ImageNetCResult | Mapping[str, Mapping[int, float]],
                         defined_only: bool = False) -> float:
        """The mean over the corruptions of :meth:`relative_fs` (mCE's normalised average).

        NaN when rFS is undefined for some corruption (the reference's FS sums to <= 0 there), unless
        ``defined_only``: then the mean over the corruptions where it is defined (NaN if none is); say
        which were left out when you report it (:meth:`to_markdown` does)."""
        values = list(self.relative_fs(reference).values())
        if defined_only:
            values = [v for v in values if not math.isnan(v)]
        return _nanmean(values)

    # ---------------------------------------------------------------------------------- output
    def to_dict(self) -> dict[str, Any]:
        """JSON-ready numbers; severities become string keys. The underlying fragility result (generated
        runs) is included under ``"fragility"``."""
        def by_sev(table: Mapping[str, Mapping[int, Any]]) -> dict[str, dict[str, Any]]:
            return {c: {str(s): table[c][s] for s in self.severities} for c in self.corruptions}

        return {
            "source": self.source,
            "corruptions": list(self.corruptions),
            "severities": list(self.severities),
            "num_images": self.num_images,
            "clean_accuracy": self.clean_accuracy,
            "accuracy": by_sev(self.accuracy),
            "fs": by_sev(self.fs),
            "corruption_fs": self.corruption_fs,
            "mean_fs": self.mean_fs,
            "complete": self.complete,
            "counts": {"clean": dict(self.counts["clean"]),
                       **{c: {str(s): dict(self.counts[c][s]) for s in self.severities} for c in self.corruptions}},
            "definitions": "FS[c][s] = 1 - A[c][s] / A_clean; FS_c = mean over severities; mean_fs = mean over "
                           "corruptions of FS_c",
            "settings": to_jsonable(self.settings),
            "fragility": self.fragility.to_dict() if self.fragility is not None else None,
        }

    def to_json(self, path: str | os.PathLike | None = None, indent: int = 2) -> str:
        """The :meth:`to_dict` numbers as strict JSON (NaN written as null); also written to ``path`` if given (atomically)."""
        return dump_json(self.to_dict(), path, indent)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ImageNetCResult:
        """The result :meth:`to_dict` wrote (without per-image arrays or the fragility result); for a reference."""
        try:
            severities = [int(s) for s in d["severities"]]
            corruptions = list(d["corruptions"])

            def table(t: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[int, float]]:
                return {c: {s: (math.nan if t[c][str(s)] is None else float(t[c][str(s)])) for s in severities}
                        for c in corruptions}

            counts = {"clean": dict(d["counts"]["clean"]),
                      **{c: {s: dict(d["counts"][c][str(s)]) for s in severities} for c in corruptions}}
            clean = d["clean_accuracy"]
            return cls(corruptions=corruptions, severities=severities, num_images=int(d["num_images"]),
                       clean_accuracy=math.nan if clean is None else float(clean), accuracy=table(d["accuracy"]),
                       fs=table(d["fs"]), counts=counts, source=str(d["source"]), settings=dict(d.get("settings") or {}))
        except (KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"not an ImageNet-C result (imagenet_c.json): missing or malformed {e}") from None

    @classmethod
    def from_json(cls, path: str | os.PathLike) -> ImageNetCResult:
        """Read a result written by :meth:`to_json` (``imagenet_c.json``)."""
        import json

        return cls.from_dict(json.loads(Path(path).read_text()))

    def to_markdown(self, digits: int = 3, reference: ImageNetCResult | None = None) -> str:
        """A table corruption x severity of FS, with FS_c and the mean top-1 per corruption, a row of means
        per severity, and lines for the clean accuracy and the mean FS (and the normalised mean with a
        ``reference``)."""
        f = f"{{:.{digits}f}}"

        def fmt(v: float) -> str:
            return "nan" if math.isnan(v) else f.format(v)

        head = ["corruption", *(f"FS s{s}" for s in self.severities), "FS_c (mean)", "top-1 (mean)"]
        relative = self.relative_fs(reference) if reference is not None else None
        if relative is not None:
            head.append("rFS_c")
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        cfs, cacc = self.corruption_fs, self.corruption_accuracy
        for c in self.corruptions:
            cells = [c, *(fmt(self.fs[c][s]) for s in self.severities), fmt(cfs[c]), fmt(cacc[c])]
            if relative is not None:
                cells.append(fmt(relative[c]))
            lines.append("| " + " | ".join(cells) + " |")
        means = [fmt(_nanmean([self.fs[c][s] for c in self.corruptions])) for s in self.severities]
        row = ["mean", *means, fmt(self.mean_fs), fmt(_nanmean(list(cacc.values())))]
        if relative is not None:
            row.append(fmt(_nanmean(list(relative.values()))))
        lines.append("| " + " | ".join(row) + " |")
        scope = ("ImageNet-C's 15 corruptions x severities 1-5" if self.complete else
                 f"{len(self.corruptions)} corruption(s) x severities {','.join(map(str, self.severities))} "
                 "(not all of ImageNet-C)")
        lines += ["", f"clean top-1 {fmt(self.clean_accuracy)} on {self.num_images} images; {self.source} corruptions",
                  f"mean FS over {scope}: {fmt(self.mean_fs)}"]
        if relative is not None:
            lines.append(f"mean rFS (normalised by the reference's FS per corruption, like mCE): "
                         f"{fmt(_nanmean(list(relative.values())))}")
            undefined = [c for c, v in relative.items() if math.isnan(v)]
            defined = [v for v in relative.values() if not math.isnan(v)]
            if undefined and defined:
                lines.append(f"mean rFS over the {len(defined)} corruption(s) where it is defined (left out, the "
                             f"reference's FS sums to <= 0: {', '.join(undefined)}): {fmt(_nanmean(defined))}")
        return "\n".join(lines)


def _tables(counts: Mapping[str, Any], corruptions: Sequence[str], severities: Sequence[int],
            clean_accuracy: float) -> tuple[dict[str, dict[int, float]], dict[str, dict[int, float]]]:
    accuracy = {c: {s: counts[c][s]["correct"] / counts[c][s]["total"] for s in severities} for c in corruptions}
    if clean_accuracy == 0:
        warnings.warn("clean accuracy is 0: every fragility score is NaN", RuntimeWarning, stacklevel=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        fs = {c: {s: fragility_score(accuracy[c][s], clean_accuracy) for s in severities} for c in corruptions}
    return accuracy, fs


# --------------------------------------------------------------------------------------------
# generated on the fly
# --------------------------------------------------------------------------------------------
def imagenet_c_fragility(
        model: nn.Module,
        data: Any,
        corruptions: str | Sequence[str] = "all",
        severities: Sequence[int] = SEVERITIES,
        *,
        batch_size: int = 64,
        resize: str = "paper",
        num_workers: int | None = None,
        rpi: bool = False,
        alpha: float | None = None,
        seed: int = 0,
        max_images: int | None = None,
        device: str | torch.device | None = None,
        progress: bool = True,
        img_size: int | tuple[int, int] | None = None,
        labels: str = "check",
) -> ImageNetCResult:
    """FS of every ImageNet-C corruption and severity, corrupting the clean split on the fly.

    One :func:`~timm_posgeom.robustness.fragility` call: one pass over the clean images with the model
    loaded once; each image is decoded and resized once and every corrupted copy made from it in the
    loader's workers (a copy per corruption and severity, 75 for ``"all"``); clean accuracy is counted
    once. Image i is corrupted with :func:`~timm_posgeom.shifts.image_seed` ``(seed, i, name)``
    (reproducible; the same draws at every severity).

    Args:
        corruptions: ``"all"`` (ImageNet-C's 15), ``"extra"`` (its 4 extras), or names (list or
            comma-separated).
        severities: a subset of 1-5.
        batch_size: images (clean and corrupted copies together) per model forward; each loader step
            takes ``max(1, batch_size // (1 + number of corrupted copies))`` clean images.

    The other arguments are those of :func:`~timm_posgeom.robustness.fragility` (``labels`` too: the data's
    classes checked against the model's, or mapped).

    Returns:
        An :class:`ImageNetCResult` (``source="generated"``) holding the FragilityResult.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    names = _corruption_list(corruptions)
    levels = [_check_severity(s) for s in severities]
    specs = imagenet_c_shifts(names, levels)
    shifts = [imagenet_c(name, s) for name in names for s in levels]
    step = max(1, batch_size // (1 + len(specs)))
    result = fragility(model, data, shifts, resize=resize, batch_size=step, num_workers=num_workers, rpi=rpi,
                       alpha=alpha, seed=seed, max_images=max_images, device=device, progress=progress,
                       img_size=img_size, forward_size=batch_size, labels=labels)
    assert result.shifts == specs, (result.shifts, specs)
    counts: dict[str, Any] = {"clean": dict(result.counts["clean"])}
    for c in names:
        counts[c] = {s: dict(result.counts[_spec(c, s)]) for s in levels}
    accuracy = {c: {s: result.accuracy[_spec(c, s)] for s in levels} for c in names}
    fs = {c: {s: result.fs[_spec(c, s)] for s in levels} for c in names}
    settings = {**result.settings, "corruption_seed": "image_seed(seed, image index, corruption)"}
    return ImageNetCResult(corruptions=names, severities=levels, num_images=result.num_images,
                           clean_accuracy=result.clean_accuracy, accuracy=accuracy, fs=fs, counts=counts,
                           source="generated", fragility=result, settings=settings)


# --------------------------------------------------------------------------------------------
# released images
# --------------------------------------------------------------------------------------------
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
        raise ValueError(f"extra_classes must be 'error' or 'ignore', got {extra_classes!r}")
    names = _corruption_list(corruptions)
    levels = [_check_severity(s) for s in severities]
    folders = list(classes if class_folders is None else class_folders)
    if len(folders) != len(classes):
        raise ValueError(f"class_folders names {len(folders)} folders for {len(classes)} classes")
    if len(set(folders)) != len(folders):
        raise ValueError(f"class folder names repeat: {_some([f for f, k in Counter(folders).items() if k > 1])}")
    label_of = {f: i for i, f in enumerate(folders)}
    layout = "expected ROOT/CORRUPTION/SEVERITY/CLASS/IMAGE, the released ImageNet-C layout"

    missing = [c for c in names if not (root / c).is_dir()]
    if missing:
        raise ImageNetCTreeError(f"{root} lacks the corruption folder(s) {_some(missing)} ({layout})")
    missing = [f"{c}/{s}" for c in names for s in levels if not (root / c / str(s)).is_dir()]
    if missing:
        raise ImageNetCTreeError(f"{root} lacks the severity folder(s) {_some(missing)} ({layout})")

    reference: tuple[str, dict[str, list[str]]] | None = None
    for c in names:
        for s in levels:
            here = root / c / str(s)
            present = sorted(p.name for p in here.iterdir() if p.is_dir())
            present_set = set(present)
            absent = [f for f in folders if f not in present_set]
            if absent:
                hint = (f"; its folders are {_some(present, 3)}: pass the class folders (e.g. wnids) if they are "
                        "named otherwise" if present else "")
                raise ImageNetCTreeError(f"{here} has no folder for {len(absent)} of the {len(folders)} classes "
                                         f"({_some(absent, 3)}){hint}")
            extra = [f for f in present if f not in label_of]
            if extra and extra_classes == "error":
                raise ImageNetCTreeError(f"{here} has {len(extra)} folder(s) that are none of the classes "
                                         f"({_some(extra, 3)}); pass extra_classes='ignore' (posgeom: "
                                         "--imagenet-c-extra-classes ignore) to read only the model's classes")
            files = {}
            for f in folders:
                files[f] = _image_files(here / f)
                if not files[f]:
                    raise ImageNetCTreeError(f"{here / f} holds no image ({', '.join(IMAGE_EXTENSIONS)})")
            if reference is None:
                reference = (f"{c}/{s}", files)
            elif files != reference[1]:
                f = next(f for f in folders if files[f] != reference[1][f])
                only_here = sorted(set(files[f]) - set(reference[1][f]))
                only_there = sorted(set(reference[1][f]) - set(files[f]))
                raise ImageNetCTreeError(
                    f"{here / f} and {reference[0]}/{f} hold different images ({len(files[f])} vs "
                    f"{len(reference[1][f])}; only in {c}/{s}: {_some(only_here, 2) or 'none'}; only in "
                    f"{reference[0]}: {_some(only_there, 2) or 'none'}): an incomplete download or extraction?")
    assert reference is not None
    return [(f"{f}/{name}", label_of[f]) for f in folders for name in reference[1][f]]


class _TreeImages(Dataset):
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


def _split_labels(data: Any, n: int) -> list[int]:
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


class _Framed(Dataset):
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


def imagenet_c_released(
        model: nn.Module,
        data: Any,
        root: str | os.PathLike,
        corruptions: str | Sequence[str] = "all",
        severities: Sequence[int] = SEVERITIES,
        *,
        classes: Sequence[str] | None = None,
        class_folders: Sequence[str] | None = None,
        extra_classes: str = "error",
        batch_size: int = 64,
        resize: str = "paper",
        num_workers: int | None = None,
        rpi: bool = False,
        alpha: float | None = None,
        seed: int = 0,
        device: str | torch.device | None = None,
        progress: bool = True,
        img_size: int | tuple[int, int] | None = None,
        clean_framing: str = "imagenet-c",
        labels: str = "check",
) -> ImageNetCResult:
    """FS of each corruption and severity from the released ImageNet-C images under ``root``.

    ``clean_framing``: ``"imagenet-c"`` (default) frames each clean image as the release framed the
    images it corrupted (:func:`frame_like_imagenet_c`: short side 256, centre 224 crop) before the
    model's preprocessing, so that A_clean and ``A[c][s]`` see the same pictures; without it FS also holds
    the effect of the other framing (measured: FS 0.075 with no corruption at all). ``"as-is"``: the
    clean images are already framed so.

    ``A_clean`` is counted on ``data`` (the clean split: ImageNet's validation images, or the classes of
    it a model knows) by :func:`~timm_posgeom.robustness.fragility` with no shift; ``A[c][s]`` on every
    image of ``root/c/s`` (:func:`check_imagenet_c_tree` checks the tree first), each read as RGB and
    given the clean images' preprocessing (``resize``, the model's mean and std). The images of all
    corruptions and severities stream through one loader and one model.

    Args:
        data: the clean split; its labels index ``classes``.
        root: the released tree's root.
        classes: the class names in label order (default ``data.classes``).
        class_folders: as :func:`check_imagenet_c_tree`.
        extra_classes: as :func:`check_imagenet_c_tree`.
        rpi: as :func:`~timm_posgeom.robustness.fragility`; under RPI the released images get
            permutations of their own (they are not paired with the clean images).
        labels: as :func:`~timm_posgeom.robustness.fragility`: the data's classes checked against the
            model's, or mapped (``"by-name"``; the released images' labels mapped the same way).

    The other arguments (``alpha``, ``seed``, ...) are those of :func:`~timm_posgeom.robustness.fragility`
    (``batch_size``: images per forward). Launched as several processes, the clean split is shared by
    batch (``fragility``) but every process reads every released image: the same result in each, not faster.

    Raises:
        ImageNetCTreeError: for a tree that does not match, and for a tree whose number of images of
            some class differs from the clean split's (they would not be the same images: a subset of
            the clean split, ``max_images``, or another split).

    Returns:
        An :class:`ImageNetCResult` with ``source="released"`` (no paired intervals).
    """
    if classes is None:
        classes = getattr(data, "classes", None)
        if not classes:
            raise ValueError("the clean split has no class names (data.classes): pass classes=[...] in label order")
    classes = list(classes)
    matched = match_labels(model, data, labels)  # a mismatch refused before the tree is read
    names = _corruption_list(corruptions)
    levels = [_check_severity(s) for s in severities]
    files = check_imagenet_c_tree(root, classes, names, levels, class_folders=class_folders,
                                  extra_classes=extra_classes)
    n = check_split(data)
    clean_counts = Counter(_split_labels(data, n))
    tree_counts = Counter(label for _, label in files)
    differ = [i for i in range(len(classes)) if clean_counts.get(i, 0) != tree_counts.get(i, 0)]
    if differ:
        i = differ[0]
        raise ImageNetCTreeError(
            f"the clean split has {clean_counts.get(i, 0)} images of {classes[i]!r} but {root}/{names[0]}/{levels[0]} "
            f"has {tree_counts.get(i, 0)} ({len(differ)} class(es) differ): the released images are corrupted copies "
            "of the clean ones, so FS needs the same images (the whole clean split, not a subset)")

    if clean_framing not in CLEAN_FRAMINGS:
        raise ValueError(f"clean_framing must be one of {', '.join(CLEAN_FRAMINGS)}, got {clean_framing!r}")
    if matched is not data:  # mapped by name: the released images' labels (indices of `classes`) map alike
        mapping = list(matched.mapping)
        files = [(path, mapping[label]) for path, label in files]
    clean_data = _Framed(matched) if clean_framing == "imagenet-c" else matched
    clean = fragility(model, clean_data, (), resize=resize, batch_size=batch_size, num_workers=num_workers, rpi=rpi,
                      alpha=alpha, seed=seed, device=device, progress=progress, img_size=img_size, labels="as-is")

    order = [(c, s) for c in names for s in levels]
    tree = _TreeImages(Path(root), order, files)
    dev = _model_device(model, device)
    loader = eval_loader(model, tree, batch_size=batch_size, resize=resize, num_workers=num_workers,
                         pin_memory=dev.type == "cuda", img_size=img_size)
    correct = np.zeros(len(tree), dtype=bool)
    from tqdm.auto import tqdm

    with contextlib.ExitStack() as stack:
        stack.enter_context(eval_mode(model))
        if alpha is not None:
            stack.enter_context(pe_scale(model, alpha))
        if rpi:
            stack.enter_context(token_permutation(model, seed=seed, per="batch"))
        stack.enter_context(torch.inference_mode())
        start = 0
        for images, labels in tqdm(loader, desc="imagenet-c", disable=not progress, leave=False):
            logits = model(images.to(dev, non_blocking=True))
            check_labels(labels, logits.shape[-1])
            b = labels.shape[0]
            correct[start:start + b] = (logits.argmax(dim=-1).cpu() == labels).numpy()
            start += b
    if start != len(tree):
        raise RuntimeError(f"evaluated {start} released images, expected {len(tree)}")

    counts: dict[str, Any] = {"clean": dict(clean.counts["clean"])}
    per_folder = correct.reshape(len(order), len(files))
    for j, (c, s) in enumerate(order):
        counts.setdefault(c, {})[s] = {"correct": int(per_folder[j].sum()), "total": len(files)}
    accuracy, fs = _tables(counts, names, levels, clean.clean_accuracy)
    settings = {**clean.settings, "root": str(root), "extra_classes": extra_classes, "clean_framing": clean_framing,
                "class_folders": None if class_folders is None else list(class_folders),
                "accuracy_interval": {_spec(c, s): list(wilson_interval(counts[c][s]["correct"], counts[c][s]["total"]))
                                      for c, s in order},
                "clean_interval": list(clean.clean_interval)}
    return ImageNetCResult(corruptions=names, severities=levels, num_images=clean.num_images,
                           clean_accuracy=clean.clean_accuracy, accuracy=accuracy, fs=fs, counts=counts,
                           source="released", fragility=None, settings=settings)
