"""Every figure the package draws, rendered from small hand-built results: titles inside the canvas,
maps with colour bars, bands and error bars that say what they are, alpha increasing left to right."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("matplotlib")

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
    """The filled bands (fill_between) of an axes."""
    from matplotlib.collections import FillBetweenPolyCollection, PolyCollection

    kinds = tuple(k for k in (FillBetweenPolyCollection, PolyCollection) if k is not None)
    return [c for c in ax.collections if isinstance(c, kinds)]


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

    from timm_posgeom.probes.result import PerImageStats, SSDCResult

    per_layer = [0.62, 0.55, 0.41, 0.30]
    per_image = [PerImageStats(m - 0.15, 0.2, m - 0.19, m - 0.11, 100) for m in per_layer]
    maps = torch.rand(4, 16, 16)
    return SSDCResult(per_layer=per_layer, layers=[0, 1, 2, 3], per_image=per_image,
                      content_per_layer=[0.1, 0.05, 0.0, 0.0] if rpi else None, mean_maps=maps,
                      metadata={"model": LONG, "site": "attn_input", "rpi": rpi})


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
        assert np.isnan(np.diag(np.asarray(ax.get_images()[0].get_array(), dtype=float).copy())).all() or \
            np.ma.getmaskarray(ax.get_images()[0].get_array()).diagonal().all()
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
        rows.append(AlphaSweepRow(alpha=a, delta_ssdc=0.2 * a, ssdc_per_layer=[0.3 * a, 0.5 * a],
                                  clean_accuracy=frag.clean_accuracy, accuracy=frag.accuracy,
                                  fs={s: 0.3 + 0.1 * a + 0.05 * i for i, s in enumerate(frag.shifts)}, fragility=frag))
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


# --------------------------------------------------------------------------------------------
# the zoo's figures
# --------------------------------------------------------------------------------------------
def _zoo_records() -> list[Any]:
    from timm_posgeom.app.records import ZooModel

    # points at the corners of the data range, with long names: the labels must still stay inside
    corners = [(-0.05, 0.02), (0.30, 0.02), (-0.05, 0.60), (0.30, 0.60), (0.12, 0.31)]
    return [ZooModel(model=f"{LONG}_{i}", status="ok", settings={}, versions={}, elapsed_s=1.0, measured_at="now",
                     ssdc=[0.5, 0.4, 0.3], rpi_ssdc=[0.1, 0.1 + d, 0.2], rpi_delta_ssdc=d, clean_accuracy=0.7,
                     fs={"jpeg:5": fs}, fs_interval={"jpeg:5": [fs - 0.05, fs + 0.08]})
            for i, (d, fs) in enumerate(corners)]


def _kept(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Keep the Figure the zoo saves (``seen["fig"]``) while still writing the PNG."""
    from timm_posgeom.app import zoo

    seen: dict[str, Any] = {}
    original = zoo._save

    def save(fig: Any, path: Path) -> None:
        seen["fig"] = fig
        original(fig, path)

    monkeypatch.setattr(zoo, "_save", save)
    return seen


def test_zoo_fragility_scatter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from matplotlib.text import Annotation

    from timm_posgeom.app import zoo

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
