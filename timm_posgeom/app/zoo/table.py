"""``zoo.csv``: one row per model, its columns and per-layer summaries."""

from __future__ import annotations

import csv
import io
import math
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ...results.jsonio import nan_if_none, to_jsonable, write_atomic
from ..records import ZooModel
from ..rundir import set_aside
from .config import SWEEP_SHIFTS, ZooConfig
from .model_sets import PUBLISHED_SETS, published_top1


def relative_depth(n: int) -> list[float]:
    """Layer i of n at relative depth ``i / (n - 1)`` (0 the first probed layer, 1 the last; [0.0] for one)."""
    return [0.0] if n == 1 else [i / (n - 1) for i in range(n)]


def layer_summary(values: Sequence[float | None] | None) -> dict[str, Any]:
    """``first``, ``last``, ``peak`` (the largest), ``peak_layer`` (its index) and ``mean`` of per-layer
    SSDC, undefined (NaN) layers left out; every entry None when there is none."""
    vals = [float(v) for v in nan_if_none(values or [])]
    finite = [(i, v) for i, v in enumerate(vals) if math.isfinite(v)]
    if not finite:
        return dict(first=None, last=None, peak=None, peak_layer=None, mean=None)
    peak_layer, peak = max(finite, key=lambda t: t[1])
    return dict(
        first=to_jsonable(vals[0]),
        last=to_jsonable(vals[-1]),
        peak=peak,
        peak_layer=peak_layer,
        mean=sum(v for _, v in finite) / len(finite),
    )


def summary_intervals(
    values: Sequence[float | None] | None,
    per_layer_ci: Sequence[Sequence[float | None]] | None,
    mean_ci: Sequence[float | None] | None,
) -> dict[str, tuple[Any, ...]]:
    """The 95% interval (low, high) of each entry of :func:`layer_summary`: ``first``, ``last`` and ``peak``
    are single layers (that layer's interval), ``mean`` the mean over layers (its own interval); (None, None)
    where none was measured."""
    none = (None, None)
    summary = layer_summary(values)
    cis = [tuple(c) if c is not None else none for c in (per_layer_ci or [])]
    if not cis or summary["peak_layer"] is None:
        return dict(first=none, last=none, peak=none, mean=tuple(mean_ci) if mean_ci else none)
    return dict(first=cis[0], last=cis[-1], peak=cis[summary["peak_layer"]], mean=tuple(mean_ci) if mean_ci else none)


def fmt_cell(value: Any, spec: str = ".6g") -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return ""
    return format(value, spec) if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)


def _series(values: Sequence[float | None] | None) -> str:
    return " ".join("nan" if v is None else f"{v:.6g}" for v in values) if values else ""


def _ci_series(cis: Sequence[Sequence[float | None]] | None, side: int) -> str:
    """The low (side 0) or high (1) ends of per-layer intervals, as a series."""
    return _series([c[side] if c is not None else None for c in cis]) if cis else ""


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


def published_columns(records: Sequence[ZooModel] | None) -> list[str]:
    """``timm_top1_<set>`` for each set timm publishes (:data:`~.model_sets.PUBLISHED_SETS`), when a record's model has
    published numbers (:func:`~.model_sets.published_top1`); none otherwise."""
    if not records or not any(published_top1(r.model) for r in records):
        return []
    return [f"timm_top1_{s}" for s in PUBLISHED_SETS]


