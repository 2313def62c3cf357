"""timm-posgeom: what positional encodings do inside Vision Transformers.

Importing the package registers the PE-variant ViTs with timm::

    import timm, timm_posgeom
    model = timm.create_model("vit_small_patch16_224_rope", num_classes=100, alpha=1.0)
"""
from . import models  # noqa: F401  (registers the models with timm)
from .interventions import PEScaleError, TokenPermutation, find_embed_module, pe_scale, token_permutation
from .models import PosGeomViT, list_models

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "PosGeomViT",
    "list_models",
    "token_permutation",
    "TokenPermutation",
    "find_embed_module",
    "pe_scale",
    "PEScaleError",
]
