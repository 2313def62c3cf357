"""Names and argument checks shared by the positional encodings."""

from __future__ import annotations

from ..defaults import check_alpha

__all__ = ["PE_TYPES", "TOKEN_SHUFFLE_MODES", "check_alpha"]

PE_TYPES = ("none", "ape", "sincos", "rope")
TOKEN_SHUFFLE_MODES = ("none", "train", "eval", "always")
