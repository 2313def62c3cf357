"""A held-out part of a training split: a seeded, class-stratified fraction of its images, set apart for
monitoring training, so that the validation split is read only for the final numbers
(docs/method.md#how-this-implementation-differs-from-the-papers-code).

    train, heldout, record = carve_heldout(split, fraction=0.1, seed=0)

Per class c with n_c images, ``round(fraction * n_c)`` of them (at most n_c - 1: every class keeps a training
image) are drawn without replacement by a generator seeded with ``(seed, c)``, so the draw of one class does not
depend on the others, on the order of the classes, or on the training seed. Both parts keep the split's order.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..errors import PosgeomError
from ..results.fingerprints import fingerprint
from .splits import ImageSplit, SubsetSplit

__all__ = ["HeldoutError", "carve_heldout", "heldout_indices"]


class HeldoutError(PosgeomError, ValueError):
    """A held-out fraction no split can give (outside (0, 1), or one that holds out no image)."""


def heldout_indices(labels: Any, fraction: float, seed: int = 0) -> np.ndarray:
    """The sorted indices (into ``labels``, (N,) ints) of the held-out images: per class, ``round(fraction *
    n_c)`` (half up; at most n_c - 1) drawn by ``numpy.random.default_rng((seed, c))``."""
    if not 0 < fraction < 1:
        raise HeldoutError(f"a held-out fraction must be in (0, 1), got {fraction}")
    labels = np.asarray(labels, dtype=np.int64)
    held: list[np.ndarray] = []
    for c in np.unique(labels):
        members = np.flatnonzero(labels == c)
        k = min(math.floor(fraction * len(members) + 0.5), len(members) - 1)
        if k > 0:
            rng = np.random.default_rng((int(seed), int(c)))
            held.append(rng.permutation(members)[:k])
    return np.sort(np.concatenate(held)) if held else np.zeros(0, dtype=np.int64)


def carve_heldout(split: ImageSplit, fraction: float, seed: int = 0) -> tuple[SubsetSplit, SubsetSplit, dict[str, Any]]:
    """(the training part, the held-out part, the record of the carving) of ``split``.

    The record (JSON-ready): ``fraction``, ``seed``, ``images`` (held out), ``per_class`` (held out per class,
    in class order), ``train_images`` (left to train on) and ``indices_sha1`` (the
    :func:`~timm_posgeom.results.fingerprints.fingerprint` of the held-out indices, comma-separated): what a reader needs to rebuild the split and to check it is the same.
    Raises :class:`HeldoutError` when the fraction holds out no image (too small for the classes' sizes)."""
    held = heldout_indices(split.labels, fraction, seed)
    if not len(held):
        raise HeldoutError(
            f"a held-out fraction of {fraction} holds out no image of this split ({len(split)} images in "
            f"{split.num_classes} classes): raise it, or set it to 0 to monitor on the validation split"
        )
    mask = np.zeros(len(split), dtype=bool)
    mask[held] = True
    counts = np.bincount(np.asarray(split.labels, dtype=np.int64)[held], minlength=split.num_classes)
    record = dict(
        fraction=float(fraction),
        seed=int(seed),
        images=int(len(held)),
        per_class=counts.tolist(),
        train_images=int((~mask).sum()),
        indices_sha1=fingerprint(",".join(map(str, held.tolist()))),
    )
    return SubsetSplit(split, np.flatnonzero(~mask).tolist()), SubsetSplit(split, held.tolist()), record
