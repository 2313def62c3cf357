"""SSDC: spatial structure of a token-similarity map, as a rank correlation with grid distance.

Definition (the paper's; docs/method.md#ssdc): for a similarity map S (N x N) over N patch tokens laid out
row-major on an H x W grid, and D the grid distance between token positions,

    SSDC(S) = spearman({S_ij}, {-D_ij})  over the M = N (N - 1) / 2 pairs i < j,

with tie-averaged ranks exactly as ``scipy.stats.spearmanr`` (Pearson correlation of the average
ranks). Only the upper triangle of S is read.

How it is fast: the distance vector depends only on the grid, so its centred ranks are computed once
and cached. The ranks of S come from one sort per map, vectorised over the batch. On CPU, float32
maps are widened to float64 whose spare low mantissa bits carry a payload (the distance rank of the
pair, or its index when several distance vectors share the sort), so one values-only SIMD sort
(numpy) yields the order, the tie groups and the distance ranks in sorted order at once; rows are
processed in chunks of bounded size over a small thread pool. On other devices ``torch.sort`` is used.
Ties among similarities are averaged exactly; Spearman is then a dot product with the distance ranks.
"""

from __future__ import annotations

import functools
import math
import threading
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from ...errors import SettingError

__all__ = ["ssdc", "DISTANCES", "FLAT_RTOL", "ConstantMapWarning", "grid_positions", "pair_distances", "rankdata"]

DISTANCES = ("manhattan", "euclidean", "chebyshev")


class ConstantMapWarning(RuntimeWarning):
    """A similarity map (or the distance vector) is constant over the pairs i < j: SSDC is NaN."""


# --------------------------------------------------------------------------------------------
# ranks
# --------------------------------------------------------------------------------------------
def _average_ranks_sorted(sorted_vals: torch.Tensor) -> torch.Tensor:
    """Tie-averaged 1-based ranks at each sorted position.

    sorted_vals: (B, M), each row ascending (any dtype with ``!=``). Returns (B, M) float64: the rank
    that ``scipy.stats.rankdata(method='average')`` gives the element at that sorted position.
    """
    B, M = sorted_vals.shape
    pos = torch.arange(M, device=sorted_vals.device).expand(B, M)
    change = sorted_vals[:, 1:] != sorted_vals[:, :-1]  # (B, M - 1): a new tie group starts at k + 1
    if bool(change.all()):
        return (pos + 1).to(torch.float64)
    ones = torch.ones(B, 1, dtype=torch.bool, device=sorted_vals.device)
    first = torch.cat([ones, change], dim=1)  # position k opens a group
    last = torch.cat([change, ones], dim=1)  # position k closes a group
    start = torch.where(first, pos, torch.zeros_like(pos)).cummax(dim=1).values
    end = torch.where(last, pos, torch.full_like(pos, M - 1)).flip(1).cummin(dim=1).values.flip(1)
    return (start + end).to(torch.float64) / 2 + 1


def rankdata(values: torch.Tensor) -> torch.Tensor:
    """Tie-averaged ranks along the last axis, like ``scipy.stats.rankdata(x, axis=-1)``.

    values: (..., M) real tensor. Returns float64 ranks in 1..M of the same shape.
    """
    flat = values.reshape(-1, values.shape[-1])
    sorted_vals, order = torch.sort(flat, dim=1, stable=True)
    ranks = torch.empty(flat.shape, dtype=torch.float64, device=flat.device)
    ranks.scatter_(1, order, _average_ranks_sorted(sorted_vals))
    return ranks.reshape(values.shape)


_INDEX_BITS = 29  # float32 -> float64 leaves 29 zero mantissa bits: room for the pair index
_PAYLOAD_LIMIT = 2 ** (_INDEX_BITS - 1)  # payloads below half a float32 ulp: a key rounds back to its float32
_PAIRS_PER_CHUNK = 320_000  # 16 rows of 19,110 pairs (14 x 14 grids): measured best on 2 cores (8, 32: slower)


