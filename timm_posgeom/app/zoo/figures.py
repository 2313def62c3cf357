"""``zoo.md`` and the zoo's figures, from the records."""

from __future__ import annotations

import io
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ...results.jsonio import nan_if_none, write_atomic
from ..provenance import describe_versions
from ..records import ZooModel
from .config import JPEG_SHIFT, ZooConfig, versions
from .model_sets import PUBLISHED_SETS, PUBLISHED_SOURCE, published_top1
from .table import fmt_cell, layer_summary, pe_kinds, relative_depth, write_csv


def _save(fig: Any, path: Path) -> None:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=120)
    write_atomic(path, buffer.getvalue())


def _label(name: str, width: int = 40) -> str:
    """A model's name for a legend or a point: whole up to ``width`` characters, else its tail."""
    return name if len(name) <= width else "..." + name[-(width - 3) :]


def _empty(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, fontsize=9, color="0.4", wrap=True)


def fig_ssdc_depth(records: Sequence[ZooModel], path: Path) -> None:
    """SSDC against relative depth (:func:`relative_depth`), one line per model: normal (left) and under
    RPI (right), against the index grid; each line with its 95% interval as a band (over images without RPI,
    over the RPI permutations under it)."""
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
            y = nan_if_none(values)
            x = relative_depth(len(y))
            ax.plot(
                x,
                y,
                marker="s" if r.granularity == "stage" else "o",
                ms=4,
                color=f"C{i % 10}",
                linestyle=("-", "--", ":")[i // 10 % 3],
                label=_label(r.model),
            )
            cis = getattr(r, f"{key}_ci")
            if cis and len(cis) == len(y):
                ax.fill_between(
                    x,
                    nan_if_none([c[0] for c in cis]),
                    nan_if_none([c[1] for c in cis]),
                    color=f"C{i % 10}",
                    alpha=0.15,
                    lw=0,
                )
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
    from ...results.plotting import fit_titles

    fit_titles(fig)
    _save(fig, path)


def fig_fragility_delta(records: Sequence[ZooModel], path: Path, shift: str = JPEG_SHIFT) -> list[str]:
    """``shift``'s FS against delta SSDC under RPI, one labelled point per model that has both, with FS's
    paired-bootstrap 95% interval as a vertical error bar and delta SSDC's 95% interval over the RPI
    permutations as a horizontal one; labels point inwards so they stay inside the axes. Returns the models
    left out."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from ...results.plotting import fit_titles

    fig = Figure(figsize=(6.4, 4.8), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    points, left_out = _fs_delta_points(ax, records, shift)
    if not points:
        _empty(ax, f"no model has both FS {shift} and delta SSDC under RPI")
    ax.axhline(0, color="0.6", lw=0.5)
    ax.axvline(0, color="0.6", lw=0.5)
    ax.margins(0.12)
    if points:
        _label_fs_delta_points(ax, points)
    ax.set_xlabel("delta SSDC under RPI (layer 1 - layer 0)")
    ax.set_ylabel(f"fragility score FS, {shift}")
    ax.set_title(
        f"JPEG fragility against delta SSDC ({len(points)} model{'s' if len(points) != 1 else ''})", fontsize=10
    )
    fit_titles(fig)
    _save(fig, path)
    return left_out


_Point = tuple[float, float, str, int]  # a model's point in fig_fragility_delta: delta SSDC, FS, name, index


def _fs_delta_points(ax: Any, records: Sequence[ZooModel], shift: str) -> tuple[list[_Point], list[str]]:
    """Draw each model that has ``shift``'s FS and delta SSDC under RPI as a point with its two 95% intervals
    as error bars (colour ``C{i}``, ``i`` its index in ``records``); the points (delta SSDC, FS, model, i)
    and the models left out."""
    left_out = []
    points = []
    for i, r in enumerate(records):
        fs = (r.fs or {}).get(shift)
        if r.status != "ok" or fs is None or r.rpi_delta_ssdc is None:
            left_out.append(r.model)
            continue
        lo, hi = ((r.fs_interval or {}).get(shift) or [None, None])[:2]
        err = None if lo is None or hi is None else [[max(fs - lo, 0.0)], [max(hi - fs, 0.0)]]
        dlo, dhi = (r.rpi_delta_ssdc_ci or [None, None])[:2]
        d = r.rpi_delta_ssdc
        xerr = None if dlo is None or dhi is None else [[max(d - dlo, 0.0)], [max(dhi - d, 0.0)]]
        ax.errorbar([d], [fs], yerr=err, xerr=xerr, fmt="o", color=f"C{i % 10}", ms=5, capsize=3, zorder=3)
        points.append((r.rpi_delta_ssdc, fs, r.model, i))
    return points, left_out


def _label_fs_delta_points(ax: Any, points: list[_Point]) -> None:
    """The legend of the two error bars, and each point's model name, pointing away from the nearer edge of the
    axes (whose limits are set by then) so that it stays inside."""
    from matplotlib.lines import Line2D

    bar = Line2D([], [], color="0.3", marker="|", ms=10, ls="none", label="FS: paired bootstrap 95% interval")
    hbar = Line2D(
        [], [], color="0.3", marker="_", ms=10, ls="none", label="delta SSDC: 95% interval over the RPI permutations"
    )
    ax.legend(handles=[bar, hbar], fontsize=7, loc="best")
    mid = sum(ax.get_xlim()) / 2
    top = sum(ax.get_ylim()) / 2
    for x, y, model, i in points:  # a label points away from the nearer edge, so it stays inside
        right, above = x <= mid, y <= top
        ax.annotate(
            _label(model, 32),
            (x, y),
            xytext=(5 if right else -5, 4 if above else -4),
            textcoords="offset points",
            fontsize=7,
            ha="left" if right else "right",
            va="bottom" if above else "top",
            color=f"C{i % 10}",
            annotation_clip=True,
        )


def _f3(value: Any) -> str:
    return "" if value is None or (isinstance(value, float) and not math.isfinite(value)) else f"{value:.3f}"


def _ci3(value: Any, ci: Sequence[Any] | None) -> str:
    """``0.123 [0.100, 0.150]``: a number with its 95% interval (the number alone where there is none)."""
    text = _f3(value)
    if not text or not ci or ci[0] is None or ci[1] is None:
        return text
    return f"{text} [{_f3(ci[0])}, {_f3(ci[1])}]"


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

    lines += [
        "| model | attention distance (patches) | attention entropy (nats) | position probe | "
        "position probe under RPI | chance |",
        "|---|---|---|---|---|---|",
    ]
    for r in measured:
        lines.append(
            f"| `{_md_cell(r.model)}` | {fml(r.attention_distance)} | {fml(r.attention_entropy)} | "
            f"{fml(r.position_accuracy)} | {fml(r.position_accuracy_rpi)} | {_f3(r.position_chance)} |"
        )
    return lines + [
        "",
        "Each cell: the first / middle / last block. Attention distance: the attention-weighted "
        "mean grid distance (patch units) from each patch query to the patch keys, mean over heads "
        "and queries; entropy likewise (docs/attention.md). Position probe: the fraction of patch "
        "tokens whose (row, col) a linear map of the token reads right, fitted on the first half of the "
        "probe images and scored on the second; under RPI with a fresh permutation per batch, where a "
        "model without PE falls to chance (docs/attention.md#position-probe).",
    ]


def zoo_markdown(records: Sequence[ZooModel], config: ZooConfig, left_out: Sequence[str] = ()) -> str:
    """``zoo.md``: settings, the table, the alpha sweeps, notes and failures, the figures."""
    lines = _md_header(records, config) + _md_table(records, config) + _md_published(records, config)
    lines += _md_sweeps(records, config) + _extras_markdown(records, config) + _md_notes(records)
    lines += _md_figures(left_out)
    return "\n".join(lines) + "\n"


def _md_header(records: Sequence[ZooModel], config: ZooConfig) -> list[str]:
    """The title, the settings and versions, what the columns mean, a warning for random-init models."""
    # each model records the versions that measured it; a resumed zoo may mix several invocations' versions
    vers = describe_versions(versions(), [(r.model, [r.versions]) for r in records if r.status == "ok"])
    lines = [
        "# Model zoo: positional encodings, SSDC and fragility",
        "",
        f"Data: `{config.data}` ({config.split}), the first {config.probe_count()} images for SSDC and "
        f"{'all' if config.max_images is None else f'the first {config.max_images}'} for fragility; "
        f"probe site `{config.site}`; resize `{config.resize}`; input size "
        f"{config.img_size if config.img_size else 'each model own'}; weights `{config.pretrained}`; seed {config.seed}. "
        f"Versions: {vers}.",
        "",
        "SSDC: Spearman correlation of the patch tokens' cosine similarities with minus their grid distance, "
        "per layer (per block of a flat ViT, per stage otherwise), from the similarity map averaged over the "
        f"images. RPI: the patch contents permuted before any PE, under {config.rpi_permutations} shared "
        "permutations (seeds seed .. seed + K - 1); every number under RPI is their mean. Delta SSDC: SSDC under "
        "RPI of layer 1 minus layer 0 (undefined per stage). FS = 1 - A_shift / A_clean. Top-1 as a fraction, "
        "only where the data's labels match the model's classes. Brackets: 95% intervals of the number before "
        "them: top-1 Wilson, FS paired bootstrap over images, SSDC under RPI and delta SSDC Student t over the "
        "RPI permutations (two models whose intervals overlap may not differ). Definitions: docs/method.md.",
        "",
    ]
    if any(r.weights == "random-init" for r in records):
        lines += [
            "**Random-init models** (weights `random-init`) are measured at initialisation: their numbers "
            "describe the architecture's prior, and say nothing about a trained or pretrained model.",
            "",
        ]
    return lines


def _md_table(records: Sequence[ZooModel], config: ZooConfig) -> list[str]:
    """The main table: one row per model (a failed one says so)."""
    head = [
        "model",
        "weights",
        "params (M)",
        "size",
        "PE",
        "top-1",
        *(f"FS {s}" for s in config.shifts),
        "SSDC first / last / peak (layer)",
        "RPI: mean over layers",
        "ΔSSDC (RPI)",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in records:
        if r.status != "ok":
            lines.append("| " + " | ".join([f"`{_md_cell(r.model)}`", "failed"] + [""] * (len(head) - 2)) + " |")
            continue
        s, p = layer_summary(r.ssdc), layer_summary(r.rpi_ssdc)
        size = r.input_size or []
        cells = [
            f"`{_md_cell(r.model)}`",
            r.weights or "",
            fmt_cell(r.params / 1e6 if r.params else None, ".2f"),
            "x".join(map(str, size[1:])),
            _md_cell(pe_kinds(r.pe)),
            _ci3(r.clean_accuracy, r.clean_accuracy_ci),
            *(_ci3((r.fs or {}).get(sh), (r.fs_interval or {}).get(sh)) for sh in config.shifts),
            (
                f"{_f3(s['first'])} / {_f3(s['last'])} / {_f3(s['peak'])} ({s['peak_layer']})"
                if s["first"] is not None
                else ""
            ),
            _ci3(p["mean"], r.rpi_ssdc_mean_ci) if p["first"] is not None else "",
            _ci3(r.rpi_delta_ssdc, r.rpi_delta_ssdc_ci),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _md_sweeps(records: Sequence[ZooModel], config: ZooConfig) -> list[str]:
    """The alpha sweeps' table (none when the zoo swept no alpha)."""
    alphas = config.alphas
    if alphas is None:
        return []
    sweeps = [(r, r.alpha_sweep) for r in records if r.status == "ok" and r.alpha_sweep is not None]
    lines = ["", f"## Alpha sweep (PE scaled by alpha; delta SSDC under RPI, FS {JPEG_SHIFT})", ""]
    if not sweeps:
        return lines + ["No model could be swept (see the notes)."]
    order = sorted(range(len(alphas)), key=lambda k: alphas[k])  # alpha increasing
    lines += [
        "| model | " + " | ".join(f"α={alphas[k]:g}" for k in order) + " |",
        "|---|" + "---|" * len(alphas),
    ]
    for r, sw in sweeps:
        fs = sw.fs.get(JPEG_SHIFT) or [None] * len(sw.alphas)
        dci: Sequence[Sequence[Any] | None] = sw.delta_ssdc_ci or [None] * len(sw.alphas)  # None: no interval
        fci: Sequence[Sequence[Any] | None] = (sw.fs_interval or {}).get(JPEG_SHIFT) or [None] * len(sw.alphas)
        cells = sorted(zip(sw.alphas, sw.delta_ssdc, dci, fs, fci), key=lambda c: c[0])
        lines.append(
            f"| `{_md_cell(r.model)}` | "
            + " | ".join(
                f"{_ci3(d, dc) or 'n/a'}" + (f" / {_ci3(f, fc)}" if f is not None else "") for _, d, dc, f, fc in cells
            )
            + " |"
        )
    return lines + [
        "",
        "Each cell: delta SSDC under RPI [its 95% interval over the RPI permutations, drawn afresh "
        "for each alpha] / FS [paired bootstrap 95% interval] (FS only where the labels match).",
    ]


def _md_notes(records: Sequence[ZooModel]) -> list[str]:
    """The measured models' notes, then the failures."""
    lines = []
    notes = [(r.model, n) for r in records if r.status == "ok" for n in r.notes]
    if notes:
        lines += ["", "## Notes", ""] + [f"- `{m}`: {_md_cell(n)}" for m, n in notes]
    failed = [r for r in records if r.status != "ok"]
    if failed:
        lines += ["", "## Failed", ""] + [f"- `{r.model}`: {_md_cell(r.error or '')}" for r in failed]
    return lines


def _md_figures(left_out: Sequence[str]) -> list[str]:
    """The figures with their captions, and the models the fragility figure leaves out."""
    lines = [
        "",
        "## Figures",
        "",
        "![SSDC against relative depth, normal and under RPI](figures/zoo_ssdc_depth.png)",
        "",
        "*SSDC of the mean map against relative depth, one line per model: left without RPI, right under "
        "RPI (against the index grid, the mean over the RPI permutations). Bands: 95% intervals, over images "
        "(a delete-a-group jackknife) on the left, over the RPI permutations on the right.*",
        "",
        "![JPEG fragility against delta SSDC](figures/zoo_fragility_vs_delta.png)",
        "",
        f"*FS under {JPEG_SHIFT} against delta SSDC under RPI, one point per model; vertical bars: FS's "
        "paired-bootstrap 95% interval over the images; horizontal bars: delta SSDC's 95% interval over the "
        "RPI permutations.*",
    ]
    if left_out:
        lines += [
            "",
            f"Not in the fragility figure (no FS {JPEG_SHIFT} or no delta SSDC under RPI): "
            + ", ".join(f"`{m}`" for m in left_out)
            + ".",
        ]
    return lines


def _md_published(records: Sequence[ZooModel], config: ZooConfig) -> list[str]:
    """timm's published top-1 of each model that has them (``--model-set pe-variants``), beside what the zoo measured
    on its own data; nothing when no model has published numbers."""
    shown = [r for r in records if r.status == "ok" and published_top1(r.model)]
    if not shown:
        return []
    jpeg = JPEG_SHIFT if JPEG_SHIFT in config.shifts else config.shifts[0]
    head = [
        "model",
        "PE",
        "timm: ImageNet / -R / -A / -Sketch top-1 (%)",
        f"top-1 here ({config.data})",
        f"FS {jpeg}",
        "ΔSSDC (RPI)",
        "RPI: SSDC mean over layers",
    ]
    lines = [
        "",
        "## Published by timm, beside ours",
        "",
        f"timm's own top-1 of each model on ImageNet-1k, ImageNet-R, ImageNet-A and ImageNet-Sketch ({PUBLISHED_SOURCE}), "
        "next to what this zoo measured on its own data (brackets: 95% intervals). None of these models has "
        "published ImageNet-C numbers.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for r in shown:
        top1 = published_top1(r.model) or {}
        cells = [
            f"`{_md_cell(r.model)}`",
            _md_cell(pe_kinds(r.pe)),
            " / ".join(f"{top1[k]:.2f}" for k in PUBLISHED_SETS),
            _ci3(r.clean_accuracy, r.clean_accuracy_ci),
            _ci3((r.fs or {}).get(jpeg), (r.fs_interval or {}).get(jpeg)),
            _ci3(r.rpi_delta_ssdc, r.rpi_delta_ssdc_ci),
            _ci3(layer_summary(r.rpi_ssdc)["mean"], r.rpi_ssdc_mean_ci),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def write_outputs(records: Sequence[ZooModel], out: str | os.PathLike, config: ZooConfig) -> dict[str, Path]:
    """Write ``zoo.csv``, ``figures/zoo_ssdc_depth.png``, ``figures/zoo_fragility_vs_delta.png`` and
    ``zoo.md`` from the records (each file atomically); returns their paths."""
    out = Path(out)
    figures = out / "figures"
    figures.mkdir(parents=True, exist_ok=True)
    paths = dict(
        csv=write_csv(records, out / "zoo.csv", config),
        ssdc=figures / "zoo_ssdc_depth.png",
        fragility=figures / "zoo_fragility_vs_delta.png",
        md=out / "zoo.md",
    )
    fig_ssdc_depth(records, paths["ssdc"])
    left_out = fig_fragility_delta(records, paths["fragility"])
    write_atomic(paths["md"], zoo_markdown(records, config, left_out))
    return paths
