"""Interventions on any timm ViT: random token permutation (RPI / RPT), PE scaling (alpha), the encoding moved
(PE shuffle, PE shift) and the image's tiles shuffled.

The model interventions are context managers that leave the model exactly as they found it, exceptions
included. Definitions: docs/method.md#rpi-and-rpt, docs/method.md#pe-scaling-alpha,
docs/method.md#pe-shuffle-and-pe-shift and docs/method.md#image-grid-shuffle.

Modules: :mod:`.permutation` (token_permutation and its checks), :mod:`.scaling` (pe_scale, pe_inventory),
:mod:`.pe_search` (the PEs of a model), :mod:`.pe_scalers` (how each kind is scaled and restored),
:mod:`.pe_moves` (pe_shuffle, pe_shift), :mod:`.tiles` (the image-grid shuffle), :mod:`.modes` (eval_mode),
:mod:`.draws` (the permutations of the RPI protocol, drawn reproducibly). Every public name is importable from
here.
"""

from __future__ import annotations

from .draws import draw_permutations, image_permutations, permutation_seeds
from .modes import eval_mode
from .pe_moves import EDGES, PEMoveError, pe_moves, pe_shift, pe_shuffle, read_table
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
from .tiles import check_tile_grid, shuffle_tiles, tile_token_permutation

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
    "pe_shuffle",
    "pe_shift",
    "pe_moves",
    "PEMoveError",
    "EDGES",
    "read_table",
    "shuffle_tiles",
    "tile_token_permutation",
    "check_tile_grid",
]
