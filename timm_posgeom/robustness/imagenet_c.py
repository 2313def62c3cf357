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
  the model's input, then corrupted; :func:`~timm_posgeom.data.shifts.imagenet_c`), all corruptions and
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
import functools
import math
import os
import warnings
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn as nn

from ..data.eval_data import check_split, eval_loader
from ..data.labels import match_labels
from ..data.shifts import check_severity, corruption_list, imagenet_c, imagenet_c_shifts
from ..errors import DataError, NonFiniteWarning, SettingError, nonfinite_message
from ..interventions import eval_mode, image_permutations, pe_scale, token_permutation
from ..measuring.settings import MeasureSettings
from .fragility_eval import check_labels, device_of, fragility, score_logits
from .imagenet_c_result import ImageNetCResult, imagenet_c_spec
from .imagenet_c_tree import (
    CLEAN_FRAMINGS,
    IMAGE_EXTENSIONS,
    SEVERITIES,
    Framed,
    ImageNetCTreeError,
    TreeImages,
    check_imagenet_c_tree,
    frame_like_imagenet_c,
    split_labels,
)
from .scores import FragilityResult, fragility_score, wilson_interval

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


def _tables(
    counts: Mapping[str, Any], corruptions: Sequence[str], severities: Sequence[int], clean_accuracy: float
) -> tuple[dict[str, dict[int, float]], dict[str, dict[int, float]]]:
    accuracy = {
        c: {
            s: math.nan if counts[c][s].get("nonfinite") else counts[c][s]["correct"] / counts[c][s]["total"]
            for s in severities
        }
        for c in corruptions
    }
    bad = [imagenet_c_spec(c, s) for c in corruptions for s in severities if counts[c][s].get("nonfinite")]
    if bad:
        warnings.warn(
            nonfinite_message(
                "the logits",
                sum(
                    counts[c][s]["nonfinite"] for c in corruptions for s in severities if counts[c][s].get("nonfinite")
                ),
                sum(counts[c][s]["total"] for c in corruptions for s in severities),
                f"top-1 and FS of {', '.join(bad[:3])}{' ...' if len(bad) > 3 else ''} are NaN",
            ),
            NonFiniteWarning,
            stacklevel=3,
        )
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
    rpi: bool = False,
    alpha: float | None = None,
    labels: str = "check",
    settings: MeasureSettings | None = None,
    **options: Any,
) -> ImageNetCResult:
    """FS of every ImageNet-C corruption and severity, corrupting the clean split on the fly.

    One :func:`~timm_posgeom.robustness.fragility` call: one pass over the clean images with the model
    loaded once; each image is decoded and resized once and every corrupted copy made from it in the
    loader's workers (a copy per corruption and severity, 75 for ``"all"``); clean accuracy is counted
    once. Image i is corrupted with :func:`~timm_posgeom.data.shifts.image_seed` ``(seed, i, name)``
    (reproducible; the same draws at every severity).

    Args:
        corruptions: ``"all"`` (ImageNet-C's 15), ``"extra"`` (its 4 extras), or names (list or
            comma-separated).
        severities: a subset of 1-5.
        settings: a :class:`~timm_posgeom.measuring.MeasureSettings` (or its fields as keywords, which
            override it), as :func:`~timm_posgeom.robustness.fragility`'s; but ``batch_size`` counts the
            images (clean and corrupted copies together) per model forward: each loader step takes
            ``max(1, batch_size // (1 + number of corrupted copies))`` clean images.

    The other arguments are those of :func:`~timm_posgeom.robustness.fragility` (``labels`` too: the data's
    classes checked against the model's, or mapped).

    Returns:
        An :class:`ImageNetCResult` (``source="generated"``) holding the FragilityResult.
    """
    settings, _ = MeasureSettings.resolve("imagenet_c_fragility", settings, options)
    if settings.batch_size is None:
        raise SettingError("batch_size must be an integer >= 1 (images per forward), got None")
    names = corruption_list(corruptions)
    levels = [check_severity(s) for s in severities]
    specs = imagenet_c_shifts(names, levels)
    shifts = [imagenet_c(name, s) for name in names for s in levels]
    step = max(1, settings.batch_size // (1 + len(specs)))
    result = fragility(
        model,
        data,
        shifts,
        rpi=rpi,
        alpha=alpha,
        labels=labels,
        settings=settings.replace(batch_size=step),
        forward_size=settings.batch_size,
    )
    assert result.shifts == specs, (result.shifts, specs)
    counts: dict[str, Any] = {"clean": dict(result.counts["clean"])}
    for c in names:
        counts[c] = {s: dict(result.counts[imagenet_c_spec(c, s)]) for s in levels}
    accuracy = {c: {s: result.accuracy[imagenet_c_spec(c, s)] for s in levels} for c in names}
    fs = {c: {s: result.fs[imagenet_c_spec(c, s)] for s in levels} for c in names}
    recorded = {**result.settings, "corruption_seed": "image_seed(seed, image index, corruption)"}
    return ImageNetCResult(
        corruptions=names,
        severities=levels,
        num_images=result.num_images,
        clean_accuracy=result.clean_accuracy,
        accuracy=accuracy,
        fs=fs,
        counts=counts,
        source="generated",
        fragility=result,
        settings=recorded,
    )


# --------------------------------------------------------------------------------------------


def imagenet_c_released(
    model: nn.Module,
    data: Any,
    root: str | os.PathLike,
    corruptions: str | Sequence[str] = "all",
    severities: Sequence[int] = SEVERITIES,
    *,
    rpi: bool = False,
    alpha: float | None = None,
    settings: MeasureSettings | None = None,
    **options: Any,
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
        rpi: as :func:`~timm_posgeom.robustness.fragility`; under RPI the released images get
            permutations of their own (they are not paired with the clean images).
        alpha: as :func:`~timm_posgeom.robustness.fragility`.
        settings: a :class:`~timm_posgeom.measuring.MeasureSettings` (or its fields as keywords, which
            override it), as :func:`~timm_posgeom.robustness.fragility`'s (``batch_size``: images per
            forward); ``max_images`` is refused (the tree holds copies of the whole clean split).
        **options: this function's own keywords too: ``classes`` (the class names in label order,
            default ``data.classes``), ``class_folders`` and ``extra_classes`` (as
            :func:`check_imagenet_c_tree`), ``clean_framing`` (above) and ``labels`` (as
            :func:`~timm_posgeom.robustness.fragility`: the data's classes checked against the model's,
            or mapped, ``"by-name"``; the released images' labels mapped the same way).

    Launched as several processes, the clean split is shared by batch (``fragility``) but every process
    reads every released image: the same result in each, not faster.

    Raises:
        ImageNetCTreeError: for a tree that does not match, and for a tree whose number of images of
            some class differs from the clean split's (they would not be the same images: a subset of
            the clean split, ``max_images``, or another split).

    Returns:
        An :class:`ImageNetCResult` with ``source="released"`` (no paired intervals).
    """
    settings, own = MeasureSettings.resolve("imagenet_c_released", settings, options, _RELEASED_OPTIONS)
    if settings.max_images is not None:
        raise SettingError(
            "imagenet_c_released reads the whole clean split (the tree holds corrupted copies of all "
            f"of it): max_images does not apply, got {settings.max_images}"
        )
    names = corruption_list(corruptions)
    levels = [check_severity(s) for s in severities]
    matched, files = _released_files(model, data, root, names, levels, own)
    clean_data = Framed(matched) if own["clean_framing"] == "imagenet-c" else matched
    clean = fragility(model, clean_data, (), rpi=rpi, alpha=alpha, settings=settings, labels="as-is")
    order = [(c, s) for c in names for s in levels]
    tree = TreeImages(Path(root), order, files)
    correct = _evaluate_released(model, tree, settings, rpi, alpha)
    counts = _released_counts(clean, correct, order, len(files))
    accuracy, fs = _tables(counts, names, levels, clean.clean_accuracy)
    recorded = _released_settings(clean, root, own, counts, order)
    return ImageNetCResult(
        corruptions=names,
        severities=levels,
        num_images=clean.num_images,
        clean_accuracy=clean.clean_accuracy,
        accuracy=accuracy,
        fs=fs,
        counts=counts,
        source="released",
        fragility=None,
        settings=recorded,
    )


def _released_counts(
    clean: FragilityResult, correct: np.ndarray, order: list[tuple[str, int]], n_files: int
) -> dict[str, Any]:
    """``"clean"`` and corruption -> severity -> ``{"correct": k, "total": n}`` (and ``"nonfinite"``: the
    images whose logits were not finite), from the clean run and ``correct`` (:func:`_evaluate_released`, the
    folders of ``order`` one after another, ``n_files`` images each)."""
    counts: dict[str, Any] = {"clean": dict(clean.counts["clean"])}
    per_folder = correct.reshape(len(order), n_files)
    for j, (c, s) in enumerate(order):
        counts.setdefault(c, {})[s] = {"correct": int((per_folder[j] == 1).sum()), "total": n_files}
        if (per_folder[j] < 0).any():  # logits not finite: no prediction, the accuracy NaN (_tables)
            counts[c][s]["nonfinite"] = int((per_folder[j] < 0).sum())
    return counts


def _released_settings(
    clean: FragilityResult,
    root: str | os.PathLike,
    own: dict[str, Any],
    counts: dict[str, Any],
    order: list[tuple[str, int]],
) -> dict[str, Any]:
    """How a released run's numbers were made: the clean run's settings, the tree (root, classes, framing) and
    the Wilson 95% interval of each folder's accuracy (NaN with non-finite logits) and of the clean one."""
    class_folders = own["class_folders"]
    return {
        **clean.settings,
        "root": str(root),
        "extra_classes": own["extra_classes"],
        "clean_framing": own["clean_framing"],
        "class_folders": None if class_folders is None else list(class_folders),
        "accuracy_interval": {
            imagenet_c_spec(c, s): list(
                wilson_interval(counts[c][s]["correct"], counts[c][s]["total"])
                if not counts[c][s].get("nonfinite")
                else (math.nan, math.nan)
            )
            for c, s in order
        },
        "clean_interval": list(clean.clean_interval),
    }


