"""The probe's running sums: per layer, the summed similarity map and streaming per-image SSDC moments.

:class:`Accumulator` is the hook target of :func:`~timm_posgeom.probes.probe_ssdc`: it turns each probed
layer's tokens (B, N, C) into unit vectors, their cosine maps (B, N, N), and keeps only running sums, so
memory does not grow with the number of images (docs/method.md#similarity-maps-and-probe-sites).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import torch

from ...errors import DataError, IntervalWarning
from ...interventions.draws import draw_permutations
from ...measuring.settings import sums_budget_error
from ...results.intervals import image_groups
from ..streaming import StopForward
from .result import PerImageStats
from .spearman import distance_ranks, grid_positions, ssdc_pairs, upper_pairs

# the jackknife's (G, M) float64 group sums of every probed layer: past this (a 112 x 112 map's 20 sums take
# 12.6 GB), the groups are summed into one and the interval over images is NaN, said in a warning
MAX_GROUP_BYTES = 4 * 2**30
MAX_GRID_TOKENS = 128 * 128  # a larger map's pairs (> 134M) and their ranks need tens of GB: refused, not OOM-killed
_DEFER_BYTES = 256 * 2**20  # per batch, the pairs of all layers kept for one SSDC call after the forward


def _gram_pairs(z: torch.Tensor, out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Each image's map z z^T from its unit tokens z (B, N, C): its pairs i < j (B, M), row-major (into ``out``
    when given), and its diagonal (B, N)."""
    sim = torch.bmm(z, z.transpose(1, 2))  # (B, N, N) cosine similarity per image
    return upper_pairs(sim, out=out), sim.diagonal(dim1=1, dim2=2)


class Moments:
    """Streaming count / mean / sum of squared deviations of per-image values (Chan et al. merge)."""

    def __init__(self) -> None:
        self.n, self.mean, self.m2, self.n_nan = 0, 0.0, 0.0, 0

    def update(self, values: torch.Tensor) -> None:
        """values: (B,) float64; NaN entries (constant maps) are counted apart."""
        nan = torch.isnan(values)
        n_nan = int(nan.sum())
        if n_nan:
            values = values[~nan]
        self.n_nan += n_nan
        nb = values.numel()
        if nb == 0:
            return
        mb = float(values.mean())
        m2b = float((values - mb).square().sum())
        tot = self.n + nb
        delta = mb - self.mean
        self.mean += delta * nb / tot
        self.m2 += m2b + delta * delta * self.n * nb / tot
        self.n = tot

    def stats(self) -> PerImageStats:
        return PerImageStats.from_moments(self.n, self.mean, self.m2, self.n_nan)

    def state(self) -> tuple[int, float, float, int]:
        """(n, mean, m2, n_nan): what another process needs to :meth:`merge` these moments."""
        return self.n, self.mean, self.m2, self.n_nan

    def merge(self, state: tuple[int, float, float, int]) -> None:
        """Add another stream's moments (:meth:`state`): Chan et al.'s pairwise merge, as in :meth:`update`
        (n and n_nan summed exactly; into empty moments the other's are copied as they are)."""
        nb, mb, m2b, n_nan = state
        self.n_nan += int(n_nan)
        if nb == 0:
            return
        if self.n == 0:
            self.n, self.mean, self.m2 = int(nb), float(mb), float(m2b)
            return
        tot = self.n + nb
        delta = mb - self.mean
        self.mean += delta * nb / tot
        self.m2 += m2b + delta * delta * self.n * nb / tot
        self.n = tot


