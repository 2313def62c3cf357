"""Where a split comes from: :func:`resolve_source` classifies a source (the synthetic set, a local folder, a
Hub id) and :func:`load_split` loads one split of it (see :mod:`timm_posgeom.data` for the sources)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from ..errors import PathNotFoundError, SettingError
from .folder import is_image_folder, load_folder_split
from .hub import HubOptions, load_hub_split
from .splits import ImageSplit, split_name
from .synthetic import SyntheticShapes

if sys.version_info >= (3, 11):
    from typing import Unpack
else:  # Python 3.10: typing_extensions, which torch requires
    from typing_extensions import Unpack

__all__ = ["resolve_source", "load_split"]


def resolve_source(source: str | os.PathLike | None) -> tuple[str, str | None]:
    """Classify a data source as ``("synthetic", None)``, ``("local", path)`` or ``("hub", id)``.

    A string that exists on disk is local; one that looks like a path (absolute, ``./``, ``../``,
    ``~``, or with more than one ``/``) but does not exist raises FileNotFoundError; ``owner/name``
    is a Hub id.
    """
    if source is None or str(source) in ("", "synthetic"):
        return "synthetic", None
    text = str(source)
    path = Path(text).expanduser()
    if path.exists():
        return "local", str(path)
    looks_like_path = (
        text.startswith(("/", "./", "../", "~", ".\\", "..\\"))
        or text in (".", "..")
        or text.count("/") != 1
        or os.sep in text.replace("/", "")
    )
    if looks_like_path:
        raise PathNotFoundError(f"data path {text!r} does not exist (resolved to {path.resolve()})")
    return "hub", text


def _synthetic_getter(ds, index):
    return ds[int(index)]


def load_split(
    source: str | os.PathLike | None,
    split: str = "train",
    *,
    subset: int | None = None,
    img_size: int = 64,
    seed: int = 0,
    synthetic_size: int | None = None,
    **hub: Unpack[HubOptions],
) -> ImageSplit:
    """Load one split of a classification set (see :mod:`timm_posgeom.data` for the sources).

    Args:
        source: Hub id, local folder, or None / ``"synthetic"``.
        split: ``train``, ``validation`` (aliases training, val, valid) or another split the data has
            (``test``, ...); a split the data lacks is refused (ValueError naming those it has).
        subset: keep only the first ``subset`` items (rows of the parquet sets are pre-shuffled; an
            ImageFolder split is put in a fixed order mixed across classes first).
        img_size: resolution of the synthetic set (ignored for real data).
        seed: seed of the synthetic set.
        synthetic_size: number of synthetic images (default 5000 train, 1000 validation).
        **hub: which data of a Hub or parquet set, and how it is read (:class:`HubOptions`): the
            keywords below; another keyword is a TypeError.

    Keyword Args:
        config (str | None): the dataset's configuration name (Hub and parquet sets with several).
        revision (str | None): a branch, tag or commit of a Hub dataset.
        streaming (bool): read the first ``subset`` items of the split as a stream (Hub and parquet sets):
            only the files holding them are read, nothing else is downloaded or prepared. Needs ``subset``.

    Only the asked split is downloaded and prepared: ``datasets.load_dataset(path)`` without a split
    prepares every split (all of ImageNet's train split to probe its validation split).
    """
    unknown = sorted(set(hub) - set(HubOptions.__annotations__))
    if unknown:
        raise TypeError(f"load_split() got an unexpected keyword argument {unknown[0]!r}")
    if hub.get("streaming") and not subset:
        raise SettingError(
            "streaming reads the first N items of a split: give their number (subset, or "
            "--max-images on the command line)"
        )
    kind, where = resolve_source(source)
    if kind == "synthetic":
        if any(hub.values()):
            raise SettingError("config, revision and streaming apply to Hub and parquet data, not to the synthetic set")
        split = split_name(["train", "validation"], split)  # the synthetic set has these two: another is refused
        n = synthetic_size or (5000 if split == "train" else 1000)
        n = min(n, subset) if subset else n
        ds = SyntheticShapes(n, img_size=img_size, seed=seed, split="train" if split == "train" else "validation")
        return ImageSplit(ds, ds.classes, ds.labels, ds.fingerprint, _synthetic_getter)
    assert where is not None  # only the synthetic set has no location
    if kind == "local" and is_image_folder(Path(where)):
        return load_folder_split(Path(where), split, subset)
    return load_hub_split(kind, where, source, split, subset, hub)
