"""Linear CKA between the layers of two models (or of one): how alike their representations of the same
images are, up to rotation and scale (docs/attention.md#cka).

Minibatch CKA (Nguyen, Raghu & Kornblith 2021, "Do wide and deep networks learn the same things?"): for
each batch b of images, K_b = X_b X_b^T and L_b = Y_b Y_b^T are the (B, B) Gram matrices of the two
layers' image representations (each image's patch tokens flattened, (N * C,); prefix tokens dropped), and

    CKA = sum_b HSIC_1(K_b, L_b) / sqrt(sum_b HSIC_1(K_b, K_b) * sum_b HSIC_1(L_b, L_b))

with HSIC_1 the unbiased estimator (Song et al. 2012), so that the value does not drift with the batch
size as the biased one does. With ``unbiased=False`` and one batch it is the linear CKA of Kornblith et al.
(2019), ||Y_c^T X_c||_F^2 / (||X_c^T X_c||_F ||Y_c^T Y_c||_F) on centred features (tests/test_cka.py).
The two models read the same batches in the same order; one process (the Grams of a batch are kept, not
summed, until both models have run).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch

from ..errors import DataError, SettingError
from ..measuring.settings import MeasureSettings
from ..results.intervals import jackknife_interval, t_interval
from .measures import LayerView, Measure, MeasureResult, run_measures
from .ssdc_probe.spearman import FLAT_RTOL
from .streaming import same_passes

__all__ = ["cka", "minibatch_cka", "hsic", "CKAResult"]


def hsic(K: torch.Tensor, L: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """HSIC of two (n, n) Gram matrices: the unbiased estimator HSIC_1 (needs n >= 4), or the biased
    tr(K H L H) / (n - 1)^2 with H the centring matrix."""
    n = K.shape[0]
    if unbiased:
        if n < 4:
            raise SettingError(f"the unbiased HSIC needs batches of at least 4 images, got {n}")
        K, L = K.clone(), L.clone()
        K.fill_diagonal_(0)
        L.fill_diagonal_(0)
        ones = torch.ones(n, 1, dtype=K.dtype, device=K.device)
        trace = (K * L.T).sum()
        middle = (ones.T @ K @ ones) * (ones.T @ L @ ones) / ((n - 1) * (n - 2))
        last = 2.0 / (n - 2) * (ones.T @ K @ L @ ones)
        return ((trace + middle - last) / (n * (n - 3))).reshape(())
    H = torch.eye(n, dtype=K.dtype, device=K.device) - 1.0 / n
    return (K @ H * (L @ H).T).sum() / (n - 1) ** 2


def minibatch_cka(
    grams_a: list[torch.Tensor],
    grams_b: list[torch.Tensor],
    unbiased: bool = True,
    constant_a: list[bool] | None = None,
    constant_b: list[bool] | None = None,
) -> float:
    """CKA from the per-batch Gram matrices of two representations of the same batches (module docstring).

    ``constant_a`` / ``constant_b``: per batch, whether that representation is the same for every image of
    the batch, decided on the features up to float rounding (:class:`_Grams`). Such a batch's Gram matrix is constant, and
    every HSIC with it is exactly 0: it adds exactly 0 (computed, it would add a rounding error of either
    sign). A representation with no variance across images in every batch gives 0 / 0: NaN, as does a Gram
    matrix that is not finite."""
    if len(grams_a) != len(grams_b) or not grams_a:
        raise DataError(
            f"the two representations have {len(grams_a)} and {len(grams_b)} batches: they must "
            "read the same, non-empty, batches"
        )
    flat_a = constant_a or [False] * len(grams_a)
    flat_b = constant_b or [False] * len(grams_b)
    if not all(bool(torch.isfinite(g).all()) for g in [*grams_a, *grams_b]):
        return math.nan
    zero = torch.zeros((), dtype=torch.float64)
    ab = sum(zero if fa or fb else hsic(K, L, unbiased) for K, L, fa, fb in zip(grams_a, grams_b, flat_a, flat_b))
    aa = sum(zero if fa else hsic(K, K, unbiased) for K, fa in zip(grams_a, flat_a))
    bb = sum(zero if fb else hsic(L, L, unbiased) for L, fb in zip(grams_b, flat_b))
    if all(flat_a) or all(flat_b):  # no variance across images: 0 / 0, decided on the features, not on a sign
        return math.nan
    return float(ab / torch.sqrt(cast(torch.Tensor, aa * bb)))  # sums of (non-empty) tensors: tensors, not 0


class _Grams(Measure):
    """Keeps, per block and batch, the (B, B) Gram matrix of the images' flattened patch tokens."""

    names = ()

    def __init__(self, site: str):
        super().__init__()
        self.source = site
        self.grams: dict[int, list[torch.Tensor]] = {}
        self.constant: dict[int, list[bool]] = {}  # per block and batch: the same features for every image

    def update(self, x: torch.Tensor, view: LayerView) -> None:
        flat = x[:, view.prefix :].reshape(x.shape[0], -1)  # (B, N * C)
        # the same for every image up to float rounding: its centred Gram matrix holds rounding noise, not variance
        spread = (flat - flat[:1]).abs().amax() if flat.numel() else flat.new_zeros(())
        scale = flat.abs().amax() if flat.numel() else flat.new_zeros(())
        self.constant.setdefault(view.layer, []).append(bool(spread <= FLAT_RTOL * scale))
        flat = flat.to(torch.float64)
        self.grams.setdefault(view.layer, []).append((flat @ flat.T).cpu())

    def finish(self, layers: list[int], n_images: int, grid: tuple[int, int]) -> dict[str, np.ndarray]:
        return {}


