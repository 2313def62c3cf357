"""The SSDC of a learned absolute position table itself: a cheap signal that a reference frame forms."""

from __future__ import annotations

import math
import warnings

import torch
import torch.nn as nn

from .ssdc_probe.spearman import ssdc

__all__ = ["pe_table_ssdc", "pe_content_norm_ratio"]


def pe_table_ssdc(model: nn.Module) -> float | None:
    """SSDC of a learned absolute position table: Spearman correlation between the cosine
    similarity of its patch rows and minus their Manhattan distance on the patch grid (pairs
    i < j, row-major; docs/method.md#ssdc). None when the model has no learned ``pos_embed`` table."""
    table = getattr(model, "pos_embed", None)
    patch_embed = getattr(model, "patch_embed", None)
    if not isinstance(table, nn.Parameter) or not table.requires_grad or patch_embed is None:
        return None
    grid = tuple(patch_embed.grid_size)
    n = grid[0] * grid[1]
    rows = table.detach().float().reshape(-1, table.shape[-1])[-n:]  # (N, C) patch rows; prefix rows come first
    rows = nn.functional.normalize(rows, dim=-1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a constant (e.g. all-zero) table: NaN, reported as None
        rho = float(ssdc((rows @ rows.T).cpu(), grid, distance="manhattan"))
    return rho if math.isfinite(rho) else None


def pe_content_norm_ratio(model: nn.Module, images: torch.Tensor) -> float | None:
    """How loud the position table is against the content it is added to: the mean L2 norm of the
    table's patch rows (times the model's ``alpha`` when it has one) over the mean L2 norm of the patch
    tokens ``model.patch_embed(images)`` (``images``: (B, 3, H, W)). None when the model has no
    additive ``pos_embed`` table (no PE, RoPE). Read over training, it shows whether content drowns
    the table out as the model widens (docs/method.md#pe-to-content-norm-ratio)."""
    table = getattr(model, "pos_embed", None)
    patch_embed = getattr(model, "patch_embed", None)
    if not isinstance(table, torch.Tensor) or patch_embed is None:
        return None
    grid = tuple(patch_embed.grid_size)
    n = grid[0] * grid[1]
    device = next(patch_embed.parameters()).device
    with torch.no_grad():
        tokens = patch_embed(images.to(device))  # (B, N, C), or (B, H, W, C) for NHWC patch embeds
        tokens = tokens.float().reshape(-1, tokens.shape[-1])
        rows = table.detach().float().reshape(-1, table.shape[-1])[-n:]  # (N, C) patch rows
        pe = rows.norm(dim=-1).mean() * float(getattr(model, "alpha", 1.0))
        content = tokens.norm(dim=-1).mean()
    ratio = float(pe / content)
    return ratio if math.isfinite(ratio) else None
