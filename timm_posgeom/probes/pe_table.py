"""The SSDC of a learned absolute position table itself: a cheap signal that a reference frame forms."""
from __future__ import annotations

import math
import warnings

import torch.nn as nn

from .spearman import ssdc

__all__ = ["pe_table_ssdc"]


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
