"""The whole study in one command: train (or reuse) every condition, probe, stress, sweep, report.

For each condition (no PE, APE, sincos, RoPE, RPT) and seed, a run directory
``<out>/runs/<condition>_s<seed>/`` holds the training run (``posgeom train``, in a subprocess so
each model starts from fresh memory, resumable from its checkpoints) and ``eval.json``:

* clean accuracy and fragility (the paper's JPEG q5 and blur sigma 2.5 / kernel 5, optionally
  ImageNet-C severities), exact counts over the evaluation images;
* SSDC across depth at the attention input, normal and under RPI, both reductions (mean map and per
  image), and the mean similarity maps of layers 0 and 1; under RPI with ``rpi_permutations``
  permutations (seeds 0 .. P-1, the same for every model and seed), whose spread enters the claims'
  intervals (docs/method.md#rpi-and-rpt);
* for APE, sincos and RoPE, an alpha sweep (delta SSDC under RPI and JPEG fragility per alpha);
* attention per head (mean distance, entropy, SSDC) at a few layers, normal and under RPI;
* the SSDC of the same architecture untrained (the paper's static prior).

The study goes one way down: :mod:`.config` (what a study does, the presets, its protocol) -> :mod:`.plan`
(every run with its recipe, built once) -> per run :mod:`.training` -> :mod:`.measure` (the parts ``eval.json``
lacks, each by :func:`timm_posgeom.protocol.measure_model` under ``StudyConfig.protocol()``, the zoo's
measuring function) -> a record, then :mod:`timm_posgeom.app.report` from the results in memory
(:mod:`.runner`).

Every stage's result is written as soon as it exists, so an interrupted study resumes where it
stopped (``--resume``). ``results.json`` collects every number with the exact configuration,
versions and seeds; :mod:`timm_posgeom.app.report` turns it into ``report.md`` and figures.
"""

from __future__ import annotations

from .config import (
    CONDITIONS,
    LEGACY_SETTINGS,
    PRESETS,
    RPI_SETTINGS,
    SWEPT,
    StudyConfig,
    StudyError,
    config_changes,
    preset_config,
)
from .plan import PlannedRun, StudyPlan, dry_run, make_plan, plan_study, write_plan
from .runner import run_study

__all__ = [
    "CONDITIONS",
    "PRESETS",
    "StudyConfig",
    "run_study",
    "plan_study",
    "preset_config",
    "dry_run",
    "write_plan",
    "StudyError",
    "config_changes",
    "make_plan",
    "StudyPlan",
    "PlannedRun",
    "SWEPT",
    "LEGACY_SETTINGS",
    "RPI_SETTINGS",
]
