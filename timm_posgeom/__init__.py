"""timm-posgeom: what positional encodings do inside Vision Transformers.

Importing the package registers the PE-variant ViTs with timm::

    import timm, timm_posgeom
    model = timm.create_model("posgeom_vit_small_patch16_224_rope", num_classes=100, alpha=1.0)

This package root is the library: models, positional encodings, interventions, probes, shifts,
transforms, data and robustness. The application built on it (recipes, ``timm_posgeom.app.train``,
``timm_posgeom.app.study``, ``timm_posgeom.app.report``, ``timm_posgeom.app.hub`` and the ``posgeom`` command)
is imported by its users only, never from here. Data flows one way: data -> model (+ interventions)
-> probes / robustness -> study -> report. Definitions: docs/method.md.
"""
from . import models  # noqa: F401  (registers the models with timm)
from .data import ImageSplit, load_split
from .eval_data import eval_loader
from .factory import create_model
from .imagenet_c import ImageNetCResult, check_imagenet_c_tree, imagenet_c_fragility, imagenet_c_released
from .interventions import (
    PEEntry,
    PEScaleError,
    TokenPermutation,
    TokenPermutationError,
    find_embed_module,
    pe_inventory,
    pe_scale,
    token_permutation,
)
from .models import PosGeomViT, list_models
from .probes import (
    AttentionMeasure,
    AttentionResult,
    CKAResult,
    Measure,
    MeasureResult,
    PositionProbeResult,
    SSDCResult,
    attention_measures,
    cka,
    pe_table_ssdc,
    position_probe,
    probe_ssdc,
    run_measures,
    ssdc,
)
from .robustness import AlphaSweepResult, FragilityResult, alpha_sweep, fragility
from .shifts import JPEG, Corruption, GaussianBlur, imagenet_c, imagenet_c_shifts, parse_shift
from .support import SupportRow, check_support
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
    "TokenPermutationError",
    "pe_scale",
    "pe_inventory",
    "PEEntry",
    "PEScaleError",
    # probes
    "ssdc",
    "probe_ssdc",
    "pe_table_ssdc",
    "SSDCResult",
    "attention_measures",
    "AttentionResult",
    "AttentionMeasure",
    "run_measures",
    "Measure",
    "MeasureResult",
    "position_probe",
    "PositionProbeResult",
    "cka",
    "CKAResult",
    "check_support",
    "SupportRow",
    # robustness
    "JPEG",
    "GaussianBlur",
    "imagenet_c",
    "imagenet_c_shifts",
    "Corruption",
    "parse_shift",
    "fragility",
    "FragilityResult",
    "imagenet_c_fragility",
    "imagenet_c_released",
    "check_imagenet_c_tree",
    "ImageNetCResult",
    "alpha_sweep",
    "AlphaSweepResult",
    # data
    "load_split",
    "eval_loader",
    "create_model",
    "ImageSplit",
    "SyntheticShapes",
    "eval_transform",
]
