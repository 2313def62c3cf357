"""Positional encodings of the PE-variant ViTs: learned absolute, fixed 2-D sincos, 2-D axial RoPE.

Every encoding here takes an ``alpha`` that scales it at inference (see ``timm_posgeom.pe_scale``).
"""
from .common import PE_TYPES, check_alpha
from .rope import ScaledRotaryEmbeddingCat
from .sincos import sincos_2d

__all__ = ["PE_TYPES", "check_alpha", "ScaledRotaryEmbeddingCat", "sincos_2d"]
