"""Probes of spatial structure in ViT representations: the SSDC metric and its streaming probe.

* :func:`ssdc` - the metric, a pure function on similarity maps (one or a batch).
* :func:`probe_ssdc` - SSDC of any flat timm ViT, layer by layer, over a whole dataset (optionally
  under random token permutation, RPI) -> :class:`SSDCResult`.
* :func:`pe_table_ssdc` - the SSDC of a learned position table itself;
  :func:`pe_content_norm_ratio` - its norm against the content tokens'.
* :func:`attention_measures` - mean attention distance, attention entropy and attention SSDC per
  block and head (docs/attention.md) -> :class:`AttentionResult`; :func:`run_measures` runs any
  :class:`Measure` of the blocks' tokens or attention weights in one streamed pass.
* :func:`position_probe` - a linear (row, col) probe of the patch tokens per block; :func:`cka` - linear
  minibatch CKA between the blocks of two models (both built on :func:`run_measures`).
* :func:`find_sites` - the blocks, probe sites, prefix tokens and token grid of a timm ViT.
"""

from .attention_measures import AttentionMeasure, AttentionResult, attention_measures
from .cka import CKAResult, cka
from .measures import LayerView, Measure, MeasureResult, run_measures
from .pe_table import pe_content_norm_ratio, pe_table_ssdc
from .position import PositionMap, PositionProbeResult, fit_position_map, position_probe
from .sites import SITES, ProbeSites, UnsupportedModelError, find_sites
from .ssdc_probe.probe import REDUCTIONS, probe_ssdc
from .ssdc_probe.result import PerImageStats, SSDCResult
from .ssdc_probe.spearman import DISTANCES, ConstantMapWarning, grid_positions, pair_distances, rankdata, ssdc

__all__ = [
    "ssdc",
    "probe_ssdc",
    "attention_measures",
    "AttentionResult",
    "AttentionMeasure",
    "run_measures",
    "Measure",
    "MeasureResult",
    "LayerView",
    "position_probe",
    "PositionProbeResult",
    "fit_position_map",
    "PositionMap",
    "cka",
    "CKAResult",
    "pe_table_ssdc",
    "pe_content_norm_ratio",
    "SSDCResult",
    "PerImageStats",
    "find_sites",
    "ProbeSites",
    "UnsupportedModelError",
    "ConstantMapWarning",
    "grid_positions",
    "pair_distances",
    "rankdata",
    "DISTANCES",
    "SITES",
    "REDUCTIONS",
]