class Accumulator:
    """Hook target: turns the tokens of each probed layer into running sums.

    Each layer has its own token grid (one grid for every block of a flat ViT; one per stage of a
    hierarchical model or CNN), fixed across batches when the mean map is wanted.

    Replicas: under RPI, K permutations (``permutations``, (K, N)) each give their own sums; a forward pass
    carries R of them as R equal chunks of its batch (the same images R times, chunk r permuted by replica
    ``replicas[r]``, :meth:`start_batch`). Without RPI there is one replica, and its summed map is kept per
    jackknife group of images (``groups``; group of image i from (``group_seed``, i)): the interval of the
    mean map's SSDC over images (:func:`~timm_posgeom.results.intervals.jackknife_interval`). ``map_sum[layer]`` is
    (pairs (S, M), diagonal (S, N)) float64 with slot ``replica * G + group`` (G = max(groups, 1)).
    """

    def __init__(
        self,
        layers: list[int],
        reduction: str,
        distance: str,
        num_prefix_tokens: int = 0,
        *,
        permutation_seeds: list[int] | None = None,
        groups: int = 0,
        group_seed: int = 0,
    ) -> None:
        self.layers, self.distance, self.num_prefix_tokens = layers, distance, num_prefix_tokens
        self.want_map = reduction in ("mean_map", "both")
        self.want_images = reduction in ("per_image", "both")
        self.permutation_seeds = permutation_seeds  # under RPI, the K permutations' seeds; else None
        self.permutations: dict[int, torch.Tensor] = {}  # token count N -> the (K, N) permutations drawn
        self.num_replicas = 1 if permutation_seeds is None else len(permutation_seeds)
        self.groups = groups if permutation_seeds is None and self.want_map else 0
        self.dropped_groups: str | None = None  # why the jackknife's groups were given up (_fit_groups)
        self.group_seed = group_seed
        self.group_counts = torch.zeros(max(self.groups, 1), dtype=torch.int64)
        self.last_layer = max(layers)
        self.grid: tuple[int, int] | None = None  # the image's patch grid (flat ViTs) for this batch
        self.grids: dict[int, tuple[int, int]] = {}  # each layer's grid (the first batch's, for the mean map)
        self.map_sum: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.index_moments = {(layer, k): Moments() for layer in layers for k in range(self.num_replicas)}
        self.content_moments = {(layer, k): Moments() for layer in layers for k in range(self.num_replicas)}
        self._replicas: list[int] = [0]  # the replicas of this forward pass, one per chunk of its batch
        self._group_ids: torch.Tensor | None = None  # (B,) jackknife group of each image of the batch
        self._onehot: torch.Tensor | None = None  # (G, B) float32 one-hot of _group_ids, on the tokens' device
        self._pairs: dict[tuple[int, int], torch.Tensor] = {}  # per grid: (L, R * B, M) this batch's pairs i < j
        self._batch: dict[tuple[int, int], list[int]] = {}  # per grid: the layers whose pairs wait in _pairs
        self.too_small: set[int] = set()  # layers whose grid has fewer than 2 tokens: SSDC undefined
        self.nonfinite: dict[tuple[int, int], int] = {}  # (layer, replica) -> images whose tokens are not finite

    @property
    def slots(self) -> int:
        return self.num_replicas * max(self.groups, 1)

    def start_batch(
        self, grid: tuple[int, int] | None = None, replicas: list[int] | None = None, offset: int = 0, batch: int = 0
    ) -> None:
        """A new forward pass of ``batch`` images (the first at index ``offset`` in the data), stacked once
        per replica of ``replicas`` (default [0]); ``grid`` is the image's patch grid where one grid serves
        every layer (flat ViTs)."""
        if grid is not None and not self.grids:  # a flat ViT's first batch: every layer's sums, before the forward
            self._check_budget(grid[0] * grid[1], len(self.layers))
        self.grid = grid
        self._batch = {}
        self._replicas = list(replicas) if replicas is not None else [0]
        self._group_ids = self._onehot = None
        if self.groups:
            ids = image_groups(np.arange(offset, offset + batch), self.group_seed, self.groups)
            self._group_ids = torch.from_numpy(ids)
            if self._replicas == [0]:
                self.group_counts += torch.bincount(self._group_ids, minlength=self.groups)

    def permutations_for(self, n: int) -> torch.Tensor:
        """(K, n): the K permutations of ``n`` tokens (drawn from the seeds the first time, then kept)."""
        if self.permutation_seeds is None:
            raise RuntimeError("permutations asked of an accumulator without RPI (no permutation seeds)")
        if n not in self.permutations:
            self.permutations[n] = draw_permutations(n, self.permutation_seeds)
        return self.permutations[n]

    def content_defined(self, grid: tuple[int, int]) -> bool:
        """Under RPI, whether a layer with this grid has a content grid: its tokens are the permuted patch
        slots themselves (same count), not pooled or merged from several of them (later stages)."""
        return grid[0] * grid[1] in self.permutations

    def distance_targets(self, grid: tuple[int, int], replica: int, device: torch.device) -> list:
        """[the index grid's centred distance ranks, and under RPI the content grid's of ``replica``]."""
        targets = [distance_ranks(grid, self.distance, None, device)]
        if self.content_defined(grid):
            positions = grid_positions(grid)[self.permutations[grid[0] * grid[1]][replica].cpu()]
            targets.append(distance_ranks(grid, self.distance, positions, device))
        return targets

    def patch_tokens(self, layer: int, tokens: torch.Tensor) -> torch.Tensor:
        """(B, T, C) or (B, H, W, C) -> the (B, N, C) patch tokens of the batch's grid, prefix tokens dropped."""
        H, W = self._batch_grid()
        n = H * W
        if tokens.ndim == 4:
            tokens = tokens.reshape(tokens.shape[0], -1, tokens.shape[-1])
        if tokens.ndim != 3:
            raise ValueError(f"layer {layer}: expected (B, T, C) tokens, got shape {tuple(tokens.shape)}")
        prefix = tokens.shape[1] - n
        if prefix not in (0, self.num_prefix_tokens):
            raise ValueError(
                f"layer {layer} carries {tokens.shape[1]} tokens but the {H}x{W} patch grid has {n} (+ "
                f"{self.num_prefix_tokens} prefix tokens): the model changes its token count between blocks; "
                "probe it per stage with site='stage_output'"
            )
        return tokens[:, prefix:]

    def __call__(self, layer: int, tokens: torch.Tensor) -> None:
        """Hook callback of a flat ViT: ``tokens`` (R * B, T, C) on the batch's patch grid."""
        self.add(layer, self.patch_tokens(layer, tokens), self._batch_grid())
        if layer == self.last_layer:
            raise StopForward

    def _batch_grid(self) -> tuple[int, int]:
        """The batch's patch grid (flat ViTs), as :meth:`start_batch` was given it."""
        if self.grid is None:
            raise RuntimeError("tokens of a flat ViT's block before start_batch gave the batch's patch grid")
        return self.grid

    def add_feature_map(self, layer: int, fmap: torch.Tensor) -> None:
        """A stage's (R * B, C, H, W) feature map: its H x W positions are the tokens, on their own grid."""
        if fmap.ndim != 4:
            raise ValueError(f"stage {layer}: expected a (B, C, H, W) feature map, got shape {tuple(fmap.shape)}")
        self.add(layer, fmap.flatten(2).transpose(1, 2), (int(fmap.shape[2]), int(fmap.shape[3])))

    def add(self, layer: int, patches: torch.Tensor, grid: tuple[int, int]) -> None:
        """Add one layer's (R * B, N, C) tokens on ``grid`` (N = H * W) to the running sums (chunk r of the
        batch to replica ``replicas[r]``)."""
        n = self._check_grid(layer, grid)  # tokens on the layer's grid
        if n < 2:  # no pair i < j (a 1 x 1 last stage of a CNN on small images): NaN, said in _finish
            self.too_small.add(layer)
            return
        # unit tokens, as F.normalize makes them (the same operations), with their norms kept: a token holds a
        # non-finite value only where its norm is not finite, so the (R * B, N) norms are checked, not every value
        # (that check was 4% of a ViT-S/16 forward); a non-finite norm of finite values (squares past float32's
        # range) is told apart on those images alone
        tokens = patches.float()
        norms = torch.linalg.vector_norm(tokens, dim=-1, keepdim=True)  # (R * B, N, 1)
        bad = ~torch.isfinite(norms).flatten(1).all(dim=1)  # (R * B,) images whose tokens are not all finite
        if bad.any():
            bad[bad.clone()] = ~torch.isfinite(patches[bad]).flatten(1).all(dim=1)  # in their own dtype
        if bad.any():  # their SSDC is NaN, never one of NaN maps ranked (probe._finish blanks the layer)
            for replica, chunk in zip(self._replicas, bad.chunk(len(self._replicas))):
                self.nonfinite[(layer, replica)] = self.nonfinite.get((layer, replica), 0) + int(chunk.sum())
        if self.groups and layer not in self.map_sum:
            self._fit_groups(n)
        z = tokens / norms.clamp_min(1e-12).expand_as(tokens)  # (R * B, N, C): F.normalize(tokens, dim=-1)
        if self.want_images or (self.groups and z.shape[0] * n * n * z.element_size() <= _DEFER_BYTES):
            # each image's cosine similarity map as its pairs i < j (R * B, M) and diagonal (R * B, N)
            pairs, diag = self._per_image(layer, z, grid) if self.want_images else _gram_pairs(z)
            if self.want_map:
                # summed in float64: a float32 sum adds columns in different orders, so a constant map came
                # out varying by a rounding step, and Spearman ranked that noise (a number where NaN is right)
                self._add_images(layer, pairs, diag)
            return
        # the summed map of each replica (and of each jackknife group where a batch's per-image maps would
        # exceed _DEFER_BYTES: 20 GB for a 112 x 112 map at batch 32) in one GEMM: sum_b z_b z_b^T = Z Z^T with
        # Z = (N, b * C) the images side by side. (Per group it is slower than the per-image maps and their
        # one-hot GEMM above: 7.0 vs 4.3 ms a ViT-S/16 layer at batch 32, one GEMM for all 3.9 ms.)
        for replica, chunk in zip(self._replicas, z.chunk(len(self._replicas))):
            for slot, members in self._slots_of(replica, chunk.shape[0]):
                part = chunk if members is None else chunk[members]
                flat = part.transpose(0, 1).reshape(part.shape[1], -1)
                total = flat @ flat.T  # (N, N)
                self._add_slot(layer, slot, upper_pairs(total), total.diagonal())

    def _check_grid(self, layer: int, grid: tuple[int, int]) -> int:
        """The tokens on ``layer``'s ``grid``; ValueError for a grid that changed between batches (mean map),
        one too large for a similarity map, or (a stage's own grid, first seen) running sums past the budget."""
        known = self.grids.setdefault(layer, grid)
        if known != grid and self.want_map:
            raise DataError(
                f"the token grid of layer {layer} changed from {known} to {grid} between batches: the "
                "mean map needs one image size (resize the data, or use reduction='per_image')"
            )
        n = grid[0] * grid[1]
        if n > MAX_GRID_TOKENS:
            raise DataError(
                f"layer {layer}'s grid {grid[0]}x{grid[1]} has {n:,} tokens, more than the "
                f"{MAX_GRID_TOKENS:,} a similarity map is built for (its pairs and their ranks would need "
                "tens of GB): probe the other layers (layers=...) or smaller images"
            )
        if self.grid is None and n >= 2 and layer not in self.map_sum:  # a stage's own grid: before its sums
            self._check_budget(n, 1)
        return n

    def _check_budget(self, n: int, layers: int) -> None:
        """Under RPI, refuse (ValueError naming the count that fits) a number of permutations whose running sums
        would pass :data:`~timm_posgeom.measuring.MEMORY_BUDGET_BYTES`: the sums already held, and for ``layers``
        more layers of ``n`` tokens each permutation's summed map (pairs and diagonal, float64) and its
        permutation of the tokens (int64)."""
        if self.permutation_seeds is None:
            return
        held = sum(p.numel() + d.numel() for p, d in self.map_sum.values()) * 8
        each = (layers * (n * (n - 1) // 2 + n) * 8 if self.want_map else 0) + n * 8 + held // self.num_replicas
        error = sums_budget_error("probe_ssdc", self.num_replicas, each)
        if error is not None:
            raise error

    def _slots_of(self, replica: int, batch: int) -> list[tuple[int, torch.Tensor | None]]:
        """[(slot, the batch's images of that slot, None for all)]: one slot per replica, or per jackknife group
        present in the batch."""
        if self._group_ids is None:
            return [(replica, None)]
        ids = self._group_ids[:batch]
        return [(replica * self.groups + int(g), (ids == g).nonzero().squeeze(1)) for g in torch.unique(ids)]

    def _fit_groups(self, n: int) -> None:
        """Keep the jackknife's group sums only while every probed layer's (G, M) float64 sums fit in
        ``MAX_GROUP_BYTES`` (``n`` tokens on this layer's grid); past that, the groups summed into one and the
        interval over images given up (NaN, with a warning), never an out-of-memory kill."""
        held = sum(p.numel() + d.numel() for p, d in self.map_sum.values()) * 8
        need = held + self.slots * (n * (n - 1) // 2 + n) * 8
        if need <= MAX_GROUP_BYTES:
            return
        self.dropped_groups = (
            f"the {self.groups} jackknife group sums of the mean maps would take {need / 2**30:.1f} GiB "
            f"(a {n:,}-token map), more than the {MAX_GROUP_BYTES / 2**30:.0f} GiB kept for them"
        )
        warnings.warn(f"no interval over images: {self.dropped_groups}", IntervalWarning, stacklevel=2)
        for layer, sums in self.map_sum.items():  # the layers already summed: their groups added up, exactly
            self.map_sum[layer] = tuple(t.reshape(self.num_replicas, self.groups, -1).sum(1) for t in sums)  # type: ignore[assignment]
        self.groups, self._group_ids = 0, None

    def _per_image(self, layer: int, z: torch.Tensor, grid: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-image SSDC of ``layer``'s maps, from its unit tokens z (R * B, N, C): their pairs i < j are kept
        for :meth:`end_batch` when those of every probed layer of the batch fit in ``_DEFER_BYTES``, else
        computed now. Returns the maps' pairs (R * B, M) and diagonals (R * B, N)."""
        B, n = z.shape[0], z.shape[1]
        shape = (len(self.layers), B, n * (n - 1) // 2)
        if math.prod(shape) * z.element_size() > _DEFER_BYTES:
            pairs, diag = _gram_pairs(z)
            self._score(layer, pairs, grid)
            return pairs, diag
        buffer = self._pairs.get(grid)
        if buffer is None or buffer.shape != shape or buffer.device != z.device:
            buffer = self._pairs[grid] = torch.empty(shape, dtype=z.dtype, device=z.device)
        waiting = self._batch.setdefault(grid, [])
        waiting.append(layer)
        return _gram_pairs(z, out=buffer[len(waiting) - 1])

    def end_batch(self) -> None:
        """Per-image SSDC of every probed layer of the batch kept by :meth:`_per_image`, one call per grid and
        replica after the batch's forward pass.

        Deferred on purpose: between two layers the CPU's OpenMP threads of the forward still spin
        (up to milliseconds after each parallel op) and would halve the speed of the sort-bound SSDC;
        one call per batch also spreads L * B maps over the thread pool at once.
        """
        for grid, waiting in self._batch.items():
            _, RB, M = self._pairs[grid].shape
            L, R = len(waiting), len(self._replicas)
            B = RB // R
            for r, replica in enumerate(self._replicas):
                pairs = self._pairs[grid][:L, r * B : (r + 1) * B].reshape(L * B, M)
                rhos = ssdc_pairs(pairs, self.distance_targets(grid, replica, pairs.device))
                for k, layer in enumerate(waiting):
                    self._update(layer, replica, [rho[k * B : (k + 1) * B] for rho in rhos])
        self._batch = {}

    def _score(self, layer: int, pairs: torch.Tensor, grid: tuple[int, int]) -> None:
        """Per-image SSDC of one layer's pairs (R * B, M) now (maps too large to defer)."""
        B = pairs.shape[0] // len(self._replicas)
        for r, replica in enumerate(self._replicas):
            chunk = pairs[r * B : (r + 1) * B]
            self._update(layer, replica, ssdc_pairs(chunk, self.distance_targets(grid, replica, chunk.device)))

    def _update(self, layer: int, replica: int, rhos: list[torch.Tensor]) -> None:
        """Add one batch's per-image SSDC of ``layer`` under ``replica``: against the index grid, and the
        content grid."""
        self.index_moments[(layer, replica)].update(rhos[0])
        if len(rhos) > 1:
            self.content_moments[(layer, replica)].update(rhos[1])

    def _add_images(self, layer: int, pairs: torch.Tensor, diag: torch.Tensor) -> None:
        """Add the per-image pairs (R * B, M) and diagonals (R * B, N): each chunk to its replica, each image
        to its jackknife group."""
        chunks = len(self._replicas)
        for replica, p, d in zip(self._replicas, pairs.chunk(chunks), diag.chunk(chunks)):
            if self._group_ids is None:
                self._add_slot(layer, replica, p.sum(0, dtype=torch.float64), d.sum(0, dtype=torch.float64))
                continue
            # this batch's sum per group as one small GEMM with the (G, B) one-hot of the groups (torch's
            # index_add_ on the CPU took 50 ms a layer for ViT-S/16's 32 x 19,110 pairs, a sixth of the layer's
            # forward), added to the float64 sums: at most a batch of float32 values is summed in float32
            onehot = self._group_onehot(p)
            group_pairs, group_diag = onehot @ p, onehot @ d
            if layer not in self.map_sum and self.slots == self.groups:  # the first batch's sums are these
                self.map_sum[layer] = (group_pairs.double(), group_diag.double())
                continue
            sums = self._sums(layer, p.shape[1], d.shape[1], p.device)
            rows = slice(replica * self.groups, (replica + 1) * self.groups)
            sums[0][rows] += group_pairs
            sums[1][rows] += group_diag

    def _group_onehot(self, like: torch.Tensor) -> torch.Tensor:
        """(G, B): the batch's images one-hot by jackknife group, in ``like``'s dtype and device (made once a
        batch, for every layer)."""
        ids = self._group_ids
        assert ids is not None
        if self._onehot is None or self._onehot.dtype != like.dtype or self._onehot.device != like.device:
            self._onehot = torch.zeros(self.groups, ids.numel(), dtype=like.dtype, device=like.device)
            self._onehot[ids.to(like.device), torch.arange(ids.numel(), device=like.device)] = 1.0
        return self._onehot[:, : like.shape[0]]

    def _sums(self, layer: int, m: int, n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if layer not in self.map_sum:
            self.map_sum[layer] = (
                torch.zeros(self.slots, m, dtype=torch.float64, device=device),
                torch.zeros(self.slots, n, dtype=torch.float64, device=device),
            )
        return self.map_sum[layer]

    def _add_slot(self, layer: int, replica: int, pair_sum: torch.Tensor, diag_sum: torch.Tensor) -> None:
        """Accumulate (in float64) one replica's summed similarities: pairs i < j (M,) and diagonal (N,)."""
        sums = self._sums(layer, pair_sum.numel(), diag_sum.numel(), pair_sum.device)
        sums[0][replica].add_(pair_sum)
        sums[1][replica].add_(diag_sum)

    def nonfinite_layers(self) -> tuple[list[int], int]:
        """(the layers whose tokens were not finite in some image, the most such images of one replica)."""
        return sorted({layer for layer, _ in self.nonfinite}), max(self.nonfinite.values(), default=0)

    def replica_pairs(self, layer: int) -> torch.Tensor:
        """(K, M) float64: each replica's summed pairs (its groups added up)."""
        pairs = self.map_sum[layer][0]
        return pairs.reshape(self.num_replicas, max(self.groups, 1), -1).sum(1)

    def mean_map(
        self, layer: int, n_images: int, replica: int = 0, pair_sum: torch.Tensor | None = None
    ) -> torch.Tensor:
        """(N, N) float32: ``replica``'s similarity map averaged over the images (in float64, then rounded),
        rebuilt symmetric (a grid of fewer than 2 tokens: its N x N map of NaN, nothing having been summed).
        ``pair_sum``: the (K, M) :meth:`replica_pairs` when the caller has them."""
        if layer in self.too_small:
            n = self.grids[layer][0] * self.grids[layer][1]
            return torch.full((n, n), math.nan)
        groups = max(self.groups, 1)
        pairs = (self.replica_pairs(layer) if pair_sum is None else pair_sum)[replica]
        diag_sum = self.map_sum[layer][1].reshape(self.num_replicas, groups, -1).sum(1)[replica]
        n = diag_sum.numel()
        iu = torch.triu_indices(n, n, offset=1, device=pairs.device)
        full = torch.diag((diag_sum / n_images).float())
        mean = (pairs / n_images).float()
        full[iu[0], iu[1]] = mean
        full[iu[1], iu[0]] = mean
        return full
