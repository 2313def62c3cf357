"""Interventions on any timm ViT: random token permutation (RPI / RPT) and PE scaling (alpha).

Both are context managers that leave the model exactly as they found it, exceptions included.
Definitions: docs/method.md#rpi-and-rpt and docs/method.md#pe-scaling-alpha.

Modules: :mod:`.permutation` (token_permutation and its checks), :mod:`.scaling` (pe_scale, pe_inventory),
:mod:`.pe_search` (the PEs of a model), :mod:`.pe_scalers` (how each kind is scaled and restored) and
:mod:`.modes` (eval_mode), :mod:`.draws` (the permutations of the RPI protocol, drawn reproducibly). Every public name is importable from here.
"""

from __future__ import annotations

from .draws import draw_permutations, image_permutations, permutation_seeds
from .modes import eval_mode
from .pe_search import PEEntry
from .permutation import (
    TokenPermutation,
    TokenPermutationError,
    TokenPermutationUnsupported,
    active_permutations,
    check_unpermuted,
    find_embed_module,
    token_permutation,
    vlm_encoder,
)
from .scaling import AlphaOverflowError, PEScaleError, pe_inventory, pe_scale

__all__ = [
    "token_permutation",
    "TokenPermutation",
    "TokenPermutationError",
    "TokenPermutationUnsupported",
    "active_permutations",
    "check_unpermuted",
    "pe_scale",
    "PEScaleError",
    "find_embed_module",
    "vlm_encoder",
    "eval_mode",
    "pe_inventory",
    "PEEntry",
    "AlphaOverflowError",
    "draw_permutations",
    "image_permutations",
    "permutation_seeds",
]
