"""Hugging Face datasets as a split: a Hub id (``owner/name``) or a local folder in the same parquet layout,
loading the asked split alone (its data files only, or, streaming, its first rows), with the image and
label columns found from the features."""

from __future__ import annotations

from typing import Any, TypedDict

from ..errors import PathNotFoundError, PosgeomError, one_line, require
from .splits import ImageSplit, split_name
from .transforms import class_index

__all__ = ["HubOptions", "DataSourceError", "find_columns", "load_hub_split", "take_stream"]

_IMAGE_NAMES = ("image", "img", "jpg", "png", "pixel_values")
_LABEL_NAMES = ("label", "labels", "fine_label", "class", "cls", "target")


class HubOptions(TypedDict, total=False):
    """Which data of a Hub or parquet set, and how it is read: :func:`~timm_posgeom.data.load_split`'s
    keywords ``config`` (the dataset's configuration name), ``revision`` (a branch, tag or commit of a Hub
    dataset) and ``streaming`` (read the first ``subset`` items as a stream)."""

    config: str | None
    revision: str | None
    streaming: bool


class DataSourceError(PosgeomError, ValueError):
    """A data source that cannot be read: a Hub dataset out of reach (offline), a configuration it lacks, a label
    column that holds no class indices."""


def find_columns(features: Any) -> tuple[str, str]:
    """(image column, label column) of a ``datasets.Features``: by feature type, else by usual name."""
    datasets = require("datasets", "reading a Hub or parquet data set")

    names = list(features)
    image = next((n for n in names if isinstance(features[n], datasets.Image)), None)
    image = image or next((n for n in _IMAGE_NAMES if n in names), None)
    class_labels = [n for n in names if isinstance(features[n], datasets.ClassLabel)]
    if len(class_labels) > 1:  # e.g. CIFAR-100's fine_label and coarse_label: the usual name, else refuse
        label = next((n for n in _LABEL_NAMES if n in class_labels), None)
        if label is None:
            raise DataSourceError(
                f"several label columns ({', '.join(class_labels)}) and none of the usual names "
                f"{_LABEL_NAMES}: which one is the class is not guessed"
            )
    else:
        label = class_labels[0] if class_labels else next((n for n in _LABEL_NAMES if n in names), None)
    if image is None or label is None:
        raise DataSourceError(
            f"cannot find the image and label columns among {names}: expected an Image "
            f"feature (or one of {_IMAGE_NAMES}) and a ClassLabel (or one of {_LABEL_NAMES})"
        )
    return image, label


def _hf_getter(image_col: str, label_col: str):
    def get(ds, index):
        row = ds[int(index)]
        return row[image_col], class_index(row[label_col])

    return get


def _hf_stored(ds: Any, image_col: str):
    """``index -> bytes``: a row's image as stored (its encoded bytes, or the file its path names), not decoded."""
    datasets = require("datasets", "reading a Hub or parquet data set")

    raw = (
        ds.cast_column(image_col, datasets.Image(decode=False))
        if isinstance(ds.features[image_col], datasets.Image)
        else ds
    )

    def stored(index: int) -> bytes:
        value = raw[int(index)][image_col]
        if isinstance(value, dict):
            if value.get("bytes") is not None:
                return bytes(value["bytes"])
            with open(value["path"], "rb") as f:
                return f.read()
        return value if isinstance(value, bytes) else repr(value).encode()

    return stored


def load_hub_split(kind: str, where: str, source: Any, split: str, subset: int | None, hub: HubOptions) -> ImageSplit:
    """The ``split`` of a Hub (``kind="hub"``) or parquet (``"local"``) set at ``where``, its first ``subset``
    items; ``source`` as the user named it, for messages. A Hub out of reach raises :class:`DataSourceError`."""
    datasets = require("datasets", "reading a Hub or parquet data set")

    try:
        ds = _load_hf_split(where, source, split, subset=subset, **hub)
    except OSError as e:  # ConnectionError and the Hub's HTTP errors: offline, or the Hub unreachable
        if kind != "hub" or isinstance(e, FileNotFoundError):
            raise
        raise DataSourceError(
            f"cannot reach the Hugging Face Hub for the dataset {source!r} ({type(e).__name__}: "
            f"{str(e).strip().splitlines()[0] if str(e).strip() else ''}): download it while online "
            "(it is then cached), or pass a local folder"
        ) from None
    image_col, label_col = find_columns(ds.features)
    ds = ds.select_columns([image_col, label_col])
    if subset and subset < len(ds):
        ds = ds.select(range(subset))
    feature = ds.features[label_col]
    labels = ds[label_col]
    labels = list(labels) if not isinstance(labels, list) else labels
    try:
        labels = [class_index(v) for v in labels]
    except ValueError as e:
        raise DataSourceError(f"the {split!r} split of {source}, column {label_col!r}: {e}") from None
    if isinstance(feature, datasets.ClassLabel):
        classes = feature.names
    else:
        classes = [str(i) for i in range(max(labels, default=-1) + 1)]
    return ImageSplit(
        ds,
        classes,
        labels,
        f"hf-{ds._fingerprint}-{len(ds)}",
        _hf_getter(image_col, label_col),
        lambda index: f"row {index} of the {split!r} split of {source}",
        _hf_stored(ds, image_col),
    )


def take_stream(stream: Any, n: int) -> Any:
    """The first ``n`` rows of a ``datasets.IterableDataset`` as a ``datasets.Dataset`` with the stream's
    features (class names included), its images the encoded bytes as stored: rows of decoded images would be
    encoded again (a JPEG re-compressed)."""
    datasets = require("datasets", "reading a Hub or parquet data set")

    features = stream.features
    image_col, _ = find_columns(features)
    stream = stream.cast_column(image_col, datasets.Image(decode=False))
    return datasets.Dataset.from_list(list(stream.take(n)), features=stream.features).cast(features)


def _load_hf_split(
    where: str,
    source: Any,
    split: str,
    *,
    subset: int | None,
    config: str | None = None,
    revision: str | None = None,
    streaming: bool = False,
) -> Any:
    """One split of a Hub or parquet set as a ``datasets.Dataset``, loading that split alone: its data files
    only (read from the builder's configuration), or, streaming, its first ``subset`` rows."""
    datasets = require("datasets", "reading a Hub or parquet data set")

    try:
        builder = datasets.load_dataset_builder(where, config, revision=revision)
    except FileNotFoundError as e:
        raise PathNotFoundError(f"cannot load data {source!r}: {e}") from e
    except ValueError as e:  # datasets refuses what was asked of the data: a configuration it lacks, ...
        raise DataSourceError(f"cannot load data {source!r}: {one_line(e, first_line=True)}") from None
    files = builder.config.data_files or {}
    names = list(files) or list(datasets.get_dataset_split_names(where, config, revision=revision))
    name = split_name(names, split)
    if streaming:
        assert subset is not None  # load_split refuses streaming without a count
        return take_stream(datasets.load_dataset(where, config, split=name, revision=revision, streaming=True), subset)
    only = {name: files[name]} if name in files else None  # a script-built set: its own split logic
    return datasets.load_dataset(where, config, split=name, revision=revision, data_files=only)
