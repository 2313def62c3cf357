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
  model's outputs (:func:`~timm_posgeom.labels.map_by_name`); otherwise left empty with the reason;
* optionally an alpha sweep (:func:`~timm_posgeom.robustness.alpha_sweep`: delta SSDC under RPI and
  JPEG q5 FS per PE scale alpha).

Each model runs at its own data config (input size, interpolation, mean / std:
:func:`~timm_posgeom.transforms.resolve_config`) unless ``img_size`` is given.

Files, under ``out``: ``models/<safe-name>.json`` (a :class:`~timm_posgeom.app.records.ZooModel` per model,
written atomically as soon as the model is done), ``zoo.json`` (settings and model list),
``zoo.csv`` (one row per model, as timm's ``results/*.csv``), ``zoo.md`` and ``figures/*.png``.
A rerun into the same ``out`` skips every model already measured with the same settings (a kill
loses at most the model in progress), retries the ones that failed, and refuses other settings
unless ``allow_changes``. Only the main process writes (:func:`is_main_process`).
"""
from __future__ import annotations

import csv
import gc
import hashlib
import io
import math
import os
import re
import time
import traceback
import warnings
from collections.abc import Callable, Iterable, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import InitVar, asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..distributed import broadcast_object, fail_together, is_main
from ..errors import PosgeomError, one_line
from ..jsonio import to_jsonable, write_atomic
from ..labels import map_by_name
from ..protocol import probe_count
from ..shifts import PAPER_SHIFTS
from .provenance import describe_versions, package_versions
from .records import SweepSummary, ZooIndex, ZooModel
from .rundir import NEUTRAL_KEYS, RunDirError, RunLock, describe_changes, set_aside, settings_changes

__all__ = ["ZooConfig", "ZooError", "ZooSummary", "run_zoo", "measure_model", "read_models_file",
           "filter_models", "safe_name", "is_main_process", "csv_rows", "write_outputs", "JPEG_SHIFT",
           "SWEEP_SHIFTS", "relative_depth", "layer_summary", "csv_columns", "write_csv", "pe_kinds",
           "versions", "weights_key"]

JPEG_SHIFT = "jpeg:5"  # the paper's JPEG shift: the x of the fragility figure is this shift's FS
SWEEP_SHIFTS = (JPEG_SHIFT,)  # the alpha sweep's shifts, as the study's
PRETRAINED_MODES = ("auto", "on", "off")
EXTRAS = ("attention", "position")  # measures beyond SSDC and fragility, each a group of columns
_NO_MODELS = "no models to measure: give model names, --models-file FILE or --filter PATTERN"


class ZooError(PosgeomError, RuntimeError):
    """A zoo that cannot run as asked (no models, settings that differ from the recorded ones)."""


@dataclass
class ZooConfig:
    """What a zoo measures and how. ``settings()`` is what its records are compared on."""

    data: str
    split: str = "validation"
    data_config: str | None = None  # the data set's configuration (Hub and parquet sets)
    revision: str | None = None  # of a Hub data set
    streaming: bool = False  # stream the first images of the split (the same images: neutral)
    max_images: int | None = None  # at most the first N images for all the work (None: the whole split)
    probe_images: int | None = None  # SSDC's count (None: protocol.PROBE_IMAGES, or max_images if fewer)
    site: str = "auto"
    resize: str = "paper"
    img_size: int | None = None  # None: each model's own input size
    pretrained: str = "auto"  # auto: timm names with weights load them; on: required; off: random init
    shifts: tuple[str, ...] = PAPER_SHIFTS
    alphas: tuple[float, ...] | None = None  # None: no alpha sweep
    seed: int = 0  # random init (torch.manual_seed before each model is built), RPI permutation, bootstrap
    batch_size: int = 64
    num_workers: int | None = None
    device: str | None = None
    shared_decode: bool = True  # decode the images once and resize them once per input configuration
    extras: tuple[str, ...] = EXTRAS  # attention (distance, entropy per head), position (the linear probe)
    images: InitVar[int | None] = None  # the old name of max_images (SSDC and fragility on the first N): one release

    def __post_init__(self, images: int | None = None) -> None:
        if images is not None:
            warnings.warn("ZooConfig(images=N) is deprecated and will be removed in the next release: use "
                          "max_images=N (and probe_images=N for the same SSDC count)", DeprecationWarning, stacklevel=3)
            if self.max_images is None:
                self.max_images = images
            if self.probe_images is None:
                self.probe_images = images
        if self.pretrained not in PRETRAINED_MODES:
            raise ValueError(f"pretrained must be one of {', '.join(PRETRAINED_MODES)}, got {self.pretrained!r}")
        self.probe_count()  # max_images, probe_images >= 1
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.img_size is not None and self.img_size < 1:
            raise ValueError(f"img_size must be >= 1, got {self.img_size}")
        if self.alphas is not None and not self.alphas:
            raise ValueError("alphas is empty")
        unknown = [e for e in self.extras if e not in EXTRAS]
        if unknown:
            raise ValueError(f"unknown extras {unknown}: choose among {', '.join(EXTRAS)} (or none)")
        if len(set(self.shifts)) != len(self.shifts) or not self.shifts:
            raise ValueError(f"shifts must be distinct and not empty, got {list(self.shifts)}")

    def probe_count(self) -> int:
        """The images of each SSDC probe: ``probe_images``, else 1,000 or ``max_images`` if fewer."""
        return probe_count(self.probe_images, self.max_images)

    def load_count(self) -> int | None:
        """The images to load: ``max_images``, or more when ``probe_images`` asks for more (None: all)."""
        if self.max_images is None:
            return None
        return max(self.max_images, self.probe_images or 0)

    def settings(self) -> dict[str, Any]:
        """The result-changing settings, JSON-ready (the data as an absolute path when it is local)."""
        from ..data import resolve_source

        kind, where = resolve_source(self.data)
        values = {k: v for k, v in asdict(self).items() if k not in NEUTRAL_KEYS["zoo"]}
        values["data"] = os.path.abspath(where) if kind == "local" else (where or "synthetic")
        values["sweep_shifts"] = list(SWEEP_SHIFTS) if self.alphas is not None else None
        return to_jsonable(values)


# --------------------------------------------------------------------------------------------
# model lists
# --------------------------------------------------------------------------------------------
def read_models_file(path: str | os.PathLike) -> list[str]:
    """Model names from a text file: one per line; ``#`` starts a comment; blank lines ignored."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"models file not found: {path}")
    names = []
    for line in path.read_text().splitlines():
        name = line.split("#", 1)[0].strip()
        if name:
            names.append(name)
    return names


def filter_models(pattern: str, pretrained: str = "auto") -> list[str]:
    """``timm.list_models(pattern, pretrained=...)``: with weights (timm's ``name.tag`` names) unless
    ``pretrained`` is ``off``. Raises ZooError when nothing matches."""
    import timm

    names = timm.list_models(pattern, pretrained=pretrained != "off")
    if not names:
        raise ZooError(f"--filter {pattern!r} matches no timm model{' with pretrained weights' if pretrained != 'off' else ''}")
    return list(names)


def safe_name(name: str) -> str:
    """A file name for a model: the name itself when it is made of ``[A-Za-z0-9._-]`` (timm's names),
    else those characters with the rest as ``_`` plus 8 hex digits of the name's SHA-1 (no two names
    share a file)."""
    clean = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "model"
    if clean == name:
        return name
    return f"{clean[:80]}-{hashlib.sha1(name.encode()).hexdigest()[:8]}"


# --------------------------------------------------------------------------------------------
# processes
# --------------------------------------------------------------------------------------------
def is_main_process() -> bool:
    """Whether this process writes files: the only process, or rank 0 of a launch (accelerate, torchrun)."""
    return bool(is_main())


def _default_device() -> str:
    if torch.cuda.is_available():
        local = os.environ.get("LOCAL_RANK")
        return f"cuda:{local}" if local else "cuda"
    return "cpu"


def versions() -> dict[str, str]:
    """Python, torch, timm and timm-posgeom versions."""
    return package_versions(training=False)


def match_labels(model: torch.nn.Module, data: Any) -> tuple[Any | None, str]:
    """Deprecated: :func:`timm_posgeom.labels.map_by_name` (the library's, used by every function that
    scores labels); kept for one release."""
    warnings.warn("timm_posgeom.app.zoo.match_labels is deprecated and will be removed in the next release: use "
                  "timm_posgeom.labels.map_by_name", DeprecationWarning, stacklevel=2)
    return map_by_name(model, data)


# --------------------------------------------------------------------------------------------
# one model
# --------------------------------------------------------------------------------------------
def _source(name: str) -> str:
    if name.startswith(("hf-hub:", "hf_hub:")):
        return "hf-hub"
    if name.startswith("local-dir:"):
        return "local-dir"
    return "timm"


def weights_key(name: str, weights: str | None) -> str | None:
    """What identifies the weights a zoo model is measured with, known without loading it, so that a rerun
    re-measures (or refuses) a model whose weights changed under the same name instead of keeping its numbers.

    ``local-dir:PATH``: the absolute folder and the size and modification time of each file in it;
    ``hf-hub:ORG/NAME`` and timm's pretrained weights on the Hub: the revision the local Hub cache holds
    (``refs/main``; None before the first download); other pretrained weights: their URL; random init:
    ``"random-init"`` (the seed is among the settings). ``weights`` is the record's: pretrained,
    random-init or loaded.
    """
    if weights == "random-init":
        return "random-init"
    if name.startswith("local-dir:"):
        from ..data import (
            _file_key,  # path|size|mtime: the data cache's key of a file, here a weights folder's
        )

        root = Path(name[len("local-dir:"):]).expanduser().resolve()
        files = sorted(p for p in root.iterdir() if p.is_file()) if root.is_dir() else []
        digest = hashlib.sha1("\n".join(_file_key(str(p)) for p in files).encode()).hexdigest()[:16]
        return f"local-dir:{root}|{digest}"
    if name.startswith(("hf-hub:", "hf_hub:")):
        return _hub_revision(name.split(":", 1)[1].split("@")[0])
    import timm

    try:
        cfg = timm.models.get_pretrained_cfg(name)
    except Exception:  # not a timm name with a pretrained config: nothing known to compare
        return None
    if cfg is None:
        return None
    if getattr(cfg, "hf_hub_id", None):
        return _hub_revision(cfg.hf_hub_id)
    return f"url:{cfg.url}" if getattr(cfg, "url", None) else None


def _hub_revision(repo_id: str) -> str | None:
    """``hub:REPO@COMMIT``, the revision of ``repo_id`` that the local Hub cache resolves (None if not cached)."""
    from huggingface_hub.constants import HF_HUB_CACHE

    ref = Path(HF_HUB_CACHE) / f"models--{repo_id.replace('/', '--')}" / "refs" / "main"
    try:
        return f"hub:{repo_id}@{ref.read_text().strip()}"
    except OSError:
        return None


def _load(name: str, config: ZooConfig, record: ZooModel) -> torch.nn.Module:
    """The model in eval mode, torch seeded with ``config.seed`` before it is built; ``record.weights`` says
    which weights it has (set before loading, so a failed load says what was tried)."""
    import timm

    from ..factory import create_model

    pretrained = False
    if record.source == "timm" and config.pretrained != "off" and timm.is_model(name):
        has_weights = timm.models.is_model_pretrained(name)
        if config.pretrained == "on" and not has_weights:
            raise ValueError(f"{name} has no pretrained weights in timm (--no-pretrained measures it at random init)")
        pretrained = has_weights
    record.weights = "loaded" if record.source != "timm" else ("pretrained" if pretrained else "random-init")
    torch.manual_seed(config.seed)
    return create_model(name, pretrained=pretrained, img_size=config.img_size).eval()


def _failure_text(error: BaseException) -> str:
    """``"ErrorClass: message"`` on one line: a zoo record names what failed."""
    return f"{type(error).__name__}: {one_line(error)}"


def _floats(values: Iterable[float]) -> list[float | None]:
    return [None if v is None or not math.isfinite(float(v)) else float(v) for v in values]


def _num(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(float(value)) else float(value)


def _short_kind(kind: str) -> str:
    """``"an absolute position table (alpha scales ...)"`` -> ``"absolute position table"``."""
    text = kind.split(" (", 1)[0].strip()
    return re.sub(r"^(a|an) ", "", text)


def pe_kinds(pe: Sequence[dict[str, Any]] | None) -> str:
    """The distinct PE kinds of a record, in order, with a count where several (``"relative position
    bias table x12"``); ``"none"`` when none was found; ``""`` when not inspected."""
    if pe is None:
        return ""
    counts: dict[str, int] = {}
    for entry in pe:
        kind = _short_kind(str(entry.get("kind", "")))
        counts[kind] = counts.get(kind, 0) + 1
    return "; ".join(k if n == 1 else f"{k} x{n}" for k, n in counts.items()) or "none"


def measure_model(name: str, config: ZooConfig, data: Any, *, progress: bool = False,
                  log: Callable[[str], None] = print) -> ZooModel:
    """Load and measure one model (see the module docstring); never raises for the model's own failures:
    a model that fails to load or to measure gives a record with ``status="error"`` (KeyboardInterrupt
    and SystemExit pass through)."""
    started = time.time()
    record = ZooModel(model=name, status="ok", settings=config.settings(), versions=versions(), elapsed_s=0.0,
                      measured_at=time.strftime("%Y-%m-%d %H:%M:%S"), source=_source(name))
    model = None
    try:
        try:
            with fail_together():  # a model that fails to load on one process fails on all: none waits for it
                model = _load(name, config, record)
            record.weights_key = weights_key(name, record.weights)  # after the load: a first download is in the cache
        except Exception as e:  # unknown name, missing folder, no network, a constructor that fails
            raise _Stage("load" + (" (timm's pretrained weights; --no-pretrained builds it at random init)"
                                   if record.weights == "pretrained" else ""), e) from e
        try:
            with warnings.catch_warnings():  # recorded as a note instead
                warnings.filterwarnings("ignore", "clean accuracy is 0", RuntimeWarning)
                _measure(model, record, config, data, progress)
        except Exception as e:
            raise _Stage("measure", e) from e
    except _Stage as failure:
        record.status = "error"
        record.error = f"{failure.stage}: {_failure_text(failure.error)}"
        frames = traceback.format_exception(failure.error)[-4:]  # the innermost frames and the error, one line
        record.notes.append("traceback: " + " | ".join(" ".join(f.split()) for f in frames if f.strip()))
    finally:
        del model
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    record.elapsed_s = round(time.time() - started, 2)
    return record


class _Stage(Exception):
    def __init__(self, stage: str, error: BaseException):
        super().__init__(stage)
        self.stage, self.error = stage, error


def _measure(model: torch.nn.Module, record: ZooModel, config: ZooConfig, data: Any, progress: bool) -> None:
    """Fill ``record`` with the model's measurements (the parts that do not apply get a note)."""
    from ..eval_data import eval_loader
    from ..interventions import TokenPermutationError, pe_inventory
    from ..probes import probe_ssdc
    from ..probes.probe import _model_name
    from ..robustness import fragility
    from ..transforms import resolve_config

    device = torch.device(config.device or _default_device())
    model.to(device)
    cfg = resolve_config(model, config.img_size)
    record.architecture = _model_name(model)
    record.params = int(sum(p.numel() for p in model.parameters()))
    record.input_size = [int(v) for v in cfg["input_size"]]
    record.data_config = to_jsonable({k: cfg.get(k) for k in ("interpolation", "mean", "std", "crop_pct", "crop_mode")})
    record.pe = [dict(name=e.name, kind=e.kind, scalable=e.scalable) for e in pe_inventory(model)]
    common = dict(seed=config.seed, device=device, progress=progress)

    def loader():
        return eval_loader(model, data, max_images=config.probe_count(), batch_size=config.batch_size, resize=config.resize,
                           num_workers=config.num_workers, img_size=config.img_size)

    normal = probe_ssdc(model, loader(), site=config.site, rpi=False, **common)
    record.site = str(normal.metadata["site"])
    record.granularity = str(normal.metadata["granularity"])
    record.grid_sizes = [list(map(int, g)) for g in normal.metadata["grid_sizes"]]
    record.probe_images = int(normal.metadata["n_images"])
    record.ssdc = _floats(normal.per_layer)
    record.delta_ssdc = _num(normal.delta)
    try:
        rpi = probe_ssdc(model, loader(), site=config.site, rpi=True, **common)
    except (TypeError, TokenPermutationError) as e:  # no patch embedding to permute after (CNNs), ...
        record.notes.append(f"RPI not measured: {_failure_text(e)}")
    else:
        record.rpi_ssdc = _floats(rpi.per_layer)
        record.rpi_content_ssdc = _floats(rpi.content_per_layer or [])
        record.rpi_delta_ssdc = _num(rpi.delta)
        if record.granularity == "stage":
            record.notes.append("delta SSDC undefined: probed per stage (layers 0 and 1 lie on different grids)")

    matched, how = map_by_name(model, data)
    if matched is None:
        record.notes.append(f"top-1 and FS left empty: the data's labels cannot be matched to the model's "
                            f"outputs ({how})")
    else:
        record.labels = how
        frag = fragility(model, matched, list(config.shifts), resize=config.resize, batch_size=config.batch_size,
                         num_workers=config.num_workers, max_images=config.max_images, img_size=config.img_size,
                         **common)
        record.num_images = frag.num_images
        record.clean_accuracy = _num(frag.clean_accuracy)
        record.accuracy = {k: _num(v) for k, v in frag.accuracy.items()}
        record.fs = {k: _num(v) for k, v in frag.fs.items()}
        record.fs_interval = {k: _floats(v) for k, v in frag.fs_interval.items()}
        if frag.clean_accuracy == 0:
            record.notes.append("FS undefined: clean top-1 is 0")
    if config.alphas is not None:
        record.alpha_sweep = _sweep(model, record, config, data, matched, common)
    if record.granularity == "block":
        _extras(model, record, config, data, loader, common)
    elif config.extras:
        record.notes.append(f"{' and '.join(config.extras)} not measured: per-stage model (flat ViTs only)")


def _extras(model: torch.nn.Module, record: ZooModel, config: ZooConfig, data: Any, loader: Callable[[], Any],
            common: dict[str, Any]) -> None:
    """Attention distance and entropy per block (mean over heads, and per head), and the linear position
    probe (fitted on the first half of the probe images, scored on the second), normal and under RPI."""
    from ..probes import attention_measures, position_probe
    from ..probes.attention_measures import AttentionEntropy, MeanAttentionDistance

    if "attention" in config.extras:
        try:
            att = attention_measures(model, loader(), measures=[MeanAttentionDistance(), AttentionEntropy()],
                                     distributed="off",
                                     **common)
        except PosgeomError as e:  # an attention module the capture does not know
            record.notes.append(f"attention not measured: {_failure_text(e)}")
        else:
            heads = np.asarray(att.mean_distance, dtype=float)  # (L, heads)
            record.attention_distance_heads = [_floats(row) for row in heads]
            record.attention_distance = _floats(np.nanmean(heads, axis=1))
            record.attention_entropy = _floats(np.nanmean(np.asarray(att.entropy, dtype=float), axis=1))
    if "position" in config.extras:
        from torch.utils.data import Subset

        from ..eval_data import eval_loader

        n = min(config.probe_count(), len(data))
        if n < 2:
            record.notes.append("position probe not measured: it needs 2 probe images or more")
            return
        half = n // 2

        def part(indices: range) -> Any:  # the probe images' first or second half, as the model reads them
            return eval_loader(model, Subset(data, indices), batch_size=config.batch_size, resize=config.resize,
                               num_workers=config.num_workers, img_size=config.img_size)

        options = dict(batch_size=config.batch_size, device=common["device"], progress=common["progress"],
                       distributed="off")
        fit, score = range(0, half), range(half, n)
        plain = position_probe(model, part(fit), part(score), seed=config.seed, **options)
        record.position_accuracy = _floats(plain.accuracy)
        record.position_chance = plain.chance["both"]
        try:
            shuffled = position_probe(model, part(fit), part(score), rpi=True, seed=config.seed, **options)
        except PosgeomError as e:
            record.notes.append(f"position probe under RPI not measured: {_failure_text(e)}")
        else:
            record.position_accuracy_rpi = _floats(shuffled.accuracy)


def _sweep(model: torch.nn.Module, record: ZooModel, config: ZooConfig, data: Any, matched: Any,
           common: dict[str, Any]) -> SweepSummary | None:
    """The alpha sweep: :func:`~timm_posgeom.robustness.alpha_sweep` when the labels match; else delta SSDC
    under RPI per alpha alone (``pe_scale`` + ``probe_ssdc``, the same steps), FS left empty."""
    from ..eval_data import eval_loader
    from ..interventions import PEScaleError, TokenPermutationError, pe_scale
    from ..probes import probe_ssdc
    from ..robustness import alpha_sweep

    alphas = [float(a) for a in config.alphas or ()]
    try:
        if matched is not None:
            sweep = alpha_sweep(model, matched, alphas, SWEEP_SHIFTS, probe_images=config.probe_count(), site=config.site,
                                resize=config.resize, batch_size=config.batch_size, num_workers=config.num_workers,
                                max_images=config.max_images, img_size=config.img_size, **common)
            return SweepSummary(alphas=alphas, delta_ssdc=_floats(sweep.delta_ssdc),
                                fs={k: _floats(v) for k, v in sweep.fs.items()},
                                clean_accuracy=_floats(r.clean_accuracy for r in sweep.rows),
                                rpi_per_layer=[_floats(r.ssdc_per_layer) for r in sweep.rows])
        deltas, layers = [], []
        for alpha in alphas:
            loader = eval_loader(model, data, max_images=config.probe_count(), batch_size=config.batch_size,
                                 resize=config.resize, num_workers=config.num_workers, img_size=config.img_size)
            with pe_scale(model, alpha):
                res = probe_ssdc(model, loader, site=config.site, rpi=True, seed=common["seed"],
                                 device=common["device"], progress=False)
            deltas.append(res.delta)
            layers.append(_floats(res.per_layer))
        record.notes.append("alpha sweep: delta SSDC only (FS needs matched labels)")
        return SweepSummary(alphas=alphas, delta_ssdc=_floats(deltas), fs={}, clean_accuracy=[None] * len(alphas),
                            rpi_per_layer=layers)
    except (PEScaleError, TokenPermutationError, TypeError) as e:
        record.notes.append(f"alpha sweep not measured: {_failure_text(e)}")
        return None


# --------------------------------------------------------------------------------------------
# the zoo
# --------------------------------------------------------------------------------------------
@dataclass
class ZooSummary:
    """What :func:`run_zoo` did: every record in the zoo's order, which were measured now, which failed."""

    records: list[ZooModel]
    measured: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    out: Path | None = None

    @property
    def failed(self) -> list[ZooModel]:
        return [r for r in self.records if r.status != "ok"]


def _dedupe(names: Iterable[str]) -> list[str]:
    seen, out = set(), []
    for n in names:
        n = n.strip()
        if n and n not in seen:
            seen.add(n)
            out.append(n)
    return out


def parse_shard(text: str) -> tuple[int, int]:
    """``"K/N"`` -> ``(K, N)``: the shard that measures the zoo's models K, K + N, K + 2N, ... (0 <= K < N)."""
    try:
        k, n = (int(v) for v in text.split("/"))
    except ValueError:
        raise ValueError(f"--shard must be K/N (e.g. 0/4: models 0, 4, 8, ... of the zoo), got {text!r}") from None
    if not (n >= 1 and 0 <= k < n):
        raise ValueError(f"--shard K/N needs 0 <= K < N, got {text!r}")
    return k, n


@contextmanager
def _index_lock(out: Path, say: Callable[[str], None], wait_s: float = 120.0):
    """The zoo folder's lock, held briefly (reading and writing ``zoo.json`` and the combined outputs):
    processes of other shards wait for it instead of being refused. The lock of a killed holder is taken
    over (:class:`RunLock`)."""
    lock = RunLock(out)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            lock.acquire(say=say)
            break
        except RunDirError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    try:
        yield
    finally:
        lock.release()


def _model_lock(out: Path, name: str) -> RunLock | None:
    """The lock of one model's measurement (``locks/<name>/.lock``), taken; None when a live process of
    another shard holds it (that process measures the model)."""
    folder = out / "locks" / safe_name(name)
    folder.mkdir(parents=True, exist_ok=True)
    lock = RunLock(folder)
    try:
        lock.acquire(say=lambda s: None)
    except RunDirError:
        return None
    return lock


def _still_to_measure(out: Path, name: str, settings: dict[str, Any]) -> bool:
    """Whether the model has no ok record with these settings and its current weights (another shard may
    have written one since the plan was made)."""
    path = out / "models" / f"{safe_name(name)}.json"
    if not path.is_file():
        return True
    record = ZooModel.read(path)
    return not (record.status == "ok" and record.settings == settings
                and record.weights_key == weights_key(name, record.weights))


def read_records(out: Path, names: Sequence[str]) -> tuple[list[ZooModel], list[str]]:
    """(the records in ``out/models`` of ``names``, in that order; the names that have none yet)."""
    records, missing = [], []
    for name in names:
        path = out / "models" / f"{safe_name(name)}.json"
        if path.is_file():
            records.append(ZooModel.read(path))
        else:
            missing.append(name)
    return records, missing


def run_zoo(models: Sequence[str], config: ZooConfig, out: str | os.PathLike, *, allow_changes: bool = False,
            progress: bool = True, log: Callable[[str], None] | None = None,
            shard: tuple[int, int] | None = None) -> ZooSummary:
    """Measure every model (those recorded in ``out`` before, then the new ones) and write the comparison.

    Models already measured with the same settings and the same weights (:func:`weights_key`) are skipped;
    failed ones are measured again. A settings change, or a model whose weights changed under its name (a
    new export in a ``local-dir:``, a new Hub revision), is refused (:class:`ZooError`, one line) unless
    ``allow_changes``: then each such model is measured again, its former record kept as ``.replaced-N``.

    ``shard=(K, N)`` measures the zoo's models K, K + N, ... only (model-parallel: a job array, or one job
    per node). Shards may run at once into one ``out``: each model is measured under its own lock
    (``locks/<name>``), so a model is measured once and a killed shard loses only the model it was
    measuring; ``zoo.json`` and the combined outputs are written under the folder's lock, held briefly.
    Each shard writes ``zoo.csv``, ``zoo.md`` and the figures from every record present when it ends, so
    the last one to end writes the whole zoo (:func:`merge_zoo` writes them again at any time).
    """
    from tqdm.auto import tqdm

    from ..data import load_split
    from ..eval_data import DecodedImages

    out = Path(out)
    if not _dedupe(models) and not (out / "zoo.json").is_file():
        raise ZooError(_NO_MODELS)
    main = is_main_process()
    settings = config.settings()
    say_now = log or print
    if main:
        out.mkdir(parents=True, exist_ok=True)
        (out / "models").mkdir(exist_ok=True)
    with _index_lock(out, say_now) if main else nullcontext():
        names, records, done = _plan(out, _dedupe(models), settings, allow_changes)
        if main:
            for name in names:
                if name in records and name not in done and records[name].status == "ok":
                    set_aside(out / "models" / f"{safe_name(name)}.json")
            ZooIndex(settings=settings, models=names).write(out / "zoo.json")
    mine = names if shard is None else names[shard[0]::shard[1]]
    data = load_split(config.data, config.split, subset=config.load_count(), config=config.data_config,
                      revision=config.revision, streaming=config.streaming)
    if config.shared_decode and any(name not in done for name in mine):
        # decoded once here and resized once per input configuration, for every model: the same batches
        # bit for bit as decoding them for each model (tests/test_zoo.py; benchmarks/bench_zoo.py)
        data = DecodedImages(data, progress=progress and main)
    summary = ZooSummary(records=[], out=out)
    bar = tqdm(mine, desc="zoo" if shard is None else f"zoo shard {shard[0]}/{shard[1]}", unit="model",
               disable=not (progress and main))
    say = log or (bar.write if main else (lambda s: None))
    for k, name in enumerate(bar, 1):
        bar.set_postfix_str(name[-40:])
        if name in done:
            say(f"[{k}/{len(mine)}] {name}: measured before, kept")
            summary.skipped.append(name)
            continue
        lock = _model_lock(out, name) if main else None
        # every process of a launch measures the same models: main's lock decides for all
        taken = broadcast_object(lock is not None if main else None)
        if taken and main and not _still_to_measure(out, name, settings):
            lock.release()
            taken = False
        taken = broadcast_object(taken)
        if not taken:
            say(f"[{k}/{len(mine)}] {name}: measured by another shard, skipped")
            summary.skipped.append(name)
            continue
        try:
            say(f"[{k}/{len(mine)}] {name}: measuring")
            record = measure_model(name, config, data, progress=progress and main)
            records[name] = record
            summary.measured.append(name)
            if main:
                record.write(out / "models" / f"{safe_name(name)}.json")
                with _index_lock(out, say_now):  # the table so far, every shard's records in it
                    write_csv(read_records(out, names)[0], out / "zoo.csv", config)
        finally:
            if lock is not None:
                lock.release()
        state = "done" if record.status == "ok" else f"FAILED ({record.error})"
        say(f"[{k}/{len(mine)}] {name}: {state} in {record.elapsed_s:.1f} s")
    bar.close()
    if main:
        with _index_lock(out, say_now):
            summary.records, missing = read_records(out, names)
            write_outputs(summary.records, out, config)
        if missing:
            say(f"{len(missing)} model(s) of the zoo not measured yet (other shards): {', '.join(missing[:5])}"
                f"{' ...' if len(missing) > 5 else ''}")
    else:
        summary.records = [records[n] for n in names if n in records]
    return summary


def merge_zoo(out: str | os.PathLike, config: ZooConfig | None = None) -> tuple[ZooSummary, list[str]]:
    """Write ``zoo.csv``, ``zoo.md`` and the figures of ``out`` again from every record its shards wrote,
    measuring nothing; returns the summary and the models that have no record yet."""
    out = Path(out)
    if not (out / "zoo.json").is_file():
        raise ZooError(f"{out} holds no zoo (no zoo.json): run posgeom zoo into it first")
    index = ZooIndex.read(out / "zoo.json")
    config = config or config_from_settings(index.settings)
    with _index_lock(out, print):
        records, missing = read_records(out, index.models)
        write_outputs(records, out, config)
    return ZooSummary(records=records, out=out), missing


def config_from_settings(settings: dict[str, Any]) -> ZooConfig:
    """The :class:`ZooConfig` a zoo's recorded settings describe (its neutral fields at their defaults)."""
    known = {f for f in ZooConfig.__dataclass_fields__}
    values = {k: v for k, v in settings.items() if k in known}
    for key in ("shifts", "alphas"):
        if values.get(key) is not None:
            values[key] = tuple(values[key])
    return ZooConfig(**values)


def _plan(out: Path, asked: list[str], settings: dict[str, Any],
          allow_changes: bool) -> tuple[list[str], dict[str, ZooModel], set[str]]:
    """(the zoo's models: those of ``zoo.json`` then the new ones, their records, the ones to keep).

    Raises ZooError for settings that differ from the recorded ones (unless ``allow_changes``). The
    models and the ones to keep are main's view, shared with every process."""
    index_path = out / "zoo.json"
    index = ZooIndex.read(index_path) if index_path.is_file() else None
    names = _dedupe([*(index.models if index else []), *asked])
    if not names:
        raise ZooError(_NO_MODELS)
    records: dict[str, ZooModel] = {}
    changes: dict[str, tuple[Any, Any]] = {}
    if index is not None:
        changes.update(settings_changes("zoo", index.settings, settings))
    stale: set[str] = set()
    for name in names:
        path = out / "models" / f"{safe_name(name)}.json"
        if path.is_file():
            records[name] = record = ZooModel.read(path)
            if record.status == "ok":
                changes.update(settings_changes("zoo", record.settings, settings))
                now = weights_key(name, record.weights)
                if record.weights_key != now:  # the same name, other weights (a new export, a new revision)
                    stale.add(name)
                    changes[f"{name}'s weights"] = (record.weights_key or "not recorded", now or "unknown")
    if changes and not allow_changes:
        raise ZooError(f"{out} was measured with other settings ({describe_changes(changes)}); pass --allow-changes "
                       "to measure its models again with these (former records are kept as .replaced-N), or choose "
                       "another --out")
    # main's view in every process: every process then measures the same models in the same order, even
    # when one read the records while main was writing one
    names, done = broadcast_object((names, {n for n, r in records.items()
                                            if r.status == "ok" and r.settings == settings and n not in stale}))
    return names, records, done


# --------------------------------------------------------------------------------------------
# table
# --------------------------------------------------------------------------------------------
def relative_depth(n: int) -> list[float]:
    """Layer i of n at relative depth ``i / (n - 1)`` (0 the first probed layer, 1 the last; [0.0] for one)."""
    return [0.0] if n == 1 else [i / (n - 1) for i in range(n)]


def layer_summary(values: Sequence[float | None] | None) -> dict[str, Any]:
    """``first``, ``last``, ``peak`` (the largest), ``peak_layer`` (its index) and ``mean`` of per-layer
    SSDC, undefined (NaN) layers left out; every entry None when there is none."""
    vals = [math.nan if v is None else float(v) for v in (values or [])]
    finite = [(i, v) for i, v in enumerate(vals) if math.isfinite(v)]
    if not finite:
        return dict(first=None, last=None, peak=None, peak_layer=None, mean=None)
    peak_layer, peak = max(finite, key=lambda t: t[1])
    return dict(first=_num(vals[0]), last=_num(vals[-1]), peak=peak, peak_layer=peak_layer,
                mean=sum(v for _, v in finite) / len(finite))


def _fmt(value: Any, spec: str = ".6g") -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return ""
    return format(value, spec) if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)


def _series(values: Sequence[float | None] | None) -> str:
    return " ".join("nan" if v is None else f"{v:.6g}" for v in values) if values else ""


def csv_columns(config: ZooConfig) -> list[str]:
    """The columns of ``zoo.csv``: identity, size, PE, accuracy and FS per shift, SSDC summaries, versions."""
    cols = ["model", "status", "weights", "source", "architecture", "param_count", "img_size", "interpolation",
            "pe_kinds", "site", "granularity", "n_layers", "probe_images", "top1", "n_images", "labels",
            *(f"fs_{s}" for s in config.shifts)]
    for prefix in ("ssdc", "rpi_ssdc"):
        cols += [f"{prefix}_{k}" for k in ("first", "last", "peak", "peak_layer", "mean")]
    cols += ["delta_ssdc_rpi", "ssdc_per_layer", "rpi_ssdc_per_layer"]
    if config.alphas is not None:
        cols += ["sweep_alphas", "sweep_delta_ssdc_rpi", *(f"sweep_fs_{s}" for s in SWEEP_SHIFTS)]
    if "attention" in config.extras:
        cols += ["attn_distance_mean", "attn_distance_per_layer", "attn_entropy_per_layer"]
    if "position" in config.extras:
        cols += ["position_chance", "position_acc_mean", "position_acc_rpi_mean", "position_acc_per_layer",
                 "position_acc_rpi_per_layer"]
    return cols + ["notes", "error", "elapsed_s", "timm_posgeom_version", "timm_version", "torch_version"]


def csv_rows(records: Sequence[ZooModel], config: ZooConfig) -> list[dict[str, str]]:
    """One dict per record, keyed by :func:`csv_columns`; a value that does not exist is ``""``.

    ``param_count`` is in millions (3 decimals); ``top1`` (clean top-1), FS and SSDC are fractions with 6
    significant digits, as everywhere in the package; ``*_per_layer`` are space-separated."""
    rows = []
    for r in records:
        row = {c: "" for c in csv_columns(config)}
        row.update(model=r.model, status=r.status, weights=r.weights or "", source=r.source or "",
                   architecture=r.architecture or "", error=r.error or "", elapsed_s=_fmt(r.elapsed_s, ".1f"),
                   timm_posgeom_version=r.versions.get("timm_posgeom", ""), timm_version=r.versions.get("timm", ""),
                   torch_version=r.versions.get("torch", ""))
        if r.status == "ok":
            size = r.input_size or []
            row.update(
                param_count=_fmt(r.params / 1e6 if r.params is not None else None, ".3f"),
                img_size=(str(size[1]) if len(size) == 3 and size[1] == size[2] else "x".join(map(str, size[1:]))),
                interpolation=str((r.data_config or {}).get("interpolation") or ""), pe_kinds=pe_kinds(r.pe),
                site=r.site or "", granularity=r.granularity or "", n_layers=_fmt(len(r.ssdc) if r.ssdc else None),
                probe_images=_fmt(r.probe_images), n_images=_fmt(r.num_images), labels=r.labels or "",
                top1=_fmt(r.clean_accuracy),
                delta_ssdc_rpi=_fmt(r.rpi_delta_ssdc), ssdc_per_layer=_series(r.ssdc),
                rpi_ssdc_per_layer=_series(r.rpi_ssdc), notes=" | ".join(n for n in r.notes))
            for s in config.shifts:
                row[f"fs_{s}"] = _fmt((r.fs or {}).get(s))
            for prefix, values in (("ssdc", r.ssdc), ("rpi_ssdc", r.rpi_ssdc)):
                for k, v in layer_summary(values).items():
                    row[f"{prefix}_{k}"] = _fmt(v)
            if "attention" in config.extras:
                row.update(attn_distance_mean=_fmt(layer_summary(r.attention_distance)["mean"]),
                           attn_distance_per_layer=_series(r.attention_distance),
                           attn_entropy_per_layer=_series(r.attention_entropy))
            if "position" in config.extras:
                row.update(position_chance=_fmt(r.position_chance),
                           position_acc_mean=_fmt(layer_summary(r.position_accuracy)["mean"]),
                           position_acc_rpi_mean=_fmt(layer_summary(r.position_accuracy_rpi)["mean"]),
                           position_acc_per_layer=_series(r.position_accuracy),
                           position_acc_rpi_per_layer=_series(r.position_accuracy_rpi))
            if config.alphas is not None and r.alpha_sweep is not None:
                sw = r.alpha_sweep
                row["sweep_alphas"] = " ".join(f"{a:g}" for a in sw.alphas)
                row["sweep_delta_ssdc_rpi"] = _series(sw.delta_ssdc)
                for s in SWEEP_SHIFTS:
                    row[f"sweep_fs_{s}"] = _series(sw.fs.get(s))
        rows.append(row)  # a failed model: its error (the record keeps the traceback's last lines)
    return rows


def write_csv(records: Sequence[ZooModel], path: Path, config: ZooConfig) -> Path:
    """``zoo.csv``: one row per record (:func:`csv_rows`), written atomically."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=csv_columns(config), lineterminator="\n")
    writer.writeheader()
    writer.writerows(csv_rows(records, config))
    write_atomic(path, buffer.getvalue())
    return path


# --------------------------------------------------------------------------------------------
# figures and zoo.md
# --------------------------------------------------------------------------------------------
def _save(fig: Any, path: Path) -> None:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=120)
    write_atomic(path, buffer.getvalue())


def _label(name: str, width: int = 40) -> str:
    """A model's name for a legend or a point: whole up to ``width`` characters, else its tail."""
    return name if len(name) <= width else "..." + name[-(width - 3):]


def _empty(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, fontsize=9, color="0.4", wrap=True)


def fig_ssdc_depth(records: Sequence[ZooModel], path: Path) -> None:
    """SSDC against relative depth (:func:`relative_depth`), one line per model: normal (left) and under
    RPI (right), against the index grid."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4.2), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 2, sharey=True)
    ok = [r for r in records if r.status == "ok"]
    for ax, key, title in ((axes[0], "ssdc", "SSDC across depth"), (axes[1], "rpi_ssdc", "under RPI (index grid)")):
        drawn = 0
        for i, r in enumerate(ok):
            values = getattr(r, key)
            if not values:
                continue
            y = [math.nan if v is None else v for v in values]
            ax.plot(relative_depth(len(y)), y, marker="s" if r.granularity == "stage" else "o", ms=4,
                    color=f"C{i % 10}", linestyle=("-", "--", ":")[i // 10 % 3], label=_label(r.model))
            drawn += 1
        if not drawn:
            _empty(ax, "no model measured" if key == "ssdc" else "no model measured under RPI")
        ax.axhline(0, color="k", lw=0.5)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("relative depth (first probed layer 0, last 1)")
    axes[0].set_ylabel("SSDC (mean map)")
    handles, labels = axes[0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, fontsize=7, loc="outside lower center", ncols=min(3, len(handles)))
    from ..plotting import fit_titles

    fit_titles(fig)
    _save(fig, path)


def fig_fragility_delta(records: Sequence[ZooModel], path: Path, shift: str = JPEG_SHIFT) -> list[str]:
    """``shift``'s FS against delta SSDC under RPI, one labelled point per model that has both, with FS's
    paired-bootstrap 95% interval as a vertical error bar (delta SSDC has no interval in a zoo record);
    labels point inwards so they stay inside the axes. Returns the models left out."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from ..plotting import fit_titles

    fig = Figure(figsize=(6.4, 4.8), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    left_out = []
    points = []
    for i, r in enumerate(records):
        fs = (r.fs or {}).get(shift)
        if r.status != "ok" or fs is None or r.rpi_delta_ssdc is None:
            left_out.append(r.model)
            continue
        lo, hi = ((r.fs_interval or {}).get(shift) or [None, None])[:2]
        err = None if lo is None or hi is None else [[max(fs - lo, 0.0)], [max(hi - fs, 0.0)]]
        ax.errorbar([r.rpi_delta_ssdc], [fs], yerr=err, fmt="o", color=f"C{i % 10}", ms=5, capsize=3, zorder=3)
        points.append((r.rpi_delta_ssdc, fs, r.model, i))
    if not points:
        _empty(ax, f"no model has both FS {shift} and delta SSDC under RPI")
    ax.axhline(0, color="0.6", lw=0.5)
    ax.axvline(0, color="0.6", lw=0.5)
    ax.margins(0.12)
    if points:
        from matplotlib.lines import Line2D

        bar = Line2D([], [], color="0.3", marker="|", ms=10, ls="none", label="FS: paired bootstrap 95% interval")
        ax.legend(handles=[bar], fontsize=7, loc="best")
        mid = sum(ax.get_xlim()) / 2
        top = sum(ax.get_ylim()) / 2
        for x, y, model, i in points:  # a label points away from the nearer edge, so it stays inside
            right, above = x <= mid, y <= top
            ax.annotate(_label(model, 32), (x, y), xytext=(5 if right else -5, 4 if above else -4),
                        textcoords="offset points", fontsize=7, ha="left" if right else "right",
                        va="bottom" if above else "top", color=f"C{i % 10}", annotation_clip=True)
    ax.set_xlabel("delta SSDC under RPI (layer 1 - layer 0; no interval recorded)")
    ax.set_ylabel(f"fragility score FS, {shift}")
    ax.set_title(f"JPEG fragility against delta SSDC ({len(points)} model{'s' if len(points) != 1 else ''})", fontsize=10)
    fit_titles(fig)
    _save(fig, path)
    return left_out


def _f3(value: Any) -> str:
    return "" if value is None or (isinstance(value, float) and not math.isfinite(value)) else f"{value:.3f}"


def _md_cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _extras_markdown(records: Sequence[ZooModel], config: ZooConfig) -> list[str]:
    """The attention and position-probe section of ``zoo.md`` (per block, first / middle / last)."""
    if not config.extras:
        return []
    measured = [r for r in records if r.status == "ok" and (r.attention_distance or r.position_accuracy)]
    lines = ["", "## Attention and position, per block", ""]
    if not measured:
        return lines + ["No model could be measured (flat ViTs only; see the notes)."]

    def fml(values: Sequence[float | None] | None) -> str:  # first / middle / last block
        if not values:
            return ""
        return " / ".join(_f3(values[k]) or "n/a" for k in sorted({0, len(values) // 2, len(values) - 1}))

    lines += ["| model | attention distance (patches) | attention entropy (nats) | position probe | "
              "position probe under RPI | chance |", "|---|---|---|---|---|---|"]
    for r in measured:
        lines.append(f"| `{_md_cell(r.model)}` | {fml(r.attention_distance)} | {fml(r.attention_entropy)} | "
                     f"{fml(r.position_accuracy)} | {fml(r.position_accuracy_rpi)} | {_f3(r.position_chance)} |")
    return lines + ["", "Each cell: the first / middle / last block. Attention distance: the attention-weighted "
                    "mean grid distance (patch units) from each patch query to the patch keys, mean over heads "
                    "and queries; entropy likewise (docs/attention.md). Position probe: the fraction of patch "
                    "tokens whose (row, col) a linear map of the token reads right, fitted on the first half of the "
                    "probe images and scored on the second; under RPI with a fresh permutation per batch, where a "
                    "model without PE falls to chance (docs/attention.md#position-probe)."]


def zoo_markdown(records: Sequence[ZooModel], config: ZooConfig, left_out: Sequence[str] = ()) -> str:
    """``zoo.md``: settings, the table, the alpha sweeps, notes and failures, the figures."""
    # each model records the versions that measured it; a resumed zoo may mix several invocations' versions
    vers = describe_versions(versions(), [(r.model, [r.versions]) for r in records if r.status == "ok"])
    lines = [
        "# Model zoo: positional encodings, SSDC and fragility", "",
        f"Data: `{config.data}` ({config.split}), the first {config.probe_count()} images for SSDC and "
        f"{'all' if config.max_images is None else f'the first {config.max_images}'} for fragility; "
        f"probe site `{config.site}`; resize `{config.resize}`; input size "
        f"{config.img_size if config.img_size else 'each model own'}; weights `{config.pretrained}`; seed {config.seed}. "
        f"Versions: {vers}.",
        "",
        "SSDC: Spearman correlation of the patch tokens' cosine similarities with minus their grid distance, "
        "per layer (per block of a flat ViT, per stage otherwise), from the similarity map averaged over the "
        "images. RPI: the patch contents permuted once before any PE. Delta SSDC: SSDC under RPI of layer 1 "
        "minus layer 0 (undefined per stage). FS = 1 - A_shift / A_clean. Top-1 as a fraction, only where the "
        "data's labels match the model's classes. Definitions: docs/method.md.", "",
    ]
    if any(r.weights == "random-init" for r in records):
        lines += ["**Random-init models** (weights `random-init`) are measured at initialisation: their numbers "
                  "describe the architecture's prior, and say nothing about a trained or pretrained model.", ""]
    head = ["model", "weights", "params (M)", "size", "PE", "top-1", *(f"FS {s}" for s in config.shifts),
            "SSDC first / last / peak (layer)", "RPI: first / last / mean", "ΔSSDC (RPI)"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in records:
        if r.status != "ok":
            lines.append("| " + " | ".join([f"`{_md_cell(r.model)}`", "failed"] + [""] * (len(head) - 2)) + " |")
            continue
        s, p = layer_summary(r.ssdc), layer_summary(r.rpi_ssdc)
        size = r.input_size or []
        cells = [
            f"`{_md_cell(r.model)}`", r.weights or "", _fmt(r.params / 1e6 if r.params else None, ".2f"),
            "x".join(map(str, size[1:])), _md_cell(pe_kinds(r.pe)),
            _f3(r.clean_accuracy),
            *(_f3((r.fs or {}).get(sh)) for sh in config.shifts),
            (f"{_f3(s['first'])} / {_f3(s['last'])} / {_f3(s['peak'])} ({s['peak_layer']})"
             if s["first"] is not None else ""),
            f"{_f3(p['first'])} / {_f3(p['last'])} / {_f3(p['mean'])}" if p["first"] is not None else "",
            _f3(r.rpi_delta_ssdc),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    sweeps = [r for r in records if r.status == "ok" and r.alpha_sweep is not None]
    if config.alphas is not None:
        lines += ["", f"## Alpha sweep (PE scaled by alpha; delta SSDC under RPI, FS {JPEG_SHIFT})", ""]
        if sweeps:
            order = sorted(range(len(config.alphas)), key=lambda k: config.alphas[k])  # alpha increasing
            lines += ["| model | " + " | ".join(f"α={config.alphas[k]:g}" for k in order) + " |",
                      "|---|" + "---|" * len(config.alphas)]
            for r in sweeps:
                sw = r.alpha_sweep
                fs = sw.fs.get(JPEG_SHIFT) or [None] * len(sw.alphas)
                cells = sorted(zip(sw.alphas, sw.delta_ssdc, fs), key=lambda c: c[0])
                lines.append(f"| `{_md_cell(r.model)}` | " + " | ".join(
                    f"{_f3(d) or 'n/a'}" + (f" / {_f3(f)}" if f is not None else "")
                    for _, d, f in cells) + " |")
            lines += ["", "Each cell: delta SSDC under RPI / FS (FS only where the labels match)."]
        else:
            lines.append("No model could be swept (see the notes).")
    lines += _extras_markdown(records, config)
    notes = [(r.model, n) for r in records if r.status == "ok" for n in r.notes]
    if notes:
        lines += ["", "## Notes", ""] + [f"- `{m}`: {_md_cell(n)}" for m, n in notes]
    failed = [r for r in records if r.status != "ok"]
    if failed:
        lines += ["", "## Failed", ""] + [f"- `{r.model}`: {_md_cell(r.error or '')}" for r in failed]
    lines += ["", "## Figures", "", "![SSDC against relative depth, normal and under RPI](figures/zoo_ssdc_depth.png)",
              "", "*SSDC of the mean map against relative depth, one line per model: left without RPI, right under "
              "RPI (against the index grid). One run per model: no band.*",
              "", "![JPEG fragility against delta SSDC](figures/zoo_fragility_vs_delta.png)",
              "", f"*FS under {JPEG_SHIFT} against delta SSDC under RPI, one point per model; vertical bars: FS's "
              "paired-bootstrap 95% interval over the images. Delta SSDC has no interval in a zoo record.*"]
    if left_out:
        lines += ["", f"Not in the fragility figure (no FS {JPEG_SHIFT} or no delta SSDC under RPI): "
                  + ", ".join(f"`{m}`" for m in left_out) + "."]
    return "\n".join(lines) + "\n"


def write_outputs(records: Sequence[ZooModel], out: str | os.PathLike, config: ZooConfig) -> dict[str, Path]:
    """Write ``zoo.csv``, ``figures/zoo_ssdc_depth.png``, ``figures/zoo_fragility_vs_delta.png`` and
    ``zoo.md`` from the records (each file atomically); returns their paths."""
    out = Path(out)
    figures = out / "figures"
    figures.mkdir(parents=True, exist_ok=True)
    paths = dict(csv=write_csv(records, out / "zoo.csv", config), ssdc=figures / "zoo_ssdc_depth.png",
                 fragility=figures / "zoo_fragility_vs_delta.png", md=out / "zoo.md")
    fig_ssdc_depth(records, paths["ssdc"])
    left_out = fig_fragility_delta(records, paths["fragility"])
    write_atomic(paths["md"], zoo_markdown(records, config, left_out))
    return paths