def _rows_per_chunk(M: int) -> int:
    """Rows per CPU work item: about _PAIRS_PER_CHUNK pairs (1 row for grids of 24 x 24 and up), so a
    worker's scratch arrays stay bounded (21 bytes per pair: under 7 MB) whatever the grid."""
    return max(1, _PAIRS_PER_CHUNK // max(M, 1))


_BUFFERS = threading.local()  # per worker thread: the chunk's scratch arrays, reused across calls


def _scratch(b: int, M: int) -> tuple[np.ndarray, ...]:
    """(b, M) float32 pairs, (b, M) float64 keys, (b, M - 1) bool and (b, M) float64 scratch.

    Reused per thread: arrays of a few MB would otherwise be mapped and page-faulted on every chunk.
    """
    bufs = getattr(_BUFFERS, "arrays", None)
    if bufs is None or bufs[0].shape[1] != M or bufs[0].shape[0] < b:
        bufs = (
            np.empty((b, M), np.float32),
            np.empty((b, M), np.float64),
            np.empty((b, max(M - 1, 0)), bool),
            np.empty((b, M), np.float64),
        )
        _BUFFERS.arrays = bufs
    return tuple(x[:b] for x in bufs)


@functools.lru_cache(maxsize=16)
def _ordinal(M: int) -> tuple[np.ndarray, np.ndarray]:
    """Read-only (M,) int64 pair indices 0..M-1 and (M,) float64 ordinal ranks 1..M minus their mean."""
    index = np.arange(M, dtype=np.int64)
    centred = np.arange(1, M + 1, dtype=np.float64) - (M + 1) / 2
    index.flags.writeable = centred.flags.writeable = False
    return index, centred


def _rank_payload(d: np.ndarray) -> np.ndarray | None:
    """(M,) int64 payload 2 d + M of centred tie-averaged ranks d (half-integers in [-M/2, M/2]), or None
    when that does not fit the spare key bits or ``d`` is not such a rank vector."""
    M = d.shape[0]
    if 2 * M >= _PAYLOAD_LIMIT:
        return None
    exact = 2 * d + M
    payload = np.rint(exact)
    if payload.min() < 0 or payload.max() > 2 * M or not np.array_equal(payload, exact):
        return None
    return payload.astype(np.int64)


def _spearman_chunk_np(
    vals: np.ndarray, targets: list[np.ndarray], pair_index: np.ndarray | None = None, payload: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Spearman numerators and rank norms of a few rows on CPU.

    vals: (b, M) float32 or float64, or with ``pair_index`` (M,) whole maps (b, N * N) whose entries
    ``pair_index`` (the pairs i < j) are read here, inside the worker, while the chunk is in cache.
    targets: centred distance ranks, each (M,) float64. payload: optional :func:`_rank_payload` of the
    single target.
    Returns nums (T, b) = sum_k (rank_k - mean) d_k, norms (b,) = |rank - mean|, where rank is
    the tie-averaged rank of row b's k-th pair, and the rows without a ranking (b,) bool: holding a NaN, or
    constant up to float rounding (:func:`_flat_rows`).

    float32 rows are sorted as float64 keys whose 29 spare low mantissa bits carry a payload below
    2^28: the keys sort as the floats do (equal floats stay adjacent), so one values-only SIMD sort
    gives the order, and rounding the sorted keys back to float32 gives the tie groups. With one
    target the payload is that target's rank itself (2 d + M), so the numerator is a dot product of
    the sorted payloads with the ordinal ranks, no gather; otherwise it is the pair index, and each
    target is gathered through it. Ranks are ordinal first; ties, a few per row, are then corrected
    sparsely: an element of a tie group spanning sorted positions s..e gets
    (s + e) / 2 + 1 instead of its position + 1, and the squared norm loses (t^3 - t) / 12 per group of
    size t. Every pass writes into per-thread scratch arrays.
    """
    b = vals.shape[0]
    M = vals.shape[1] if pair_index is None else pair_index.shape[0]
    if vals.dtype == np.float32 and M < _PAYLOAD_LIMIT:
        pairs, keys, equal_next, sorted_d = _scratch(b, M)
        if pair_index is not None:
            vals = np.take(vals, pair_index, axis=1, out=pairs, mode="clip")
        np.add(vals, 0.0, out=keys)  # widen; -0.0 + 0.0 = +0.0, so equal floats have equal bits
        bits = keys.view(np.int64)
        index, centred = _ordinal(M)
        np.bitwise_or(bits, index if payload is None else payload, out=bits)
        keys.sort(axis=1)
        # +-inf and NaN turn into NaN keys (inf with payload bits is a NaN), which sort last; -inf with
        # payload 0 stays first. A finite chunk therefore has finite first and last columns.
        if not (np.isfinite(keys[:, 0]).all() and np.isfinite(keys[:, -1]).all()):
            return _spearman_chunk_generic(
                vals, targets
            )  # reads vals (this thread's scratch) before anything reuses it
        # back to float32 (vals is not read again): rounding to nearest drops the payload, which is
        # below half a float32 ulp, so each sorted key gives back exactly its float
        np.copyto(pairs, keys, casting="same_kind")
        flat = _flat_rows(pairs[:, 0], pairs[:, -1])  # sorted: the spread of each row is last - first
        np.equal(pairs[:, 1:], pairs[:, :-1], out=equal_next)  # (b, M - 1): sorted k and k + 1 are one float
        if payload is not None:  # the sorted payloads are the target's 2 d + M
            np.bitwise_and(bits, (1 << _INDEX_BITS) - 1, out=sorted_d, casting="unsafe")
            nums = (sorted_d @ centred)[None] / 2  # (1, b): sum_k c_k (2 d_k + M) / 2, and sum_k c_k = 0
            nums, norms = _tie_correct(nums, equal_next, lambda r, p: [(sorted_d[r, p] - M) / 2])
        else:  # the sorted payloads are pair indices
            order = np.bitwise_and(bits, (1 << _INDEX_BITS) - 1, out=bits)
            nums = np.stack([np.take(d, order, out=sorted_d, mode="clip") @ centred for d in targets])  # (T, b)
            nums, norms = _tie_correct(nums, equal_next, lambda r, p: [d[order[r, p]] for d in targets])
        return nums, norms, flat
    if pair_index is not None:
        vals = np.take(vals, pair_index, axis=1)
    return _spearman_chunk_generic(vals, targets)


def _spearman_chunk_generic(vals: np.ndarray, targets: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`_spearman_chunk_np` for float64 rows and rows with NaN or +-inf (argsort, no packing)."""
    b, M = vals.shape
    nan_rows = np.isnan(vals).any(axis=1)
    vals = np.where(nan_rows[:, None], 0.0, vals.astype(np.float64))
    order = np.argsort(vals, axis=1)
    sorted_vals = np.take_along_axis(vals, order, 1)
    nan_rows |= _flat_rows(sorted_vals[:, 0], sorted_vals[:, -1])
    equal_next = sorted_vals[:, 1:] == sorted_vals[:, :-1]
    centred = _ordinal(M)[1]
    nums = np.stack([np.take(d, order) @ centred for d in targets])  # (T, b)
    nums, norms = _tie_correct(nums, equal_next, lambda r, p: [d[order[r, p]] for d in targets])
    return nums, norms, nan_rows


# A map whose pairs spread less than this, relative to their largest magnitude, is constant up to float rounding
# (a float32 similarity of unit vectors is exact to ~1e-7): the order of its pairs is rounding noise, not a
# ranking, and its SSDC is NaN, as a constant map's is (scipy's spearmanr gives a number made of that noise).
FLAT_RTOL = 1e-5


def _flat_rows(first: np.ndarray, last: np.ndarray) -> np.ndarray:
    """(b,) bool: rows whose smallest and largest values ``first`` and ``last`` are equal up to float rounding
    (:data:`FLAT_RTOL`); an exactly constant row is flat too."""
    first, last = first.astype(np.float64), last.astype(np.float64)
    with np.errstate(invalid="ignore"):  # inf - inf: a row with infinities is flat only when it is all one value
        close = (last - first) <= FLAT_RTOL * np.maximum(np.abs(first), np.abs(last))
    return (first == last) | (np.isfinite(first) & np.isfinite(last) & close)


def _tie_correct(
    nums: np.ndarray, equal_next: np.ndarray, d_at: Callable[[np.ndarray, np.ndarray], list[np.ndarray]]
) -> tuple[np.ndarray, np.ndarray]:
    """Turn ordinal-rank numerators (T, b) into tie-averaged ones; return them and the rank norms (b,).

    equal_next: (b, M - 1), sorted positions k and k + 1 of a row hold one value. d_at(rows, pos): the T
    targets' values at those sorted positions, each (n,).
    """
    b, M = equal_next.shape[0], equal_next.shape[1] + 1
    norm2 = np.full(b, M * (M * M - 1) / 12)
    rows, pos = np.divmod(np.flatnonzero(equal_next), M - 1)  # sorted positions pos, pos + 1 of row `rows` tie
    if rows.size:
        opens = np.ones(rows.size, dtype=bool)
        opens[1:] = (rows[1:] != rows[:-1]) | (pos[1:] != pos[:-1] + 1)
        closes = np.ones(rows.size, dtype=bool)
        closes[:-1] = opens[1:]
        group = np.cumsum(opens) - 1
        g_row, g_start, g_end = rows[opens], pos[opens], pos[closes] + 1  # tie group: positions start..end
        el_row = np.concatenate([rows, g_row])
        el_pos = np.concatenate([pos, g_end])
        el_group = np.concatenate([group, np.arange(g_row.size)])
        shift = (g_start + g_end)[el_group] / 2 - el_pos  # averaged minus ordinal rank
        for t, d in enumerate(d_at(el_row, el_pos)):
            nums[t] += np.bincount(el_row, weights=shift * d, minlength=b)
        size = (g_end - g_start + 1).astype(np.float64)
        norm2 -= np.bincount(g_row, weights=(size**3 - size) / 12, minlength=b)
    return nums, np.sqrt(np.maximum(norm2, 0.0))


_POOL: ThreadPoolExecutor | None = None


def _pool() -> ThreadPoolExecutor:
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=max(1, torch.get_num_threads()), thread_name_prefix="ssdc")
    return _POOL


def _spearman_torch(pairs: torch.Tensor, targets: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """Device-agnostic twin of :func:`_spearman_chunk_np` (used off CPU): torch.sort + dense tie averaging.

    pairs: (B, M); targets: centred distance ranks (M,) float64 on the same device.
    Returns nums (T, B), norms (B,), rows without a ranking (B,) bool (a NaN, or constant up to rounding).
    """
    M = pairs.shape[1]
    nan_rows = torch.isnan(pairs).any(dim=1)  # (B,)
    pairs = torch.where(nan_rows[:, None], torch.zeros_like(pairs), pairs)
    sorted_vals, order = torch.sort(pairs, dim=1)
    first, last = sorted_vals[:, 0].double(), sorted_vals[:, -1].double()
    close = (last - first) <= FLAT_RTOL * torch.maximum(first.abs(), last.abs())
    flat = (first == last) | (first.isfinite() & last.isfinite() & close)  # as _flat_rows
    centred = _average_ranks_sorted(sorted_vals) - (M + 1) / 2  # (B, M) float64
    nums = torch.stack([(centred * d[order]).sum(dim=1) for d in targets])
    norms = centred.square().sum(dim=1).sqrt()
    return nums, norms, nan_rows | flat


def _spearman_rows(values: torch.Tensor, targets: Sequence[tuple[torch.Tensor, float]]) -> list[torch.Tensor]:
    """Spearman correlation of each pair vector with each target (centred ranks (M,), norm).

    values: (B, M) pair vectors, or (B, N, N) maps whose pairs i < j are used. Returns one (B,)
    float64 tensor per target on the input's device; NaN for rows that are constant (up to float rounding:
    :data:`FLAT_RTOL`) or hold a NaN. CPU: numpy, in chunks of rows (cache-sized) over a thread pool (numpy
    releases the GIL); maps are read pair by pair inside each chunk, so the (B, M) copy never exists. Other
    devices: torch.sort.
    """
    B = values.shape[0]
    if B == 0:
        return [torch.empty(0, dtype=torch.float64, device=values.device) for _ in targets]
    if values.device.type == "cpu":
        vals = values.detach()
        if vals.dtype not in (torch.float32, torch.float64):
            vals = vals.float()
        pair_index = None
        if vals.ndim == 3:
            pair_index = _upper_pairs(vals.shape[-1], "cpu").numpy()
            vals = vals.reshape(B, -1)
        vals_np = vals.contiguous().numpy()
        d_np = [d.cpu().numpy() for d, _ in targets]
        payload = _rank_payload(d_np[0]) if len(d_np) == 1 and vals_np.dtype == np.float32 else None
        rows = _rows_per_chunk(d_np[0].shape[0])
        chunks = [vals_np[i : i + rows] for i in range(0, B, rows)]
        if len(chunks) > 1 and torch.get_num_threads() > 1:
            parts = list(_pool().map(lambda c: _spearman_chunk_np(c, d_np, pair_index, payload), chunks))
        else:
            parts = [_spearman_chunk_np(c, d_np, pair_index, payload) for c in chunks]
        nums = torch.from_numpy(np.concatenate([p[0] for p in parts], axis=1))  # (T, B)
        norms = torch.from_numpy(np.concatenate([p[1] for p in parts]))  # (B,)
        nan_rows = torch.from_numpy(np.concatenate([p[2] for p in parts]))  # (B,)
    else:
        pairs = upper_pairs(values) if values.ndim == 3 else values
        nums, norms, nan_rows = _spearman_torch(pairs, [d for d, _ in targets])
    out = []
    for t, (_, d_norm) in enumerate(targets):
        rho = (nums[t] / (norms * d_norm)).clamp(-1.0, 1.0)
        bad = nan_rows | (norms == 0)
        out.append(torch.where(bad, torch.full_like(rho, math.nan), rho))
    return out


# --------------------------------------------------------------------------------------------
# distances
# --------------------------------------------------------------------------------------------
def grid_positions(grid_size: Sequence[int]) -> torch.Tensor:
    """(H*W, 2) float64 (row, col) coordinates of the tokens of an H x W grid, row-major."""
    H, W = (int(s) for s in grid_size)
    rows, cols = torch.meshgrid(torch.arange(H), torch.arange(W), indexing="ij")
    return torch.stack([rows.reshape(-1), cols.reshape(-1)], dim=1).to(torch.float64)


@functools.lru_cache(maxsize=64)
def _upper_pairs(n: int, device: str) -> torch.Tensor:
    """Flat indices i * N + j of the pairs i < j, row-major (M,) int64."""
    with torch.inference_mode(False):  # cached: must stay an ordinary tensor whatever the caller's mode
        iu = torch.triu_indices(n, n, offset=1)
        return (iu[0] * n + iu[1]).to(device)


def pair_distances(positions: torch.Tensor, distance: str = "manhattan") -> torch.Tensor:
    """Distances D_ij over the pairs i < j (row-major upper triangle).

    positions: (N, 2) coordinates. Returns (M,) float64 with M = N (N - 1) / 2.
    """
    if distance not in DISTANCES:
        raise SettingError(f"unknown distance {distance!r}; expected one of {', '.join(DISTANCES)}")
    pos = positions.to(torch.float64)
    diff = (pos[:, None, :] - pos[None, :, :]).abs()  # (N, N, 2)
    if distance == "manhattan":
        dist = diff.sum(-1)
    elif distance == "euclidean":
        dist = diff.square().sum(-1).sqrt()
    else:
        dist = diff.amax(-1)
    return dist.reshape(-1)[_upper_pairs(pos.shape[0], "cpu")]


@functools.lru_cache(maxsize=64)
def _distance_ranks_cached(key: tuple, distance: str, device: str) -> tuple[torch.Tensor, float]:
    kind, payload = key
    with torch.inference_mode(False):  # cached: must stay an ordinary tensor whatever the caller's mode
        positions = grid_positions(payload) if kind == "grid" else torch.tensor(payload, dtype=torch.float64)
        ranks = rankdata(-pair_distances(positions, distance))
        centred = ranks - ranks.mean()
        return centred.to(device), float(centred.square().sum().sqrt())


def distance_ranks(
    grid_size: Sequence[int], distance: str, positions: torch.Tensor | None, device: torch.device
) -> tuple[torch.Tensor, float]:
    """Centred tie-averaged ranks of {-D_ij} (M,) float64 on ``device`` and their norm (cached)."""
    key: tuple[str, tuple[Any, ...]]
    if positions is None:
        key = ("grid", tuple(int(s) for s in grid_size))
    else:
        key = ("positions", tuple(tuple(p) for p in positions.detach().to("cpu", torch.float64).tolist()))
    return _distance_ranks_cached(key, distance, str(device))


# --------------------------------------------------------------------------------------------
# public metric
# --------------------------------------------------------------------------------------------
def _check_args(shape: torch.Size, grid_size, distance: str, positions) -> tuple[int, int]:
    if distance not in DISTANCES:
        raise SettingError(f"unknown distance {distance!r}; expected one of {', '.join(DISTANCES)}")
    if len(shape) not in (2, 3) or shape[-1] != shape[-2]:
        raise ValueError(f"similarity must be (N, N) or (B, N, N), got shape {tuple(shape)}")
    try:
        H, W = (int(s) for s in grid_size)
    except (TypeError, ValueError):
        raise ValueError(f"grid_size must be (H, W), got {grid_size!r}") from None
    n = shape[-1]
    if n < 2:
        raise ValueError(f"SSDC needs at least 2 tokens (one pair i < j), got a {n} x {n} map")
    if positions is not None:
        if tuple(positions.shape) != (n, 2):
            raise ValueError(f"positions must be ({n}, 2) for {n} tokens, got {tuple(positions.shape)}")
    elif H * W != n:
        raise ValueError(f"grid_size {(H, W)} has {H * W} positions but the similarity map has {n} tokens")
    return H, W


def ssdc_pairs(pairs: torch.Tensor, d_centred_list: Sequence[tuple[torch.Tensor, float]]) -> list[torch.Tensor]:
    """SSDC of a batch of pair vectors (or maps) against one or more centred distance-rank vectors.

    pairs: (B, M) similarities over the pairs i < j, or (B, N, N) maps (only i < j is read).
    Returns one (B,) float64 tensor per entry of ``d_centred_list`` (NaN for rows constant up to float
    rounding or with a NaN; +-inf rank as extremes, as in scipy). Shares one sort across the entries.
    """
    return _spearman_rows(pairs, d_centred_list)


def upper_pairs(similarity: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """(..., N, N) -> (..., M): the entries i < j, row-major (written into ``out`` when given)."""
    n = similarity.shape[-1]
    flat = similarity.reshape(*similarity.shape[:-2], n * n)
    return torch.index_select(flat, -1, _upper_pairs(n, str(similarity.device)), out=out)


def ssdc(
    similarity: torch.Tensor,
    grid_size: Sequence[int],
    distance: str = "manhattan",
    positions: torch.Tensor | None = None,
) -> torch.Tensor:
    """Spatial-structure / distance correlation (SSDC) of one similarity map or a batch of maps.

    SSDC = Spearman correlation between {S_ij} and {-D_ij} over the pairs i < j, with tie-averaged
    ranks (identical to ``scipy.stats.spearmanr`` on those two vectors). D is the grid distance
    between token positions: tokens are laid out row-major on ``grid_size`` = (H, W), or at
    ``positions`` when given (e.g. where each token's content came from under RPI).

    Args:
        similarity: (N, N) or (B, N, N) real tensor, float32 or float64, any device. Only the upper
            triangle (i < j) is read.
        grid_size: (H, W) with H * W = N (ignored for the distances when ``positions`` is given).
        distance: ``manhattan`` (L1, the paper's), ``euclidean`` or ``chebyshev``.
        positions: optional (N, 2) (row, col) coordinates of each token.

    Returns:
        A 0-d tensor for one map, (B,) for a batch, in the input's floating dtype (float32 for
        integer input) on its device. NaN (with a :class:`ConstantMapWarning`) for a map that is
        constant over the pairs up to float rounding (they spread less than :data:`FLAT_RTOL` of their
        largest magnitude: scipy would rank the rounding noise), and NaN for a map with a NaN entry, like
        scipy; +-inf entries rank as the largest / smallest values, as in scipy (a finite result).
    """
    if not isinstance(similarity, torch.Tensor):
        similarity = torch.as_tensor(similarity)
    if positions is not None and not isinstance(positions, torch.Tensor):
        positions = torch.as_tensor(positions)
    _check_args(similarity.shape, grid_size, distance, positions)
    single = similarity.ndim == 2
    maps = similarity[None] if single else similarity
    out_dtype = similarity.dtype if similarity.is_floating_point() else torch.float32
    if not maps.is_floating_point():
        maps = maps.to(torch.float64)
    if maps.shape[0] == 0:
        return torch.empty(0, dtype=out_dtype, device=similarity.device)
    d_centred, d_norm = distance_ranks(grid_size, distance, positions, maps.device)
    if d_norm == 0:
        warnings.warn(
            "the grid distance is constant over the pairs i < j: SSDC is undefined (NaN)",
            ConstantMapWarning,
            stacklevel=2,
        )
    (rho,) = ssdc_pairs(maps, [(d_centred, d_norm)])
    if d_norm > 0:
        _warn_constant(rho, maps)
    rho = rho.to(out_dtype)
    return rho[0] if single else rho


def _warn_constant(rho: torch.Tensor, maps: torch.Tensor) -> None:
    nan = torch.isnan(rho)
    if bool(nan.any()):
        n_nan = int(nan.sum())
        warnings.warn(
            f"{n_nan} of {rho.numel()} similarity maps are constant over the pairs i < j (up to float "
            "rounding) or not finite: their SSDC is NaN",
            ConstantMapWarning,
            stacklevel=3,
        )
