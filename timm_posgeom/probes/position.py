"""A linear position probe: can each patch token's (row, col) on the grid be read from the token by a
linear map? The most direct test of "position is recoverable from the tokens" (docs/attention.md#position-probe).

Per probed block: a least-squares linear classifier (one-hot targets, ridge ``ridge``, a bias) maps each
patch token x (C,) to scores for the H rows and the W columns; it is fitted on the tokens of the ``train``
images and scored on those of the ``test`` images: accuracy of the row (argmax of the row scores), of the
column, and of both. Chance is 1/H, 1/W and 1/(HW). The fit is closed form from streamed sums (X^T X and
X^T Y over every token), so it is exact, deterministic and reduces across processes by summing.

Under RPI the targets are the index grid (slot k at (k // W, k % W), where the PE puts it), and every
image has its own permutation, from (seed, its index; the score's seed is the fit's + 1), so fit and score
never share one and no number depends on the batch size: a model without PE is equivariant, its
token at slot k depends on the content of a random patch, and the probe falls to chance; a model whose
PE survives in the tokens is read by it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..errors import SettingError
from .measures import LayerView, Measure, MeasureResult, run_measures

__all__ = ["position_probe", "PositionProbeResult", "fit_position_map", "PositionMap"]


def _features(x: torch.Tensor, view: LayerView) -> torch.Tensor:
    """(B, T, C) tokens -> (B * N, C + 1) float64 patch tokens with a trailing 1 (the bias)."""
    patches = x[:, view.prefix :].reshape(-1, x.shape[-1]).to(torch.float64)
    return torch.cat([patches, patches.new_ones(patches.shape[0], 1)], dim=1)


def _targets(view: LayerView, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Row and column index of every patch slot of a batch, (B * N,) each (row-major slots)."""
    H, W = view.grid
    k = torch.arange(H * W).repeat(batch)
    return k // W, k % W


class _Fit(Measure):
    """Streams X^T X and X^T Y (Y: one-hot row, then one-hot column) per block."""

    names = ()

    def __init__(self, site: str):
        super().__init__()
        self.source = site

    def update(self, x: torch.Tensor, view: LayerView) -> None:
        X = _features(x, view)
        rows, cols = _targets(view, x.shape[0])
        H, W = view.grid
        Y = torch.cat([torch.nn.functional.one_hot(rows, H), torch.nn.functional.one_hot(cols, W)], 1).to(X)
        self.add("xtx", view.layer, X.T @ X)
        self.add("xty", view.layer, X.T @ Y)

    def finish(self, layers: list[int], n_images: int, grid: tuple[int, int]) -> dict[str, np.ndarray]:
        return {}


class _Score(Measure):
    """Counts the test tokens whose row, column, and both are read right by each block's fitted map."""

    names = ("row_accuracy", "col_accuracy", "accuracy")

    def __init__(self, site: str, weights: dict[int, torch.Tensor]):
        super().__init__()
        self.source, self.weights = site, weights

    def update(self, x: torch.Tensor, view: LayerView) -> None:
        X = _features(x, view)
        rows, cols = _targets(view, x.shape[0])
        H, _ = view.grid
        scores = X @ self.weights[view.layer].to(X.device)
        row_ok = scores[:, :H].argmax(1).cpu() == rows
        col_ok = scores[:, H:].argmax(1).cpu() == cols
        counts = torch.stack([row_ok.sum(), col_ok.sum(), (row_ok & col_ok).sum(), torch.tensor(len(rows))])
        self.add("counts", view.layer, counts)

    def finish(self, layers: list[int], n_images: int, grid: tuple[int, int]) -> dict[str, np.ndarray]:
        counts = np.stack([self.sums[("counts", layer)].numpy() for layer in layers])  # (L, 4)
        return {name: counts[:, i] / counts[:, 3] for i, name in enumerate(self.names)}


def _solve(xtx: torch.Tensor, xty: torch.Tensor, ridge: float) -> torch.Tensor:
    """argmin_W ||X W - Y||^2 + ridge * n_dims_scale * ||W||^2 (the bias row not penalised), float64."""
    penalty = torch.eye(xtx.shape[0], dtype=xtx.dtype) * ridge * xtx.diagonal()[:-1].mean()
    penalty[-1, -1] = 0.0
    try:
        return torch.linalg.solve(xtx + penalty, xty)
    except RuntimeError:  # singular (ridge 0 on tokens with a constant dimension), or not finite: no map
        return torch.full_like(xty, math.nan)


@dataclass
class PositionProbeResult:
    """Linear position probe per block (docs/attention.md#position-probe).

    Attributes:
        layers: block indices.
        row_accuracy, col_accuracy, accuracy: (L,) fraction of test patch tokens whose row, column, and
            both, the block's fitted linear map reads right.
        chance: {"row": 1/H, "col": 1/W, "both": 1/(HW)}.
        settings: site, rpi, seed, ridge, train and test image counts, grid, model.
    """

    layers: list[int]
    row_accuracy: np.ndarray
    col_accuracy: np.ndarray
    accuracy: np.ndarray
    chance: dict[str, float]
    settings: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {
            "layers": self.layers,
            "row_accuracy": self.row_accuracy.tolist(),
            "col_accuracy": self.col_accuracy.tolist(),
            "accuracy": self.accuracy.tolist(),
            "chance": self.chance,
            "settings": self.settings,
        }