_RELEASED_OPTIONS = {
    "classes": None,
    "class_folders": None,
    "extra_classes": "error",
    "clean_framing": "imagenet-c",
    "labels": "check",
}


def _released_files(
    model: nn.Module, data: Any, root: str | os.PathLike, names: list[str], levels: list[int], own: dict[str, Any]
) -> tuple[Any, list[tuple[str, int]]]:
    """(the clean split with its labels checked or mapped, the tree's [(CLASS/IMAGE, label)]), the tree
    checked against the split: its classes, and the same number of images of each class."""
    classes = own["classes"]
    if classes is None:
        classes = getattr(data, "classes", None)
        if not classes:
            raise DataError("the clean split has no class names (data.classes): pass classes=[...] in label order")
    classes = list(classes)
    matched = match_labels(model, data, own["labels"])  # a mismatch refused before the tree is read
    files = check_imagenet_c_tree(
        root, classes, names, levels, class_folders=own["class_folders"], extra_classes=own["extra_classes"]
    )
    n = check_split(data)
    clean_counts = Counter(split_labels(data, n))
    tree_counts = Counter(label for _, label in files)
    differ = [i for i in range(len(classes)) if clean_counts.get(i, 0) != tree_counts.get(i, 0)]
    if differ:
        i = differ[0]
        raise ImageNetCTreeError(
            f"the clean split has {clean_counts.get(i, 0)} images of {classes[i]!r} but {root}/{names[0]}/{levels[0]} "
            f"has {tree_counts.get(i, 0)} ({len(differ)} class(es) differ): the released images are corrupted copies "
            "of the clean ones, so FS needs the same images (the whole clean split, not a subset)"
        )
    if own["clean_framing"] not in CLEAN_FRAMINGS:
        raise SettingError(f"clean_framing must be one of {', '.join(CLEAN_FRAMINGS)}, got {own['clean_framing']!r}")
    if matched is not data:  # mapped by name: the released images' labels (indices of `classes`) map alike
        mapping = list(matched.mapping)
        files = [(path, mapping[label]) for path, label in files]
    return matched, files


