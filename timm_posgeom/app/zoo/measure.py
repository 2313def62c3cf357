"""One model of a zoo: loaded (:func:`weights_key` names its weights), measured into a ZooModel record.

A record holds its numbers as they are written and read back (:func:`timm_posgeom.jsonio.to_jsonable`: lists,
NaN as None), so that a record measured now and one read from its file are the same."""

from __future__ import annotations

import gc
import math
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ...data.labels import map_by_name
from ...errors import NonFiniteWarning, SettingError
from ...measuring.distributed import fail_together
from ...results.fingerprints import fingerprint
from ...results.jsonio import to_jsonable
from ..records import SweepSummary, ZooModel
from .config import EXTRAS, ZooConfig, failure_text, versions


def match_labels(model: torch.nn.Module, data: Any) -> tuple[Any | None, str]:
    """Deprecated: :func:`timm_posgeom.data.labels.map_by_name` (the library's, used by every function that
    scores labels); kept for one release."""
    warnings.warn(
        "timm_posgeom.app.zoo.match_labels is deprecated and will be removed in the next release: use "
        "timm_posgeom.data.labels.map_by_name",
        DeprecationWarning,
        stacklevel=2,
    )
    return map_by_name(model, data)


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
        from ...data.folder import file_key  # path|size|mtime: the data cache's key of a file, here a folder's

        root = Path(name[len("local-dir:") :]).expanduser().resolve()
        files = sorted(p for p in root.iterdir() if p.is_file()) if root.is_dir() else []
        digest = fingerprint("\n".join(file_key(str(p)) for p in files))
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
    hub_id = getattr(cfg, "hf_hub_id", None)
    if hub_id:
        return _hub_revision(hub_id)
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

    from ...models.factory import create_model

    pretrained = False
    if record.source == "timm" and config.pretrained != "off" and timm.is_model(name):
        has_weights = timm.models.is_model_pretrained(name)
        if config.pretrained == "on" and not has_weights:
            raise SettingError(f"{name} has no pretrained weights in timm (--no-pretrained measures it at random init)")
        pretrained = has_weights
    record.weights = "loaded" if record.source != "timm" else ("pretrained" if pretrained else "random-init")
    torch.manual_seed(config.seed)
    return create_model(name, pretrained=pretrained, img_size=config.img_size).eval()


def measure_model(
    name: str, config: ZooConfig, data: Any, *, progress: bool = False, log: Callable[[str], None] = print
) -> ZooModel:
    """Load and measure one model (see the module docstring); never raises for the model's own failures:
    a model that fails to load or to measure gives a record with ``status="error"`` (KeyboardInterrupt
    and SystemExit pass through)."""
    started = time.time()
    record = ZooModel(
        model=name,
        status="ok",
        settings=config.settings(),
        versions=versions(),
        elapsed_s=0.0,
        measured_at=time.strftime("%Y-%m-%d %H:%M:%S"),
        source=_source(name),
    )
    model = None
    try:
        try:
            with fail_together():  # a model that fails to load on one process fails on all: none waits for it
                model = _load(name, config, record)
            record.weights_key = weights_key(name, record.weights)  # after the load: a first download is in the cache
        except Exception as e:  # unknown name, missing folder, no network, a constructor that fails
            raise _Stage(
                "load"
                + (
                    " (timm's pretrained weights; --no-pretrained builds it at random init)"
                    if record.weights == "pretrained"
                    else ""
                ),
                e,
            ) from e
        try:
            with warnings.catch_warnings(record=True) as caught:  # recorded as notes instead
                warnings.simplefilter("always", NonFiniteWarning)
                warnings.filterwarnings("ignore", "clean accuracy is 0", RuntimeWarning)
                _measure(model, record, config, data, progress)
        except Exception as e:
            raise _Stage("measure", e) from e
        finally:
            _note_warnings(record, caught)
    except _Stage as failure:
        record.status = "error"
        record.error = f"{failure.stage}: {failure_text(failure.error)}"
        frames = traceback.format_exception(failure.error)[-4:]  # the innermost frames and the error, one line
        record.notes.append("traceback: " + " | ".join(" ".join(f.split()) for f in frames if f.strip()))
    finally:
        del model
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    record.elapsed_s = round(time.time() - started, 2)
    return record


def _note_warnings(record: ZooModel, caught: list) -> None:
    """Numbers that were not finite (NaN in the record) become notes, once each; other warnings are shown."""
    for w in caught:
        text = " ".join(str(w.message).split())
        if issubclass(w.category, NonFiniteWarning):
            if f"not finite: {text}" not in record.notes:
                record.notes.append(f"not finite: {text}")
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


class _Stage(Exception):
    def __init__(self, stage: str, error: BaseException):
        super().__init__(stage)
        self.stage, self.error = stage, error


def _measure(model: torch.nn.Module, record: ZooModel, config: ZooConfig, data: Any, progress: bool) -> None:
    """Fill ``record`` with the model's measurements under the zoo's protocol (:func:`timm_posgeom.protocol.
    measure_model`); the parts that do not apply get a note."""
    from ...protocol import measure_model

    _describe(model, record, config)
    measured = measure_model(model, data, config.protocol(progress=progress))
    if measured.ssdc is not None:
        _ssdc(record, measured.ssdc, measured.ssdc_rpi)
    if measured.fragility is not None:
        _fragility(record, measured.fragility, measured.labels)
    if measured.sweep_ssdc is not None:
        record.alpha_sweep = _sweep(measured.protocol, measured.sweep_ssdc, measured.alpha_sweep)
    _extras(record, measured.extras)
    record.notes.extend(measured.notes)


