"""Image-classification data for training and probing: Hub ids, local folders, a synthetic set.

Sources (``load_split``):

* a Hugging Face Hub id, e.g. ``clane9/imagenet-100`` (parquet with ``image`` / ``label`` columns);
* a local folder in the same parquet layout (e.g. ``../shared/data/imagenette``), or an ImageFolder
  tree (``root/<split>/<class>/<image>``);
* ``None`` or ``"synthetic"``: the embedded procedural set of :mod:`timm_posgeom.synthetic`.

The image and label columns are found from the features (``datasets.Image`` / ``ClassLabel``) or
their usual names. A split is ``(PIL RGB image, int label)`` per item.

Transforms: ``augment="none"`` resizes straight to ``img_size`` (the paper: no augmentation);
``"crop_flip"`` adds a random crop after reflect padding and a horizontal flip (the CPU pilot);
``"timm"`` is timm's ``create_transform`` training pipeline (RandomResizedCrop, RandAugment, ...).
Evaluation transforms have one owner, :func:`timm_posgeom.transforms.eval_transform` (``resize="paper"``
straight to the input size; ``"timm"``: short side to ``size / crop_pct``, centre crop).

For small-resolution CPU runs, :func:`cache_uint8` decodes and resizes a split once into a
``(N, 3, S, S)`` uint8 tensor (optionally kept on disk too), and :class:`CachedTrainDataset`
augments those tensors directly, so training is not bound by JPEG decoding.

Reproducibility: training augmentation draws its randomness from a seed derived from
``(seed, epoch, index)``, never from the process RNG, so it is the same with any number of
workers and after a resume; :class:`EpochBatchSampler` orders each epoch from ``seed + epoch``
and shards global batches across processes.
"""
from __future__ import annotations

import hashlib
import os
import random
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset, Sampler

from .errors import PosgeomError
from .jsonio import replacing
from .synthetic import SyntheticShapes, seed32
from .transforms import class_index, eval_transform, to_rgb

__all__ = [
    "AUGMENTATIONS",
    "ImageSplit", "RelabeledSplit", "relabel_by_name", "SubsetSplit", "BadImageError", "DataSourceError", "check_images",
    "BAD_IMAGE_POLICIES", "load_split", "data_identity", "identity_change", "resolve_source", "find_columns", "split_name",
    "train_transform", "eval_config", "crop_flip",
    "CachedSplit", "cache_uint8", "CachedTrainDataset", "CachedEvalDataset", "TransformDataset",
    "EpochBatchSampler", "make_loader", "default_cache_dir",
]

AUGMENTATIONS = ("none", "crop_flip", "timm")
SPLIT_ALIASES = {
    "train": ("train", "training"),
    "validation": ("validation", "val", "valid", "test"),
}
_IMAGE_NAMES = ("image", "img", "jpg", "png", "pixel_values")
_LABEL_NAMES = ("label", "labels", "fine_label", "class", "cls", "target")
_IMAGE_EXTS = {".jpg", ".jpeg", ".png", ".bmp", ".webp", ".ppm", ".tif", ".tiff", ".gif"}


# --------------------------------------------------------------------------------------------
# sources and splits
# --------------------------------------------------------------------------------------------
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
        text.startswith(("/", "./", "../", "~", ".\\", "..\\")) or text in (".", "..")
        or text.count("/") != 1 or os.sep in text.replace("/", "")
    )
    if looks_like_path:
        raise FileNotFoundError(f"data path {text!r} does not exist (resolved to {path.resolve()})")
    return "hub", text


def split_name(available: Sequence[str], split: str) -> str:
    """The name in ``available`` that serves as ``split``: itself, else an alias (validation / val /
    valid / test are interchangeable, as are train / training)."""
    if split in available:
        return split
    for group in SPLIT_ALIASES.values():
        if split in group:
            for alias in group:
                if alias in available:
                    return alias
    raise ValueError(f"no split {split!r} in the data; available splits: {', '.join(available)}")


