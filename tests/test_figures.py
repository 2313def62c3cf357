"""Every figure the package draws, rendered from small hand-built results: titles inside the canvas,
maps with colour bars, bands and error bars that say what they are, alpha increasing left to right."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("matplotlib")

# pytest-xdist (CI): the whole module on one worker, so that the study figures of its module fixture are made once
pytestmark = pytest.mark.xdist_group("figures")

LONG = "local-dir:" + "/".join(["experiments", "scaling", "8x8-paper-with-a-long-name", "runs", "ape_s0", "export"] * 2)


# --------------------------------------------------------------------------------------------
# checks
# --------------------------------------------------------------------------------------------
def _drawn(fig: Any) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    if not hasattr(fig.canvas, "get_renderer"):
        FigureCanvasAgg(fig)
    fig.canvas.draw()
    return fig.canvas.get_renderer()


def _titles(fig: Any) -> list[Any]:
    texts = [fig._suptitle] if getattr(fig, "_suptitle", None) is not None else []
    for ax in fig.axes:
        texts += [ax.title, ax._left_title, ax._right_title]
    return [t for t in texts if t.get_text()]


def assert_titles_fit(fig: Any) -> None:
    """Every title's drawn extent lies inside the figure's canvas."""
    renderer = _drawn(fig)
    canvas = fig.bbox
    titles = _titles(fig)
    assert titles, "the figure has no title"
    for t in titles:
        box = t.get_window_extent(renderer)
        assert box.x0 >= canvas.x0 - 0.5 and box.x1 <= canvas.x1 + 0.5, (t.get_text(), box, canvas)
        assert box.y0 >= canvas.y0 - 0.5 and box.y1 <= canvas.y1 + 0.5, (t.get_text(), box, canvas)


def assert_texts_inside(ax: Any, texts: list[Any]) -> None:
    """Each text's drawn extent lies inside the axes."""
    renderer = _drawn(ax.figure)
    frame = ax.get_window_extent(renderer)
    for t in texts:
        box = t.get_window_extent(renderer)
        assert frame.x0 - 0.5 <= box.x0 and box.x1 <= frame.x1 + 0.5, (t.get_text(), box, frame)
        assert frame.y0 - 0.5 <= box.y0 and box.y1 <= frame.y1 + 0.5, (t.get_text(), box, frame)


def image_axes(fig: Any) -> list[Any]:
    """The axes that show an image (a map), colour bars left out."""
    return [ax for ax in fig.axes if ax.get_images() and not _is_colorbar(ax)]


def _is_colorbar(ax: Any) -> bool:
    return getattr(ax, "_colorbar", None) is not None or ax.get_label() == "<colorbar>"


def colorbars(fig: Any) -> list[Any]:
    return [ax for ax in fig.axes if _is_colorbar(ax)]


def legend_labels(fig: Any) -> list[str]:
    labels = []
    for leg in [*fig.legends, *(ax.get_legend() for ax in fig.axes)]:
        if leg is not None:
            labels += [t.get_text() for t in leg.get_texts()]
            if leg.get_title().get_text():
                labels.append(leg.get_title().get_text())
    return labels


def bands(ax: Any) -> list[Any]:
    """The filled bands (fill_between) of an axes: PolyCollections (matplotlib 3.10's FillBetweenPolyCollection
    is one; older versions return a plain PolyCollection)."""
    from matplotlib.collections import PolyCollection

    return [c for c in ax.collections if isinstance(c, PolyCollection)]


def assert_bands_labelled(fig: Any) -> None:
    """Every band is in a legend under a label that says what it is (an interval, a std...)."""
    found = 0
    for ax in fig.axes:
        for band in bands(ax):
            label = band.get_label()
            assert label and not label.startswith("_"), f"an unlabelled band on {ax.get_title()!r}"
            assert any(w in label for w in ("interval", "std", "±")), label
            found += 1
    assert found, "no band drawn"


