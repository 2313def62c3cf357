"""Turn a study's ``results.json`` into ``report.md``, ``report.html`` and PNG figures.

Everything here is derived from ``results.json`` (``posgeom report RUN_DIR`` regenerates it), so a
report can be rebuilt, restyled or re-thresholded without re-running a model.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from ...data.shifts import PAPER_SHIFTS
from ...results.intervals import t_quantile
from ...results.jsonio import nan_if_none
from ..records import StudyResults, StudyRun
from ..rundir import RunDirError
from .claims import (
    CHANCE_FACTOR,
    LABELS,
    NEAR_ZERO,
    SUBSTANTIAL,
    evaluate_claims,
    rpi_cube,
    spread,
    spread_sp,
)
from .figures import (
    fig_alpha_sweep,
    fig_attention_heads,
    fig_fragility,
    fig_similarity_maps,
    fig_ssdc_depth,
    fig_training,
    no_pe_floor,
)
from .header import report_header, report_intro, versions_text
from .runs import by_condition, layer_mean_std, run_fs, seed_history, sweep_order
from .shift_size import fragility_at_size_lines

__all__ = ["write_report", "render_html", "PAPER", "evaluate_claims"]

# The paper's ViT-S/16 on ImageNet-100 (4 seeds, 60 epochs): clean top-1, JPEG q5 FS, blur FS.
PAPER = {
    "ape": (0.641, 0.435, 0.184),
    "sincos": (0.657, 0.435, 0.208),
    "rope": (0.690, 0.299, 0.147),
    "nope": (0.568, 0.646, 0.298),
    "rpt": (0.560, 0.630, 0.243),
}


def _floor_line(results: StudyResults, delta: bool = False) -> str:
    """One line stating the no-PE floor under RPI, to stand next to every SSDC-under-RPI table."""
    floor = no_pe_floor(results)
    if floor is None:
        return (
            "No-PE floor under RPI (the structure a permuted model shows by chance): not measured, the study "
            "has no no-PE run."
        )
    layers, mean, d = floor
    perms = mean.permutations
    what = (
        f"delta SSDC {d.text()}"
        if delta
        else f"per layer {', '.join(f'{s.mean:.3f}' for s in layers)}; mean over layers {mean.text()}"
    )
    return (
        f"No-PE floor under RPI (the structure a permuted model shows by chance: this study's no-PE runs under "
        f"the same {perms} permutation{'s' if perms != 1 else ''}, over seeds x permutations): {what}."
    )


def formed_at(epochs: np.ndarray, mean_ssdc: np.ndarray) -> float | None:
    """First logged epoch from which the mean SSDC under RPI stays above SUBSTANTIAL, or None."""
    above = mean_ssdc > SUBSTANTIAL
    for i in range(len(epochs)):
        if above[i:].all():
            return float(epochs[i])
    return None


def _monitor_split(results: StudyResults) -> str:
    """What monitored the runs' training, in words: the held-out part of the training split, or validation."""
    monitors = {h.monitor or "validation" for r in results.runs for h in r.history or []}
    if monitors == {"heldout"}:
        return "the part of the training split held out from training (`heldout_fraction`)"
    return (
        "the validation split" if monitors <= {"validation"} else "the validation split or a held-out part of training"
    )


def training_table(results: StudyResults) -> list[str]:
    rows = []
    for c, runs in by_condition(results).items():
        epochs, ssdc_l, top1, records = seed_history(runs)
        if not epochs.size:
            continue
        mean = np.nanmean(ssdc_l, 1)
        marks = [int(round(q * (len(epochs) - 1))) for q in (0.25, 0.5, 0.75, 1.0)]
        formed = formed_at(epochs, mean)

        # at each mark: each seed's mean over layers, then mean ± std over seeds
        at = [_short(spread([float(np.nanmean(nan_if_none(r.rpi_ssdc))) for r in records[i]])) for i in marks]
        rows.append(
            f"| {LABELS.get(c, c)} | "
            + " | ".join(f"{a} (ep {epochs[i]:g})" for a, i in zip(at, marks))
            + f" | {'never' if formed is None else f'{formed:g}'} | "
            + _short(spread(nan_if_none([r.monitor_top1 for r in records[-1]])))
            + " |"
        )
    if not rows:
        return []
    return [
        "",
        "## During training: SSDC under RPI (mean over layers; training log, mean ± std over seeds)",
        "",
        f"Logged by the training loop on the first images of {_monitor_split(results)} (`probe_images` in the "
        "recipe), as is top-1 at end: when the index anchor forms, and whether it is still moving at the end of "
        "training.",
        "",
        _floor_line(results) + " Measured at the end, by the study's probe.",
        "",
        "| condition | 1/4 | 1/2 | 3/4 | end | stays above " + f"{SUBSTANTIAL} from epoch | top-1 at end |",
        "|---|---|---|---|---|---|---|",
    ] + rows


