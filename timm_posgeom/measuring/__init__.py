"""How a measurement runs: its settings (:mod:`.settings`: :class:`MeasureSettings`, the bounds on counts), its
processes (:mod:`.distributed`: data-parallel measuring) and its per-image seeds (:mod:`.seeding`).

The settings' names are importable from here, as in 0.1.0 (``from timm_posgeom.measuring import
MeasureSettings``); the package's own modules import them from :mod:`.settings`. Nothing here imports torch.
"""

from .settings import (
    DISTRIBUTED_MODES,
    MAX_CLASSES,
    MAX_IMG_SIZE,
    MAX_RPI_PERMUTATIONS,
    MEMORY_BUDGET_BYTES,
    RESIZE_MODES,
    MeasureSettings,
    MeasureSettingsError,
    max_workers,
    sums_budget_error,
)

__all__ = [
    "MeasureSettings",
    "MeasureSettingsError",
    "DISTRIBUTED_MODES",
    "RESIZE_MODES",
    "MAX_RPI_PERMUTATIONS",
    "MEMORY_BUDGET_BYTES",
    "MAX_IMG_SIZE",
    "MAX_CLASSES",
    "max_workers",
    "sums_budget_error",
]