def find_columns(features: Any) -> tuple[str, str]:
    """(image column, label column) of a ``datasets.Features``: by feature type, else by usual name."""
    import datasets

    names = list(features)
    image = next((n for n in names if isinstance(features[n], datasets.Image)), None)
    image = image or next((n for n in _IMAGE_NAMES if n in names), None)
    class_labels = [n for n in names if isinstance(features[n], datasets.ClassLabel)]
    if len(class_labels) > 1:  # e.g. CIFAR-100's fine_label and coarse_label: the usual name, else refuse
        label = next((n for n in _LABEL_NAMES if n in class_labels), None)
        if label is None:
            raise ValueError(f"several label columns ({', '.join(class_labels)}) and none of the usual names "
                             f"{_LABEL_NAMES}: which one is the class is not guessed")
    else:
        label = class_labels[0] if class_labels else next((n for n in _LABEL_NAMES if n in names), None)
    if image is None or label is None:
        raise ValueError(f"cannot find the image and label columns among {names}: expected an Image "
                         f"feature (or one of {_IMAGE_NAMES}) and a ClassLabel (or one of {_LABEL_NAMES})")
    return image, label


class ImageSplit(Dataset):
    """One split of an image-classification set: ``split[i] -> (PIL RGB image, label)``.

    Attributes: ``classes`` (names), ``labels`` (list of int, one per item), ``fingerprint`` (a
    string identifying the exact content, used for the on-disk uint8 cache).
    """

    def __init__(self, items: Any, classes: Sequence[str], labels: Sequence[int], fingerprint: str,
                 getter: Callable[[Any, int], tuple[Image.Image, int]],
                 where: Callable[[int], str] | None = None):
        self.items = items
        self.classes = list(classes)
        self.labels = [class_index(v) for v in labels]
        self.fingerprint = fingerprint
        self._get = getter
        self.where = where or (lambda index: f"item {index}")

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[Image.Image, int]:
        try:
            image, label = self._get(self.items, index)
            image.load()  # decode now: a damaged file fails here, named, not later inside a transform
            image = to_rgb(image)  # 16-bit, palette, CMYK, alpha: 8-bit RGB, or refused (see to_rgb)
        except (OSError, SyntaxError, ValueError) as e:  # what PIL raises for truncated or invalid files
            raise BadImageError(f"cannot decode {self.where(index)}: {e}") from None
        return image, label


class DataSourceError(PosgeomError, ValueError):
    """A data source that cannot be read: a Hub dataset out of reach (offline)."""


class BadImageError(PosgeomError, ValueError):
    """An image that cannot be decoded; the message names the file (or the row of a parquet set)."""


class SubsetSplit(ImageSplit):
    """The items of a split at ``indices`` (what :func:`check_images` keeps)."""

    def __init__(self, split: ImageSplit, indices: Sequence[int]):
        self.split, self.indices = split, list(indices)
        super().__init__(split.items, split.classes, [split.labels[i] for i in self.indices],
                         f"{split.fingerprint}-subset-{hashlib.sha1(str(self.indices).encode()).hexdigest()[:12]}",
                         split._get, lambda index: split.where(self.indices[index]))

    def __getitem__(self, index: int) -> tuple[Image.Image, int]:
        return self.split[self.indices[index]]


BAD_IMAGE_POLICIES = ("error", "skip")


def check_images(split: ImageSplit, policy: str = "error", progress: bool = False) -> ImageSplit:
    """Decode every image of ``split`` once, before expensive work uses it.

    ``policy="error"``: raise :class:`BadImageError` naming the bad files (up to five, and the count);
    ``"skip"``: return the split without them, with ``skipped`` listing where each was.
    """
    if policy not in BAD_IMAGE_POLICIES:
        raise ValueError(f"bad_images must be one of {', '.join(BAD_IMAGE_POLICIES)}, got {policy!r}")
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
        raise BadImageError(f"{len(bad)} image(s) cannot be decoded: {'; '.join(bad[:5])}"
                            f"{' ...' if len(bad) > 5 else ''} (bad_images=skip leaves them out, listed)")
    checked = SubsetSplit(split, good) if bad else split
    checked.skipped = bad
    return checked