@dataclass
class PositionMap:
    """The linear (row, col) readout fitted per block by :func:`fit_position_map`.

    Attributes:
        layers: block indices.
        weights: block -> (C + 1, H + W) float64: scores = [token, 1] @ W, the H row scores then the W column
            scores (NaN where the block's tokens or its solve were not finite).
        mean: block -> (C,) float64, the mean patch token of the fitted images.
        settings: model, site, rpi, seed, ridge, the fitted image count (``train_images``), grid, the blocks
            whose tokens were not finite (``nonfinite_layers``).
    """

    layers: list[int]
    weights: dict[int, torch.Tensor]
    mean: dict[int, torch.Tensor]
    settings: dict[str, Any]

    def directions(self, layer: int) -> torch.Tensor:
        """(C, r) float64: an orthonormal basis of the token directions the block's readout reads (the span of
        its weight columns, the bias row left out; r their rank); (C, 0) when the map is not finite."""
        w = self.weights[layer][:-1]
        if not bool(torch.isfinite(w).all()):
            return w.new_zeros(w.shape[0], 0)
        u, s, _ = torch.linalg.svd(w, full_matrices=False)
        return u[:, s > s.max() * 1e-10] if s.numel() and s.max() > 0 else w.new_zeros(w.shape[0], 0)


def fit_position_map(
    model: torch.nn.Module,
    train: Any,
    *,
    site: str = "attn_input",
    rpi: bool = False,
    seed: int = 0,
    ridge: float = 1e-3,
    layers: list[int] | None = None,
    **options: Any,
) -> PositionMap:
    """Fit, per block, the ridge least-squares (row, col) readout of the patch tokens on ``train`` (the first half
    of :func:`position_probe`; arguments as there)."""
    if site not in ("attn_input", "block_output"):
        raise SettingError(f"site must be attn_input or block_output, got {site!r}")
    if not ridge >= 0:
        raise SettingError(f"ridge must be >= 0, got {ridge}")
    fit = _Fit(site)
    fitted: MeasureResult = run_measures(
        model, train, [fit], rpi=rpi, seed=seed, layers=layers, rpi_per="image", **options
    )
    weights, mean = {}, {}
    for layer in fitted.layers:
        xtx = fit.sums[("xtx", layer)]
        weights[layer] = _solve(xtx, fit.sums[("xty", layer)], ridge)
        mean[layer] = xtx[-1, :-1] / xtx[-1, -1]  # the bias column's sums: the tokens' sum, then their count
    settings = dict(
        model=fitted.settings["model"],
        site=site,
        rpi=rpi,
        seed=seed,
        ridge=ridge,
        train_images=fitted.settings["n_images"],
        grid_size=list(fitted.settings["grid_size"]),
        nonfinite_layers=list(fitted.settings["nonfinite_layers"]),
    )
    return PositionMap(layers=fitted.layers, weights=weights, mean=mean, settings=settings)


def position_probe(
    model: torch.nn.Module,
    train: Any,
    test: Any,
    *,
    site: str = "attn_input",
    rpi: bool = False,
    seed: int = 0,
    ridge: float = 1e-3,
    layers: list[int] | None = None,
    **options: Any,
) -> PositionProbeResult:
    """Fit a linear (row, col) classifier of the patch tokens on ``train``, score it on ``test``, per block.

    Args:
        model: a flat timm ViT (as :func:`~timm_posgeom.probes.run_measures`).
        train: batches as :func:`~timm_posgeom.probe_ssdc` reads them (e.g. ``eval_loader`` of one split,
            or of one part of a split); one image size.
        test: batches of the other split (or part), read the same way, at the same image size.
        site: ``attn_input`` (the paper's) or ``block_output``.
        rpi: tokens permuted after the patch embedding, one permutation per image (from ``seed`` and the
            image's index for the fit, ``seed + 1`` for the score); targets are the index grid.
        ridge: the ridge penalty, relative to the mean diagonal of X^T X.
        layers: block indices (default every block).
        **options: ``max_images``, ``batch_size``, ``device``, ``progress``, ``distributed`` of
            :func:`~timm_posgeom.probes.run_measures`, for both passes.
    """
    fitted = fit_position_map(model, train, site=site, rpi=rpi, seed=seed, ridge=ridge, layers=layers, **options)
    weights = fitted.weights
    score = _Score(site, {k: w.to(torch.float64) for k, w in weights.items()})
    scored = run_measures(
        model, test, [score], rpi=rpi, seed=seed + 1, layers=fitted.layers, rpi_per="image", **options
    )
    H, W = scored.settings["grid_size"]
    values = {k: np.array(scored.values[k], dtype=float) for k in _Score.names}
    # a block whose tokens were not finite (fit or score), or whose map is not: no reading, NaN (an arg-max of
    # NaN scores would read row 0 and column 0 for every token)
    blank = [
        i
        for i, layer in enumerate(scored.layers)
        if layer in fitted.settings["nonfinite_layers"] or not bool(torch.isfinite(weights[layer]).all())
    ]
    for k in values:
        values[k][blank] = math.nan
    settings = dict(
        model=scored.settings["model"],
        site=site,
        rpi=rpi,
        seed=seed,
        ridge=ridge,
        train_images=fitted.settings["train_images"],
        test_images=scored.settings["n_images"],
        grid_size=[H, W],
    )
    return PositionProbeResult(
        layers=scored.layers,
        row_accuracy=values["row_accuracy"],
        col_accuracy=values["col_accuracy"],
        accuracy=values["accuracy"],
        chance={"row": 1 / H, "col": 1 / W, "both": 1 / (H * W)},
        settings=settings,
    )