def _attention_table(results: StudyResults) -> list[str]:
    """Per condition and measured layer: mean attention distance (normal and under RPI), entropy and attention
    SSDC, each the mean over heads and seeds with its range; [] when no run has attention per head."""
    rows = []
    for c, runs in by_condition(results).items():
        summaries = [r.eval.attention for r in runs if r.eval.attention is not None]
        for k, layer in enumerate(summaries[0].layers if summaries else []):
            cells = [
                _head_range([getattr(a, key)[k] for a in summaries if getattr(a, key)])
                for key in ("mean_distance", "rpi_mean_distance", "entropy", "ssdc")
            ]
            rows.append(f"| {LABELS.get(c, c)} | {layer} | " + " | ".join(cells) + " |")
    if not rows:
        return []
    images = sorted({r.eval.attention.n_images for r in results.runs if r.eval.attention is not None})
    return [
        "",
        "## Attention per head (mean over heads and seeds [min, max])",
        "",
        f"Measured at a few layers on the first {'/'.join(map(str, images))} images of the SSDC probe, without "
        "and under RPI (one permutation; distances on the index grid): mean attention distance in patch units, "
        "attention entropy in nats, SSDC of each head's symmetrised mean attention map "
        "(docs/attention.md in the timm-posgeom repository).",
        "",
        "| condition | layer | mean distance | mean distance under RPI | entropy | attention SSDC |",
        "|---|---|---|---|---|---|",
    ] + rows


def _head_range(rows: list[list[float | None]]) -> str:
    """``mean [min, max]`` over every head of ``rows`` (one list of heads per seed), NaN left out; n/a if none."""
    values = np.array([v for row in rows for v in nan_if_none(row)], dtype=float)
    values = values[np.isfinite(values)]
    if not values.size:
        return "n/a"
    return f"{values.mean():.3f} [{values.min():.3f}, {values.max():.3f}]"


def study_tables(results: StudyResults) -> list[str]:
    """The study's tables: accuracy and fragility, SSDC across depth, and the alpha sweep when measured."""
    by = by_condition(results)
    return _accuracy_table(results, by) + _ssdc_table(results, by) + _alpha_sweep_tables(results, by)