def _describe(model: torch.nn.Module, record: ZooModel, config: ZooConfig) -> None:
    """What the model is: architecture, parameters, input size, data config, positional encodings."""
    from ...data.transforms import resolve_config
    from ...interventions import pe_inventory
    from ...probes.streaming import model_name

    cfg = resolve_config(model, config.img_size)
    record.architecture = model_name(model)
    record.params = int(sum(p.numel() for p in model.parameters()))
    record.input_size = [int(v) for v in cfg["input_size"]]
    record.data_config = to_jsonable({k: cfg.get(k) for k in ("interpolation", "mean", "std", "crop_pct", "crop_mode")})
    record.pe = [dict(name=e.name, kind=e.kind, scalable=e.scalable) for e in pe_inventory(model)]


def _ssdc(record: ZooModel, normal: Any, rpi: Any | None) -> None:
    """SSDC per layer, normal and under RPI (None: the model could not be permuted, the notes say why)."""
    record.site = str(normal.settings["site"])
    record.granularity = str(normal.settings["granularity"])
    record.grid_sizes = [list(map(int, g)) for g in normal.settings["grid_sizes"]]
    record.probe_images = int(normal.settings["n_images"])
    record.ssdc, record.ssdc_ci, record.ssdc_mean_ci = _with_intervals(normal)
    record.rise = to_jsonable(normal.rise)
    record.rise_ci = to_jsonable(normal.rise_ci) if normal.rise_ci else None
    if rpi is not None:
        record.rpi_permutations = int(rpi.settings["rpi_permutations"])
        record.rpi_ssdc, record.rpi_ssdc_ci, record.rpi_ssdc_mean_ci = _with_intervals(rpi)
        record.rpi_content_ssdc = to_jsonable(rpi.content_per_layer or [])
        record.rpi_delta_ssdc = to_jsonable(rpi.rise)
        record.rpi_delta_ssdc_ci = to_jsonable(rpi.rise_ci) if rpi.rise_ci else None


def _with_intervals(result: Any) -> tuple[list[float | None], list[list[float | None]] | None, list[float | None]]:
    """(SSDC per layer, its 95% interval per layer, the interval of its mean over layers) of a probe."""
    cis = [to_jsonable(c) for c in result.per_layer_ci] if result.per_layer_ci is not None else None
    _, low, high = result.interval_of(lambda v: float(np.nanmean(v)) if np.isfinite(v).any() else math.nan)
    return to_jsonable(result.per_layer), cis, to_jsonable((low, high))


def _fragility(record: ZooModel, frag: Any, labels: str | None) -> None:
    """Clean top-1, accuracy and FS per shift, on the data whose labels match the model's classes."""
    record.labels = labels
    record.num_images = frag.num_images
    record.clean_accuracy = to_jsonable(frag.clean_accuracy)
    record.clean_accuracy_ci = to_jsonable(frag.clean_interval)
    record.accuracy = {k: to_jsonable(v) for k, v in frag.accuracy.items()}
    record.fs = {k: to_jsonable(v) for k, v in frag.fs.items()}
    record.fs_interval = {k: to_jsonable(v) for k, v in frag.fs_interval.items()}


def _extras(record: ZooModel, extras: dict[str, Any]) -> None:
    """Attention distance and entropy per block (mean over heads, and per head) and the linear position probe
    (normal and under RPI) into their columns; any other measure of the registry whole, in ``record.measures``."""
    if "attention" in extras:
        att = extras["attention"]
        heads = np.asarray(att.mean_distance, dtype=float)  # (L, heads)
        record.attention_distance_heads = [to_jsonable(row) for row in heads]
        record.attention_distance = to_jsonable(np.nanmean(heads, axis=1))
        record.attention_entropy = to_jsonable(np.nanmean(np.asarray(att.entropy, dtype=float), axis=1))
    if "position" in extras:
        position = extras["position"]
        record.position_accuracy = to_jsonable(position.normal.accuracy)
        record.position_chance = position.normal.chance["both"]
        if position.rpi is not None:
            record.position_accuracy_rpi = to_jsonable(position.rpi.accuracy)
        record.notes.extend(position.notes)
    others = {name: to_jsonable(result.to_dict()) for name, result in extras.items() if name not in EXTRAS}
    if others:
        record.measures = others


def _sweep(protocol: Any, ssdcs: list[Any], sweep: Any | None) -> SweepSummary:
    """The alpha sweep's record: delta SSDC under RPI per alpha, and FS and clean top-1 per alpha when the labels
    matched (``sweep``; else left empty, the notes say so)."""
    alphas = [float(a) for a in protocol.alphas]
    return SweepSummary(
        alphas=alphas,
        delta_ssdc=to_jsonable([r.rise for r in ssdcs]),
        fs={k: to_jsonable(v) for k, v in sweep.fs.items()} if sweep is not None else {},
        clean_accuracy=to_jsonable([r.clean_accuracy for r in sweep.rows])
        if sweep is not None
        else [None] * len(alphas),
        rpi_per_layer=[to_jsonable(r.per_layer) for r in ssdcs],
        fs_interval=(
            {k: [to_jsonable(r.fragility.fs_interval[k]) for r in sweep.rows] for k in sweep.shifts}
            if sweep is not None
            else None
        ),
        rpi_permutations=protocol.rpi_permutations,
        delta_ssdc_ci=[to_jsonable(r.delta_ci) for r in ssdcs],
    )
