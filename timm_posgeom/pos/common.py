"""Names and argument checks shared by the positional encodings."""

from __future__ import annotations

import math

PE_TYPES = ("none", "ape", "sincos", "rope")
TOKEN_SHUFFLE_MODES = ("none", "train", "eval", "always")


def check_alpha(alpha: float) -> float:
    """Return ``alpha`` as a float; raise ValueError unless it is finite and >= 0."""
    try:
        value = float(alpha)
    except (TypeError, ValueError):
        raise ValueError(f"alpha must be a finite number >= 0, got {alpha!r}") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"alpha must be a finite number >= 0, got {alpha!r}")
    return value