def _grams_of(result: MeasureResult) -> list[_Grams]:
    """The :class:`_Grams` measure of each replica (permutation) of a :func:`run_measures` call, in order."""
    return [m for replica in result.replica_measures for m in replica if isinstance(m, _Grams)]


def _say_constant(ra: Any, rb: Any) -> None:
    """A warning naming the blocks whose representation is the same for every image (their CKA is NaN)."""
    flat = [
        f"{which} block {layer}"
        for which, r in (("model_a", ra), ("model_b", rb))
        for layer in r.layers
        if all(all(g[0].constant[layer]) for g in r.replica_measures)
    ]
    if flat:
        warnings.warn(
            f"CKA is undefined (0 / 0, NaN) where a representation has no variance across the images "
            f"(every image's features the same): {', '.join(flat)}",
            RuntimeWarning,
            stacklevel=3,
        )


def _jackknife(
    ga: _Grams, gb: _Grams, layers_a: list[int], layers_b: list[int], full: np.ndarray, unbiased: bool
) -> tuple[np.ndarray, np.ndarray]:
    """The delete-a-batch jackknife 95% interval of every entry of ``full`` (minibatch CKA sums over batches, so
    a batch is the natural unit to leave out; batches weighted by their image counts); NaN with one batch."""
    first = ga.grams[layers_a[0]]
    sizes = [g.shape[0] for g in first]
    deleted = np.full((len(sizes), *full.shape), np.nan)
    for k in range(len(sizes) if len(sizes) > 1 else 0):
        keep = [i for i in range(len(sizes)) if i != k]
        for i, la in enumerate(layers_a):
            for j, lb in enumerate(layers_b):
                deleted[k, i, j] = minibatch_cka(
                    [ga.grams[la][t] for t in keep],
                    [gb.grams[lb][t] for t in keep],
                    unbiased,
                    [ga.constant[la][t] for t in keep],
                    [gb.constant[lb][t] for t in keep],
                )
    return jackknife_interval(full, deleted, sizes)


@dataclass
class CKAResult:
    """CKA between the blocks of two models: ``matrix[i, j]`` for block ``layers_a[i]`` of model a and
    ``layers_b[j]`` of model b (docs/attention.md#cka). Under RPI ``matrix`` is the mean over the shared
    permutations (both models under the same ones) and ``matrix_ci`` its 95% interval over them ((low, high),
    each shaped like ``matrix``); without RPI ``matrix_ci`` is the delete-a-batch jackknife interval over the
    batches (NaN with one batch)."""

    layers_a: list[int]
    layers_b: list[int]
    matrix: np.ndarray
    settings: dict[str, Any]
    matrix_ci: tuple[np.ndarray, np.ndarray] | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {
            "layers_a": self.layers_a,
            "layers_b": self.layers_b,
            "matrix": self.matrix.tolist(),
            "settings": self.settings,
        }
        if self.matrix_ci is not None:
            out["matrix_ci_low"], out["matrix_ci_high"] = (m.tolist() for m in self.matrix_ci)
        return out


