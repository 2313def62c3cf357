"""One schema for what runs and studies write: typed records, a schema version, one JSON writer.

=================  ======================================  ===========================================
file               record                                  written by / read by
=================  ======================================  ===========================================
``summary.json``   :class:`RunSummary`                      ``posgeom train`` / study, report, hub
``eval.json``      :class:`RunEval`                         ``posgeom study`` / study (resume), hub
``untrained/*``    :class:`SSDCSummary`                     ``posgeom study`` / study
``results.json``   :class:`StudyResults`                    ``posgeom study`` / ``posgeom report``
``zoo.json``       :class:`ZooIndex`                        ``posgeom zoo`` / ``posgeom zoo`` (resume)
``models/*.json``  :class:`ZooModel`                        ``posgeom zoo`` / ``posgeom zoo`` (resume, table)
=================  ======================================  ===========================================

Every file carries ``"schema": "timm-posgeom/<kind>"`` and ``"schema_version"``; :meth:`Record.read`
refuses, with one line naming the file, a file of another kind, of a schema version it cannot read, with
unknown or missing keys, or that is not JSON.

Schema versions (a new version only adds optional keys, so every version in ``READABLE_VERSIONS`` still
reads; files are written with ``SCHEMA_VERSION``):

* 1: the first.
* 2: :class:`SSDCSummary` gains ``rpi_permutations`` (the RPI permutation seeds measured) and
  ``rpi_by_permutation`` (SSDC per layer under each); ``rpi_per_layer`` and ``rpi_delta`` are their mean
  over permutations. A version 1 record has neither: one permutation, seed 0.
* 3: :class:`RunSummary` gains ``export_sha1`` and ``export_ema_sha1`` (SHA-1 of the exported weights its
  top-1 and table SSDC were measured on); older records have None: not recorded, and a card states none
  of their numbers.
* 4: :class:`RunEval` gains ``attention`` (:class:`AttentionSummary`: attention measures per head at a few
  layers, normal and under RPI); older records have None (not measured; a resumed study measures it).
* 5: every number a reader compares has its 95% interval beside it. :class:`SSDCSummary`: ``delta`` (SSDC of
  layer 1 minus layer 0 without RPI) is renamed ``rise`` (a version 4 file's ``delta`` is read as ``rise``),
  and it gains ``per_layer_ci`` and ``rise_ci`` (jackknife over images), ``rpi_per_layer_ci`` and
  ``rpi_delta_ci`` (over the RPI permutations); ``rpi_content_per_layer`` and ``rpi_per_image_*`` are means
  over the permutations (the first permutation's before). :class:`SweepSummary` gains ``rpi_permutations``
  (K, drawn afresh for every alpha; None: one, seed 0 at every alpha) and ``delta_ssdc_ci``.
  :class:`AttentionSummary` gains ``rpi_permutations`` (its RPI fields are means over them; None: one, seed 0).
* 6: the held-out monitor and the shift at a fixed size. :class:`RunSummary` gains ``monitor`` (the split the
  per-epoch evaluations read: ``validation`` or ``heldout``), ``monitor_images`` and ``monitor_top1``;
  :class:`HistoryPoint` gains ``monitor`` and ``heldout_top1``; :class:`RunEval` gains ``fragility_at_size``
  (:class:`FragilityAtSize`). Older records have None: monitored on the validation split, not measured.
* 7: the protocol's optional measures (:func:`timm_posgeom.protocol.register_measure`) without a place of their
  own: :class:`ZooModel` and :class:`RunEval` gain ``measures`` (registry name -> the measure's ``to_dict()``).
  Older records have None: none measured.

Files are written through
:func:`timm_posgeom.results.jsonio.write_json` (strict JSON, NaN as ``null``, atomic). A ``None`` where a
number is expected is a NaN (a constant map's SSDC, an undefined FS): readers that compute turn it
back into NaN.
"""

from __future__ import annotations

import dataclasses
import json
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from ..errors import PosgeomError
from ..results.jsonio import tagged as with_schema_tags
from ..results.jsonio import to_jsonable, write_json