class RelabeledSplit(ImageSplit):
    """A split whose labels are mapped to another class list by name (see :func:`relabel_by_name`)."""

    def __init__(self, split: ImageSplit, classes: Sequence[str], mapping: Sequence[int]):
        self.split, self.mapping = split, list(mapping)
        super().__init__(split.items, classes, [self.mapping[v] for v in split.labels],
                         f"{split.fingerprint}-relabeled", split._get, split.where)

    def __getitem__(self, index: int) -> tuple[Image.Image, int]:
        image, label = self.split[index]
        return image, self.mapping[label]


def relabel_by_name(split: ImageSplit, classes: Sequence[str]) -> RelabeledSplit:
    """``split`` with each label replaced by the index of its class name in ``classes`` (a model's label
    names). Raises ValueError naming the classes of the data that ``classes`` lacks."""
    index = {name: i for i, name in enumerate(classes)}
    missing = [c for c in split.classes if c not in index]
    if missing:
        raise ValueError(f"the model's classes lack {len(missing)} of the data's ({', '.join(missing[:5])}"
                         f"{', ...' if len(missing) > 5 else ''}): the labels cannot be mapped by name")
    return RelabeledSplit(split, classes, [index[c] for c in split.classes])


def _hf_getter(image_col: str, label_col: str):
    def get(ds, index):
        row = ds[int(index)]
        return row[image_col], class_index(row[label_col])
    return get


def _open_image(path: str) -> Image.Image:
    """An image file decoded in its own mode (torchvision's default loader converts to RGB itself, which
    clips 16-bit images at 255: :func:`~timm_posgeom.transforms.to_rgb` converts it later, correctly)."""
    with open(path, "rb") as f:
        image = Image.open(f)
        image.load()
    return image


def _folder_getter(ds, index):
    return ds[int(index)]


def _synthetic_getter(ds, index):
    return ds[int(index)]


def _file_key(path: str) -> str:
    """``path|size|mtime_ns``: what identifies a file's content for the on-disk cache (no read needed)."""
    stat = os.stat(path)
    return f"{path}|{stat.st_size}|{stat.st_mtime_ns}"


def _is_image_folder(root: Path) -> bool:
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


