"""timm-posgeom: what positional encodings do inside Vision Transformers.

Importing the package registers the PE-variant ViTs with timm::

    import timm, timm_posgeom
    model = timm.create_model("posgeom_vit_small_patch16_224_rope", num_classes=100, alpha=1.0)

Data flows one way: data -> model (+ interventions) -> probes / robustness -> study -> report.
Training (``timm_posgeom.train``) is a client of the library and is not imported here.
"""
from . import models  # noqa: F401  (registers the models with timm)
from .data import ImageSplit, load_split
from .hub import export_for_hub, push_run, render_card
from .interventions import PEScaleError, TokenPermutation, find_embed_module, pe_scale, token_permutation
from .models import PosGeomViT, list_models
from .probes import SSDCResult, probe_ssdc, ssdc
from .robustness import AlphaSweepResult, FragilityResult, alpha_sweep, fragility
from .shifts import JPEG, GaussianBlur, imagenet_c, parse_shift
from .synthetic import SyntheticShapes
from .transforms import eval_transform
from .version import __version__

__all__ = [
    "__version__",
    # models
    "PosGeomViT",
    "list_models",
    # interventions
    "token_permutation",
    "TokenPermutation",
    "find_embed_module",
    "pe_scale",
    "PEScaleError",
    # probes
    "ssdc",
    "probe_ssdc",
    "SSDCResult",
    # robustness
    "JPEG",
    "GaussianBlur",
    "imagenet_c",
    "parse_shift",
    "fragility",
    "FragilityResult",
    "alpha_sweep",
    "AlphaSweepResult",
    # data
    "load_split",
    "ImageSplit",
    "SyntheticShapes",
    "eval_transform",
    # hub
    "export_for_hub",
    "render_card",
    "push_run",
]