__all__ = [
    "SCHEMA_VERSION",
    "READABLE_VERSIONS",
    "RecordError",
    "RENAMED_KEYS",
    "Num",
    "Record",
    "RunSummary",
    "SSDCSummary",
    "SweepSummary",
    "AttentionSummary",
    "FragilityAtSize",
    "RunEval",
    "HistoryPoint",
    "StudyRun",
    "StudyResults",
    "ZooModel",
    "ZooIndex",
]

SCHEMA_VERSION = 7
READABLE_VERSIONS = (1, 2, 3, 4, 5, 6, 7)  # older versions whose records this one reads (new keys take their defaults)
R = TypeVar("R", bound="Record")
Num = typing.Optional[float]  # a number, or None for NaN


class RecordError(PosgeomError, ValueError):
    """A record file that is missing, foreign, of another schema version or malformed."""


# Keys renamed since a record was first written, per kind: former name -> current. A file written before is read
# under the current names (schema 5: SSDC's difference of layer 1 minus layer 0 without RPI became ``rise``).
RENAMED_KEYS: dict[str, dict[str, str]] = {
    "ssdc-summary": {"delta": "rise"},
    "zoo-model": {"delta_ssdc": "rise"},
}


@dataclass
class Record:
    """Base of the typed records: ``to_dict`` / ``from_dict``, ``write`` / ``read`` with a schema tag."""

    KIND: ClassVar[str] = ""

    def to_dict(self, tagged: bool = True) -> dict[str, Any]:
        body = to_jsonable(dataclasses.asdict(self))
        return with_schema_tags(self.KIND, body, SCHEMA_VERSION) if tagged else body

    @classmethod
    def from_dict(cls: type[R], values: Any, source: str = "record") -> R:
        """Build the record from its dict (schema tags, if present, checked; keys under a former name,
        :data:`RENAMED_KEYS`, read under the current one); RecordError names ``source``."""
        if not isinstance(values, dict):
            raise RecordError(f"{source}: expected a JSON object for {cls.__name__}, got {type(values).__name__}")
        values = dict(values)
        for old, new in RENAMED_KEYS.get(cls.KIND, {}).items():
            if old in values and new not in values:
                values[new] = values.pop(old)
        schema, version = values.pop("schema", None), values.pop("schema_version", None)
        if schema is not None and schema != f"timm-posgeom/{cls.KIND}":
            raise RecordError(f"{source}: a {schema!r} record, not timm-posgeom/{cls.KIND}")
        if version is not None and version not in READABLE_VERSIONS:
            raise RecordError(
                f"{source}: schema version {version}, this timm-posgeom reads versions "
                f"{', '.join(map(str, READABLE_VERSIONS))} (re-run the command that wrote it with "
                "this version)"
            )
        hints = typing.get_type_hints(cls)
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - set(fields))
        if unknown:
            raise RecordError(f"{source}: unknown keys {unknown} for {cls.__name__}")
        missing = [
            n
            for n, f in fields.items()
            if n not in values and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        ]
        if missing:
            raise RecordError(f"{source}: missing keys {missing} for {cls.__name__}")
        return cls(**{k: _build(hints[k], v, f"{source}: {k}") for k, v in values.items()})

    def write(self, path: str | os.PathLike) -> Path:
        """Write the tagged record as strict JSON, atomically."""
        return write_json(path, self.to_dict())

    @classmethod
    def read(cls: type[R], path: str | os.PathLike) -> R:
        """Read a file written by :meth:`write`; RecordError (one line naming the file) otherwise."""
        path = Path(path)
        if not path.is_file():
            raise RecordError(f"{path}: no such file (a {cls.KIND} record)")
        try:
            values = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise RecordError(f"{path}: not valid JSON ({e})") from None
        if not isinstance(values, dict) or "schema" not in values:
            raise RecordError(
                f"{path}: not a timm-posgeom {cls.KIND} record (no schema tag; written by another "
                "program or an older timm-posgeom)"
            )
        return cls.from_dict(values, source=str(path))


