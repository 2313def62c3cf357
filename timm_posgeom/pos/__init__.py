"""Positional encodings of the PE-variant ViTs: learned absolute, fixed 2-D sincos, 2-D axial RoPE.

Every encoding here takes an ``alpha`` that scales it at inference (see ``timm_posgeom.pe_scale``).
"""

# timm first, before any module of this package starts: importing timm registers our models (the import
# hook of timm_posgeom/__init__.py), and the models import pos.rope, which must not be half-imported then
import timm  # noqa: F401,I001

from .common import PE_TYPES, check_alpha
from .rope import ScaledRotaryEmbeddingCat
from .sincos import sincos_2d

__all__ = ["PE_TYPES", "check_alpha", "ScaledRotaryEmbeddingCat", "sincos_2d"]