def load_split(
        source: str | os.PathLike | None,
        split: str = "train",
        *,
        subset: int | None = None,
        img_size: int = 64,
        seed: int = 0,
        synthetic_size: int | None = None,
        config: str | None = None,
        revision: str | None = None,
        streaming: bool = False,
) -> ImageSplit:
    """Load one split of a classification set (see the module docstring for the sources).

    Args:
        source: Hub id, local folder, or None / ``"synthetic"``.
        split: ``train`` or ``validation`` (aliases val/valid/test accepted in the data).
        subset: keep only the first ``subset`` items (rows of the parquet sets are pre-shuffled; an
            ImageFolder split is put in a fixed order mixed across classes first).
        img_size: resolution of the synthetic set (ignored for real data).
        seed: seed of the synthetic set.
        synthetic_size: number of synthetic images (default 5000 train, 1000 validation).
        config: the dataset's configuration name (Hub and parquet sets with several).
        revision: a branch, tag or commit of a Hub dataset.
        streaming: read the first ``subset`` items of the split as a stream (Hub and parquet sets): only
            the files holding them are read, nothing else is downloaded or prepared. Needs ``subset``.

    Only the asked split is downloaded and prepared: ``datasets.load_dataset(path)`` without a split
    prepares every split (all of ImageNet's train split to probe its validation split).
    """
    if streaming and not subset:
        raise ValueError("streaming reads the first N items of a split: give their number (subset, or "
                         "--max-images on the command line)")
    if (config or revision or streaming) and resolve_source(source)[0] == "synthetic":
        raise ValueError("config, revision and streaming apply to Hub and parquet data, not to the synthetic set")
    kind, where = resolve_source(source)
    if kind == "synthetic":
        n = synthetic_size or (5000 if split == "train" else 1000)
        n = min(n, subset) if subset else n
        ds = SyntheticShapes(n, img_size=img_size, seed=seed, split="train" if split == "train" else "validation")
        return ImageSplit(ds, ds.classes, ds.labels, ds.fingerprint, _synthetic_getter)
    if kind == "local" and _is_image_folder(Path(where)):
        from torchvision.datasets import ImageFolder

        root = Path(where)
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

    import datasets

    try:
        ds = _load_hf_split(where, source, split, subset=subset, config=config, revision=revision, streaming=streaming)
    except OSError as e:  # ConnectionError and the Hub's HTTP errors: offline, or the Hub unreachable
        if kind != "hub" or isinstance(e, FileNotFoundError):
            raise
        raise DataSourceError(f"cannot reach the Hugging Face Hub for the dataset {source!r} ({type(e).__name__}: "
                              f"{str(e).strip().splitlines()[0] if str(e).strip() else ''}): download it while online "
                              "(it is then cached), or pass a local folder") from None
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
        raise ValueError(f"the {split!r} split of {source}, column {label_col!r}: {e}") from None
    if isinstance(feature, datasets.ClassLabel):
        classes = feature.names
    else:
        classes = [str(i) for i in range(max(labels, default=-1) + 1)]
    return ImageSplit(ds, classes, labels, f"hf-{ds._fingerprint}-{len(ds)}", _hf_getter(image_col, label_col),
                      lambda index: f"row {index} of the {split!r} split of {source}")


def _load_hf_split(where: str, source: Any, split: str, *, subset: int | None, config: str | None,
                   revision: str | None, streaming: bool) -> Any:
    """One split of a Hub or parquet set as a ``datasets.Dataset``, loading that split alone: its data files
    only (read from the builder's configuration), or, streaming, its first ``subset`` rows."""
    import datasets

    try:
        builder = datasets.load_dataset_builder(where, config, revision=revision)
    except FileNotFoundError as e:
        raise FileNotFoundError(f"cannot load data {source!r}: {e}") from e
    files = builder.config.data_files or {}
    names = list(files) or list(datasets.get_dataset_split_names(where, config, revision=revision))
    name = split_name(names, split)
    if streaming:
        stream = datasets.load_dataset(where, config, split=name, revision=revision, streaming=True)
        image_col, _ = find_columns(stream.features)
        features = stream.features
        # the encoded bytes as stored: rows of decoded images would be encoded again (a JPEG re-compressed)
        stream = stream.cast_column(image_col, datasets.Image(decode=False))
        rows = list(stream.take(subset))
        return datasets.Dataset.from_list(rows, features=stream.features).cast(features)
    only = {name: files[name]} if name in files else None  # a script-built set: its own split logic
    return datasets.load_dataset(where, config, split=name, revision=revision, data_files=only)


def data_identity(split: ImageSplit, images: int = 8) -> dict[str, Any]:
    """What identifies a split's content, the same in any checkout or folder: its classes, size, a hash of
    its labels and a hash of the pixels of its first ``images`` items (decoded RGB). The study's data is
    named by a path that may be relative (committed runs move between checkouts), so the path alone
    cannot tell that a resume is looking at other data (the study and training compare it on resume)."""
    pixels = hashlib.sha1()
    for i in range(min(images, len(split))):
        image = split[i][0]
        pixels.update(np.asarray(to_rgb(image), dtype=np.uint8).tobytes())
    labels = hashlib.sha1(",".join(map(str, split.labels)).encode()).hexdigest()[:16]
    return dict(classes=list(split.classes), images=len(split), labels=labels, pixels=pixels.hexdigest()[:16])