# --------------------------------------------------------------------------------------------
# the library's figures: probe (ssdc.png), fragility (fragility.png), sweep (sweep.png)
# --------------------------------------------------------------------------------------------
def _ssdc_result(rpi: bool = False) -> Any:
    import torch

    from timm_posgeom.probes.ssdc_probe.result import PerImageStats, SSDCResult

    per_layer = [0.62, 0.55, 0.41, 0.30]
    per_image = [PerImageStats(m - 0.15, 0.2, m - 0.19, m - 0.11, 100) for m in per_layer]
    maps = torch.rand(4, 16, 16)
    return SSDCResult(
        per_layer=per_layer,
        layers=[0, 1, 2, 3],
        per_image=per_image,
        content_per_layer=[0.1, 0.05, 0.0, 0.0] if rpi else None,
        mean_maps=maps,
        metadata={"model": LONG, "site": "attn_input", "rpi": rpi},
    )


@pytest.mark.parametrize("rpi", [False, True])
def test_probe_figure(tmp_path: Path, rpi: bool) -> None:
    result = _ssdc_result(rpi)
    fig = result.plot(tmp_path / "ssdc.png")
    assert (tmp_path / "ssdc.png").stat().st_size > 0
    assert_titles_fit(fig)
    # every map has its colour bar and a masked (blank) diagonal
    maps = image_axes(fig)
    assert len(maps) == 4 and len(colorbars(fig)) == len(maps)
    for ax in maps:
        assert (
            np.isnan(np.diag(np.asarray(ax.get_images()[0].get_array(), dtype=float).copy())).all()
            or np.ma.getmaskarray(ax.get_images()[0].get_array()).diagonal().all()
        )
    assert_bands_labelled(fig)
    depth = fig.axes[0]
    lines = {line.get_label(): line for line in depth.get_lines()}
    # the band is the per-image mean's 95% interval and it holds the per-image mean drawn with it
    mean_line = next(v for k, v in lines.items() if k.startswith("per-image SSDC, mean"))
    band = bands(depth)[0]
    y = np.asarray(mean_line.get_ydata(), dtype=float)
    verts = band.get_paths()[0].vertices
    assert verts[:, 1].min() <= y.min() and y.max() <= verts[:, 1].max()
    assert any(k.startswith("SSDC of the mean map") for k in lines)