def cka(
    model_a: torch.nn.Module,
    model_b: torch.nn.Module,
    data: Any,
    *,
    site: str = "attn_input",
    layers_a: list[int] | None = None,
    layers_b: list[int] | None = None,
    unbiased: bool = True,
    rpi: bool = False,
    **options: Any,
) -> CKAResult:
    """Linear minibatch CKA between every probed block of ``model_a`` and of ``model_b`` on ``data``.

    Args:
        model_a: a flat timm ViT (the same model twice compares its blocks with each other).
        model_b: a flat timm ViT; both read the same batches, so they must take the same input
            (transform ``data`` for both).
        data: a (n, C, H, W) tensor (chunks of ``batch_size``) or a fixed iterable of batches (e.g. an
            ``eval_loader``; it is read once per model, and the second pass is checked to read the same images in
            the same order: a shuffling DataLoader is refused, :class:`~.streaming.SamePasses`); batches of >= 4
            images.
        site: ``attn_input`` or ``block_output``.
        unbiased: HSIC_1 (default) or the biased estimator.
        rpi: both models under RPI, under the same ``rpi_permutations`` shared permutations (seeds ``seed`` ..
            ``seed + K - 1``): the matrix is the mean over them, with its interval (``matrix_ci``).
        **options: ``settings`` (a :class:`~timm_posgeom.measuring.MeasureSettings`) and its fields as
            keywords: ``seed`` (default 0), ``max_images``, ``batch_size``, ``device``, ``progress`` of
            :func:`~timm_posgeom.probes.run_measures` (one process: ``distributed`` is ``off``).
    """
    if site not in ("attn_input", "block_output"):
        raise SettingError(f"site must be attn_input or block_output, got {site!r}")
    if options.get("distributed", "off") != "off":
        raise SettingError("cka runs in one process: each batch's Gram matrices are kept until both models ran")
    settings, _ = MeasureSettings.resolve("cka", options.pop("settings", None), {**options, "distributed": "off"})
    data = same_passes(data, "cka")  # model b's pass checked against model a's: the same images, in order
    ra = run_measures(model_a, data, [_Grams(site)], rpi=rpi, layers=layers_a, settings=settings)
    rb = run_measures(model_b, data, [_Grams(site)], rpi=rpi, layers=layers_b, settings=settings)
    if ra.settings["n_images"] != rb.settings["n_images"]:
        raise DataError("the two models read different numbers of images: give data that reads the same twice")
    matrices = np.stack(
        [  # (K, La, Lb): one matrix per permutation (K = 1 without RPI)
            np.array(
                [
                    [
                        minibatch_cka(ga.grams[i], gb.grams[j], unbiased, ga.constant[i], gb.constant[j])
                        for j in rb.layers
                    ]
                    for i in ra.layers
                ]
            )
            for ga, gb in zip(_grams_of(ra), _grams_of(rb))
        ]
    )
    _say_constant(ra, rb)
    described = dict(
        model_a=ra.settings["model"],
        model_b=rb.settings["model"],
        site=site,
        unbiased=unbiased,
        rpi=rpi,
        n_images=ra.settings["n_images"],
        rpi_permutations=ra.settings["rpi_permutations"],
        permutation_seeds=ra.settings["permutation_seeds"],
        interval=ra.settings["interval"],
    )
    if not rpi:
        described["interval"] = "delete-a-batch jackknife over the batches"
        (ga,), (gb,) = _grams_of(ra), _grams_of(rb)
        ci = _jackknife(ga, gb, ra.layers, rb.layers, matrices[0], unbiased)
        return CKAResult(layers_a=ra.layers, layers_b=rb.layers, matrix=matrices[0], settings=described, matrix_ci=ci)
    mean, low, high = t_interval(matrices, axis=0)
    return CKAResult(layers_a=ra.layers, layers_b=rb.layers, matrix=mean, settings=described, matrix_ci=(low, high))
