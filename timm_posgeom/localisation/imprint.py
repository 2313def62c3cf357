"""The PE imprint: the SSDC of a constant image's tokens per layer, no data needed
(docs/method.md#the-pe-imprint).

A constant image (every pixel one colour) gives every patch the same content, so whatever spatial structure
its tokens hold at a layer was put there by the positional encoding (or by an architecture that knows
positions: convolutions, windows). Per layer and per colour: the cosine-similarity map of the patch tokens
at ``site`` and its SSDC against the patch grid; the result is the mean over ``colours`` random colours
(uniform in RGB, from ``seed``) with a Student t 95% interval over them.

Where the tokens of a layer are all alike (no PE has reached them: every layer of a model without PE, a
RoPE model's tokens before its first attention), the map holds nothing but float rounding and the SSDC is
undefined: NaN with a :class:`~timm_posgeom.probes.ConstantMapWarning`, never a number. Alike means every
token within ``1e-5`` (relative to their mean norm) of their mean token.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn as nn

from ..data.transforms import resolve_config
from ..errors import SettingError
from ..interventions import check_unpermuted, eval_mode
from ..measuring.settings import MeasureSettings
from ..probes.sites import find_sites
from ..probes.ssdc_probe.spearman import ConstantMapWarning, ssdc
from ..results.intervals import t_interval
from .batches import placed
from .result import LayerCurves

__all__ = ["pe_imprint", "ImprintResult", "ALIKE_RTOL"]

ALIKE_RTOL = 1e-5
"""Tokens within this distance of their mean token, relative to their mean norm, are alike (float rounding)."""


class ImprintResult(LayerCurves):
    """The PE imprint per block: ``ssdc`` (L,), the mean over the constant colours, its interval over them in
    ``intervals["ssdc"]``, each colour's value in ``replicates["ssdc"]`` (V, L); ``alike`` (L,) the fraction of
    colours whose tokens were all alike at that layer (their SSDC NaN)."""

    kind: ClassVar[str] = "pe-imprint"


def constant_images(model: nn.Module, colours: int, seed: int, img_size: Any = None) -> torch.Tensor:
    """(V, 3, H, W) float32: ``colours`` images of one uniform-random RGB colour each, at the model's input size
    (or ``img_size``), normalised with the model's mean and std as its eval transform does."""
    cfg = resolve_config(model, img_size)
    h, w = cfg["input_size"][-2:]
    rgb = torch.rand(colours, 3, 1, 1, generator=torch.Generator().manual_seed(int(seed)))
    mean = torch.tensor(cfg["mean"], dtype=torch.float32).reshape(1, 3, 1, 1)
    std = torch.tensor(cfg["std"], dtype=torch.float32).reshape(1, 3, 1, 1)
    return ((rgb - mean) / std).expand(colours, 3, h, w).contiguous()


def _alike(patches: torch.Tensor) -> torch.Tensor:
    """(V,) whether each image's patch tokens (V, N, C) are all within ALIKE_RTOL of their mean token."""
    x = patches.to(torch.float64)
    spread = (x - x.mean(1, keepdim=True)).norm(dim=-1).amax(1)
    return spread <= ALIKE_RTOL * x.norm(dim=-1).mean(1).clamp_min(1e-30)


def pe_imprint(
    model: nn.Module,
    data: Any = None,
    settings: MeasureSettings | None = None,
    *,
    colours: int = 8,
    site: str = "attn_input",
    **options: Any,
) -> ImprintResult:
    """SSDC per block of the patch tokens of constant images (module docstring).

    Args:
        model: a flat timm ViT (:func:`~timm_posgeom.probes.find_sites`); eval mode for the call, restored.
        data: not read (the imprint needs no data; the argument keeps the measures' common signature).
        settings: :class:`~timm_posgeom.measuring.MeasureSettings`: ``seed`` (the colours), ``img_size`` (default:
            the model's input size), ``device``; fields may be given as keywords.
        colours: how many constant images (>= 2 for an interval).
        site: ``attn_input`` (the paper's) or ``block_output``.
    """
    settings, _ = MeasureSettings.resolve("pe_imprint", settings, options)
    if site not in ("attn_input", "block_output"):
        raise SettingError(f"site must be attn_input or block_output, got {site!r}")
    if isinstance(colours, bool) or not isinstance(colours, int) or colours < 1:
        raise SettingError(f"colours must be an integer >= 1, got {colours!r}")
    check_unpermuted(model, "pe_imprint")
    sites = find_sites(model)
    seed = 0 if settings.seed is None else int(settings.seed)
    images = constant_images(model, colours, seed, settings.img_size)
    grid = sites.grid_size((int(images.shape[-2]), int(images.shape[-1])))
    n = grid[0] * grid[1]
    tokens: dict[int, torch.Tensor] = {}
    handles = sites.register(site, list(range(len(sites.blocks))), lambda layer, x: tokens.__setitem__(layer, x))
    try:
        with placed(model, settings.device) as (device, dtype), eval_mode(model), torch.no_grad():
            model(images.to(device=device, dtype=dtype))
    finally:
        for h in handles:
            h.remove()
    per_colour = np.full((colours, len(sites.blocks)), math.nan)
    alike = np.zeros(len(sites.blocks))
    for layer in range(len(sites.blocks)):
        patches = tokens[layer].reshape(colours, -1, tokens[layer].shape[-1])[:, -n:]
        same = _alike(patches)
        alike[layer] = float(same.float().mean())
        unit = patches.float() / patches.float().norm(dim=-1, keepdim=True).clamp_min(1e-12)
        keep = (~same).nonzero().flatten()
        if len(keep):
            with warnings.catch_warnings():  # a constant map among the kept ones is NaN, said below with the rest
                warnings.simplefilter("ignore", ConstantMapWarning)
                maps = (unit[keep] @ unit[keep].transpose(1, 2)).to(torch.float64).cpu()
                per_colour[keep.numpy(), layer] = ssdc(maps, grid).numpy()
    return _result(per_colour, alike, site, grid, seed, model)


def _result(
    per_colour: np.ndarray, alike: np.ndarray, site: str, grid: tuple[int, int], seed: int, model: nn.Module
) -> ImprintResult:
    mean, low, high = t_interval(per_colour, axis=0)
    undefined = [i for i in range(per_colour.shape[1]) if not np.isfinite(per_colour[:, i]).any()]
    if undefined:
        warnings.warn(
            f"the patch tokens of a constant image are all alike at block(s) {', '.join(map(str, undefined))} (no "
            "positional encoding has reached them): the PE imprint is undefined there (NaN)",
            ConstantMapWarning,
            stacklevel=3,
        )
    settings = dict(
        model=str((getattr(model, "pretrained_cfg", None) or {}).get("architecture") or type(model).__name__),
        site=site,
        colours=int(per_colour.shape[0]),
        seed=seed,
        grid_size=list(grid),
        intervals="Student t over the constant colours",
    )
    return ImprintResult(
        layers=list(range(per_colour.shape[1])),
        values={"ssdc": mean, "alike": alike},
        intervals={"ssdc": (low, high)},
        settings=settings,
        replicates={"ssdc": per_colour},
    )
