"""Small matplotlib helpers every figure of the package uses: titles that fit their canvas, similarity
maps drawn one way (diagonal masked, with a colour bar).

matplotlib is imported inside the functions (docs/architecture.md, rule 6).
"""

from __future__ import annotations

import io
import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import require
from .jsonio import write_atomic

__all__ = ["elide", "fit_titles", "masked_map", "block_mean", "show_map", "save_figure", "MAP_LABEL", "MAP_PIXELS"]

# What a similarity map's colour bar measures; the diagonal (a token with itself, always 1) is masked
# in every map so that it does not swamp the colour scale.
MAP_LABEL = "cosine similarity (diagonal masked)"
# A map panel is about 350 pixels wide (2.9 inches at 120 dpi): a map of more tokens than this is shown as the
# means of square blocks of it (diagonal left out), a few times the panel's pixels still. matplotlib resampled
# swin's 3,136-token map (9.8 M pixels) on every draw: 5.4 s of a 17-s probe command on 2 cores.
MAP_PIXELS = 768


def elide(text: str, width: int) -> str:
    """``text`` whole when it has at most ``width`` characters, else its head and tail around an ellipsis
    (a long ``local-dir:`` path keeps its scheme and its last folders)."""
    if len(text) <= width:
        return text
    width = max(width, 5)
    head = (width - 1) // 3
    tail = width - 1 - head
    return text[:head] + "\u2026" + text[len(text) - tail :]


def _renderer(fig: Any) -> Any:
    """The figure's renderer, attaching an Agg canvas to a bare ``Figure`` first."""
    if not hasattr(fig.canvas, "get_renderer"):
        FigureCanvasAgg = require("matplotlib.backends.backend_agg", "plotting").FigureCanvasAgg

        FigureCanvasAgg(fig)
    return fig.canvas.get_renderer()


def _titles(fig: Any) -> list[Any]:
    """Every non-empty title Text of ``fig``: the suptitle and each axes' centre, left and right titles."""
    texts = [fig._suptitle] if getattr(fig, "_suptitle", None) is not None else []
    for ax in fig.axes:
        texts += [ax.title, ax._left_title, ax._right_title]
    return [t for t in texts if t.get_text()]


def fit_titles(fig: Any, margin_px: float = 2.0, max_rounds: int = 12) -> None:
    """Shorten (:func:`elide`) every title of ``fig`` that does not fit inside the canvas once drawn.

    Call it last, just before saving: legends, colour bars and the layout engine move the axes. Each
    round draws the figure (without rendering pixels) and elides the titles that stick out, in proportion
    to how far they do.
    """
    for _ in range(max_rounds):
        renderer = _renderer(fig)
        fig.draw_without_rendering()
        width = fig.bbox.width
        changed = False
        for text in _titles(fig):
            box = text.get_window_extent(renderer)
            if box.x0 >= margin_px and box.x1 <= width - margin_px:
                continue
            s = text.get_text()
            lines = s.split("\n")
            longest = max(lines, key=len)
            keep = int(len(longest) * (width - 2 * margin_px) / max(box.width, 1.0) * 0.95)
            # centred on its axes: it must also fit on the side nearer the canvas' edge
            centre = (box.x0 + box.x1) / 2
            half = min(centre, width - centre) - margin_px
            keep = min(keep, int(len(longest) * 2 * max(half, 1.0) / max(box.width, 1.0) * 0.95))
            keep = min(keep, len(longest) - 1)
            text.set_text("\n".join(elide(line, keep) if line is longest else line for line in lines))
            changed = True
        if not changed:
            return


def masked_map(m: Any) -> np.ndarray:
    """A (N, N) similarity map as a float array with its diagonal set to NaN (drawn blank)."""
    img = np.array(m.numpy() if hasattr(m, "numpy") else m, dtype=float)
    np.fill_diagonal(img, np.nan)
    return img


def block_mean(img: np.ndarray, limit: int = MAP_PIXELS) -> np.ndarray:
    """``img`` (H, W) itself when both sides are at most ``limit``, else the NaN-ignoring means of its f x f
    blocks, f = ceil(max(H, W) / limit) (the last blocks padded with NaN): (ceil(H / f), ceil(W / f))."""
    f = -(-max(img.shape) // limit)
    if f <= 1:
        return img
    h, w = img.shape
    padded = np.full((-(-h // f) * f, -(-w // f) * f), np.nan)
    padded[:h, :w] = img
    blocks = padded.reshape(padded.shape[0] // f, f, padded.shape[1] // f, f)
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a block of NaN only (a padded corner): NaN, blank
        return np.nanmean(blocks, axis=(1, 3))


def show_map(
    ax: Any,
    m: Any,
    *,
    vmin: float | None = None,
    vmax: float | None = None,
    colorbar: bool = True,
    label: str = MAP_LABEL,
) -> Any:
    """Draw a similarity map on ``ax`` (diagonal masked, viridis; a map over ``MAP_PIXELS`` tokens as
    :func:`block_mean`) with a colour bar unless ``colorbar`` is False (a caller sharing one bar across panels);
    return the image."""
    img = block_mean(masked_map(m))
    im = ax.imshow(img, cmap="viridis", vmin=vmin, vmax=vmax)
    ax.set_xticks([])
    ax.set_yticks([])
    if colorbar:
        bar = ax.figure.colorbar(im, ax=ax, shrink=0.8)
        bar.set_label(label, fontsize=7)
        bar.ax.tick_params(labelsize=6)
    return im


def save_figure(fig: Any, path: str | os.PathLike, dpi: float) -> Path:
    """Save ``fig`` to ``path`` atomically (rendered in memory, then :func:`~timm_posgeom.results.jsonio.write_atomic`):
    a reader or a kill never meets a half-written figure. The format is the suffix's (``.png``, ``.pdf``,
    ...; none: png)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format=Path(path).suffix.lstrip(".").lower() or "png", dpi=dpi)
    return write_atomic(path, buffer.getvalue())
