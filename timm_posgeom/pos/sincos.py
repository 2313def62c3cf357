"""Fixed 2-D sine-cosine position table (MoCo v3 / MAE style), built by timm."""

from __future__ import annotations

import torch
from timm.layers import build_sincos2d_pos_embed, freq_bands

from ..errors import SettingError


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
        raise SettingError(f"2-D sincos needs an embedding dim divisible by 4, got {dim}")
    table = build_sincos2d_pos_embed(list(grid_size), dim=dim, temperature=temperature, device=device)
    return table.unsqueeze(0)


def sincos_2d_at(positions: torch.Tensor, dim: int, temperature: float = 10000.0) -> torch.Tensor:
    """The 2-D sincos encoding of any (row, col) positions, integer or not: (N, 2) -> (1, N, dim) float32.

    The same formula and channel order as :func:`sincos_2d` (timm's ``build_sincos2d_pos_embed``), evaluated at
    ``positions`` instead of the integer grid: at the grid's own positions (row-major) it is that table bit for bit.
    A PE shift (:func:`~timm_posgeom.interventions.pe_shift`) moves our sincos models' table with it.
    """
    if dim % 4:
        raise SettingError(f"2-D sincos needs an embedding dim divisible by 4, got {dim}")
    bands = freq_bands(dim // 4, temperature=temperature, step=1, device=positions.device)
    angles = positions.to(torch.float32).unsqueeze(-1) * bands.unsqueeze(0)  # (N, 2, dim / 4)
    return torch.stack([torch.sin(angles), torch.cos(angles)], dim=1).flatten(1).unsqueeze(0)
