"""Fragility scores under distribution shifts, and alpha sweeps linking PE strength to robustness.

Definitions (the paper; docs/method.md#fragility-score-and-shifts):

* top-1 accuracy ``A = k / n``: ``k`` images of ``n`` whose arg-max logit equals the label, counted
  exactly over every image (never an average of per-batch accuracies);
* fragility score ``FS = 1 - A_shift / A_clean`` (0: the shift costs nothing; 1: it destroys all
  correct predictions; negative when the shift helps). ``A_clean = 0`` gives NaN with a warning;
* 95% intervals: accuracies by the Wilson score interval; FS by a paired percentile bootstrap over
  images (each image contributes its (clean correct, shifted correct) pair, so the interval
  accounts for the pairing). Resampling n pairs only changes the counts of the four pair types,
  so the bootstrap draws those counts from a multinomial: the same distribution, exactly, at
  no cost per image.

:func:`fragility` (:mod:`.fragility_eval`) runs every shift in the same pass: each batch is decoded and
resized once, the clean image and each shifted copy go through the model in one forward (or in pieces of
``forward_size``), clean accuracy is computed once. Under RPI (``rpi=True``) each image gets its own token
permutation, from (``seed``, the image's index), shared by its clean and shifted copies (reproducible).
Random shifts (ImageNet-C's noise, frost, ...) corrupt image i with a seed made of (``seed``, i): the same
copies whatever the batch size or the number of workers.
:func:`~timm_posgeom.robustness.imagenet_c.imagenet_c_fragility` runs all 75 ImageNet-C shifts this way.

:func:`alpha_sweep` (:mod:`.sweep`) scales the PE by alpha (``pe_scale``; APE incl. the class row as in the
paper, sincos, RoPE angles, third-party timm ViTs) and measures, per alpha, delta SSDC under RPI and the
fragility of every shift.

:mod:`.position_interventions` measures top-1 and SSDC with the encoding itself moved (:func:`measure_pe_shuffle`,
:func:`measure_pe_shift`) or the image's tiles shuffled (:func:`measure_tile_shuffle`), each condition with its
95% interval, into an :class:`InterventionResult` (:mod:`.intervention_result`).

Both run unchanged under ``accelerate launch`` / ``torchrun`` (see :mod:`timm_posgeom.measuring.distributed`):
each process evaluates its share of the batches, and every process returns the result one process
would compute (the per-image correctness arrays are re-assembled in data order, so counts,
accuracies, FS and the bootstrap intervals are identical).

The formulas and :class:`FragilityResult` live in :mod:`.scores`; a shift applied at a fixed size before the resize
in :mod:`.shift_size`; ImageNet-C (generated and released) in :mod:`.imagenet_c`, its result in
:mod:`.imagenet_c_result`, the released tree in :mod:`.imagenet_c_tree`. The shifts themselves are
:mod:`timm_posgeom.data.shifts` (an eval transform applies them). Every public name but ImageNet-C's is
importable from here (ImageNet-C's from :mod:`.imagenet_c`, or the package root).
"""

from __future__ import annotations

from ..defaults import DEFAULT_ALPHAS
from .fragility_eval import fragility
from .intervention_result import InterventionResult, InterventionRow
from .position_interventions import (
    DEFAULT_PE_SHIFTS,
    TileShuffle,
    default_tile_grids,
    measure_pe_shift,
    measure_pe_shuffle,
    measure_tile_shuffle,
)
from .scores import FragilityResult, fragility_score, paired_bootstrap_fs, wilson_interval
from .sweep import AlphaSweepResult, AlphaSweepRow, alpha_sweep, sweep_ssdc

__all__ = [
    "measure_pe_shuffle",
    "measure_pe_shift",
    "measure_tile_shuffle",
    "InterventionResult",
    "InterventionRow",
    "TileShuffle",
    "DEFAULT_PE_SHIFTS",
    "default_tile_grids",
    "fragility",
    "FragilityResult",
    "alpha_sweep",
    "sweep_ssdc",
    "AlphaSweepResult",
    "AlphaSweepRow",
    "fragility_score",
    "wilson_interval",
    "paired_bootstrap_fs",
    "DEFAULT_ALPHAS",
]
