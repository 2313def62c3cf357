"""The linear position probe and linear CKA (docs/attention.md#position-probe, #cka): against direct
computations, and the behaviours that make them useful (a model without PE under RPI is at chance)."""

from __future__ import annotations

import numpy as np
import pytest
import timm
import torch

import timm_posgeom  # noqa: F401  (registers the models)
from timm_posgeom import cka, position_probe
from timm_posgeom.probes.cka import hsic, minibatch_cka
from timm_posgeom.probes.sites import find_sites

MICRO = "posgeom_vit_micro_patch8_64_{}"


@pytest.fixture(scope="module")
def images() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(24, 3, 64, 64, generator=g), torch.randn(16, 3, 64, 64, generator=g)


def _model(pe: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return timm.create_model(MICRO.format(pe), num_classes=10).eval()


def _tokens(model: torch.nn.Module, x: torch.Tensor, layer: int) -> torch.Tensor:
    """The (B, N, C) patch tokens at the attention input of block ``layer``, read directly."""
    sites = find_sites(model)
    got = []
    handles = sites.register("attn_input", [layer], lambda i, t: got.append(t[:, sites.num_prefix_tokens :].clone()))
    with torch.no_grad():
        model(x)
    for h in handles:
        h.remove()
    return got[0]


@pytest.mark.slow
def test_position_probe_equals_a_direct_least_squares_fit(images):
    train, test = images
    model = _model("sincos")
    result = position_probe(model, train, test, layers=[0, 2], ridge=1e-3, batch_size=8, progress=False)
    for row, layer in enumerate(result.layers):
        fit = _tokens(model, train, layer)
        fit = fit.reshape(-1, fit.shape[-1]).double()
        X = torch.cat([fit, torch.ones(len(fit), 1, dtype=fit.dtype)], 1)
        k = torch.arange(64).repeat(len(train))
        Y = torch.cat([torch.nn.functional.one_hot(k // 8, 8), torch.nn.functional.one_hot(k % 8, 8)], 1).double()
        A = X.T @ X
        penalty = torch.eye(len(A), dtype=A.dtype) * 1e-3 * A.diagonal()[:-1].mean()
        penalty[-1, -1] = 0
        W = torch.linalg.solve(A + penalty, X.T @ Y)
        score = _tokens(model, test, layer)
        score = score.reshape(-1, score.shape[-1]).double()
        scores = torch.cat([score, torch.ones(len(score), 1, dtype=score.dtype)], 1) @ W
        k = torch.arange(64).repeat(len(test))
        rows_ok, cols_ok = scores[:, :8].argmax(1) == k // 8, scores[:, 8:].argmax(1) == k % 8
        assert result.row_accuracy[row] == pytest.approx(rows_ok.double().mean().item(), abs=1e-12)
        assert result.col_accuracy[row] == pytest.approx(cols_ok.double().mean().item(), abs=1e-12)
        assert result.accuracy[row] == pytest.approx((rows_ok & cols_ok).double().mean().item(), abs=1e-12)
    assert result.chance == {"row": 1 / 8, "col": 1 / 8, "both": 1 / 64}


def test_position_probe_reads_a_pe_and_falls_to_chance_without_one_under_rpi(images):
    train, test = images
    sincos = position_probe(_model("sincos"), train, test, rpi=True, layers=[0, 3], batch_size=8, progress=False)
    assert (sincos.accuracy > 20 * sincos.chance["both"]).all()  # the fixed PE is read, whatever the content
    nope = position_probe(_model("nope"), train, test, rpi=True, layers=[0, 3], batch_size=8, progress=False)
    assert (np.abs(nope.accuracy - nope.chance["both"]) < 0.02).all()  # equivariant: nothing to read
    assert (np.abs(nope.row_accuracy - nope.chance["row"]) < 0.05).all()


def test_hsic_and_cka_against_their_definitions():
    g = torch.Generator().manual_seed(1)
    X = torch.randn(30, 50, generator=g, dtype=torch.float64)
    Y = X @ torch.randn(50, 20, generator=g, dtype=torch.float64) + 0.5 * torch.randn(
        30, 20, generator=g, dtype=torch.float64
    )
    Xc, Yc = X - X.mean(0), Y - Y.mean(0)
    kornblith = ((Yc.T @ Xc).norm() ** 2 / ((Xc.T @ Xc).norm() * (Yc.T @ Yc).norm())).item()
    assert minibatch_cka([X @ X.T], [Y @ Y.T], unbiased=False) == pytest.approx(kornblith, abs=1e-12)
    # invariant to a rotation and a scale of one side; a representation with itself is 1
    Q, _ = torch.linalg.qr(torch.randn(50, 50, generator=g, dtype=torch.float64))
    Z = 3.0 * X @ Q
    grams = [X[i : i + 10] @ X[i : i + 10].T for i in (0, 10, 20)]
    rotated = [Z[i : i + 10] @ Z[i : i + 10].T for i in (0, 10, 20)]
    assert minibatch_cka(grams, rotated) == pytest.approx(1.0, abs=1e-12)
    # unbiased HSIC: its closed form against the explicit sum over distinct index tuples (n = 5)
    K, L = X[:5] @ X[:5].T, Y[:5] @ Y[:5].T
    n = 5
    idx = [
        (i, j, q, r) for i in range(n) for j in range(n) for q in range(n) for r in range(n) if len({i, j, q, r}) == 4
    ]
    h = lambda a, b, c, d: K[a, b] * L[a, b] + K[a, b] * L[c, d] - 2 * K[a, b] * L[a, c]  # noqa: E731
    explicit = sum(h(*t) for t in idx) / len(idx)
    assert hsic(K, L).item() == pytest.approx(explicit.item(), rel=1e-9)
    with pytest.raises(ValueError, match="at least 4 images"):
        hsic(K[:3, :3], L[:3, :3])


def test_cka_of_a_model_with_itself_is_one_on_the_diagonal(images):
    train, _ = images
    model = _model("ape")
    result = cka(model, model, train, batch_size=8, progress=False)
    assert result.matrix.shape == (4, 4)
    assert np.allclose(np.diag(result.matrix), 1.0, atol=1e-9)
    assert np.allclose(result.matrix, result.matrix.T, atol=1e-9)
    other = cka(model, _model("nope"), train, layers_a=[0], layers_b=[0], batch_size=8, progress=False)
    assert 0 < other.matrix[0, 0] < 1