def _accuracy_table(results: StudyResults, by: dict[str, list[StudyRun]]) -> list[str]:
    """Clean top-1 and FS under the paper's shifts against the paper's numbers; FS under any other shift."""
    lines = [
        "## Accuracy and fragility (mean ± std [95% interval] over seeds)",
        "",
        "| condition | seeds | clean top-1 | JPEG q5 FS | blur σ2.5 FS | paper top-1 | paper JPEG FS | paper blur FS |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c, runs in by.items():
        acc = spread([r.eval.clean_accuracy for r in runs]).text()
        fj = spread([run_fs(r, "jpeg:5") for r in runs]).text()
        fb = spread([run_fs(r, "blur:2.5:5") for r in runs]).text()
        pa = PAPER.get(c, (math.nan,) * 3)
        lines.append(
            f"| {LABELS.get(c, c)} | {len(runs)} | {acc} | {fj} | {fb} | {pa[0]:.3f} | {pa[1]:.3f} | {pa[2]:.3f} |"
        )
    extra = sorted({s for r in results.runs for s in r.eval.fs or {}} - set(PAPER_SHIFTS))
    if extra:
        lines += [
            "",
            "Other shifts (FS):",
            "",
            "| condition | " + " | ".join(extra) + " |",
            "|---|" + "---|" * len(extra),
        ]
        for c, runs in by.items():
            lines.append(
                f"| {LABELS.get(c, c)} | "
                + " | ".join(spread([run_fs(r, s) for r in runs]).text() for s in extra)
                + " |"
            )
    lines += fragility_at_size_lines(results)
    return lines


def _ssdc_table(results: StudyResults, by: dict[str, list[StudyRun]]) -> list[str]:
    """SSDC per layer (without and under RPI, untrained), its mean and delta under RPI, with the no-PE floor."""
    lines = ["", "## SSDC across depth (attention input, mean map; mean ± std over seeds)", ""]
    ns = sorted({len(runs) for runs in by.values() if len(runs) > 1})
    if ns:  # the per-layer lists keep to mean ± std; their 95% intervals follow from it
        factors = ", ".join(f"{t_quantile(n - 1) / math.sqrt(n):.2f} with {n} seeds" for n in ns)
        lines += [
            f"Per layer: mean ± std over seeds; its 95% interval is mean ± k·std (k = t(0.975, n-1)/√n: "
            f"{factors}). Delta SSDC gives mean ± std [95% interval].",
            "",
        ]
    perms = sorted({len(r.eval.ssdc.rpi_by_permutation or [None]) for r in results.runs if r.eval.ssdc})
    lines += [
        f"Under RPI: the mean over {'/'.join(map(str, perms)) or '1'} permutation(s) per model (seeds 0, 1, ..., "
        "the same for every model); the mean over layers and delta SSDC under RPI give mean ± seed std "
        "(permutations ± the std over permutations) [95% interval over seeds x permutations].",
        "",
        _floor_line(results),
        "",
        "| condition | SSDC per layer | under RPI (index grid) | mean under RPI | delta SSDC under RPI | untrained |",
        "|---|---|---|---|---|---|",
    ]
    for c, runs in by.items():
        cube = rpi_cube(runs)
        mean = spread_sp(np.nanmean(cube, 2)).text() if cube.size else "n/a"
        d = spread_sp(cube[:, :, 1] - cube[:, :, 0]).text() if cube.size and cube.shape[2] >= 2 else "n/a"
        lines.append(
            f"| {LABELS.get(c, c)} | {_layer_text(runs, 'per_layer')} | {_layer_text(runs, 'rpi_per_layer')} | "
            f"{mean} | {d} | {_layer_text(runs, 'per_layer', 'untrained')} |"
        )
    return lines


def _alpha_sweep_tables(results: StudyResults, by: dict[str, list[StudyRun]]) -> list[str]:
    """Delta SSDC under RPI and JPEG q5 FS at each alpha, alpha upwards; [] when no run swept alpha."""
    lines: list[str] = []
    swept = [(c, [r.eval.alpha_sweep for r in runs if r.eval.alpha_sweep]) for c, runs in by.items()]
    swept = [(c, s) for c, s in swept if s]
    if swept:
        for title, value in (
            ("delta SSDC under RPI", lambda s, i: s.delta_ssdc[i]),
            ("JPEG q5 FS", lambda s, i: s.fs["jpeg:5"][i]),
        ):
            lines += ["", f"## Alpha sweep: {title} (mean ± std [95% interval] over seeds)", ""]
            if title.startswith("delta"):
                lines += [
                    _sweep_protocol([s for _, sweeps in swept for s in sweeps])
                    + " "
                    + _floor_line(results, delta=True),
                    "",
                ]
            lines += [
                "| alpha | " + " | ".join(LABELS.get(c, c) for c, _ in swept) + " |",
                "|---|" + "---|" * len(swept),
            ]
            alphas = swept[0][1][0].alphas
            for i in sweep_order(alphas):  # alpha upwards, as in the figure
                a = alphas[i]
                lines.append(
                    f"| {a:g} | "
                    + " | ".join(spread([value(s, i) for s in sweeps]).text() for _, sweeps in swept)
                    + " |"
                )
    return lines


def _sweep_protocol(sweeps: list[Any]) -> str:
    """How the recorded sweeps permuted under RPI (each record says; a record before schema 5 drew one
    permutation, seed 0, at every alpha)."""
    counts = sorted({s.rpi_permutations for s in sweeps}, key=lambda k: (k is None, k or 0))
    texts = [
        f"the mean over {k} RPI permutations drawn afresh for each alpha (seeds jK .. jK + K - 1 for the j-th alpha)"
        if k
        else "one RPI permutation, the first, the same at every alpha (recorded before the "
        "protocol of fresh permutations per alpha)"
        for k in counts
    ]
    return "Delta SSDC at each alpha is " + "; in some runs ".join(texts) + ", per run."


def _short(s) -> str:
    """mean, or mean±std with 2 seeds or more (the 95% intervals are in the accuracy table's style)."""
    if s.n == 0:
        return "n/a"
    return f"{s.mean:.3f}" if s.n == 1 else f"{s.mean:.3f}±{s.std:.3f}"


def _layer_text(runs: list[StudyRun], key: str, source: str = "eval") -> str:
    """Per layer: the mean over seeds (± std with 2 seeds or more)."""
    m, sd = layer_mean_std(runs, key, source)
    many = sum(1 for r in runs if (r.eval.ssdc if source == "eval" else getattr(r, source)) is not None) > 1
    return ", ".join(f"{a:.3f}±{b:.3f}" if many else f"{a:.3f}" for a, b in zip(m, sd))


def claims_table(claims: list[dict[str, Any]]) -> list[str]:
    lines = [
        "## The paper's five claims in this run",
        "",
        f"Thresholds: 'builds structure' = the trained no-PE model's mean SSDC over layers above its untrained "
        f"start's (the same seed), paired over seeds; 'collapses' = |SSDC| < {NEAR_ZERO} at every layer under "
        f"RPI; 'substantial' = mean SSDC under RPI > {SUBSTANTIAL}; peaks early = the rise over block 1 minus "
        "the rise after it, (S1 - S0) - (S_last - S1) > 0; accumulates = last layer minus first > 0; a trend "
        "with alpha = every seed's Spearman correlation with the claimed sign and the change from the largest "
        "to the smallest alpha > 0 in the claimed direction. One rule decides every part "
        "(docs/method.md#verdicts): yes when it holds beyond its interval, no when its opposite holds beyond "
        "it, within noise otherwise; the interval is over seeds, and over seeds x RPI permutations for SSDC "
        "under RPI, on seeds - 1 degrees of freedom. Each claim is corrected for its number of parts by "
        "Holm's step-down procedure (family-wise 95%): the part with the k-th smallest p-value of m is tested "
        "at level 1 - 0.05 / (m - k + 1), and from the first part not decided on, every remaining one is "
        "within noise. One seed never decides: such a claim reads 'one seed: not decided', its evidence "
        "(intervals over RPI permutations, or from each run's bootstrap interval for fragility, MOVER) still "
        f"shown. A claim that involves a model whose clean top-1 is below {CHANCE_FACTOR:g}x chance is "
        "undecided. The evidence shows, for each part that decided, its interval at the level it was tested, "
        "that level, its p-value and the threshold.",
        "",
        "| # | claim | held here | evidence |",
        "|---|---|---|---|",
    ]
    for i, c in enumerate(claims, 1):
        held = {"held": "yes", "not held": "**no**"}.get(c["status"], f"{c['status']}: {c['reason']}")
        lines.append(f"| {i} | {_cell(c['claim'])} | {_cell(held)} | {_cell(c['evidence'])} |")
    return lines + [""]


def _cell(text: str) -> str:
    """``text`` for one cell of a markdown table: a pipe (|SSDC|) escaped, so that it does not end the cell
    (the rest of the evidence would be lost), and line breaks made spaces."""
    return " ".join(str(text).split("\n")).replace("|", "\\|")


def heading_slug(heading: str) -> str:
    """A heading's anchor as GitHub writes it (lower case, punctuation dropped, spaces to hyphens); the
    HTML page uses the same (:func:`render_html`), so the contents' links work in both."""
    import re

    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _contents(lines: list[str]) -> list[str]:
    """A table of contents: a link to every second-level heading in ``lines``."""
    heads = [line[3:].strip() for line in lines if line.startswith("## ")]
    return ["## Contents", ""] + [f"- [{h}](#{heading_slug(h)})" for h in heads] + [""]


def _place(lines: list[str], heading: str, block: list[str]) -> list[str]:
    """``block`` inserted at the end of the last section whose heading starts with ``heading`` (appended
    when there is none): a figure goes next to the table it illustrates."""
    starts = [i for i, line in enumerate(lines) if line.startswith("## " + heading)]
    if not starts:
        return lines + [""] + block
    end = next((j for j in range(starts[-1] + 1, len(lines)) if lines[j].startswith("## ")), len(lines))
    while end > 0 and lines[end - 1] == "":
        end -= 1
    while block and block[-1] == "":
        block = block[:-1]
    return lines[:end] + [""] + block + lines[end:]


def _figure(number: int, file: str, alt: str, caption: str) -> list[str]:
    return [f"![{alt}](figures/{file})", "", f"*Figure {number}. {caption}*", ""]


def write_report(out: str | os.PathLike, results: StudyResults | None = None, figures: bool = True) -> Path:
    """Write report.md, report.html and figures into ``out``; return report.md.

    ``results``: the study's results as the study holds them (:func:`~timm_posgeom.app.study.run_study` passes
    them down); None reads ``out/results.json`` (``posgeom report``). The page: a title and a table saying what
    the study varied (preset, init, width, depth, grid, overrides, seeds, data identity), a table of contents,
    the claims, then each table with the figure that illustrates it, captioned (what is drawn, what the bands
    are), and provenance last. ``figures=False`` draws none and shows those already in ``out/figures`` (the page
    alone, rendered again from the records)."""
    out = Path(out)
    if results is None:
        results = StudyResults.read(out / "results.json")
    if not results.runs:
        raise RunDirError(f"{out / 'results.json'} has no finished runs yet")
    drawn = _draw_figures(out, results) if figures else _figures_present(out)
    title, varied = report_header(results)
    body = _with_figures(
        claims_table(evaluate_claims(results))
        + study_tables(results)
        + training_table(results)
        + _attention_table(results),
        drawn,
    )
    tail = [
        "",
        "## Provenance",
        "",
        f"Versions: {versions_text(results)}.",
        "",
        "Every number above is in `results.json`; `posgeom report " + str(out) + "` rebuilds this page.",
    ]
    lines = report_intro(results, title) + varied + [""] + _contents(varied + body + tail) + body + tail
    md = "\n".join(lines) + "\n"
    (out / "report.md").write_text(md)
    _write_html(out, md)
    return out / "report.md"


def _draw_figures(out: Path, results: StudyResults) -> set[str]:
    """Draw every figure the results allow into ``out/figures``; the names of those drawn."""
    figs = out / "figures"
    figs.mkdir(exist_ok=True)
    fig_ssdc_depth(results, figs / "ssdc_depth.png")
    fig_fragility(results, figs / "fragility.png")
    drawn = {"ssdc_depth", "fragility"}
    for name, draw in (
        ("alpha_sweep", fig_alpha_sweep),
        ("training", fig_training),
        ("attention_heads", fig_attention_heads),
    ):
        if draw(results, figs / f"{name}.png"):
            drawn.add(name)
    if fig_similarity_maps(out, results, figs / "similarity_maps.png") or (figs / "similarity_maps.png").is_file():
        drawn.add("similarity_maps")  # drawn from the runs' maps.pt, which live outside git: a drawn one stays
    return drawn


def _figures_present(out: Path) -> set[str]:
    """The report's figures already drawn into ``out/figures``."""
    return {name for _, name, _, _ in _FIGURES if (out / "figures" / f"{name}.png").is_file()}


_SEEDS = "mean ± std over seeds (zero width with one seed)"
# (section heading, figure file, alt text, caption), in the order the figures are numbered
_FIGURES = (
    (
        "Accuracy and fragility",
        "fragility",
        "Fragility per shift",
        "Fragility score FS = 1 - A_shift / A_clean per shift and condition: bars the mean over seeds, error bars "
        "± std over seeds (none with one seed); the table gives the 95% intervals.",
    ),
    (
        "SSDC across depth",
        "ssdc_depth",
        "SSDC across depth",
        f"SSDC of the mean similarity map per layer, without RPI (left) and under RPI against the index grid "
        f"(right): lines the mean over seeds, bands {_SEEDS}; dotted, the same models untrained.",
    ),
    (
        "SSDC across depth",
        "similarity_maps",
        "Similarity maps",
        "Mean token-similarity maps of each condition's first seed, layers 0 and 1, without and under "
        "RPI (token slot order, row-major). The diagonal (each token with itself) is masked; each row "
        "has its own colour scale and colour bar.",
    ),
    (
        "Alpha sweep",
        "alpha_sweep",
        "Alpha sweep",
        f"Delta SSDC under RPI (left) and JPEG q5 FS (right) against the PE scale alpha (increasing to the "
        f"right, as in the tables): lines the mean over seeds, bands {_SEEDS}; with one seed the FS band is "
        f"the paired-bootstrap 95% interval over images.",
    ),
    (
        "During training",
        "training",
        "SSDC under RPI during training",
        f"SSDC under RPI per layer (colour: depth) and validation top-1 (dashed) across training, from "
        f"the training log: lines the mean over seeds, bands {_SEEDS}; dotted line: the 'substantial' "
        f"threshold {SUBSTANTIAL}.",
    ),
    (
        "Attention per head",
        "attention_heads",
        "Mean attention distance per head",
        "Mean attention distance (patch units) of each head at the measured layers, one panel per condition: "
        "filled dots without RPI, open circles under RPI (distances on the index grid), every seed's heads; "
        "lines the mean over heads and seeds. Dotted: uniform attention over the grid.",
    ),
)


def _with_figures(body: list[str], drawn: set[str]) -> list[str]:
    """``body`` with each drawn figure, numbered and captioned, at the end of the section it illustrates."""
    n = 0
    for heading, name, alt, caption in _FIGURES:
        if name in drawn:
            n += 1
            body = _place(body, heading, _figure(n, f"{name}.png", alt, caption))
    return body


_CSS = """
body { font-family: -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif; max-width: 1180px;
       margin: 2em auto; padding: 0 1.5em; color: #1d1d1f; line-height: 1.5; }
h1 { font-size: 1.7em; border-bottom: 2px solid #1f77b4; padding-bottom: .3em; }
h2 { font-size: 1.3em; margin-top: 2em; color: #1f4e79; }
table { border-collapse: collapse; margin: 1em 0; font-size: .88em; width: 100%; }
th { background: #1f4e79; color: white; text-align: left; }
th, td { padding: .45em .7em; border: 1px solid #d0d7de; vertical-align: top; }
tr:nth-child(even) td { background: #f6f8fa; }
td strong { color: #b31d28; }
code { background: #f0f2f4; padding: .1em .3em; border-radius: 3px; font-size: .92em; }
img { max-width: 100%; border: 1px solid #e1e4e8; margin: .5em 0; }
p > em:only-child { color: #57606a; font-size: .9em; }
.verdict-yes { color: #1a7f37; font-weight: 600; }
.verdict-undecided { color: #9a6700; }
"""


def render_html(md: str, figures: Path) -> str:
    """A page from the report's markdown: rendered with Python-Markdown (tables), styled, the claims' verdicts
    coloured, the headings given the anchors the contents link to, the title taken from the report's first
    heading. Its figures are linked (``figures/*.png`` beside it, as in report.md), not embedded: a copy of the
    PNGs inside every report doubled what a study keeps (``figures`` is where they are; unused)."""
    import html
    import re

    import markdown
    from markdown.extensions.toc import TocExtension

    toc = TocExtension(slugify=lambda value, separator: heading_slug(value))  # the anchors report.md links to
    body = markdown.markdown(md, extensions=["tables", "sane_lists", toc], output_format="html")
    title = next((line[2:].strip() for line in md.splitlines() if line.startswith("# ")), "timm-posgeom report")
    title = html.escape(title.replace("`", ""))

    body = re.sub(r'<h1 id="[^"]*">', "<h1>", body)  # the contents link to sections (h2) only
    body = re.sub(r'(<img [^>]*src="(figures/[^"]+\.png)"[^>]*>)', r'<a href="\2">\1</a>', body)  # click: full size
    body = re.sub(r"<td>yes</td>", '<td class="verdict-yes">yes</td>', body)
    body = re.sub(r"<td>(undecided: [^<]*)</td>", r'<td class="verdict-undecided">\1</td>', body)
    return (
        f"<!doctype html>\n<html lang='en'><head><meta charset='utf-8'><title>{title}</title>"
        f"<style>{_CSS}</style></head>\n<body>\n{body}\n</body></html>\n"
    )


def _write_html(out: Path, md: str) -> None:
    """``report.html``: :func:`render_html` of the report next to its figures."""
    (out / "report.html").write_text(render_html(md, out / "figures"))
