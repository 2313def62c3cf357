"""One split of an image-classification set and what is done to it whole: its split names, the split
itself (:class:`ImageSplit`, ``split[i] -> (PIL RGB image, label)``), a subset of it, its labels mapped to
another class list, every image decoded once (:func:`check_images`) and what identifies its content."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
from PIL import Image
from torch.utils.data import Dataset

from ..errors import DataError, PosgeomError, SettingError
from ..results.fingerprints import fingerprint
from .synthetic import SyntheticShapes
from .transforms import class_index, to_rgb

__all__ = [
    "SPLIT_ALIASES",
    "split_name",
    "ImageSplit",
    "BadImageError",
    "SubsetSplit",
    "BAD_IMAGE_POLICIES",
    "check_images",
    "RelabeledSplit",
    "relabel_by_name",
    "data_identity",
    "identity_change",
    "content_fingerprint",
    "as_image",
]

SPLIT_ALIASES = {
    "train": ("train", "training"),
    "validation": ("validation", "val", "valid"),
    "test": ("test",),  # a split of its own: never read in place of validation (often unlabelled)
}


def split_name(available: Sequence[str], split: str) -> str:
    """The name in ``available`` that serves as ``split``: itself, else an alias (validation / val /
    valid are interchangeable, as are train / training; test is a split of its own). ValueError (one line,
    naming the splits the data has) for a split the data lacks."""
    if split in available:
        return split
    for group in SPLIT_ALIASES.values():
        if split in group:
            for alias in group:
                if alias in available:
                    return alias
    raise DataError(f"no split {split!r} in the data; it has the split(s): {', '.join(available) or 'none'}")


class ImageSplit(Dataset):
    """One split of an image-classification set: ``split[i] -> (PIL RGB image, label)``.

    Attributes: ``classes`` (names), ``labels`` (list of int, one per item), ``fingerprint`` (a
    string identifying the exact content, used for the on-disk uint8 cache).
    """

    skipped: list[str]  # set by check_images: where each image it left out was

    def __init__(
        self,
        items: Any,
        classes: Sequence[str],
        labels: Sequence[int],
        fingerprint: str,
        getter: Callable[[Any, int], tuple[Image.Image, int]],
        where: Callable[[int], str] | None = None,
        stored: Callable[[int], bytes] | None = None,
    ):
        self.items = items
        self.classes = list(classes)
        self.labels = [class_index(v) for v in labels]
        self.fingerprint = fingerprint
        self._get = getter
        self.where = where or (lambda index: f"item {index}")
        self._stored = stored

    def stored(self, index: int) -> bytes:
        """The bytes item ``index`` is stored as (an image file's, a parquet row's), what
        :func:`content_fingerprint` hashes; without a known store, its decoded RGB pixels and size."""
        if self._stored is not None:
            return self._stored(index)
        image = self[index][0]
        return f"{image.size}".encode() + np.asarray(image, dtype=np.uint8).tobytes()

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[Image.Image, int]:
        try:
            image, label = self._get(self.items, index)  # a Hub set's rows decode here
            image = as_image(image)
            image.load()  # decode now: a damaged file fails here, named, not later inside a transform
            image = to_rgb(image)  # 16-bit, palette, CMYK, alpha: 8-bit RGB, or refused (see to_rgb)
        except Exception as e:  # whatever PIL raises for a truncated, invalid or oversized file (it is many kinds)
            reason = str(e)
            if isinstance(e, Image.DecompressionBombError):
                reason = f"over PIL's limit of {Image.MAX_IMAGE_PIXELS:,} pixels ({e})"
            text = re.sub(r"<_io\.BytesIO object at 0x[0-9a-f]+>", "its stored bytes", " ".join(reason.split()))
            raise BadImageError(f"cannot decode {self.where(index)}: {text}") from None
        return image, label


def as_image(value: Any) -> Image.Image:
    """A stored image as a PIL image (not decoded yet): a PIL image as it is, encoded bytes (a parquet column of
    raw bytes), a Hugging Face ``{"bytes", "path"}`` record, or a uint8 array; TypeError for anything else."""
    import io

    if isinstance(value, Image.Image):
        return value
    if isinstance(value, dict) and (value.get("bytes") or value.get("path")):
        value = value.get("bytes") or value["path"]
        return Image.open(io.BytesIO(value) if isinstance(value, (bytes, bytearray)) else value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return Image.open(io.BytesIO(bytes(value)))
    if isinstance(value, np.ndarray) and value.dtype == np.uint8 and value.ndim in (2, 3):
        return Image.fromarray(value)
    raise TypeError(f"not an image but {type(value).__name__}")


class BadImageError(PosgeomError, ValueError):
    """An image that cannot be decoded; the message names the file (or the row of a parquet set)."""


class SubsetSplit(ImageSplit):
    """The items of a split at ``indices`` (what :func:`check_images` keeps)."""

    def __init__(self, split: ImageSplit, indices: Sequence[int]):
        self.split, self.indices = split, list(indices)
        super().__init__(
            split.items,
            split.classes,
            [split.labels[i] for i in self.indices],
            f"{split.fingerprint}-subset-{fingerprint(str(self.indices))}",
            split._get,
            lambda index: split.where(self.indices[index]),
            lambda index: split.stored(self.indices[index]),
        )

    def __getitem__(self, index: int) -> tuple[Image.Image, int]:
        return self.split[self.indices[index]]


BAD_IMAGE_POLICIES = ("error", "skip")


def check_images(split: ImageSplit, policy: str = "error", progress: bool = False) -> ImageSplit:
    """Decode every image of ``split`` once, before expensive work uses it.

    ``policy="error"``: raise :class:`BadImageError` naming the bad files (up to five, and the count);
    ``"skip"``: return the split without them, with ``skipped`` listing where each was.
    """
    if policy not in BAD_IMAGE_POLICIES:
        raise SettingError(f"bad_images must be one of {', '.join(BAD_IMAGE_POLICIES)}, got {policy!r}")
    if isinstance(split.items, SyntheticShapes):  # rendered, never decoded: nothing can be damaged
        split.skipped = []
        return split
    from tqdm.auto import tqdm

    good, bad = [], []
    for index in tqdm(range(len(split)), desc="checking images", unit="img", disable=not progress, leave=False):
        try:
            split[index]
            good.append(index)
        except BadImageError as e:
            bad.append(str(e).removeprefix("cannot decode "))
    if bad and policy == "error":
        raise BadImageError(
            f"{len(bad)} image(s) cannot be decoded: {'; '.join(bad[:5])}"
            f"{' ...' if len(bad) > 5 else ''} (bad_images=skip leaves them out, listed)"
        )
    checked = SubsetSplit(split, good) if bad else split
    checked.skipped = bad
    return checked


class RelabeledSplit(ImageSplit):
    """A split whose labels are mapped to another class list by name (see :func:`relabel_by_name`)."""

    def __init__(self, split: ImageSplit, classes: Sequence[str], mapping: Sequence[int]):
        self.split, self.mapping = split, list(mapping)
        super().__init__(
            split.items,
            classes,
            [self.mapping[v] for v in split.labels],
            f"{split.fingerprint}-relabeled",
            split._get,
            split.where,
            split.stored,
        )

    def __getitem__(self, index: int) -> tuple[Image.Image, int]:
        image, label = self.split[index]
        return image, self.mapping[label]


def relabel_by_name(split: ImageSplit, classes: Sequence[str]) -> RelabeledSplit:
    """``split`` with each label replaced by the index of its class name in ``classes`` (a model's label
    names). Raises ValueError naming the classes of the data that ``classes`` lacks."""
    index = {name: i for i, name in enumerate(classes)}
    missing = [c for c in split.classes if c not in index]
    if missing:
        raise DataError(
            f"the model's classes lack {len(missing)} of the data's ({', '.join(missing[:5])}"
            f"{', ...' if len(missing) > 5 else ''}): the labels cannot be mapped by name"
        )
    return RelabeledSplit(split, classes, [index[c] for c in split.classes])


def content_fingerprint(split: ImageSplit, progress: bool = False) -> str:
    """The :func:`~timm_posgeom.results.fingerprints.fingerprint` of everything a split holds: its classes, its labels
    and the stored bytes of every image (:meth:`ImageSplit.stored`; read, not decoded), so that images replaced
    under the same path, even with the same names, sizes and times, give another fingerprint. The synthetic set
    is rendered from its seed and size: its fingerprint names them."""
    head = repr((list(split.classes), list(split.labels)))
    if isinstance(split.items, SyntheticShapes):
        return fingerprint((head, split.fingerprint))
    from tqdm.auto import tqdm

    def parts() -> Iterator[str | bytes]:
        yield head
        for index in tqdm(
            range(len(split)), desc="fingerprinting the data", unit="img", disable=not progress, leave=False
        ):
            blob = split.stored(index)
            yield len(blob).to_bytes(8, "little")
            yield blob

    return fingerprint(parts())


def data_identity(split: ImageSplit, images: int = 8, content: bool = False) -> dict[str, Any]:
    """What identifies a split's content, the same in any checkout or folder: its classes, size, a hash of
    its labels and a hash of the pixels of its first ``images`` items (decoded RGB); with ``content``, also
    :func:`content_fingerprint` (every image's bytes) as ``content``. The study's data is named by a path that
    may be relative (committed runs move between checkouts), so the path alone cannot tell that a resume is
    looking at other data (the study and training compare it on resume)."""
    pixels = fingerprint(
        np.asarray(to_rgb(split[i][0]), dtype=np.uint8).tobytes() for i in range(min(images, len(split)))
    )
    labels = fingerprint(",".join(map(str, split.labels)))
    identity = dict(classes=list(split.classes), images=len(split), labels=labels, pixels=pixels)
    if content:
        identity["content"] = content_fingerprint(split)
    return identity


def identity_change(was: dict[str, Any], now: dict[str, Any]) -> str | None:
    """What differs between two :func:`data_identity` records, for a message ("classes", "number of
    images", "labels or images"), or None when they are the same. Only what both record is compared (an
    identity recorded before ``content`` existed is compared on the rest)."""
    keys = set(was) & set(now)
    if all(was[k] == now[k] for k in keys):
        return None
    if was.get("classes") != now.get("classes"):
        return "classes"
    return "number of images" if was.get("images") != now.get("images") else "labels or images"
