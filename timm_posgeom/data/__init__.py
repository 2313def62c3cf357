"""Image-classification data for training and probing: Hub ids, local folders, a synthetic set.

Sources (``load_split``):

* a Hugging Face Hub id, e.g. ``clane9/imagenet-100`` (parquet with ``image`` / ``label`` columns);
* a local folder in the same parquet layout (a Hub data set's files downloaded), or an ImageFolder
  tree (``root/<split>/<class>/<image>``, e.g. ``imagenette2-320``, the fastai archive unpacked);
* ``None`` or ``"synthetic"``: the embedded procedural set of :mod:`timm_posgeom.data.synthetic`.

The image and label columns are found from the features (``datasets.Image`` / ``ClassLabel``) or
their usual names. A split is ``(PIL RGB image, int label)`` per item.

Transforms: ``augment="none"`` resizes straight to ``img_size`` (the paper: no augmentation);
``"crop_flip"`` adds a random crop after reflect padding and a horizontal flip (the CPU pilot);
``"timm"`` is timm's ``create_transform`` training pipeline (RandomResizedCrop, RandAugment, ...).
Evaluation transforms have one owner, :func:`timm_posgeom.data.transforms.eval_transform` (``resize="paper"``
straight to the input size; ``"timm"``: short side to ``size / crop_pct``, centre crop).

For small-resolution CPU runs, :func:`cache_uint8` decodes and resizes a split once into a
``(N, 3, S, S)`` uint8 tensor (optionally kept on disk too), and :class:`CachedTrainDataset`
augments those tensors directly, so training is not bound by JPEG decoding.

Reproducibility: training augmentation draws its randomness from a seed derived from
``(seed, epoch, index)``, never from the process RNG, so it is the same with any number of
workers and after a resume; :class:`EpochBatchSampler` orders each epoch from ``seed + epoch``

Modules: :mod:`.splits` (a split, its subsets and relabelling, image checks, identity), :mod:`.sources`
(:func:`load_split` over the three sources),
:mod:`.heldout` (a held-out part of a training split), :mod:`.folder` (ImageFolder trees), :mod:`.hub` (Hub and parquet
sets, streaming), :mod:`.augment` (training transforms), :mod:`.cache` (the uint8 cache, in memory and on
disk) and :mod:`.sampling` (batch sampler, loader). Every public name is importable from here.
"""

from __future__ import annotations

from .augment import AUGMENTATIONS, TimmAugment, TransformDataset, crop_flip, eval_config, train_transform
from .cache import CachedEvalDataset, CachedSplit, CachedTrainDataset, cache_uint8, default_cache_dir
from .heldout import HeldoutError, carve_heldout, heldout_indices
from .hub import DataSourceError, HubOptions, find_columns
from .sampling import EpochBatchSampler, make_loader
from .sources import load_split, resolve_source
from .splits import (
    BAD_IMAGE_POLICIES,
    SPLIT_ALIASES,
    BadImageError,
    ImageSplit,
    RelabeledSplit,
    SubsetSplit,
    check_images,
    content_fingerprint,
    data_identity,
    identity_change,
    relabel_by_name,
    split_name,
)

__all__ = [
    "AUGMENTATIONS",
    "ImageSplit",
    "RelabeledSplit",
    "relabel_by_name",
    "SubsetSplit",
    "BadImageError",
    "DataSourceError",
    "check_images",
    "BAD_IMAGE_POLICIES",
    "load_split",
    "data_identity",
    "content_fingerprint",
    "identity_change",
    "resolve_source",
    "find_columns",
    "split_name",
    "SPLIT_ALIASES",
    "train_transform",
    "eval_config",
    "crop_flip",
    "CachedSplit",
    "cache_uint8",
    "CachedTrainDataset",
    "CachedEvalDataset",
    "TransformDataset",
    "EpochBatchSampler",
    "make_loader",
    "default_cache_dir",
    "HubOptions",
    "TimmAugment",
    "carve_heldout",
    "heldout_indices",
    "HeldoutError",
]
