"""timm-posgeom: what positional encodings do inside Vision Transformers.

Importing the package registers the PE-variant ViTs with timm::

    import timm, timm_posgeom
    model = timm.create_model("posgeom_vit_small_patch16_224_rope", num_classes=100, alpha=1.0)

This package root is the library: models, positional encodings, interventions, probes, shifts,
transforms, data, robustness, causal localisation and resolution extrapolation. The application built on it
(recipes, ``timm_posgeom.app.train``,
``timm_posgeom.app.study``, ``timm_posgeom.app.report``, ``timm_posgeom.app.hub`` and the ``posgeom`` command)
is imported by its users only, never from here. Data flows one way: data -> model (+ interventions)
-> probes / robustness -> study -> report. Definitions: docs/method.md.

The import is light (docs/architecture.md, rule 6): the public names below are loaded on first use
(PEP 562), and the models are registered with timm as soon as timm is imported, before or after this
package, so ``posgeom --help`` answers without loading torch.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from typing import TYPE_CHECKING, Any

from . import _compat
from .version import __version__

_compat.install()  # the module paths that moved (issue 49) keep working for one release, with a warning

if TYPE_CHECKING:  # what each public name is, for type checkers and readers; loaded lazily below
    from .data import ImageSplit, load_split
    from .data.eval_data import eval_loader
    from .data.labels import LabelMismatchError, match_labels
    from .data.shifts import JPEG, Corruption, GaussianBlur, imagenet_c, imagenet_c_shifts, parse_shift
    from .data.synthetic import SyntheticShapes
    from .data.transforms import eval_transform
    from .interventions import (
        PEEntry,
        PEMoveError,
        PEScaleError,
        TokenPermutation,
        TokenPermutationError,
        find_embed_module,
        pe_inventory,
        pe_scale,
        pe_shift,
        pe_shuffle,
        shuffle_tiles,
        token_permutation,
    )
    from .localisation import (
        AblationResult,
        EncodingCKAResult,
        ImprintResult,
        LocalisationResult,
        PatchingResult,
        activation_patching,
        localise,
        pe_imprint,
        position_ablation,
    )
    from .localisation.encoding_cka import encoding_cka  # the function, not its submodule (see below)
    from .measuring.settings import MeasureSettings, MeasureSettingsError
    from .models import PosGeomViT, list_models
    from .models.factory import create_model
    from .probes import (
        AttentionMeasure,
        AttentionResult,
        CKAResult,
        Measure,
        MeasureResult,
        PositionProbeResult,
        SSDCResult,
        pe_table_ssdc,
        position_probe,
        probe_ssdc,
        run_measures,
        ssdc,
    )

    # the functions that share their submodule's name: imported from it (mypy takes `from .probes import cka`
    # for the submodule)
    from .probes.attention_measures import attention_measures
    from .probes.cka import cka
    from .probes.support import SupportRow, check_support
    from .protocol import Measurement, Protocol, ProtocolError, measure_model, measure_names, register_measure
    from .resolution import ExtrapolationResult, ExtrapolationRow, at_input_size, extrapolate
    from .robustness import (
        AlphaSweepResult,
        FragilityResult,
        InterventionResult,
        alpha_sweep,
        fragility,
        measure_pe_shift,
        measure_pe_shuffle,
        measure_tile_shuffle,
    )
    from .robustness.imagenet_c import ImageNetCResult, check_imagenet_c_tree, imagenet_c_fragility, imagenet_c_released

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
    "pe_shuffle",
    "pe_shift",
    "PEMoveError",
    "shuffle_tiles",
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
    # causal localisation
    "activation_patching",
    "PatchingResult",
    "pe_imprint",
    "ImprintResult",
    "position_ablation",
    "AblationResult",
    "encoding_cka",
    "EncodingCKAResult",
    "localise",
    "LocalisationResult",
    # how every measurement reads its images and where it runs
    "MeasureSettings",
    "MeasureSettingsError",
    # one protocol, one measuring function (study, zoo and command line alike)
    "Protocol",
    "ProtocolError",
    "measure_model",
    "Measurement",
    "register_measure",
    "measure_names",
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
    # resolution extrapolation
    "extrapolate",
    "ExtrapolationResult",
    "ExtrapolationRow",
    "at_input_size",
    "measure_pe_shuffle",
    "measure_pe_shift",
    "measure_tile_shuffle",
    "InterventionResult",
    # labels
    "match_labels",
    "LabelMismatchError",
    # data
    "load_split",
    "eval_loader",
    "create_model",
    "ImageSplit",
    "SyntheticShapes",
    "eval_transform",
]

# public name -> the module (relative to this package) that defines it
_LAZY = {
    **dict.fromkeys(("ImageSplit", "load_split"), "data"),
    "eval_loader": "data.eval_data",
    "create_model": "models.factory",
    **dict.fromkeys(
        ("ImageNetCResult", "check_imagenet_c_tree", "imagenet_c_fragility", "imagenet_c_released"),
        "robustness.imagenet_c",
    ),
    **dict.fromkeys(
        (
            "PEEntry",
            "PEMoveError",
            "PEScaleError",
            "TokenPermutation",
            "TokenPermutationError",
            "find_embed_module",
            "pe_inventory",
            "pe_scale",
            "pe_shift",
            "pe_shuffle",
            "shuffle_tiles",
            "token_permutation",
        ),
        "interventions",
    ),
    **dict.fromkeys(("LabelMismatchError", "match_labels"), "data.labels"),
    **dict.fromkeys(
        (
            "AblationResult",
            "EncodingCKAResult",
            "ImprintResult",
            "LocalisationResult",
            "PatchingResult",
            "activation_patching",
            "encoding_cka",
            "localise",
            "pe_imprint",
            "position_ablation",
        ),
        "localisation",
    ),
    **dict.fromkeys(("MeasureSettings", "MeasureSettingsError"), "measuring.settings"),
    **dict.fromkeys(("PosGeomViT", "list_models"), "models"),
    **dict.fromkeys(
        ("Measurement", "Protocol", "ProtocolError", "measure_model", "measure_names", "register_measure"), "protocol"
    ),
    **dict.fromkeys(
        (
            "SSDCResult",
            "pe_table_ssdc",
            "probe_ssdc",
            "ssdc",
            "AttentionMeasure",
            "AttentionResult",
            "Measure",
            "MeasureResult",
            "attention_measures",
            "run_measures",
            "CKAResult",
            "cka",
            "PositionProbeResult",
            "position_probe",
        ),
        "probes",
    ),
    **dict.fromkeys(
        (
            "AlphaSweepResult",
            "FragilityResult",
            "alpha_sweep",
            "fragility",
            "InterventionResult",
            "measure_pe_shuffle",
            "measure_pe_shift",
            "measure_tile_shuffle",
        ),
        "robustness",
    ),
    **dict.fromkeys(("ExtrapolationResult", "ExtrapolationRow", "at_input_size", "extrapolate"), "resolution"),
    **dict.fromkeys(
        ("JPEG", "Corruption", "GaussianBlur", "imagenet_c", "imagenet_c_shifts", "parse_shift"), "data.shifts"
    ),
    **dict.fromkeys(("SupportRow", "check_support"), "probes.support"),
    "SyntheticShapes": "data.synthetic",
    "eval_transform": "data.transforms",
}


def __getattr__(name: str) -> Any:
    """Load a public name on first use (PEP 562); the value is then cached in the module."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


class _RegisterWithTimm(importlib.abc.MetaPathFinder):
    """Imports :mod:`timm_posgeom.models` (which registers the models) right after timm itself is imported.

    Installed only while timm is not imported yet; it finds timm's own spec, wraps its loader to run the
    registration after timm's ``__init__``, gives timm back its own loader, and removes itself."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "timm":
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec("timm")
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _ThenRegister(spec.loader)
        return spec


class _ThenRegister(importlib.abc.Loader):
    def __init__(self, loader: Any):
        self.loader = loader

    def __getattr__(self, name: str) -> Any:  # get_data, get_resource_reader, ...: timm's own loader's
        return getattr(self.loader, name)

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        module.__spec__.loader = module.__loader__ = self.loader
        self.loader.exec_module(module)
        importlib.import_module(".models", __name__)


if "timm" in sys.modules:  # `import timm, timm_posgeom`: timm is loaded, register now
    importlib.import_module(".models", __name__)
elif not any(isinstance(f, _RegisterWithTimm) for f in sys.meta_path):
    sys.meta_path.insert(0, _RegisterWithTimm())
