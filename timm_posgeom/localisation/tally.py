"""Running sums of the localisation measures: per variant of a forward pass (clean, under RPI, patched,
ablated, ...), the summed similarity map of the last block's patch tokens and the top-1 hits, per random
group of images, so that every number gets its delete-a-group jackknife interval over images
(docs/method.md#intervals) and the difference of two variants on the same images too.

A variant is any hashable key. SSDC is that of the image-mean map (the paper's reduction) against the patch
grid, the maps being in content order (:func:`~timm_posgeom.localisation.tracing.similarity_sum`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..probes.ssdc_probe.spearman import ssdc
from ..results.intervals import image_groups, jackknife_interval

__all__ = ["Tally", "Estimate"]


@dataclass
class Estimate:
    """One number and its 95% interval: ``value`` on every image, ``deleted`` (G,) with each group left out."""

    value: float
    deleted: np.ndarray

    def combine(self, other: Estimate, op: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> Estimate:
        """``op(self, other)`` on the full values and on every left-out group (a paired statistic)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return Estimate(float(op(np.float64(self.value), np.float64(other.value))), op(self.deleted, other.deleted))


class Tally:
    """Summed maps, image counts and top-1 hits per variant and image group (``groups`` random groups from
    (``seed``, the image's index); 1 group: no interval over images)."""

    def __init__(self, grid: tuple[int, int], groups: int, seed: int) -> None:
        self.grid, self.groups, self.seed = grid, groups, seed
        n = grid[0] * grid[1]
        self.maps: dict[Hashable, torch.Tensor] = {}
        self.hits: dict[Hashable, np.ndarray] = {}
        self.counts = np.zeros(groups, dtype=np.int64)
        self.labelled = True
        self._n = n

    def group_of(self, offset: int, batch: int) -> torch.Tensor:
        """(B,) the group of each image of a batch whose first image has index ``offset`` in the data."""
        if self.groups == 1:
            return torch.zeros(batch, dtype=torch.long)
        return torch.as_tensor(image_groups(np.arange(offset, offset + batch), self.seed, self.groups))

    def count(self, groups: torch.Tensor, labelled: bool) -> None:
        """Count a batch's images once (whatever number of variants it is run under)."""
        self.counts += np.bincount(groups.numpy(), minlength=self.groups)
        self.labelled = self.labelled and labelled

    def add(self, key: Hashable, maps: torch.Tensor, right: torch.Tensor | None, groups: torch.Tensor) -> None:
        """Add a batch of one variant: per-image maps (B, N, N) float64 or their group sums, per-image hits (B,)
        (None without labels), each image's group (B,)."""
        summed = torch.zeros(self.groups, self._n, self._n, dtype=torch.float64)
        summed.index_add_(0, groups, maps)
        self.maps[key] = self.maps[key] + summed if key in self.maps else summed
        if right is not None:
            got = np.bincount(groups.numpy(), weights=right.numpy().astype(float), minlength=self.groups)
            self.hits[key] = self.hits.get(key, 0) + got

    def ssdc(self, keys: Sequence[Hashable]) -> dict[Hashable, Estimate]:
        """SSDC of each variant's mean map, on all the images and with each group left out (NaN for a group
        without images or with all of them: leaving it out leaves no replicate)."""
        n = int(self.counts.sum())
        left_out = [g for g in range(self.groups) if 0 < self.counts[g] < n] if self.groups > 1 else []
        rest = torch.as_tensor(n - self.counts[left_out], dtype=torch.float64).reshape(-1, 1, 1)
        rows = []
        for k in keys:
            total = self.maps[k].sum(0)
            rows += [total[None] / max(n, 1), (total[None] - self.maps[k][left_out]) / rest]
        rho = ssdc(torch.cat(rows), self.grid).numpy().reshape(len(keys), 1 + len(left_out))
        out = {}
        for k, r in zip(keys, rho):
            deleted = np.full(self.groups, math.nan)
            deleted[left_out] = r[1:]
            out[k] = Estimate(float(r[0]), deleted)
        return out

    def top1(self, keys: Sequence[Hashable]) -> dict[Hashable, Estimate]:
        """Top-1 of each variant, on all the images and with each group left out; NaN without labels."""
        n, counts = self.counts.sum(), self.counts
        out = {}
        for k in keys:
            if not self.labelled or k not in self.hits:
                out[k] = Estimate(math.nan, np.full(self.groups, math.nan))
                continue
            h = self.hits[k]
            with np.errstate(invalid="ignore", divide="ignore"):
                out[k] = Estimate(float(h.sum() / n), np.where(counts < n, (h.sum() - h) / (n - counts), math.nan))
        return out

    def interval(self, estimate: Estimate) -> tuple[float, float]:
        """The delete-a-group jackknife 95% interval of ``estimate`` (NaN with one group)."""
        if self.groups < 2:
            return math.nan, math.nan
        low, high = jackknife_interval(estimate.value, estimate.deleted, self.counts)
        return float(low), float(high)