def csv_columns(config: ZooConfig, records: Sequence[ZooModel] | None = None) -> list[str]:
    """The columns of ``zoo.csv``: identity, size, PE, accuracy and FS per shift, timm's published top-1 where
    ``records`` have any, SSDC summaries, versions."""
    cols = [
        "model",
        "status",
        "weights",
        "source",
        "architecture",
        "param_count",
        "img_size",
        "interpolation",
        "pe_kinds",
        "site",
        "granularity",
        "n_layers",
        "probe_images",
        "rpi_permutations",
        "top1",
        "top1_ci_low",
        "top1_ci_high",
        "n_images",
        "labels",
        *published_columns(records),
    ]
    for s in config.shifts:
        cols += [f"fs_{s}", f"fs_{s}_ci_low", f"fs_{s}_ci_high"]
    for prefix in ("ssdc", "rpi_ssdc"):
        for k in ("first", "last", "peak", "peak_layer", "mean"):
            cols += [f"{prefix}_{k}"] + ([f"{prefix}_{k}_ci_low", f"{prefix}_{k}_ci_high"] if k != "peak_layer" else [])
    cols += [
        "delta_ssdc_rpi",
        "delta_ssdc_rpi_ci_low",
        "delta_ssdc_rpi_ci_high",
        "ssdc_per_layer",
        "ssdc_per_layer_ci_low",
        "ssdc_per_layer_ci_high",
        "rpi_ssdc_per_layer",
        "rpi_ssdc_per_layer_ci_low",
        "rpi_ssdc_per_layer_ci_high",
    ]
    if config.alphas is not None:
        cols += [
            "sweep_alphas",
            "sweep_delta_ssdc_rpi",
            "sweep_delta_ssdc_rpi_ci_low",
            "sweep_delta_ssdc_rpi_ci_high",
            *(f"sweep_fs_{s}" for s in SWEEP_SHIFTS),
        ]
    if "attention" in config.extras:
        cols += ["attn_distance_mean", "attn_distance_per_layer", "attn_entropy_per_layer"]
    if "position" in config.extras:
        cols += [
            "position_chance",
            "position_acc_mean",
            "position_acc_rpi_mean",
            "position_acc_per_layer",
            "position_acc_rpi_per_layer",
        ]
    return cols + ["notes", "error", "elapsed_s", "timm_posgeom_version", "timm_version", "torch_version"]


def csv_rows(records: Sequence[ZooModel], config: ZooConfig) -> list[dict[str, str]]:
    """One dict per record, keyed by :func:`csv_columns`; a value that does not exist is ``""``.

    ``param_count`` is in millions (3 decimals); ``top1`` (clean top-1), FS and SSDC are fractions with 6
    significant digits, as everywhere in the package; ``*_per_layer`` are space-separated. Every column
    ``X_ci_low`` / ``X_ci_high`` is the 95% interval of column ``X`` (docs/zoo.md#zoocsv-columns)."""
    rows = []
    for r in records:
        row = {c: "" for c in csv_columns(config, records)}
        row.update(
            model=r.model,
            status=r.status,
            weights=r.weights or "",
            source=r.source or "",
            architecture=r.architecture or "",
            error=r.error or "",
            elapsed_s=fmt_cell(r.elapsed_s, ".1f"),
            timm_posgeom_version=r.versions.get("timm_posgeom", ""),
            timm_version=r.versions.get("timm", ""),
            torch_version=r.versions.get("torch", ""),
        )
        if r.status == "ok":
            size = r.input_size or []
            row.update(
                param_count=fmt_cell(r.params / 1e6 if r.params is not None else None, ".3f"),
                img_size=(str(size[1]) if len(size) == 3 and size[1] == size[2] else "x".join(map(str, size[1:]))),
                interpolation=str((r.data_config or {}).get("interpolation") or ""),
                pe_kinds=pe_kinds(r.pe),
                site=r.site or "",
                granularity=r.granularity or "",
                n_layers=fmt_cell(len(r.ssdc) if r.ssdc else None),
                probe_images=fmt_cell(r.probe_images),
                n_images=fmt_cell(r.num_images),
                labels=r.labels or "",
                top1=fmt_cell(r.clean_accuracy),
                rpi_permutations=fmt_cell(r.rpi_permutations),
                delta_ssdc_rpi=fmt_cell(r.rpi_delta_ssdc),
                ssdc_per_layer=_series(r.ssdc),
                rpi_ssdc_per_layer=_series(r.rpi_ssdc),
                notes=" | ".join(n for n in r.notes),
            )
            _ssdc_columns(row, r)
            for name, value in (published_top1(r.model) or {}).items():
                row[f"timm_top1_{name}"] = fmt_cell(value / 100)  # a fraction, as top1
            low, high = (r.clean_accuracy_ci or [None, None])[:2]
            row["top1_ci_low"], row["top1_ci_high"] = fmt_cell(low), fmt_cell(high)
            for s in config.shifts:
                row[f"fs_{s}"] = fmt_cell((r.fs or {}).get(s))
                low, high = ((r.fs_interval or {}).get(s) or [None, None])[:2]
                row[f"fs_{s}_ci_low"], row[f"fs_{s}_ci_high"] = fmt_cell(low), fmt_cell(high)
            _extra_columns(row, r, config)
        rows.append(row)  # a failed model: its error (the record keeps the traceback's last lines)
    return rows


