"""Fixed 2-D sine-cosine position table (MoCo v3 / MAE style), built by timm."""

from __future__ import annotations

import torch
from timm.layers import build_sincos2d_pos_embed


def sincos_2d(
    grid_size: tuple[int, int],
    dim: int,
    temperature: float = 10000.0,
    device: torch.device | None = None,
) -> torch.Tensor:
    """The 2-D sincos table for a (H, W) grid of patch tokens in row-major order.

    Returns a float32 tensor of shape (1, H * W, dim): a quarter of the channels are
    sin(h * w_k), cos(h * w_k), sin(w * w_k), cos(w * w_k) with w_k = temperature ** (-k / (dim / 4)).
    The table is rebuilt for every grid (never interpolated), so a model at a new image size
    sees exactly the table it would have been built with.
    """
    if dim % 4:
        raise ValueError(f"2-D sincos needs an embedding dim divisible by 4, got {dim}")
    table = build_sincos2d_pos_embed(list(grid_size), dim=dim, temperature=temperature, device=device)
    return table.unsqueeze(0)