def _build(tp: Any, value: Any, source: str) -> Any:
    """``value`` as annotation ``tp``: nested records (also in lists and Optionals) are built, the rest checked
    against its annotation (:func:`_check_type`) and kept."""
    if value is None:
        return None
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return _build(inner[0], value, source) if len(inner) == 1 else value
    if isinstance(tp, type) and issubclass(tp, Record):
        return tp.from_dict(value, source)
    if origin is list and args and isinstance(args[0], type) and issubclass(args[0], Record):
        if not isinstance(value, list):
            raise RecordError(f"{source}: expected a list, got {type(value).__name__}")
        return [args[0].from_dict(v, f"{source}[{i}]") for i, v in enumerate(value)]
    _check_type(tp, value, source)
    return value


_PLAIN = {int: (int,), float: (int, float), str: (str,), bool: (bool,)}


def _check_type(tp: Any, value: Any, source: str) -> None:
    """RecordError (one line, naming ``source``) when ``value`` read from a file is not of annotation ``tp``
    (a record edited by hand: a number written as text, a list where a number goes); None is NaN or not
    recorded anywhere, and ``Any`` holds anything."""
    if value is None or tp is Any:
        return
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        for option in inner:
            try:
                _check_type(option, value, source)
                return
            except RecordError:
                continue
        raise RecordError(f"{source}: holds {str(value)[:60]!r}, not a {tp} (edited?)")
    if origin in (list, dict):
        if not isinstance(value, origin):
            raise RecordError(f"{source}: expected a {origin.__name__}, got {type(value).__name__} (edited?)")
        items = value if origin is list else value.values()
        for item in items:
            _check_type(args[-1] if args else Any, item, source)
        return
    allowed = _PLAIN.get(tp)
    if allowed is not None and (not isinstance(value, allowed) or (tp is not bool and isinstance(value, bool))):
        raise RecordError(f"{source}: expected a {tp.__name__}, got {str(value)[:60]!r} (edited?)")


# --------------------------------------------------------------------------------------------
# a training run
# --------------------------------------------------------------------------------------------
@dataclass
class RunSummary(Record):
    """``summary.json`` of a training run: what was trained, for how long, how well."""

    KIND: ClassVar[str] = "run-summary"
    model: str
    steps: int
    epochs: float
    train_images: int
    val_images: int
    processes: int
    time_s: float
    val_top1: Num = None
    ema_val_top1: Num = None
    pe_ssdc: Num = None  # SSDC of the learned position table itself (None: no learned table)
    resumed_from: str | None = None
    export: str | None = None
    export_ema: str | None = None
    # SHA-1 of export/ and export_ema/model.safetensors as exported (schema 3; None: not recorded): val_top1 and
    # pe_ssdc were measured on the first, ema_val_top1 on the second; a card shows each only for those weights
    export_sha1: str | None = None
    export_ema_sha1: str | None = None
    skipped_images: list[str] | None = None  # images left out because they cannot be decoded (bad_images=skip)
    versions: dict[str, str] | None = None  # of the process that finished the training (None: not recorded)
    # schema 6: the split the per-epoch evaluations read (validation | heldout; None: validation, not recorded),
    # its size and the last top-1 on it; val_top1 is on the validation split either way
    monitor: str | None = None
    monitor_images: int | None = None
    monitor_top1: Num = None