def identity_change(was: dict[str, Any], now: dict[str, Any]) -> str | None:
    """What differs between two :func:`data_identity` records, for a message ("classes", "number of
    images", "labels or images"), or None when they are the same."""
    if was == now:
        return None
    if was.get("classes") != now.get("classes"):
        return "classes"
    return "number of images" if was.get("images") != now.get("images") else "labels or images"


# --------------------------------------------------------------------------------------------
# transforms
# --------------------------------------------------------------------------------------------
def _pil_interp(name: str) -> int:
    return {"bicubic": Image.BICUBIC, "bilinear": Image.BILINEAR, "nearest": Image.NEAREST,
            "lanczos": Image.LANCZOS, "box": Image.BOX}[name]


def _resize_uint8(image: Image.Image, img_size: int, interpolation: str = "bicubic") -> torch.Tensor:
    """PIL image -> (3, img_size, img_size) uint8 tensor, resized straight (squashed) to the size."""
    image = to_rgb(image)
    if image.size != (img_size, img_size):
        image = image.resize((img_size, img_size), _pil_interp(interpolation))
    return torch.from_numpy(np.asarray(image, dtype=np.uint8).copy()).permute(2, 0, 1).contiguous()


def _reflect(index: torch.Tensor, n: int) -> torch.Tensor:
    """Map indices in [-(n-1), 2(n-1)] into [0, n) as reflect padding does (no edge repeat)."""
    index = index.abs()
    return torch.where(index > n - 1, 2 * (n - 1) - index, index)


def crop_flip(image: torch.Tensor, pad: int = 4, hflip: float = 0.5,
              generator: torch.Generator | None = None) -> torch.Tensor:
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