def _extra_columns(row: dict[str, str], r: ZooModel, config: ZooConfig) -> None:
    """The columns of the extras the zoo measured (attention, position) and of the alpha sweep, into ``row``."""
    if "attention" in config.extras:
        row.update(
            attn_distance_mean=fmt_cell(layer_summary(r.attention_distance)["mean"]),
            attn_distance_per_layer=_series(r.attention_distance),
            attn_entropy_per_layer=_series(r.attention_entropy),
        )
    if "position" in config.extras:
        row.update(
            position_chance=fmt_cell(r.position_chance),
            position_acc_mean=fmt_cell(layer_summary(r.position_accuracy)["mean"]),
            position_acc_rpi_mean=fmt_cell(layer_summary(r.position_accuracy_rpi)["mean"]),
            position_acc_per_layer=_series(r.position_accuracy),
            position_acc_rpi_per_layer=_series(r.position_accuracy_rpi),
        )
    if config.alphas is not None and r.alpha_sweep is not None:
        sw = r.alpha_sweep
        row["sweep_alphas"] = " ".join(f"{a:g}" for a in sw.alphas)
        row["sweep_delta_ssdc_rpi"] = _series(sw.delta_ssdc)
        row["sweep_delta_ssdc_rpi_ci_low"] = _ci_series(sw.delta_ssdc_ci, 0)
        row["sweep_delta_ssdc_rpi_ci_high"] = _ci_series(sw.delta_ssdc_ci, 1)
        for s in SWEEP_SHIFTS:
            row[f"sweep_fs_{s}"] = _series(sw.fs.get(s))


def _ssdc_columns(row: dict[str, str], r: ZooModel) -> None:
    """The SSDC summaries of a record, each with its interval, into ``row``."""
    for prefix, values, cis, mean_ci in (
        ("ssdc", r.ssdc, r.ssdc_ci, r.ssdc_mean_ci),
        ("rpi_ssdc", r.rpi_ssdc, r.rpi_ssdc_ci, r.rpi_ssdc_mean_ci),
    ):
        for k, v in layer_summary(values).items():
            row[f"{prefix}_{k}"] = fmt_cell(v)
        for k, (low, high) in summary_intervals(values, cis, mean_ci).items():
            row[f"{prefix}_{k}_ci_low"], row[f"{prefix}_{k}_ci_high"] = fmt_cell(low), fmt_cell(high)
        row[f"{prefix}_per_layer_ci_low"], row[f"{prefix}_per_layer_ci_high"] = _ci_series(cis, 0), _ci_series(cis, 1)
    low, high = (r.rpi_delta_ssdc_ci or [None, None])[:2]
    row["delta_ssdc_rpi_ci_low"], row["delta_ssdc_rpi_ci_high"] = fmt_cell(low), fmt_cell(high)


def keep_if_shrinking(path: Path, models: Sequence[str], log: Callable[[str], None] | None = print) -> Path | None:
    """Before ``zoo.csv`` at ``path`` is written again with rows for ``models``: when it has rows of models
    not among them (their records gone: a partial copy of a zoo, a shard's folder), it is their only copy, so it
    is kept as ``zoo.csv.replaced-N`` (and ``zoo.md`` beside it likewise), said through ``log``. Returns the
    path it was kept as, or None when nothing would be lost."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            before = [row.get("model") for row in csv.DictReader(f)]
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, csv.Error):  # unreadable: kept as it is, not overwritten
        before = [None]
    lost = [m for m in before if m not in set(models)]
    if not lost:
        return None
    kept = set_aside(path)
    md = path.with_name("zoo.md")
    kept_md = set_aside(md) if md.is_file() else None
    if log is not None:
        log(
            f"kept the former {path.name} as {kept.name}{f' (and {md.name} as {kept_md.name})' if kept_md else ''}: it "
            f"has rows of {len(lost)} model(s) without a record now ({', '.join(str(m) for m in lost[:5])}"
            f"{' ...' if len(lost) > 5 else ''})"
        )
    return kept


def write_csv(
    records: Sequence[ZooModel], path: Path, config: ZooConfig, log: Callable[[str], None] | None = print
) -> Path:
    """``zoo.csv``: one row per record (:func:`csv_rows`), written atomically; a former one with rows of other
    models is kept beside it first (:func:`keep_if_shrinking`), never lost."""
    keep_if_shrinking(path, [r.model for r in records], log)
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=csv_columns(config, records), lineterminator="\n")
    writer.writeheader()
    writer.writerows(csv_rows(records, config))
    write_atomic(path, buffer.getvalue())
    return path
