"""The SSDC metric against scipy.stats.spearmanr (ties, grids, distances, dtypes, batches)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from scipy.stats import rankdata as scipy_rankdata
from scipy.stats import spearmanr

from timm_posgeom.probes import ConstantMapWarning, grid_positions, pair_distances, rankdata, ssdc
from timm_posgeom.probes.ssdc_probe import spearman


def _reference(sim: np.ndarray, positions: np.ndarray, distance: str) -> float:
    """Direct formula: scipy Spearman of {S_ij} and {-D_ij} over i < j, distances from scratch."""
    n = sim.shape[0]
    i, j = np.triu_indices(n, 1)
    diff = np.abs(positions[i] - positions[j])
    d = {"manhattan": diff.sum(1), "euclidean": np.sqrt((diff**2).sum(1)), "chebyshev": diff.max(1)}[distance]
    return spearmanr(sim[i, j], -d).statistic


def _grid(h: int, w: int) -> np.ndarray:
    return np.stack(np.meshgrid(np.arange(h), np.arange(w), indexing="ij"), -1).reshape(-1, 2).astype(float)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("distance", ["manhattan", "euclidean", "chebyshev"])
@pytest.mark.parametrize("grid", [(4, 4), (3, 5), (1, 6), (14, 14)])
def test_matches_scipy(dtype, distance, grid):
    gen = torch.Generator().manual_seed(100 * grid[0] + grid[1] + len(distance))
    n = grid[0] * grid[1]
    maps = torch.randn(4, n, n, generator=gen, dtype=torch.float64)
    maps = maps + maps.transpose(1, 2)
    maps[1] = torch.round(maps[1] * 2) / 2  # heavy ties
    maps[2] = torch.round(maps[2] * 50) / 50  # some ties
    maps[3, 0, 1], maps[3, 0, 2] = -0.0, 0.0  # signed zeros tie
    maps = maps.to(dtype)
    got = ssdc(maps, grid, distance)
    assert got.shape == (4,) and got.dtype == dtype
    ref = [_reference(m.double().numpy(), _grid(*grid), distance) for m in maps]
    np.testing.assert_allclose(got.double().numpy(), ref, atol=1e-6, rtol=0)
    # one map at a time gives the same (0-d) values
    single = torch.stack([ssdc(m, grid, distance) for m in maps])
    np.testing.assert_allclose(single.double().numpy(), ref, atol=1e-6, rtol=0)
    assert ssdc(maps[0], grid, distance).ndim == 0


def test_positions_override_matches_scipy():
    gen = torch.Generator().manual_seed(1)
    maps = torch.rand(3, 12, 12, generator=gen)
    positions = torch.randint(0, 5, (12, 2), generator=gen).float()  # repeated positions: ties in D
    for distance in ("manhattan", "euclidean", "chebyshev"):
        got = ssdc(maps, (3, 4), distance, positions=positions)
        ref = [_reference(m.double().numpy(), positions.double().numpy(), distance) for m in maps]
        np.testing.assert_allclose(got.double().numpy(), ref, atol=1e-6)


def test_permuted_positions_equal_unpermuted_map():
    gen = torch.Generator().manual_seed(2)
    sim = torch.rand(20, 20, generator=gen, dtype=torch.float64)
    sim = sim + sim.T
    perm = torch.randperm(20, generator=gen)
    permuted = sim[perm][:, perm]  # slot i holds token perm[i]
    got = ssdc(permuted, (4, 5), positions=grid_positions((4, 5))[perm])
    assert torch.allclose(got, ssdc(sim, (4, 5)), atol=1e-12)


def test_perfect_structure_and_reverse():
    d = pair_distances(grid_positions((5, 5)), "manhattan")
    n = 25
    sim = torch.zeros(n, n, dtype=torch.float64)
    iu = torch.triu_indices(n, n, 1)
    sim[iu[0], iu[1]] = -d
    assert ssdc(sim, (5, 5)).item() == pytest.approx(1.0)
    sim[iu[0], iu[1]] = d
    assert ssdc(sim, (5, 5)).item() == pytest.approx(-1.0)


def test_rankdata_matches_scipy():
    x = torch.tensor([[3.0, 1.0, 3.0, 2.0, 1.0, 3.0], [0.0, -0.0, 1.0, 1.0, 1.0, -2.0]])
    np.testing.assert_allclose(rankdata(x).numpy(), scipy_rankdata(x.numpy(), axis=1))


def test_constant_map_nan_with_warning():
    maps = torch.rand(3, 9, 9)
    maps[1] = 0.5
    with pytest.warns(ConstantMapWarning):
        got = ssdc(maps, (3, 3))
    assert torch.isnan(got[1]) and not torch.isnan(got[[0, 2]]).any()
    maps[2, 0, 1] = float("nan")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConstantMapWarning)
        assert torch.isnan(ssdc(maps, (3, 3))[2])


def test_infinite_entries_match_scipy():
    """+-inf are ordinary extreme values for scipy; chunks holding them take the unpacked path."""
    gen = torch.Generator().manual_seed(7)
    maps = torch.randn(20, 16, 16, generator=gen)  # float32: more than one chunk of rows
    maps[3, 0, 5] = float("inf")
    maps[3, 2, 9] = float("inf")
    maps[12, 0, 1] = float("-inf")  # sorts first: index 0 of its row
    maps[17, 4, 6] = float("-inf")
    got = ssdc(maps, (4, 4))
    want = [_reference(m, _grid(4, 4), "manhattan") for m in maps.double().numpy()]
    np.testing.assert_allclose(got.double().numpy(), want, atol=1e-6)


def test_neighbouring_floats_and_subnormals_match_scipy():
    """Values one float32 ulp apart stay distinct, equal ones tie, subnormals and zeros keep their order; a whole
    map of two values one ulp apart is constant up to float rounding: NaN, where scipy ranks the rounding."""
    gen = torch.Generator().manual_seed(9)
    maps = torch.randn(4, 16, 16, generator=gen)
    v = torch.tensor(0.3)
    up = torch.nextafter(v, torch.tensor(1.0))
    maps[0, 0, 1:6] = torch.stack([v, up, v, up, torch.nextafter(up, torch.tensor(1.0))])
    maps[1, 0, 1:7] = torch.tensor([1.4e-45, 2.9e-45, -1.4e-45, 0.0, -0.0, 1e-40])  # float32 subnormals
    maps[2] = torch.where(maps[2] > 0, v, up)  # two values one ulp apart
    maps[3, 2, 3:9] = -v
    maps[3, 4, 5:9] = torch.nextafter(-v, torch.tensor(0.0))
    with pytest.warns(ConstantMapWarning, match="1 of 4 similarity maps are constant"):
        got = ssdc(maps, (4, 4))
    want = [_reference(m, _grid(4, 4), "manhattan") for m in maps.double().numpy()]
    assert np.isfinite(want[2]) and np.isnan(got[2].item())
    keep = [0, 1, 3]
    np.testing.assert_allclose(got.double().numpy()[keep], np.array(want)[keep], atol=1e-6)


def test_two_targets_share_one_sort():
    """Grid and content targets in one call (the probe under RPI): pair-index keys, ties included."""
    module = spearman
    gen = torch.Generator().manual_seed(8)
    maps = torch.randn(12, 16, 16, generator=gen)
    maps[1] = torch.round(maps[1] * 2) / 2  # heavy ties
    maps[5, 0, 1], maps[5, 0, 2] = -0.0, 0.0
    positions = _grid(4, 4)[torch.randperm(16, generator=gen).numpy()]
    targets = [
        module.distance_ranks((4, 4), "manhattan", None, torch.device("cpu")),
        module.distance_ranks((4, 4), "manhattan", torch.from_numpy(positions), torch.device("cpu")),
    ]
    on_grid, on_positions = module.ssdc_pairs(maps, targets)
    for got, pos in ((on_grid, _grid(4, 4)), (on_positions, positions)):
        want = [_reference(m, pos, "manhattan") for m in maps.double().numpy()]
        np.testing.assert_allclose(got.numpy(), want, atol=1e-6)


def test_large_grid_matches_scipy():
    """600 tokens: 179,700 pairs per map, one map per work item."""
    gen = torch.Generator().manual_seed(3)
    z = torch.nn.functional.normalize(torch.randn(3, 600, 32, generator=gen), dim=-1)
    maps = z @ z.transpose(1, 2)
    got = ssdc(maps, (25, 24))
    want = [_reference(m, _grid(25, 24), "manhattan") for m in maps.double().numpy()]
    np.testing.assert_allclose(got.double().numpy(), want, atol=1e-6)


def test_bad_arguments():
    with pytest.raises(ValueError, match="distance"):
        ssdc(torch.rand(4, 4), (2, 2), "cosine")
    with pytest.raises(ValueError, match="at least 2 tokens"):
        ssdc(torch.rand(3, 1, 1), (1, 1))
    with pytest.raises(ValueError, match="positions"):
        ssdc(torch.rand(6, 6), (2, 3), positions=torch.rand(5, 2))
    with pytest.raises(ValueError, match="grid_size"):
        ssdc(torch.rand(6, 6), (2, 2))
    with pytest.raises(ValueError, match=r"\(N, N\)"):
        ssdc(torch.rand(6, 5), (2, 3))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gpu_matches_cpu(dtype):
    gen = torch.Generator().manual_seed(3)
    maps = torch.randn(8, 49, 49, generator=gen).to(dtype)
    maps[1] = torch.round(maps[1])
    got = ssdc(maps.cuda(), (7, 7))
    assert got.device.type == "cuda"
    torch.testing.assert_close(got.cpu(), ssdc(maps, (7, 7)), atol=1e-6, rtol=0)


def test_device_path_matches_scipy_on_cpu():
    """The torch.sort path used off CPU (GPU), exercised on CPU against scipy."""
    module = spearman
    gen = torch.Generator().manual_seed(4)
    maps = torch.randn(3, 20, 20, generator=gen)
    maps[1] = torch.round(maps[1])
    maps[2] = 0.25
    pairs = module.upper_pairs(maps)
    d, d_norm = module.distance_ranks((4, 5), "manhattan", None, torch.device("cpu"))
    nums, norms, nan_rows = module._spearman_torch(pairs, [d])
    rho = nums[0] / (norms * d_norm)
    ref = [_reference(m.double().numpy(), _grid(4, 5), "manhattan") for m in maps[:2]]
    np.testing.assert_allclose(rho[:2].numpy(), ref, atol=1e-9)
    assert norms[2] == 0 and nan_rows.tolist() == [False, False, True]  # the constant row: undefined, flagged