def _normalize(image_u8: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    return (image_u8.float().div_(255) - mean) / std


def _stats(mean: Sequence[float], std: Sequence[float]) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.tensor(mean, dtype=torch.float32).view(3, 1, 1), torch.tensor(std, dtype=torch.float32).view(3, 1, 1)


class _CropFlipTransform:
    """PIL -> resize straight to img_size -> reflect-pad crop + flip -> normalised tensor."""

    def __init__(self, img_size, mean, std, interpolation, pad, hflip):
        self.img_size, self.interpolation, self.pad, self.hflip = img_size, interpolation, pad, hflip
        self.mean, self.std = _stats(mean, std)

    def __call__(self, image: Image.Image) -> torch.Tensor:
        u8 = crop_flip(_resize_uint8(image, self.img_size, self.interpolation), self.pad, self.hflip)
        return _normalize(u8, self.mean, self.std)


def eval_config(
        img_size: int,
        mean: Sequence[float] = (0.485, 0.456, 0.406),
        std: Sequence[float] = (0.229, 0.224, 0.225),
        interpolation: str = "bicubic",
        crop_pct: float = 0.875,
) -> dict[str, Any]:
    """A timm data config for square ``img_size`` inputs, for :func:`timm_posgeom.transforms.eval_transform`
    (the one owner of evaluation transforms): ``eval_transform(eval_config(64), resize="paper")``."""
    return dict(input_size=(3, img_size, img_size), interpolation=interpolation, mean=tuple(mean),
                std=tuple(std), crop_pct=crop_pct, crop_mode="center")


def train_transform(
        img_size: int,
        augment: str = "crop_flip",
        mean: Sequence[float] = (0.485, 0.456, 0.406),
        std: Sequence[float] = (0.229, 0.224, 0.225),
        interpolation: str = "bicubic",
        crop_pad: int = 4,
        hflip: float = 0.5,
        auto_augment: str | None = None,
        color_jitter: float | None = None,
        reprob: float = 0.0,
        scale: Sequence[float] = (0.08, 1.0),
) -> Callable[[Image.Image], torch.Tensor]:
    """PIL -> normalised tensor for training (see the module docstring for ``augment``)."""
    if augment not in AUGMENTATIONS:
        raise ValueError(f"unknown augment {augment!r}; expected one of {', '.join(AUGMENTATIONS)}")
    if augment == "none":  # the paper: no augmentation, resized straight to the input
        return eval_transform(eval_config(img_size, mean, std, interpolation), resize="paper")
    if augment == "crop_flip":
        return _CropFlipTransform(img_size, mean, std, interpolation, crop_pad, hflip)
    from timm.data import create_transform

    return create_transform(
        (3, img_size, img_size), is_training=True, scale=tuple(scale), hflip=hflip,
        color_jitter=color_jitter if color_jitter else None, auto_augment=auto_augment,
        interpolation=interpolation, mean=tuple(mean), std=tuple(std), re_prob=reprob,
    )


def _sample_seed(seed: int, epoch: int, index: int) -> int:
    return seed32(seed, epoch, index)


class TransformDataset(Dataset):
    """``(PIL, label)`` split + transform -> ``(tensor, label)``.

    With ``seed`` set, each item's randomness (python ``random``, numpy, torch) is seeded from
    ``(seed, epoch, index)`` and the process RNG states are restored afterwards, so augmentation
    does not depend on workers, batch composition or resumption. Call :meth:`set_epoch` before
    each epoch (loaders must not use persistent workers).
    """

    def __init__(self, split: Dataset, transform: Callable, seed: int | None = None):
        self.split, self.transform, self.seed, self.epoch = split, transform, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return len(self.split)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        image, label = self.split[index]
        if self.seed is None:
            return self.transform(image), label
        key = _sample_seed(self.seed, self.epoch, index)
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


# --------------------------------------------------------------------------------------------
# uint8 cache
# --------------------------------------------------------------------------------------------
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
        items = self.split.items
        if isinstance(items, SyntheticShapes) and items.img_size == self.img_size:
            return items.render(index)
        image, _ = self.split[index]
        return _resize_uint8(image, self.img_size, self.interpolation)


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
        key = hashlib.sha1(f"{split.fingerprint}|{img_size}|{interpolation}".encode()).hexdigest()[:20]
        file = Path(cache_dir) / f"uint8-{img_size}px-{key}.pt"
        if file.is_file():
            blob = torch.load(file, weights_only=True)
            return CachedSplit(blob["images"], blob["labels"], split.classes)
    loader = DataLoader(_ResizeItems(split, img_size, interpolation), batch_size=256, num_workers=workers,
                        generator=torch.Generator())
    chunks = loader
    if progress:
        from tqdm.auto import tqdm

        chunks = tqdm(loader, desc=f"caching {len(split)} images at {img_size}px", unit="batch")
    images = torch.cat([c for c in chunks]) if len(split) else torch.empty(0, 3, img_size, img_size, dtype=torch.uint8)
    labels = torch.tensor(split.labels, dtype=torch.int64)
    if file is not None:
        file.parent.mkdir(parents=True, exist_ok=True)
        with replacing(file) as tmp:
            torch.save({"images": images, "labels": labels}, tmp)
    return CachedSplit(images, labels, split.classes)


class CachedTrainDataset(Dataset):
    """Training items from a :class:`CachedSplit`: reflect-pad crop + flip on the uint8 tensor,
    then normalisation. The randomness of item ``i`` in epoch ``e`` comes from a generator seeded
    with ``(seed, e, i)``. Call :meth:`set_epoch` before each epoch."""

    def __init__(self, cache: CachedSplit, mean: Sequence[float], std: Sequence[float],
                 crop_pad: int = 4, hflip: float = 0.5, seed: int = 0, augment: str = "crop_flip"):
        if augment not in ("none", "crop_flip"):
            raise ValueError(f"the uint8 cache supports augment 'none' or 'crop_flip', not {augment!r}")
        self.cache, self.crop_pad, self.hflip, self.seed, self.epoch = cache, crop_pad, hflip, seed, 0
        self.augment = augment
        self.mean, self.std = _stats(mean, std)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return len(self.cache)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        image = self.cache.images[index]
        if self.augment == "crop_flip":
            g = torch.Generator().manual_seed(_sample_seed(self.seed, self.epoch, index))
            image = crop_flip(image, self.crop_pad, self.hflip, generator=g)
        return _normalize(image, self.mean, self.std), int(self.cache.labels[index])


class CachedEvalDataset(Dataset):
    """Evaluation items from a :class:`CachedSplit` (normalised, no randomness)."""

    def __init__(self, cache: CachedSplit, mean: Sequence[float], std: Sequence[float]):
        self.cache = cache
        self.mean, self.std = _stats(mean, std)

    def __len__(self) -> int:
        return len(self.cache)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return _normalize(self.cache.images[index], self.mean, self.std), int(self.cache.labels[index])


# --------------------------------------------------------------------------------------------
# sampling and loading
# --------------------------------------------------------------------------------------------
class EpochBatchSampler(Sampler[list[int]]):
    """Batches of one process's share of each global batch, in an order fixed by ``seed + epoch``.

    The epoch's permutation (or ``range`` without shuffle) is cut into global batches of
    ``batch_size * num_replicas`` items; process ``rank`` gets the ``rank``-th slice of each.
    ``set_epoch(epoch, start_batch)`` selects the epoch and skips its first ``start_batch``
    per-process batches (exact resumption). With ``drop_last=False`` (evaluation) the items are
    instead split into ``num_replicas`` contiguous, disjoint shards that cover the set once.
    """

    def __init__(self, num_samples: int, batch_size: int, num_replicas: int = 1, rank: int = 0,
                 seed: int = 0, shuffle: bool = True, drop_last: bool = True):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.num_samples, self.batch_size = int(num_samples), int(batch_size)
        self.num_replicas, self.rank, self.seed = int(num_replicas), int(rank), int(seed)
        self.shuffle, self.drop_last = shuffle, drop_last
        self.epoch, self.start_batch = 0, 0

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        self.epoch, self.start_batch = int(epoch), int(start_batch)

    def _order(self) -> torch.Tensor:
        if not self.shuffle:
            return torch.arange(self.num_samples)
        return torch.randperm(self.num_samples, generator=torch.Generator().manual_seed(self.seed + self.epoch))

    def _batches(self) -> list[list[int]]:
        order = self._order()
        if self.drop_last:
            step = self.batch_size * self.num_replicas
            mine = [order[i + self.rank * self.batch_size: i + (self.rank + 1) * self.batch_size].tolist()
                    for i in range(0, self.num_samples - step + 1, step)]
        else:
            shard = order.tensor_split(self.num_replicas)[self.rank].tolist()
            mine = [shard[i:i + self.batch_size] for i in range(0, len(shard), self.batch_size)]
        return mine

    def __iter__(self) -> Iterator[list[int]]:
        yield from self._batches()[self.start_batch:]

    def __len__(self) -> int:
        if self.drop_last:
            return max(0, self.num_samples // (self.batch_size * self.num_replicas) - self.start_batch)
        return len(self._batches()) - self.start_batch

    @property
    def batches_per_epoch(self) -> int:
        """Per-process batches in a full epoch (ignores ``start_batch``)."""
        if self.drop_last:
            return self.num_samples // (self.batch_size * self.num_replicas)
        return len(self._batches())


def make_loader(dataset: Dataset, batch_sampler: Sampler, workers: int = 0, pin_memory: bool = False) -> DataLoader:
    """A DataLoader that never draws from the global torch RNG (it has its own generator) and
    re-creates workers each epoch (so :meth:`set_epoch` on the dataset reaches them)."""
    return DataLoader(
        dataset, batch_sampler=batch_sampler, num_workers=workers, pin_memory=pin_memory,
        generator=torch.Generator(), persistent_workers=False,
    )
