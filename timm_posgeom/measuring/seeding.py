"""Seeds made of (a seed, an image's index in the data): what makes a random choice per image reproducible and
independent of batching, workers and processes (the RPI permutation of an image, its jackknife group)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["index_hash"]

_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def index_hash(seed: int, indices: np.ndarray | Sequence[int], salt: int) -> np.ndarray:
    """A well-mixed 64-bit value per index (uint64): SplitMix64 of (seed, salt, index).

    Vectorised and exact (integer arithmetic), so an image's value depends only on ``seed``, ``salt`` and its
    index in the data."""
    idx = np.asarray(indices, dtype=np.uint64)
    base = np.uint64((int(seed) * 0xD1B54A32D192ED03 + int(salt) * 0x8CB92BA72F3D8DD7) & _MASK)
    with np.errstate(over="ignore"):
        z = base + (idx + np.uint64(1)) * np.uint64(_GOLDEN)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))