# --------------------------------------------------------------------------------------------
# measurements of a trained run (the study)
# --------------------------------------------------------------------------------------------
@dataclass
class SSDCSummary(Record):
    """SSDC across depth at the attention input, normal and under RPI (docs/method.md#ssdc,
    docs/method.md#rpi-and-rpt).

    Lists hold one value per layer; ``per_image_*`` are the per-image reduction's mean and std. ``rise`` is
    SSDC(layer 1) - SSDC(layer 0) without RPI (delta SSDC is defined under RPI: ``rpi_delta``). Under RPI the
    study draws ``rpi_permutations`` (their seeds; None: one, seed 0, a version 1 record) and keeps SSDC per
    layer under each in ``rpi_by_permutation``; ``rpi_per_layer`` and ``rpi_delta`` are the means over
    permutations, and so are ``rpi_content_per_layer`` and ``rpi_per_image_*`` from schema 5 (the first
    permutation's before). Each ``*_ci`` is the 95% interval ``[low, high]`` of the number it is named after
    (per layer: a list of pairs): over images without RPI (a delete-a-group jackknife), over the permutations
    under RPI (schema 5; None in older records).
    """

    KIND: ClassVar[str] = "ssdc-summary"
    n_images: int
    per_layer: list[Num]
    rise: Num
    rpi_per_layer: list[Num]
    rpi_delta: Num  # delta SSDC under RPI: layer 1 - layer 0 (docs/method.md#delta-ssdc)
    rpi_content_per_layer: list[Num]  # under RPI, against where each token's content came from
    per_image_mean: list[Num] | None = None
    per_image_std: list[Num] | None = None
    rpi_per_image_mean: list[Num] | None = None
    rpi_per_image_std: list[Num] | None = None
    rpi_permutations: list[int] | None = None  # the seeds of the RPI permutations (schema version 2)
    rpi_by_permutation: list[list[Num]] | None = None  # SSDC per layer under each of them (schema version 2)
    per_layer_ci: list[list[Num]] | None = None  # schema 5: the intervals of per_layer, rise, rpi_per_layer, rpi_delta
    rise_ci: list[Num] | None = None
    rpi_per_layer_ci: list[list[Num]] | None = None
    rpi_delta_ci: list[Num] | None = None


@dataclass
class SweepSummary(Record):
    """An alpha sweep: per alpha, delta SSDC under RPI, clean accuracy and FS per shift; ``fs_interval``: per
    shift, the paired-bootstrap 95% interval ``[lo, hi]`` of FS at each alpha (absent in sweeps recorded before
    it was kept). From schema 5: ``rpi_permutations`` K (delta SSDC and ``rpi_per_layer`` are means over K
    permutations drawn afresh for every alpha; None: one permutation, seed 0, the same at every alpha) and
    ``delta_ssdc_ci``, the 95% interval ``[lo, hi]`` of delta SSDC at each alpha over those permutations."""

    KIND: ClassVar[str] = "alpha-sweep"
    alphas: list[float]
    delta_ssdc: list[Num]
    fs: dict[str, list[Num]]
    clean_accuracy: list[Num]
    rpi_per_layer: list[list[Num]]
    fs_interval: dict[str, list[list[Num]]] | None = None
    rpi_permutations: int | None = None
    delta_ssdc_ci: list[list[Num]] | None = None


@dataclass
class AttentionSummary(Record):
    """Attention measures per head at a few layers of a trained run (docs/attention.md#the-measures),
    normal and under RPI (distances on the index grid, as SSDC under RPI): the mean over ``rpi_permutations``
    shared permutations (schema 5; None: one permutation, seed 0).

    ``layers`` are the block indices measured, ``grid`` the patch grid; every other list is (layers, heads): ``mean_distance``, the
    mean attention distance in patch units, ``entropy`` in nats, ``ssdc`` the SSDC of each head's
    symmetrised mean attention map. The ``rpi_*`` lists are None when the run could not be permuted.
    """

    KIND: ClassVar[str] = "attention-summary"
    n_images: int
    layers: list[int]
    grid: list[int]  # (rows, cols) of the patch grid the distances are measured on
    mean_distance: list[list[Num]]
    entropy: list[list[Num]]
    ssdc: list[list[Num]] | None = None
    rpi_mean_distance: list[list[Num]] | None = None
    rpi_entropy: list[list[Num]] | None = None
    rpi_ssdc: list[list[Num]] | None = None
    rpi_permutations: int | None = None


