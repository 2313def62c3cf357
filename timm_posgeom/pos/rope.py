"""2-D axial RoPE whose rotation angles are scaled by ``alpha``.

The paper (arXiv 2606.00124) does not define PE scaling for RoPE; we scale the rotation angles:
angle(pos, k) = alpha * pos * w_k, so alpha = 0 is no rotation at all (identity) and alpha = 1 is
standard RoPE with base ``temperature`` (10000, as in the paper). Everything else is timm's
``RotaryEmbeddingCat`` (index grid, interleaved rotation, cached table for a fixed grid).
"""

from __future__ import annotations

import torch
from timm.layers import RotaryEmbeddingCat

from .common import check_alpha


class ScaledRotaryEmbeddingCat(RotaryEmbeddingCat):
    """timm's RotaryEmbeddingCat with frequency bands multiplied by ``alpha``.

    ``get_embed()`` returns (N, 4 * (dim // 4)) = cat(sin, cos) of the scaled angles for N = H * W
    patch tokens in row-major order.
    """

    def __init__(self, dim: int, *, alpha: float = 1.0, **kwargs):
        self.alpha = check_alpha(alpha)
        super().__init__(dim, **kwargs)

    def _compute_bands(self, device=None, dtype=None) -> torch.Tensor:
        return super()._compute_bands(device=device, dtype=dtype) * self.alpha

    def set_alpha(self, alpha: float) -> None:
        """Rescale the angles and rebuild the cached table (if any)."""
        self.alpha = check_alpha(alpha)
        self._init_buffers()
