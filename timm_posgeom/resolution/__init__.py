"""Resolution extrapolation: a ViT at input sizes it was not trained at, per way of carrying its positional encoding.

* :func:`extrapolate` - top-1, SSDC, delta SSDC under RPI and attention per layer, per input size and mode, with
  intervals -> :class:`ExtrapolationResult` (rows: :class:`ExtrapolationRow`; figure: :func:`extrapolation_figure`);
* :func:`at_input_size` - a model carried to an input size in a mode for a ``with`` block, restored exactly;
  :data:`MODES`, :func:`model_modes` (the modes a model takes), :func:`check_modes`, :func:`check_sizes`.

Modules: :mod:`.carry` (the modes and the context manager), :mod:`.measure` (the measure), :mod:`.result` (rows,
JSON, CSV, figure). Definitions: docs/method.md#resolution-extrapolation.
"""

from .carry import (
    MODE_HELP,
    MODES,
    ExtrapolationError,
    ModuleState,
    at_input_size,
    check_modes,
    model_modes,
    patch_size,
    training_size,
)
from .measure import SETTING_KEYS, SettingsChangedError, check_sizes, default_sizes, extrapolate
from .result import ExtrapolationResult, ExtrapolationRow, extrapolation_figure

__all__ = [
    "extrapolate",
    "ExtrapolationResult",
    "ExtrapolationRow",
    "extrapolation_figure",
    "ExtrapolationError",
    "at_input_size",
    "MODES",
    "MODE_HELP",
    "model_modes",
    "check_modes",
    "check_sizes",
    "default_sizes",
    "training_size",
    "patch_size",
    "ModuleState",
    "SETTING_KEYS",
    "SettingsChangedError",
]