@dataclass
class FragilityAtSize(Record):
    """Fragility with each shift applied at ``shift_size`` px, before the resize to the model's input
    (robustness.fragility's ``shift_size``; docs/method.md#fragility-score-and-shifts): clean top-1, top-1 and FS
    per shift, FS's paired-bootstrap 95% interval, on ``num_images`` images (schema 6)."""

    KIND: ClassVar[str] = "fragility-at-size"
    shift_size: int
    clean_accuracy: Num
    accuracy: dict[str, Num]
    fs: dict[str, Num]
    fs_interval: dict[str, list[Num]]
    num_images: int


@dataclass
class RunEval(Record):
    """``eval.json``: a trained run measured by the study; each part is written as soon as it exists."""

    KIND: ClassVar[str] = "run-eval"
    settings: dict[str, Any] | None = None  # what the measurements depended on (data, images, shifts, alphas)
    weights_sha1: str | None = None  # of the export/model.safetensors measured (None: recorded before it was kept)
    clean_accuracy: Num = None
    accuracy: dict[str, Num] | None = None
    fs: dict[str, Num] | None = None
    fs_interval: dict[str, list[Num]] | None = None
    num_images: int | None = None
    ssdc: SSDCSummary | None = None
    alpha_sweep: SweepSummary | None = None
    versions: list[dict[str, str]] | None = None  # every version set that measured a part (None: not recorded)
    attention: AttentionSummary | None = None  # per head at a few layers (schema version 4; None: not measured)
    # schema 6: fragility with the shifts at the study's shift_size, beside the model-input numbers above (which
    # stay: clean_accuracy, accuracy, fs); None: not measured (no shift_size)
    fragility_at_size: FragilityAtSize | None = None
    # schema 7: the study's optional measures beyond attention (StudyConfig.extras), name -> the result's to_dict()
    measures: dict[str, Any] | None = None


# --------------------------------------------------------------------------------------------
# a study
# --------------------------------------------------------------------------------------------
@dataclass
class HistoryPoint(Record):
    """One evaluation of the training log (``metrics.jsonl``)."""

    KIND: ClassVar[str] = "history-point"
    step: int
    epoch: float
    val_top1: Num = None
    rpi_ssdc: list[Num] | None = None
    pe_ssdc: Num = None
    monitor: str | None = None  # schema 6: the split evaluated (validation | heldout; None: validation)
    heldout_top1: Num = None  # schema 6: top-1 on the held-out monitor split

    @property
    def monitor_top1(self) -> float | None:
        """Top-1 on the split that monitored training (validation or held-out)."""
        return self.heldout_top1 if self.monitor == "heldout" else self.val_top1


@dataclass
class StudyRun(Record):
    """One condition x seed of a study: its training, its measurements, its training log, untrained."""

    KIND: ClassVar[str] = "study-run"
    condition: str
    seed: int
    run_dir: str
    train: RunSummary
    eval: RunEval
    history: list[HistoryPoint]
    untrained: SSDCSummary


@dataclass
class StudyResults(Record):
    """``results.json``: every number of a study with its configuration, plan and versions."""

    KIND: ClassVar[str] = "study-results"
    config: dict[str, Any]  # the StudyConfig
    plan: list[dict[str, Any]]
    versions: dict[str, str]
    runs: list[StudyRun] = field(default_factory=list)
    recipes: dict[str, Any] = field(default_factory=dict)
    eval_data: dict[str, Any] = field(default_factory=dict)
    elapsed_s: float = 0.0
    complete: bool = False