def _evaluate_released(
    model: nn.Module, tree: Any, settings: MeasureSettings, rpi: bool, alpha: float | None
) -> np.ndarray:
    """(len(tree),) int8: whether each released image is classified right (1, else 0; -1: its logits are not
    finite), every process reading them all."""
    dev = device_of(model, settings.device)
    assert settings.batch_size is not None  # fragility() on the clean images refused None first
    loader = eval_loader(
        model,
        tree,
        batch_size=settings.batch_size,
        resize=settings.resize,
        num_workers=settings.num_workers,
        pin_memory=dev.type == "cuda",
        img_size=settings.img_size,
    )
    correct = np.zeros(len(tree), dtype=np.int8)  # 1 right, 0 wrong, -1 logits not finite
    from tqdm.auto import tqdm

    with contextlib.ExitStack() as stack:
        stack.enter_context(eval_mode(model))
        if alpha is not None:
            stack.enter_context(pe_scale(model, alpha))
        handle = stack.enter_context(token_permutation(model, per="given")) if rpi else None
        stack.enter_context(torch.inference_mode())
        start = 0
        for images, labels in tqdm(loader, desc="imagenet-c", disable=not settings.progress, leave=False):
            if handle is not None:  # one permutation per released image, from (seed, its index in the tree)
                ids = np.arange(start, start + len(images))
                handle.give(functools.partial(image_permutations, seed=settings.seed or 0, indices=ids))
            logits = model(images.to(dev, non_blocking=True))
            check_labels(labels, logits.shape[-1])
            b = labels.shape[0]
            correct[start : start + b] = score_logits(logits, labels)
            start += b
    if start != len(tree):
        raise RuntimeError(f"evaluated {start} released images, expected {len(tree)}")
    return correct