def test_a_map_larger_than_a_panel_is_drawn_as_its_block_means() -> None:
    """A 3,136-token map (swin's first stage) is drawn as the means of its 5 x 5 blocks, the diagonal left
    out; a map within MAP_PIXELS is drawn as it is."""
    from matplotlib.figure import Figure

    from timm_posgeom.results.plotting import MAP_PIXELS, show_map

    rng = np.random.default_rng(0)
    n = 3136
    m = rng.random((n, n), dtype=np.float32)
    ax = Figure().subplots()
    shown = np.asarray(show_map(ax, torch.from_numpy(m), colorbar=False).get_array(), dtype=float)
    f = -(-n // MAP_PIXELS)
    assert f == 5 and shown.shape == (628, 628)  # 3,140 padded rows in 628 blocks of 5
    ref = m.astype(float)
    np.fill_diagonal(ref, np.nan)
    for i, j in [(0, 0), (0, 1), (3, 100), (627, 3)]:  # blocks on and off the diagonal, and padded
        block = ref[i * f : (i + 1) * f, j * f : (j + 1) * f]
        assert shown[i, j] == pytest.approx(np.nanmean(block), abs=1e-12)
    assert np.isnan(shown[627, 627])  # the padded corner holds the last diagonal entry alone: blank
    small = rng.random((MAP_PIXELS, MAP_PIXELS))
    drawn = np.asarray(show_map(Figure().subplots(), small, colorbar=False).get_array(), dtype=float)
    np.fill_diagonal(small, np.nan)
    np.testing.assert_array_equal(drawn, small)


def _fragility() -> Any:
    from timm_posgeom.robustness import FragilityResult

    rng = np.random.default_rng(0)
    clean = rng.random(200) < 0.7
    correct = {"clean": clean, "jpeg:5": clean & (rng.random(200) < 0.8), "blur:2.5:5": clean & (rng.random(200) < 0.9)}
    return FragilityResult.from_correct(correct, settings={"model": LONG})


def test_fragility_figure(tmp_path: Path) -> None:
    fig = _fragility().plot(tmp_path / "fragility.png")
    assert_titles_fit(fig)
    labels = legend_labels(fig)
    assert any("Wilson 95% interval" in x for x in labels) and any("bootstrap 95%" in x for x in labels)


def _sweep(alphas: tuple[float, ...] = (1.0, 0.5, 0.0)) -> Any:
    from timm_posgeom.robustness import AlphaSweepResult, AlphaSweepRow

    rows = []
    for a in alphas:
        frag = _fragility()
        frag.fs_interval = {s: (0.10, 0.50) for s in frag.shifts}
        rows.append(
            AlphaSweepRow(
                alpha=a,
                delta_ssdc=0.2 * a,
                ssdc_per_layer=[0.3 * a, 0.5 * a],
                clean_accuracy=frag.clean_accuracy,
                accuracy=frag.accuracy,
                fs={s: 0.3 + 0.1 * a + 0.05 * i for i, s in enumerate(frag.shifts)},
                fragility=frag,
            )
        )
    return AlphaSweepResult(rows=rows, shifts=list(rows[0].fs), settings={"model": LONG})


def test_sweep_figure(tmp_path: Path) -> None:
    fig = _sweep().plot(tmp_path / "sweep.png")
    assert_titles_fit(fig)
    assert_bands_labelled(fig)
    # no twin axes: every axes has its own x position; FS's axis holds its whole interval
    positions = [tuple(np.round(ax.get_position().bounds, 4)) for ax in fig.axes]
    assert len(set(positions)) == len(positions)
    fs_ax = next(ax for ax in fig.axes if "fragility" in ax.get_ylabel())
    lo, hi = fs_ax.get_ylim()
    assert lo <= 0.10 and hi >= 0.50
    for ax in fig.axes:  # alpha increases left to right
        left, right = ax.get_xlim()
        assert left < right
    # and so does the table written next to the figure (sweep.md)
    alphas = [float(line.split("|")[1]) for line in _sweep().to_markdown().splitlines()[2:]]
    assert alphas == sorted(alphas) == [0.0, 0.5, 1.0]


# --------------------------------------------------------------------------------------------
# the zoo's figures
# --------------------------------------------------------------------------------------------
def _zoo_records() -> list[Any]:
    from timm_posgeom.app.records import ZooModel

    # points at the corners of the data range, with long names: the labels must still stay inside
    corners = [(-0.05, 0.02), (0.30, 0.02), (-0.05, 0.60), (0.30, 0.60), (0.12, 0.31)]
    return [
        ZooModel(
            model=f"{LONG}_{i}",
            status="ok",
            settings={},
            versions={},
            elapsed_s=1.0,
            measured_at="now",
            ssdc=[0.5, 0.4, 0.3],
            rpi_ssdc=[0.1, 0.1 + d, 0.2],
            rpi_delta_ssdc=d,
            clean_accuracy=0.7,
            fs={"jpeg:5": fs},
            fs_interval={"jpeg:5": [fs - 0.05, fs + 0.08]},
        )
        for i, (d, fs) in enumerate(corners)
    ]


def _kept(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Keep the Figure the zoo saves (``seen["fig"]``) while still writing the PNG."""
    from timm_posgeom.app.zoo import figures as zoo

    seen: dict[str, Any] = {}
    original = zoo._save

    def save(fig: Any, path: Path) -> None:
        seen["fig"] = fig
        original(fig, path)

    monkeypatch.setattr(zoo, "_save", save)
    return seen


def test_zoo_fragility_scatter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from matplotlib.text import Annotation

    from timm_posgeom.app.zoo import figures as zoo

    records = _zoo_records()
    fig = _kept(monkeypatch)
    left_out = zoo.fig_fragility_delta(records, tmp_path / "scatter.png")
    fig = fig["fig"]
    assert left_out == [] and (tmp_path / "scatter.png").stat().st_size > 0
    assert_titles_fit(fig)
    ax = fig.axes[0]
    labels = [t for t in ax.texts if isinstance(t, Annotation)]
    assert len(labels) == len(records)
    assert_texts_inside(ax, labels)
    # one vertical error bar per point, and the legend says what it is
    bars = [c for c in ax.containers if getattr(c, "has_yerr", False)]
    assert len(bars) == len(records)
    assert any("95% interval" in x for x in legend_labels(fig))


def test_zoo_depth_figure_and_top1_fraction(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from timm_posgeom.app import zoo

    records = _zoo_records()
    seen = _kept(monkeypatch)
    zoo.fig_ssdc_depth(records, tmp_path / "depth.png")
    assert_titles_fit(seen["fig"])
    config = zoo.ZooConfig(data="synthetic", shifts=("jpeg:5",))
    row = zoo.csv_rows(records, config)[0]
    assert float(row["top1"]) == pytest.approx(0.7)  # a fraction, as FS and SSDC
    table = zoo.zoo_markdown(records, config)
    assert "top-1 %" not in table and "| 0.700 |" in table


# --------------------------------------------------------------------------------------------
# the study's report: its figures, header, contents, captions
# --------------------------------------------------------------------------------------------
CONDITIONS = ("nope", "ape", "rope")


def _study(tmp_path: Path, seeds: int = 2) -> Path:
    """A small hand-built study folder: results.json for 3 conditions x ``seeds`` seeds, maps.pt for the
    first seed of each; the models are the package's micro ViTs, narrowed by an override."""
    import torch

    from timm_posgeom.app.records import (
        HistoryPoint,
        RunEval,
        RunSummary,
        SSDCSummary,
        StudyResults,
        StudyRun,
        SweepSummary,
    )

    rng = np.random.default_rng(0)
    alphas = [1.0, 0.5, 0.0]
    runs = []
    for c in CONDITIONS:
        for seed in range(seeds):

            def layers(base: float) -> list[float]:
                return [float(base + 0.05 * k + 0.01 * rng.random()) for k in range(4)]

            ssdc = SSDCSummary(
                n_images=16,
                per_layer=layers(0.5),
                rise=0.01,
                rpi_per_layer=layers(0.1),
                rpi_delta=0.05,
                rpi_content_per_layer=layers(0.5),
            )
            sweep = None
            if c != "nope":
                sweep = SweepSummary(
                    alphas=alphas,
                    delta_ssdc=[0.1 * a + 0.01 * seed for a in alphas],
                    fs={"jpeg:5": [0.3 - 0.05 * a for a in alphas]},
                    clean_accuracy=[0.6] * 3,
                    rpi_per_layer=[layers(0.1) for _ in alphas],
                    fs_interval={"jpeg:5": [[0.1, 0.5] for _ in alphas]},
                )
            run_dir = f"runs/{c}_s{seed}"
            if seed == 0:
                (tmp_path / run_dir).mkdir(parents=True)
                maps = {"normal": torch.rand(2, 16, 16), "rpi": torch.rand(2, 16, 16)}
                torch.save(maps, tmp_path / run_dir / "maps.pt")
            runs.append(
                StudyRun(
                    condition=c,
                    seed=seed,
                    run_dir=run_dir,
                    train=RunSummary(
                        model=f"posgeom_vit_micro_patch8_64_{c}",
                        steps=10,
                        epochs=2,
                        train_images=100,
                        val_images=50,
                        processes=1,
                        time_s=1.0,
                        val_top1=0.6,
                    ),
                    eval=RunEval(
                        clean_accuracy=0.6 + 0.01 * seed,
                        accuracy={"jpeg:5": 0.45, "blur:2.5:5": 0.5},
                        fs={"jpeg:5": 0.25 + 0.01 * seed, "blur:2.5:5": 0.17},
                        num_images=50,
                        ssdc=ssdc,
                        fs_interval={"jpeg:5": [0.2, 0.3], "blur:2.5:5": [0.1, 0.2]},
                        alpha_sweep=sweep,
                    ),
                    history=[
                        HistoryPoint(step=s, epoch=float(s), val_top1=0.1 * s, rpi_ssdc=layers(0.02 * s))
                        for s in (1, 2)
                    ],
                    untrained=ssdc,
                )
            )
    recipes = {
        c: {
            "model": f"posgeom_vit_micro_patch8_64_{c}",
            "img_size": 64,
            "epochs": 2,
            "batch_size": 32,
            "model_kwargs": {"init": "paper", "embed_dim": 64, "num_heads": 2},
        }
        for c in CONDITIONS
    }
    config = {
        "preset": "demo",
        "recipe_prefix": "demo",
        "seeds": seeds,
        "conditions": list(CONDITIONS),
        "train_overrides": ["model_kwargs.embed_dim=64", "model_kwargs.num_heads=2"],
        "init": "paper",
        "probe_images": 16,
        "alphas": alphas,
        "shifts": ["jpeg:5", "blur:2.5:5"],
    }
    eval_data = {
        "source": "synthetic",
        "split": "validation",
        "images": 50,
        "classes": 10,
        "identity": {"labels": "0123456789abcdef", "pixels": "fedcba9876543210"},
    }
    StudyResults(
        config=config,
        plan=[],
        versions={"timm_posgeom": "0"},
        runs=runs,
        recipes=recipes,
        eval_data=eval_data,
        elapsed_s=3.0,
        complete=True,
    ).write(tmp_path / "results.json")
    return tmp_path


def _attention(seed: int) -> Any:
    """An AttentionSummary at layers 0 and 3 of a 2-head model on an 8 x 8 grid, under RPI too."""
    from timm_posgeom.app.records import AttentionSummary

    heads = [[1.0 + 0.1 * seed, 2.0], [3.0, 3.5 + 0.1 * seed]]
    return AttentionSummary(
        n_images=16,
        layers=[0, 3],
        grid=[8, 8],
        mean_distance=heads,
        entropy=heads,
        ssdc=[[0.5, None], [0.2, 0.1]],
        rpi_mean_distance=[[4.0, 4.1], [4.0, 4.2]],
        rpi_entropy=heads,
        rpi_ssdc=heads,
    )


@pytest.fixture(scope="module")
def study_figures(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Each study figure drawn from the hand-built study, kept open (savefig recorded, close skipped)."""
    from timm_posgeom.app.records import StudyResults
    from timm_posgeom.app.report import figures as report

    out = _study(tmp_path_factory.mktemp("study"))
    results = StudyResults.read(out / "results.json")
    kept: dict[str, Any] = {}
    mp = pytest.MonkeyPatch()
    plt = report._plt()
    mp.setattr(plt, "close", lambda fig=None: None)
    try:
        for name, draw in (
            ("ssdc_depth", report.fig_ssdc_depth),
            ("fragility", report.fig_fragility),
            ("alpha_sweep", report.fig_alpha_sweep),
            ("training", report.fig_training),
        ):
            draw(results, out / f"{name}.png")
            kept[name] = plt.gcf()
        report.fig_similarity_maps(out, results, out / "similarity_maps.png")
        kept["similarity_maps"] = plt.gcf()
        for run in results.runs:  # attention per head at 2 of the 4 layers, 2 heads
            run.eval.attention = _attention(run.seed)
        assert report.fig_attention_heads(results, out / "attention_heads.png")
        kept["attention_heads"] = plt.gcf()
    finally:
        mp.undo()
    assert len({id(f) for f in kept.values()}) == len(kept)
    yield kept
    for fig in kept.values():
        plt.close(fig)


@pytest.mark.parametrize(
    "name", ["ssdc_depth", "fragility", "alpha_sweep", "training", "similarity_maps", "attention_heads"]
)
def test_study_figure_titles_fit(study_figures: dict[str, Any], name: str) -> None:
    assert_titles_fit(study_figures[name])


@pytest.mark.parametrize("name", ["ssdc_depth", "alpha_sweep", "training"])
def test_study_figure_bands_are_named(study_figures: dict[str, Any], name: str) -> None:
    """Each band is named in a legend: ± std over seeds (or a 95% interval)."""
    fig = study_figures[name]
    assert any(bands(ax) for ax in fig.axes)
    assert any(("std over seeds" in x or "95% interval" in x) for x in legend_labels(fig)), legend_labels(fig)


def test_study_fragility_error_bars_are_named(study_figures: dict[str, Any]) -> None:
    assert any("error bars: ± std over seeds" in x for x in legend_labels(study_figures["fragility"]))


def test_study_alpha_sweep_no_twin_axes_alpha_upwards(study_figures: dict[str, Any]) -> None:
    fig = study_figures["alpha_sweep"]
    positions = [tuple(np.round(ax.get_position().bounds, 4)) for ax in fig.axes]
    assert len(fig.axes) == 2 and len(set(positions)) == 2  # two panels, not one panel with a twin
    for ax in fig.axes:
        left, right = ax.get_xlim()
        assert left < right
        for line in ax.get_lines():
            x = np.asarray(line.get_xdata(), dtype=float)
            assert x.size < 2 or (np.diff(x) > 0).all()


def test_study_attention_heads_one_panel_per_condition_heads_as_points(study_figures: dict[str, Any]) -> None:
    """Issue 33: the per-head figure: a panel per condition, every head of every seed a point at its layer,
    without RPI and under RPI, with the uniform-attention reference."""
    from timm_posgeom.app.report.figures import uniform_distance

    fig = study_figures["attention_heads"]
    assert len(fig.axes) == len(CONDITIONS)
    for ax in fig.axes:
        points = np.concatenate([c.get_offsets() for c in ax.collections])
        assert len(points) == 2 * 2 * 2 * 2  # (normal, RPI) x seeds x layers x heads
        assert {round(float(x)) for x in points[:, 0]} == {0, 3}
    labels = legend_labels(fig)
    assert "without RPI" in labels and "under RPI" in labels and "uniform attention" in labels
    for grid, documented in (((8, 8), 4.1), ((14, 14), 7.3), ((4, 6), None)):  # docs/attention.md: about 4.1, 7.3
        cells = [(r, c) for r in range(grid[0]) for c in range(grid[1])]  # every (query, key) pair, itself included
        mean = sum(math.dist(a, b) for a in cells for b in cells) / len(cells) ** 2
        assert uniform_distance(grid) == pytest.approx(mean, rel=1e-12), grid
        assert documented is None or round(mean, 1) == documented


def test_study_similarity_maps_masked_with_colour_bars(study_figures: dict[str, Any]) -> None:
    fig = study_figures["similarity_maps"]
    maps = image_axes(fig)
    assert len(maps) == 4 * len(CONDITIONS)
    assert len(colorbars(fig)) == len(CONDITIONS)  # one per condition (a row shares its colour scale)
    for ax in maps:
        img = np.asarray(ax.get_images()[0].get_array(), dtype=float)
        assert np.isnan(np.diag(img)).all() and not np.isnan(img[0, 1])


def test_report_header_contents_and_captions(tmp_path: Path) -> None:
    """The title and the header table say what the study varied; the contents link to every section with
    the anchors the HTML page gives them; each figure sits in the section of its table, captioned."""
    import re

    from timm_posgeom.app.report.document import heading_slug, write_report

    out = _study(tmp_path)
    md = write_report(out).read_text()
    lines = md.splitlines()
    assert lines[0] == "# PE geometry study: 8x8 grid, width 64, depth 4, paper init (preset `demo`)"
    varied = md.split("## What this study varied")[1].split("## Contents")[0]
    for needle in (
        "| preset | `demo`",
        "| initialisation | paper",
        "| width / depth / heads | 64 / 4 / 2 |",
        "| grid | 8 x 8 (64 px, patch 8) |",
        "`model_kwargs.embed_dim=64`",
        "| seeds | 2 per condition",
        "labels `0123456789abcdef`",
        "pixels `fedcba9876543210`",
    ):
        assert needle in varied, needle
    # contents: one link per section, each to an anchor the HTML page has
    sections = [line[3:] for line in lines if line.startswith("## ") and line != "## Contents"]
    links = re.findall(r"^- \[(.+)\]\(#([^)]+)\)$", md.split("## Contents")[1].split("\n## ")[0], re.M)
    assert [t for t, _ in links] == sections and all(a == heading_slug(t) for t, a in links)
    page = (out / "report.html").read_text()
    for _, anchor in links:
        assert f'id="{anchor}"' in page, anchor
    assert "<title>PE geometry study: 8x8 grid, width 64" in page

    # figures next to their tables, not gathered at the end, each with a numbered caption
    def section(title: str) -> str:
        return md.split("\n## " + title)[1].split("\n## ")[0]

    assert "figures/fragility.png" in section("Accuracy and fragility")
    assert "figures/ssdc_depth.png" in section("SSDC across depth") and "similarity_maps.png" in section(
        "SSDC across depth"
    )
    assert "figures/alpha_sweep.png" in section("Alpha sweep: JPEG")
    assert "figures/training.png" in section("During training")
    captions = re.findall(r"^\*Figure (\d)\. (.+)\*$", md, re.M)
    assert [int(n) for n, _ in captions] == [1, 2, 3, 4, 5]
    assert all(("std over seeds" in c or "colour bar" in c) for _, c in captions)
    assert "base64" not in page and page.count('<a href="figures/') == 5  # linked, not embedded
    # the sweep tables run alpha upwards, as the figure's axis
    rows = re.findall(r"^\| (\d(?:\.\d+)?) \|", section("Alpha sweep: delta SSDC"), re.M)
    assert [float(a) for a in rows] == [0.0, 0.5, 1.0]
