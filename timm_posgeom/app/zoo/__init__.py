"""``posgeom zoo``: measure many models the same way and compare them, one row per model.

For every model (a timm name, ``hf-hub:ORG/NAME``, ``local-dir:PATH`` or one of this package's
``posgeom_*`` models), on the same images:

* SSDC per layer at ``site`` (``auto``: the attention input of each block of a flat ViT, each stage's
  feature map otherwise), normal and under RPI (one permutation of the patch contents, seeded), with
  :func:`~timm_posgeom.probes.probe_ssdc`; where RPI is refused (a model without a patch embedding)
  the reason is recorded;
* delta SSDC: SSDC under RPI of layer 1 minus layer 0, the paper's quantity (docs/method.md#delta-ssdc);
  undefined (None) for a model probed per stage, whose first two maps lie on different grids;
* clean top-1 and the fragility score ``FS = 1 - A_shift / A_clean`` of each shift (the paper's JPEG
  q5 and blur sigma 2.5 / kernel 5, optionally ImageNet-C's severities) with
  :func:`~timm_posgeom.robustness.fragility`, only when the data's labels can be matched to the
  model's outputs (:func:`~timm_posgeom.data.labels.map_by_name`); otherwise left empty with the reason;
* optionally an alpha sweep (:func:`~timm_posgeom.robustness.alpha_sweep`: delta SSDC under RPI and
  JPEG q5 FS per PE scale alpha).

Each model runs at its own data config (input size, interpolation, mean / std:
:func:`~timm_posgeom.data.transforms.resolve_config`) unless ``img_size`` is given. Every model is measured by
:func:`timm_posgeom.protocol.measure_model` under the zoo's protocol (:meth:`ZooConfig.protocol`), the study's
measuring function: the same model, data and protocol give the same numbers in both.

Files, under ``out``: ``models/<safe-name>.json`` (:func:`record_path`; a
:class:`~timm_posgeom.app.records.ZooModel` per model, written atomically as soon as the model is done), ``zoo.json`` (settings and model list),
``zoo.csv`` (one row per model, as timm's ``results/*.csv``), ``zoo.md`` and ``figures/*.png``.
A rerun into the same ``out`` skips every model already measured with the same settings (a kill
loses at most the model in progress), retries the ones that failed, and refuses other settings
unless ``allow_changes``. Only the main process writes (:func:`is_main_process`).

The package: :mod:`.config` (:class:`ZooConfig`, model lists), :mod:`.measure` (one model),
:mod:`.run` (plan, shards, locks, :func:`run_zoo`, :func:`merge_zoo`), :mod:`.table` (``zoo.csv``),
:mod:`.figures` (``zoo.md`` and the figures) and :mod:`.model_sets` (``--model-set``: model lists, and the top-1 timm
publishes for them, shown beside the zoo's).
"""

from .config import (
    EXTRAS,
    JPEG_SHIFT,
    PRETRAINED_MODES,
    SWEEP_SHIFTS,
    ZooConfig,
    ZooError,
    config_from_settings,
    filter_models,
    is_main_process,
    read_models_file,
    record_path,
    safe_name,
    versions,
)
from .figures import fig_fragility_delta, fig_ssdc_depth, write_outputs, zoo_markdown
from .measure import match_labels, measure_model, weights_key
from .model_sets import MODEL_SETS, PUBLISHED, model_set, published_top1
from .run import ZooSummary, merge_zoo, parse_shard, read_records, run_zoo
from .table import csv_columns, csv_rows, layer_summary, pe_kinds, relative_depth, write_csv

__all__ = [
    "ZooConfig",
    "ZooError",
    "ZooSummary",
    "run_zoo",
    "merge_zoo",
    "parse_shard",
    "read_records",
    "measure_model",
    "read_models_file",
    "filter_models",
    "safe_name",
    "record_path",
    "is_main_process",
    "csv_rows",
    "write_outputs",
    "zoo_markdown",
    "fig_ssdc_depth",
    "fig_fragility_delta",
    "JPEG_SHIFT",
    "SWEEP_SHIFTS",
    "PRETRAINED_MODES",
    "EXTRAS",
    "relative_depth",
    "layer_summary",
    "csv_columns",
    "write_csv",
    "pe_kinds",
    "versions",
    "weights_key",
    "config_from_settings",
    "match_labels",
    "MODEL_SETS",
    "PUBLISHED",
    "model_set",
    "published_top1",
]
