"""Sampling and loading: :class:`EpochBatchSampler` orders each epoch from ``seed + epoch`` and shards global
batches across processes; :func:`make_loader` never draws from the global RNG."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from ..errors import SettingError

__all__ = ["EpochBatchSampler", "make_loader"]


class EpochBatchSampler(Sampler[list[int]]):
    """Batches of one process's share of each global batch, in an order fixed by ``seed + epoch``.

    The epoch's permutation (or ``range`` without shuffle) is cut into global batches of
    ``batch_size * num_replicas`` items; process ``rank`` gets the ``rank``-th slice of each.
    ``set_epoch(epoch, start_batch)`` selects the epoch and skips its first ``start_batch``
    per-process batches (exact resumption). With ``drop_last=False`` (evaluation) the items are
    instead split into ``num_replicas`` contiguous, disjoint shards that cover the set once.
    """

    def __init__(
        self,
        num_samples: int,
        batch_size: int,
        num_replicas: int = 1,
        rank: int = 0,
        seed: int = 0,
        shuffle: bool = True,
        drop_last: bool = True,
    ):
        if batch_size < 1:
            raise SettingError(f"batch_size must be >= 1, got {batch_size}")
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
            mine = [
                order[i + self.rank * self.batch_size : i + (self.rank + 1) * self.batch_size].tolist()
                for i in range(0, self.num_samples - step + 1, step)
            ]
        else:
            shard = order.tensor_split(self.num_replicas)[self.rank].tolist()
            mine = [shard[i : i + self.batch_size] for i in range(0, len(shard), self.batch_size)]
        return mine

    def __iter__(self) -> Iterator[list[int]]:
        yield from self._batches()[self.start_batch :]

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
        dataset,
        batch_sampler=batch_sampler,
        num_workers=workers,
        pin_memory=pin_memory,
        generator=torch.Generator(),
        persistent_workers=False,
    )
