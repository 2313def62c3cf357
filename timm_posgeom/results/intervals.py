"""95% intervals of the probes' numbers: over replicates (RPI permutations) and over images (a jackknife).

* :func:`t_interval`: K replicates of a quantity (one per RPI permutation) -> their mean and the Student t
  95% interval of that mean (K - 1 degrees of freedom); NaN where fewer than 2 replicates are finite: one
  replicate gives no interval, never one of zero width.
* :func:`jackknife_interval`: a statistic of the image-mean map (SSDC is a rank correlation of that mean,
  not a mean itself) -> the 95% interval of the delete-a-group jackknife over G random groups of images
  (Busing, Meijer and van der Leeden 1999, groups of unequal size weighted), Student t with G - 1 degrees of
  freedom, centred on the statistic itself.
* :func:`image_groups`: the jackknife group of each image, from (seed, its index in the data), so that the
  groups never depend on batching, workers or processes.

Definitions and why these: docs/method.md#intervals. Nothing here imports torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ..measuring.seeding import index_hash

__all__ = ["t_interval", "jackknife_interval", "image_groups", "t_quantile"]

_GROUP_SALT = 0x4A4B  # "JK"


def t_quantile(df: int, level: float = 0.95) -> float:
    """The two-sided ``level`` quantile of Student's t with ``df`` degrees of freedom (NaN for df < 1)."""
    if df < 1:
        return math.nan
    # scipy.special's inverse of Student's t CDF: the same number as scipy.stats.t.ppf (tests/test_intervals.py),
    # without importing scipy.stats (0.6 s more in every process that computes an interval: each training and
    # command)
    from scipy.special import stdtrit

    return float(stdtrit(df, 0.5 + level / 2))


def t_interval(replicates: np.ndarray | Sequence, axis: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(mean, low, high) over ``axis`` of ``replicates`` (NaN entries left out, per column).

    The interval is mean -+ t(0.975, k - 1) * s / sqrt(k), with k the finite replicates and s their sample
    std (ddof 1); NaN where k < 2 (the mean is NaN where k = 0)."""
    values = np.moveaxis(np.asarray(replicates, dtype=float), axis, 0)
    finite = np.isfinite(values)
    k = finite.sum(0)
    filled = np.where(finite, values, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(k > 0, filled.sum(0) / np.maximum(k, 1), np.nan)
        dev = np.where(finite, values - mean, 0.0)
        std = np.sqrt((dev**2).sum(0) / np.maximum(k - 1, 1))
        quant = np.vectorize(lambda df: t_quantile(int(df)), otypes=[float])(k - 1) if k.size else k.astype(float)
        half = quant * std / np.sqrt(np.maximum(k, 1))
        half = np.where(k >= 2, half, np.nan)
    return mean, mean - half, mean + half


def jackknife_interval(
    full: np.ndarray | float, deleted: np.ndarray | Sequence, sizes: np.ndarray | Sequence[int]
) -> tuple[np.ndarray, np.ndarray]:
    """(low, high): the delete-a-group jackknife 95% interval of a statistic.

    Args:
        full: the statistic on all the images, shape S (any).
        deleted: (G, *S) the statistic with group g's images left out.
        sizes: (G,) the images in each group (groups without images are ignored).

    With n = sum n_g, h_g = n / n_g: pseudo-values p_g = h_g full - (h_g - 1) deleted_g, theta_J =
    G full - sum_g (1 - n_g / n) deleted_g, variance = (1 / G) sum_g (p_g - theta_J)^2 / (h_g - 1) (equal
    groups: the usual (G - 1) / G sum (deleted_g - mean)^2). The interval is full -+ t(0.975, G - 1)
    sqrt(variance); NaN with fewer than 2 non-empty groups, or where ``full`` or a deleted value is NaN.
    """
    full = np.asarray(full, dtype=float)
    deleted = np.asarray(deleted, dtype=float)
    sizes = np.asarray(sizes, dtype=float)
    keep = sizes > 0
    deleted, sizes = deleted[keep], sizes[keep]
    g = len(sizes)
    if g < 2:
        nan = np.full(full.shape, np.nan)
        return nan, nan.copy()
    n = sizes.sum()
    shape = (g,) + (1,) * full.ndim
    h = (n / sizes).reshape(shape)
    pseudo = h * full - (h - 1) * deleted
    theta_j = g * full - ((1 - sizes / n).reshape(shape) * deleted).sum(0)
    var = ((pseudo - theta_j) ** 2 / (h - 1)).sum(0) / g
    half = t_quantile(g - 1) * np.sqrt(var)
    return full - half, full + half


def image_groups(indices: np.ndarray | Sequence[int], seed: int, groups: int) -> np.ndarray:
    """(B,) int64: the jackknife group (0 .. groups - 1) of each image index, a well-mixed hash of (seed,
    index): random groups of about equal size, the same whatever the batching."""
    return (index_hash(seed, indices, _GROUP_SALT) % np.uint64(groups)).astype(np.int64)
