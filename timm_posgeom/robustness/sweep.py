"""The alpha sweep: the PE scaled by each alpha (``pe_scale``), and per alpha delta SSDC under RPI
(:func:`~timm_posgeom.probes.probe_ssdc`) and the fragility of every shift (:func:`.fragility_eval.fragility`);
its result, :class:`AlphaSweepResult`, one :class:`AlphaSweepRow` per alpha. Definitions:
docs/method.md#fragility-score-and-shifts.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn as nn

from ..data.eval_data import check_split, eval_loader, first_items
from ..data.labels import match_labels
from ..data.shifts import Shift, parse_shift
from ..defaults import DEFAULT_ALPHAS, probe_count, rpi_count
from ..errors import SettingError, require
from ..interventions import pe_scale
from ..measuring import distributed as _dist
from ..measuring.settings import MeasureSettings
from ..probes.ssdc_probe.result import SSDCResult
from ..probes.streaming import model_name, same_passes
from ..results.jsonio import dump_json, tagged, to_jsonable
from .fragility_eval import device_of, fragility
from .scores import FragilityResult

__all__ = ["alpha_sweep", "sweep_ssdc", "AlphaSweepResult", "AlphaSweepRow"]


@dataclass
class AlphaSweepRow:
    """One alpha: delta SSDC and per-layer SSDC under RPI (means over the RPI permutations, with their 95%
    intervals over them), clean accuracy, accuracy and FS per shift (intervals in ``fragility``)."""

    alpha: float
    delta_ssdc: float
    ssdc_per_layer: list[float]
    clean_accuracy: float
    accuracy: dict[str, float]
    fs: dict[str, float]
    fragility: FragilityResult = field(repr=False)
    ssdc: Any = field(default=None, repr=False)
    delta_ssdc_ci: tuple[float, float] = (math.nan, math.nan)
    ssdc_per_layer_ci: list[tuple[float, float]] | None = None
    permutation_seeds: list[int] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "alpha": self.alpha,
            "delta_ssdc": self.delta_ssdc,
            "delta_ssdc_ci": list(self.delta_ssdc_ci),
            "ssdc_per_layer": list(self.ssdc_per_layer),
            "ssdc_per_layer_ci": [list(c) for c in self.ssdc_per_layer_ci] if self.ssdc_per_layer_ci else None,
            "ssdc_by_permutation": self.ssdc.by_permutation if self.ssdc is not None else None,
            "permutation_seeds": self.permutation_seeds,
            "clean_accuracy": self.clean_accuracy,
            "clean_accuracy_ci": list(self.fragility.clean_interval),
            "accuracy": dict(self.accuracy),
            "fs": dict(self.fs),
            "fragility": self.fragility.to_dict(),
        }


@dataclass
class AlphaSweepResult:
    """Per alpha (in the order given): delta SSDC under RPI, per-layer SSDC, FS per shift, clean accuracy."""

    rows: list[AlphaSweepRow]
    shifts: list[str]
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def alphas(self) -> list[float]:
        return [r.alpha for r in self.rows]

    @property
    def delta_ssdc(self) -> list[float]:
        return [r.delta_ssdc for r in self.rows]

    @property
    def fs(self) -> dict[str, list[float]]:
        """shift -> FS per alpha."""
        return {s: [r.fs[s] for r in self.rows] for s in self.shifts}

    def to_dict(self) -> dict[str, Any]:
        return {
            "shifts": list(self.shifts),
            "rows": [r.to_dict() for r in self.rows],
            "settings": to_jsonable(self.settings),
        }

    def to_json(self, path: str | os.PathLike | None = None, indent: int = 2) -> str:
        """The :meth:`to_dict` numbers as strict JSON (NaN written as null); also written to ``path`` if given (atomically)."""
        return dump_json(tagged("alpha-sweep-result", self.to_dict()), path, indent)

    def to_markdown(self, digits: int = 3) -> str:
        """A markdown table: alpha (increasing, as on the figure's axis), delta SSDC under RPI with its 95%
        interval over the RPI permutations, clean top-1 and FS per shift each with its 95% interval (Wilson;
        paired bootstrap), per-layer SSDC under RPI (means over the permutations)."""
        head = [
            "alpha",
            "delta SSDC (RPI)",
            "delta SSDC (RPI) 95% CI",
            "clean top-1",
            "clean top-1 95% CI",
            *(c for s in self.shifts for c in (f"FS {s}", f"FS {s} 95% CI")),
            "SSDC per layer (RPI)",
        ]
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

        def ci(pair: Any) -> str:
            low, high = pair
            return f"[{low:.{digits}f}, {high:.{digits}f}]"

        for r in sorted(self.rows, key=lambda r: r.alpha):
            cells = [
                f"{r.alpha:g}",
                f"{r.delta_ssdc:.{digits}f}",
                ci(r.delta_ssdc_ci),
                f"{r.clean_accuracy:.{digits}f}",
                ci(r.fragility.clean_interval),
                *(c for s in self.shifts for c in (f"{r.fs[s]:.{digits}f}", ci(r.fragility.fs_interval[s]))),
                ", ".join(f"{v:.{digits}f}" for v in r.ssdc_per_layer),
            ]
            lines.append("| " + " | ".join(cells) + " |")
        return "\n".join(lines)

    def plot(self, path: str | os.PathLike | None = None) -> Any:
        """Against alpha (increasing left to right), two panels sharing the x axis: delta SSDC under RPI
        (top) and FS per shift with its paired-bootstrap 95% interval as a band (bottom); no twin axes.
        Returns the matplotlib Figure; also saved to ``path`` if given."""
        Figure = require("matplotlib.figure", "plotting").Figure

        from ..results.plotting import fit_titles, save_figure

        fig = Figure(figsize=(5.4, 5.4), layout="constrained")
        top, bottom = fig.subplots(2, 1, sharex=True)
        order = np.argsort(self.alphas)
        alphas = np.asarray(self.alphas, dtype=float)[order]
        top.plot(
            alphas,
            np.asarray(self.delta_ssdc, dtype=float)[order],
            "o-",
            color="k",
            label=f"delta SSDC under RPI (mean over {self.settings.get('rpi_permutations', '?')} permutations)",
        )
        cis = np.asarray([self.rows[k].delta_ssdc_ci for k in order], dtype=float)
        if np.isfinite(cis).any():
            top.fill_between(
                alphas,
                cis[:, 0],
                cis[:, 1],
                color="k",
                alpha=0.15,
                lw=0,
                label="its 95% interval over the permutations",
            )
        top.axhline(0, color="0.6", lw=0.5)
        top.set_ylabel("delta SSDC under RPI")
        top.legend(fontsize=7)
        for i, s in enumerate(self.shifts):
            bottom.plot(alphas, np.asarray(self.fs[s], dtype=float)[order], "s-", color=f"C{i}", ms=4, label=f"FS {s}")
            rows = [self.rows[k] for k in order]
            ci = [getattr(r.fragility, "fs_interval", {}).get(s, (math.nan, math.nan)) for r in rows]
            if not all(math.isnan(lo) for lo, _ in ci):
                bottom.fill_between(
                    alphas,
                    [lo for lo, _ in ci],
                    [hi for _, hi in ci],
                    color=f"C{i}",
                    alpha=0.2,
                    lw=0,
                    label=f"FS {s}: paired bootstrap 95% interval",
                )
        bottom.axhline(0, color="0.6", lw=0.5)
        bottom.set_xlabel("alpha (PE scale)")
        bottom.set_ylabel("fragility score FS")
        bottom.legend(fontsize=7)
        top.set_title(str(self.settings.get("model") or ""), fontsize=9)
        fit_titles(fig)
        if path is not None:
            save_figure(fig, path, dpi=150)
        return fig


def alpha_sweep(
    model: nn.Module,
    data: Any,
    alphas: Sequence[float] = DEFAULT_ALPHAS,
    shifts: Sequence[str | Shift] = ("jpeg:5",),
    *,
    site: str = "auto",
    include_prefix: bool = True,
    labels: str = "check",
    settings: MeasureSettings | None = None,
    **options: Any,
) -> AlphaSweepResult:
    """Scale the PE by each alpha and measure delta SSDC under RPI and the fragility of each shift.

    Per alpha, inside ``pe_scale(model, alpha, include_prefix)`` (APE table incl. the class row as in
    the paper, sincos, RoPE angles; any timm ViT ``pe_scale`` supports):

    * SSDC per layer under RPI at ``site`` on the first ``probe_images`` clean images of
      ``probe_data`` (default: ``data``), via :func:`~timm_posgeom.probes.probe_ssdc`: the mean over
      ``rpi_permutations`` (default 10) permutations drawn afresh for each alpha, as the paper draws them
      (alpha j, in the order given, takes the seeds ``seed + jK`` .. ``seed + jK + K - 1``), with its 95%
      interval over them; delta SSDC = SSDC(layer 1) - SSDC(layer 0), its interval likewise;
    * :func:`fragility` of every shift on the first ``max_images`` images of ``data`` (default all; no
      RPI), with the same loader settings.

    ``settings`` (a :class:`~timm_posgeom.measuring.MeasureSettings`, or its fields as keywords, which
    override it) is passed to both: ``resize``, ``batch_size``, ``num_workers``, ``seed``, ``max_images``,
    ``device``, ``progress``, ``img_size``, ``distributed`` (``auto`` / ``off``). The keywords
    ``probe_images`` (int), ``probe_data`` (a split) and ``components`` are this function's own:
    ``components`` (PE component names, e.g. ``["rope"]``: :attr:`~timm_posgeom.interventions.PEEntry.component`)
    sweeps alpha on those encodings alone, ``pe_scale(model, {component: alpha})``, the others kept as they are
    (a model with several: eva02's APE and RoPE, qwen3_vit, gemma4_vit); None (default): every encoding.

    ``max_images`` bounds all the work: the probe too uses at most that many images unless
    ``probe_images`` says otherwise (default: 1,000, the paper's count, or ``max_images`` if fewer;
    :func:`~timm_posgeom.protocol.probe_count`). ``labels`` is checked (or mapped) once, as in
    :func:`fragility`.

    alpha = 1 reproduces the unscaled model exactly. ``img_size`` sets the input size of both (see
    :func:`fragility`). Launched as several processes, each alpha's probe and evaluation are shared by
    batch and reduced, every process returns the single-process result, and only the main process
    shows progress. Returns an :class:`AlphaSweepResult`.
    """
    settings, own = MeasureSettings.resolve(
        "alpha_sweep", settings, options, {"probe_images": None, "probe_data": None, "components": None}
    )
    site, alphas = _check_sweep(model, site, alphas, settings)
    components = own["components"]
    with pe_scale(model, _spec(1.0, components), include_prefix=include_prefix):  # a component the model lacks:
        pass  # refused here, before any data is read
    n_probe, probe_loader, data = _sweep_data(model, data, own, labels, settings)
    if isinstance(shifts, (str, Shift)):
        shifts = (shifts,)
    dev = device_of(model, settings.device)
    quiet = settings.replace(device=dev, progress=False)
    world = _dist.setup() if settings.distributed == "auto" else 1
    show = settings.progress and (world == 1 or _dist.is_main())
    ssdcs = sweep_ssdc(
        model,
        probe_loader,
        alphas,
        site=site,
        include_prefix=include_prefix,
        settings=quiet.replace(max_images=n_probe),
        progress=show,
        components=components,
    )
    probed = [(alpha, _spec(alpha, components), ssdc) for alpha, ssdc in zip(alphas, ssdcs)]
    rows = _fragility_rows(model, data, shifts, probed, quiet, include_prefix, show)
    k, seed = ssdcs[0].settings["rpi_permutations"], ssdcs[0].settings["seed"]
    recorded = {
        "model": model_name(model),
        "site": site,
        "probe_images": n_probe,
        "include_prefix": include_prefix,
        "components": None if components is None else list(components),
        "resize": settings.resize,
        "seed": seed,
        "rpi_permutations": k,
        "permutations_per_alpha": "fresh",
        "num_images": rows[0].fragility.num_images,
    }
    shift_names = [s if isinstance(s, str) else parse_shift(s).spec for s in shifts]
    return AlphaSweepResult(rows=rows, shifts=shift_names, settings=recorded)


def _check_sweep(
    model: nn.Module, site: str, alphas: Sequence[float], settings: MeasureSettings
) -> tuple[str, list[float]]:
    """What :func:`alpha_sweep` adds to the settings' checks, before any data is read: (the probe site
    resolved, the alphas as floats)."""
    from ..probes.sites import resolve_site

    if settings.distributed not in ("auto", "off"):
        raise SettingError(f"distributed must be 'auto' or 'off', got {settings.distributed!r}")
    site = resolve_site(model, site)
    floats = [float(a) for a in alphas]
    if not floats:
        raise SettingError("alphas is empty")
    return site, floats


def _fragility_rows(
    model: nn.Module,
    data: Any,
    shifts: Sequence[str | Shift],
    probed: list[tuple[float, Any, SSDCResult]],
    settings: MeasureSettings,
    include_prefix: bool,
    show: bool,
) -> list[AlphaSweepRow]:
    """The sweep's rows: per (alpha, what pe_scale is given for it, its SSDC under RPI) of ``probed``,
    :func:`fragility` of every shift inside ``pe_scale(model, scale, include_prefix)``."""
    from tqdm.auto import tqdm

    rows = []
    for alpha, scale, ssdc in tqdm(probed, desc="fragility per alpha", disable=not show):
        with pe_scale(model, scale, include_prefix=include_prefix):
            frag = fragility(model, data, shifts, settings=settings, labels="as-is")  # checked (or mapped) above
        rows.append(
            AlphaSweepRow(
                alpha=alpha,
                delta_ssdc=float(ssdc.rise),
                ssdc_per_layer=[float(v) for v in ssdc.per_layer],
                clean_accuracy=frag.clean_accuracy,
                accuracy=dict(frag.accuracy),
                fs=dict(frag.fs),
                fragility=frag,
                ssdc=ssdc,
                delta_ssdc_ci=ssdc.delta_ci,
                ssdc_per_layer_ci=ssdc.per_layer_ci,
                permutation_seeds=list(ssdc.settings["permutation_seeds"]),
            )
        )
    return rows


def sweep_ssdc(
    model: nn.Module,
    loader: Any,
    alphas: Sequence[float],
    *,
    site: str = "auto",
    include_prefix: bool = True,
    settings: MeasureSettings | None = None,
    progress: bool = False,
    components: Sequence[str] | None = None,
) -> list[Any]:
    """SSDC under RPI at each alpha, the SSDC part of :func:`alpha_sweep`: one
    :func:`~timm_posgeom.probes.probe_ssdc` per alpha inside ``pe_scale(model, alpha, include_prefix)`` (with
    ``components``: ``pe_scale(model, {component: alpha, ...})``, the other encodings as they are), with
    ``settings.rpi_permutations`` (K) permutations drawn afresh for every alpha, as the paper draws them: alpha
    j (in the order given) takes the seeds ``seed + jK`` .. ``seed + jK + K - 1``. ``loader``: the probe's
    batches (as ``probe_ssdc`` reads them), read once per alpha: each pass is checked to read the first pass's
    images in its order (:class:`~timm_posgeom.probes.streaming.SamePasses`; a shuffling DataLoader is refused).
    Returns one :class:`~timm_posgeom.probes.SSDCResult` per alpha."""
    from tqdm.auto import tqdm

    from ..probes import probe_ssdc

    settings = settings or MeasureSettings()
    k = rpi_count(settings.rpi_permutations)
    world = _dist.setup() if settings.distributed == "auto" else 1
    if world == 1 or _dist.shard_dataloader(loader) is None:  # sharded by index, a DataLoader reads in order
        loader = same_passes(loader, "sweep_ssdc")  # each alpha's pass checked against the first
    seed = _dist.shared_seed(settings.seed)  # None alone: one from torch's global RNG; shared by processes
    seed = seed if seed is not None else int(torch.randint(2**31, ()).item())
    out = []
    for j, alpha in enumerate(tqdm(alphas, desc="alpha sweep", disable=not progress)):
        with pe_scale(model, _spec(float(alpha), components), include_prefix=include_prefix):
            out.append(
                probe_ssdc(
                    model,
                    loader,
                    site=site,
                    rpi=True,
                    settings=settings.replace(seed=seed + j * k, rpi_permutations=k, progress=False),
                )
            )
    return out


def _spec(alpha: float, components: Sequence[str] | None) -> float | dict[str, float]:
    """What ``pe_scale`` is given for ``alpha``: the number, or ``{component: alpha}`` for each of ``components``."""
    if components is None:
        return alpha
    names = [components] if isinstance(components, str) else list(components)
    if not names:
        raise SettingError("components is empty: name PE components (e.g. ['rope']), or give None for every encoding")
    return {str(c): alpha for c in names}


def _sweep_data(
    model: nn.Module, data: Any, own: dict[str, Any], labels: str, settings: MeasureSettings
) -> tuple[int, Any, Any]:
    """(the probe's image count, its loader, the data with its labels checked or mapped)."""
    if settings.batch_size is None:  # fragility's steps need one: refused before the probe, not after it
        raise SettingError("batch_size must be an integer >= 1 (images per step), got None")
    probe_images = probe_count(own["probe_images"], settings.max_images)
    # a stream is read once, as far as the fragility part (max_images) or the probe (probe_images) goes
    bound = None if settings.max_images is None else max(settings.max_images, probe_images)
    data = match_labels(model, first_items(data, bound), labels)
    probe_source = data if own["probe_data"] is None else first_items(own["probe_data"], probe_images)
    n_probe = check_split(probe_source, probe_images)
    loader = eval_loader(
        model,
        probe_source,
        max_images=n_probe,
        batch_size=settings.batch_size,
        resize=settings.resize,
        num_workers=settings.num_workers,
        img_size=settings.img_size,
    )
    return n_probe, loader, data
