"""The permutations of the RPI protocol, drawn reproducibly (docs/method.md#rpi-and-rpt).

* :func:`draw_permutations`: K shared permutations, permutation k from the seed ``seed + k`` (the same
  draw as ``token_permutation(model, seed=seed + k)``): what SSDC and the attention measures under RPI
  average over.
* :func:`image_permutations`: one permutation per image, from a seed made of (``seed``, the image's index in
  the data): what accuracy under RPI and the position probe use. An image's permutation depends on nothing
  but the seed and its index, never on the batch size, the workers or the number of processes.

Nothing here applies a permutation: :func:`~timm_posgeom.interventions.token_permutation` does.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from ..errors import SettingError
from ..measuring.seeding import index_hash

__all__ = ["permutation_seeds", "draw_permutations", "image_permutations"]

_IMAGE_SALT = 0x525049  # "RPI"


def permutation_seeds(seed: int, count: int, start: int = 0) -> list[int]:
    """The seeds of ``count`` shared permutations: ``seed + start + k`` for k = 0 .. count - 1.

    ``start`` skips the seeds another part of one measurement used (the alpha sweep draws fresh ones for
    each alpha: alpha j starts at ``j * count``)."""
    if count < 1:
        raise SettingError(f"the number of RPI permutations must be >= 1, got {count}")
    return [int(seed) + int(start) + k for k in range(int(count))]


def draw_permutations(n: int, seeds: Sequence[int]) -> torch.Tensor:
    """(K, n) int64: permutation k of ``n`` tokens drawn by ``torch.randperm`` from a CPU generator seeded
    with ``seeds[k]`` (slot i then holds the content of patch p[k, i])."""
    return torch.stack([torch.randperm(n, generator=torch.Generator().manual_seed(int(s))) for s in seeds])


def image_permutations(n: int, seed: int, indices: np.ndarray | Sequence[int]) -> torch.Tensor:
    """(B, n) int64: a permutation of ``n`` tokens for each image index, from a CPU generator seeded with
    :func:`~timm_posgeom.measuring.seeding.index_hash` of (``seed``, the index)."""
    seeds = index_hash(seed, indices, _IMAGE_SALT) >> np.uint64(1)  # below 2**63: a valid generator seed
    if len(seeds) == 0:
        return torch.zeros(0, n, dtype=torch.long)
    return torch.stack([torch.randperm(n, generator=torch.Generator().manual_seed(int(s))) for s in seeds])