# --------------------------------------------------------------------------------------------
# a model zoo (posgeom zoo)
# --------------------------------------------------------------------------------------------
@dataclass
class ZooModel(Record):
    """``models/<name>.json`` of ``posgeom zoo``: one model measured, or why it could not be.

    ``status`` is ``"ok"`` (measured; parts that do not apply are None with the reason in ``notes``) or
    ``"error"`` (it failed to load or to measure: ``error``; retried on the next run). Lists hold one
    value per probed layer (block of a flat ViT, or stage). ``rpi_delta_ssdc`` is the paper's delta SSDC:
    SSDC under RPI of layer 1 minus layer 0 (docs/method.md#delta-ssdc); None per stage. ``rise`` is the same
    difference without RPI (``delta_ssdc`` before schema 5). Under RPI every number is the mean over
    ``rpi_permutations`` shared permutations (schema 5; before: one, seed 0). Each ``*_ci`` is the 95%
    interval ``[low, high]`` of the number it is named after (per layer: a list of pairs): over the RPI
    permutations under RPI, over images without (a delete-a-group jackknife); ``*_mean_ci`` is that of the
    mean over layers.
    ``clean_accuracy``, ``accuracy`` and ``fs`` exist only when the data's labels could be matched to the
    model's classes (``labels`` says how).
    """

    KIND: ClassVar[str] = "zoo-model"
    model: str  # as given: a timm name, hf-hub:ORG/NAME or local-dir:PATH
    status: str  # ok | error
    settings: dict[str, Any]  # the zoo's result-changing settings it was measured with
    versions: dict[str, str]
    elapsed_s: float
    measured_at: str
    error: str | None = None
    source: str | None = None  # timm | hf-hub | local-dir
    weights: str | None = None  # pretrained | random-init | loaded (hf-hub: / local-dir:)
    weights_key: str | None = None  # what identifies those weights (zoo.weights_key): a rerun checks it
    architecture: str | None = None
    params: int | None = None
    input_size: list[int] | None = None  # (C, H, W) the model was measured at
    data_config: dict[str, Any] | None = None  # interpolation, mean, std, crop_pct, crop_mode
    pe: list[dict[str, Any]] | None = None  # pe_inventory: name, kind, scalable
    site: str | None = None
    granularity: str | None = None  # block | stage
    grid_sizes: list[list[int]] | None = None
    probe_images: int | None = None
    ssdc: list[Num] | None = None
    rise: Num = None  # without RPI: layer 1 - layer 0
    rpi_ssdc: list[Num] | None = None  # under RPI, against the index grid
    rpi_content_ssdc: list[Num] | None = None  # under RPI, against where each token's content came from
    rpi_delta_ssdc: Num = None
    labels: str | None = None  # how the data's labels index the model's outputs (None: not matched)
    num_images: int | None = None
    clean_accuracy: Num = None
    accuracy: dict[str, Num] | None = None
    fs: dict[str, Num] | None = None
    fs_interval: dict[str, list[Num]] | None = None
    alpha_sweep: SweepSummary | None = None
    # attention per block (flat ViTs with timm's or eva's attention; docs/attention.md): mean attention
    # distance in patch units and entropy in nats, each the mean over heads; per head in *_heads
    attention_distance: list[Num] | None = None
    attention_distance_heads: list[list[Num]] | None = None
    attention_entropy: list[Num] | None = None
    # the linear (row, col) position probe per block (docs/attention.md#position-probe): accuracy of both
    # on the second half of the probe images, fitted on the first; under RPI too; chance 1 / (H * W)
    position_accuracy: list[Num] | None = None
    position_accuracy_rpi: list[Num] | None = None
    position_chance: Num = None
    notes: list[str] = field(default_factory=list)
    # schema 5: the intervals, and the RPI permutations the RPI numbers are means over
    rpi_permutations: int | None = None
    ssdc_ci: list[list[Num]] | None = None
    ssdc_mean_ci: list[Num] | None = None
    rise_ci: list[Num] | None = None
    rpi_ssdc_ci: list[list[Num]] | None = None
    rpi_ssdc_mean_ci: list[Num] | None = None
    rpi_delta_ssdc_ci: list[Num] | None = None
    clean_accuracy_ci: list[Num] | None = None  # Wilson 95% interval of clean_accuracy
    # schema 7: the optional measures beyond attention and position (ZooConfig.extras), name -> its to_dict()
    measures: dict[str, Any] | None = None


@dataclass
class ZooIndex(Record):
    """``zoo.json``: the zoo's settings and its models in the order they were first asked for."""

    KIND: ClassVar[str] = "zoo-index"
    settings: dict[str, Any]
    models: list[str] = field(default_factory=list)
