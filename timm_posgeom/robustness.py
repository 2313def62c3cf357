"""Fragility scores under distribution shifts, and alpha sweeps linking PE strength to robustness.

Definitions (the paper; docs/method.md#fragility-score-and-shifts):

* top-1 accuracy ``A = k / n``: ``k`` images of ``n`` whose arg-max logit equals the label, counted
  exactly over every image (never an average of per-batch accuracies);
* fragility score ``FS = 1 - A_shift / A_clean`` (0: the shift costs nothing; 1: it destroys all
  correct predictions; negative when the shift helps). ``A_clean = 0`` gives NaN with a warning;
* 95% intervals: accuracies by the Wilson score interval; FS by a paired percentile bootstrap over
  images (each image contributes its (clean correct, shifted correct) pair, so the interval
  accounts for the pairing). Resampling n pairs only changes the counts of the four pair types,
  so the bootstrap draws those counts from a multinomial: the same distribution, exactly, at
  no cost per image.

:func:`fragility` runs every shift in the same pass: each batch is decoded and resized once, the
clean image and each shifted copy go through the model in one forward (or in pieces of
``forward_size``), clean accuracy is computed once. Under RPI (``rpi=True``) each step draws one
token permutation, shared by the clean and shifted copies of the batch, from a seeded generator
(reproducible). Random shifts (ImageNet-C's noise, frost, ...) corrupt image i with a seed made of
(``seed``, i): the same copies whatever the batch size or the number of workers.
:func:`~timm_posgeom.imagenet_c.imagenet_c_fragility` runs all 75 ImageNet-C shifts this way.

:func:`alpha_sweep` scales the PE by alpha (``pe_scale``; APE incl. the class row as in the paper,
sincos, RoPE angles, third-party timm ViTs) and measures, per alpha, delta SSDC under RPI and the
fragility of every shift.

Both run unchanged under ``accelerate launch`` / ``torchrun`` (see :mod:`timm_posgeom.distributed`):
each process evaluates its share of the batches, and every process returns the result one process
would compute (the per-image correctness arrays are re-assembled in data order, so counts,
accuracies, FS and the bootstrap intervals are identical).
"""
from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset
from torchvision.transforms.v2 import functional as F

from . import distributed as _dist
from .errors import require
from .eval_data import check_split, default_workers, eval_loader, first_items, prepare_shared, resized_item
from .interventions import check_unpermuted, eval_mode, image_permutations, pe_scale, token_permutation
from .jsonio import dump_json, tagged, to_jsonable
from .labels import match_labels
from .measuring import MeasureSettings
from .probes.streaming import _model_name
from .protocol import DEFAULT_ALPHAS, probe_count, rpi_count
from .scores import FragilityResult, fragility_score, paired_bootstrap_fs, wilson_interval
from .shifts import PAPER_SHIFTS, GaussianBlur, Shift, parse_shift
from .transforms import normalize_batch, resize_transform, resolve_config

__all__ = [
    "fragility",
    "FragilityResult",
    "alpha_sweep",
    "sweep_ssdc",
    "AlphaSweepResult",
    "AlphaSweepRow",
    "fragility_score",
    "wilson_interval",
    "paired_bootstrap_fs",
    "DEFAULT_ALPHAS",
]

# --------------------------------------------------------------------------------------------
# data
# --------------------------------------------------------------------------------------------
class _ShiftedCopies(Dataset):
    """Item i -> ((V, C, H, W) uint8: resized clean image then each loader-side shift, label, i).

    Each shift gets ``shift.for_image(image, i, seed)``: random ones (ImageNet-C's noise, frost, ...)
    draw from a seed of (seed, i), so the copies do not depend on the batch size or the workers."""

    def __init__(self, data: Any, n: int, resize: Any, shifts: Sequence[Shift], seed: int = 0):
        self.data, self.n, self.resize, self.shifts, self.seed = data, n, resize, list(shifts), seed
        prepare_shared(data, resize)  # a zoo's images resized once, here: not in a worker that dies

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int, int]:
        image, label = resized_item(self.data, index, self.resize)
        copies = [image, *(shift.for_image(image, index, self.seed) for shift in self.shifts)]
        return torch.stack([F.pil_to_tensor(c) for c in copies]), label, index


def _model_device(model: nn.Module, device: str | torch.device | None) -> torch.device:
    if device is not None:
        device = torch.device(device)
        model.to(device)
        return device
    param = next(model.parameters(), None)
    return param.device if param is not None else torch.device("cpu")


def _forward_in_pieces(model: nn.Module, x: torch.Tensor, size: int | None, permutation: Any = None,
                       perms: Any = None) -> torch.Tensor:
    """``model(x)`` in pieces of at most ``size`` images, concatenated; under RPI (``permutation``, a
    ``per="given"`` handle) row i of ``x`` is permuted by ``perms(n)[i]`` (n: the tokens the patch embedding
    emits)."""
    size = size or max(x.shape[0], 1)
    pieces = []
    for i in range(0, x.shape[0], size):
        if permutation is not None:
            permutation.give(lambda n, i=i: perms(n)[i:i + size])
        pieces.append(model(x[i:i + size]))
    return torch.cat(pieces) if pieces else model(x)


# --------------------------------------------------------------------------------------------
# fragility
# --------------------------------------------------------------------------------------------
def check_labels(labels: torch.Tensor, outputs: int) -> None:
    """Raise ValueError unless every label (B,) indexes one of the model's ``outputs`` classes: a label out of
    range, or -1 (Hugging Face's unlabelled test rows), could never match a prediction and would count as wrong."""
    if not labels.numel():
        return
    if int(labels.max()) >= outputs:
        raise ValueError(f"label {int(labels.max())} is out of range for a model with {outputs} "
                         "outputs: the data's labels do not index this model's classes")
    if int(labels.min()) < 0:
        raise ValueError(f"label {int(labels.min())}: the data has unlabelled images (a test split?), which "
                         "would count as wrong; use a labelled split")


def fragility(
        model: nn.Module,
        data: Any,
        shifts: Sequence[str | Shift] = PAPER_SHIFTS,
        *,
        rpi: bool = False,
        alpha: float | None = None,
        blur_on_device: bool = False,
        labels: str = "check",
        settings: MeasureSettings | None = None,
        **options: Any,
) -> FragilityResult:
    """Top-1 accuracy on clean and shifted images and the fragility score of every shift.

    Each image is resized to the model's input (``resize``: ``paper`` straight to (H, W); ``timm``
    timm's resize + centre crop), each shift is applied to the resized uint8 image, and every copy
    is normalised with the model's mean / std (the same values as
    :func:`~timm_posgeom.transforms.eval_transform` gives, bit for bit). Counts are exact over all
    images; clean accuracy is computed once. See the module docstring for FS and the intervals.

    The settings (``settings``, a :class:`~timm_posgeom.measuring.MeasureSettings`, or its fields as
    keywords, which override it): ``resize``, ``batch_size``, ``num_workers``, ``seed``, ``max_images``,
    ``device``, ``progress``, ``img_size`` and ``distributed`` below; ``forward_size`` is a keyword of
    this function's own.

    Args:
        model: any timm classifier (its data config gives size, interpolation, mean, std).
        data: a Hugging Face dataset or any indexable of (PIL image, label) / {"image", "label"}.
        shifts: specs (``jpeg:5``, ``blur:2.5:5``, ``imagenet-c:gaussian_blur:3``) or Shift objects
            (one spec alone is accepted too); results are keyed by the spec as given, or ``Shift.spec``.
        rpi: random permutation at inference: one permutation per image, from (``seed``, the image's index in
            the data), shared by its clean and shifted copies; the accuracies are then means over as many
            permutations as images, whatever the batch size or the number of processes.
        alpha: scale the PE by alpha for the evaluation (``pe_scale``, class row included); None = as is.
        blur_on_device: run blur shifts batched on ``device`` (:func:`~timm_posgeom.shifts.gaussian_blur_batch`,
            same values) instead of in the loader workers.
        labels: how the data's labels meet the model's classes (:func:`~timm_posgeom.labels.match_labels`):
            ``"check"`` (default) raises :class:`~timm_posgeom.labels.LabelMismatchError` when they differ
            (e.g. a 1000-class ImageNet model on 10-class data), ``"by-name"`` maps the data's classes onto
            the model's (recorded class names, or an ImageNet head's WordNet ids and names), ``"as-is"``
            uses the indices unchecked.

    Keyword Args:
        batch_size (int): images per step; each step forwards ``batch_size * (1 + len(shifts))`` copies
            (in pieces of ``forward_size``).
        num_workers (int | None): DataLoader workers (default ``min(4, cpu_count - 1)``); each applies the shifts.
        seed (int | None): seeds the RPI permutations, the bootstrap, and the random shifts (image i of the data is
            corrupted with :func:`~timm_posgeom.shifts.image_seed` ``(seed, i, name)``).
        max_images (int | None): evaluate only the first ``max_images`` images.
        device (str | torch.device | None): where to run (the model is moved there); default the model's device.
        progress (bool): show a tqdm bar.
        img_size (int | tuple[int, int] | None): input size S or (H, W) for models that take any size (dynamic-size ViTs, CNNs);
            default the model's own. A model with one fixed other size is refused.
        distributed (str): ``auto`` (default) or ``off`` (``presharded`` is refused): alone, nothing changes; launched as W > 1 processes
            (``accelerate launch``, ``torchrun``: :mod:`timm_posgeom.distributed`), the batches of
            ``batch_size`` images of the first ``max_images`` are shared, global batch k to process
            k mod W (each loads and shifts only its own images); the per-image correctness arrays
            are gathered back into data order, so every process returns exactly the single-process
            result (counts, accuracies, FS, Wilson and bootstrap intervals). Under RPI each batch gets
            the permutation one process would draw for it. ``off``: this process evaluates all the
            data alone. A ``seed`` of None is replaced by one drawn on the main process.
        forward_size (int | None): at most this many copies per model forward (memory: many shifts times a large
            batch); default None, every copy of a step in one forward.

    Returns:
        A :class:`FragilityResult`.
    """
    settings, own = MeasureSettings.resolve("fragility", settings, options, {"forward_size": None})
    shift_list, names = _check_fragility(shifts, settings, own["forward_size"])
    data = match_labels(model, first_items(data, settings.max_images), labels)
    n = check_split(data, settings.max_images)
    plan = _Plan(names, shift_list, [blur_on_device and isinstance(p, GaussianBlur) for p in shift_list], n,
                 settings.batch_size, own["forward_size"])
    seed = _share(plan, settings, (len(data), rpi, alpha, blur_on_device))
    dev = _model_device(model, settings.device)
    cfg = resolve_config(model, settings.img_size)
    # random shifts: image i from a seed of (seed, i); no seed: one drawn from torch's global RNG (as RPI's)
    shift_seed = seed if seed is not None else int(torch.randint(2 ** 31, ()).item())
    loader = _loader(data, plan, settings, resize_transform(cfg, settings.resize), shift_seed, dev)
    recorded = {"model": _model_name(model), "resize": settings.resize, "rpi": rpi, "alpha": alpha, "seed": seed,
                "input_size": list(cfg["input_size"]), "shift_objects": [repr(p) for p in shift_list]}
    if seed is None:
        recorded["shift_seed"] = shift_seed
    if rpi:  # one permutation per image, from (the seed, its index)
        recorded["rpi_per"] = "image"
    show = settings.progress and (plan.own is None or _dist.is_main())
    with _dist.fail_together() if plan.own is not None else contextlib.nullcontext(), contextlib.ExitStack() as stack:
        permutation = _intervene(stack, model, plan, rpi, alpha, seed)
        hits = _evaluate(model, loader, plan, cfg, dev, permutation, show, seed=shift_seed)
    correct, nonfinite = _gather(plan, hits)
    return FragilityResult.from_correct(correct, settings=recorded, seed=seed, nonfinite=nonfinite)


@dataclass
class _Plan:
    """One :func:`fragility` call, checked: the shifts' names and objects, which run on the device, the
    image count n, the step and forward sizes, and (several processes) this process's batches as ranges
    of image indices (None alone)."""

    names: list[str]
    shifts: list[Shift]
    on_device: list[bool]
    n: int
    batch_size: int
    forward_size: int | None
    own: list[range] | None = None


def _check_fragility(shifts: Sequence[str | Shift] | str | Shift, settings: MeasureSettings,
                     forward_size: int | None) -> tuple[list[Shift], list[str]]:
    """The shifts parsed (and their names, distinct), and what fragility adds to the settings' checks."""
    if isinstance(shifts, (str, Shift)):
        shifts = (shifts,)
    shift_list = [parse_shift(s) for s in shifts]
    names = [s if isinstance(s, str) else p.spec for s, p in zip(shifts, shift_list)]
    if len(set(names)) != len(names):
        raise ValueError(f"shifts must be distinct, got {names}")
    if settings.batch_size is None:
        raise ValueError("batch_size must be an integer >= 1 (images per step), got None")
    if settings.distributed not in ("auto", "off"):
        raise ValueError(f"distributed must be 'auto' or 'off', got {settings.distributed!r}")
    if forward_size is not None and forward_size < 1:
        raise ValueError(f"forward_size must be >= 1, got {forward_size}")
    return shift_list, names


def _share(plan: _Plan, settings: MeasureSettings, agreed: tuple) -> int | None:
    """Launched as several processes: the same call everywhere (or an error everywhere, not a wait in a
    collective), the seed shared, this process's batches in ``plan.own``. Returns the seed to use."""
    world = _dist.setup() if settings.distributed == "auto" else 1
    if world == 1:
        return settings.seed
    _dist.check_same((plan.names, [repr(p) for p in plan.shifts], plan.n, settings.resize, plan.batch_size,
                      settings.seed, settings.img_size, *agreed), "fragility settings or data")
    plan.own = _dist.sequential_batches(plan.n, plan.batch_size)
    return _dist.shared_seed(settings.seed)


def _loader(data: Any, plan: _Plan, settings: MeasureSettings, resize: Any, shift_seed: int,
            dev: torch.device) -> DataLoader:
    """Batches ((B, V_loader, C, H, W) uint8 copies, labels) of this process's images: each image resized
    once, then every shift that runs in the loader's workers."""
    loader_shifts = [p for p, d in zip(plan.shifts, plan.on_device) if not d]
    shifted = _ShiftedCopies(data, plan.n, resize, loader_shifts, seed=shift_seed)
    batching = dict(batch_size=plan.batch_size, shuffle=False) if plan.own is None else \
        dict(batch_sampler=_dist.IndexBatches(plan.own))  # this process's batches only
    workers = default_workers() if settings.num_workers is None else int(settings.num_workers)
    return DataLoader(shifted, **batching, num_workers=workers, pin_memory=dev.type == "cuda",
                      persistent_workers=False)


def _intervene(stack: contextlib.ExitStack, model: nn.Module, plan: _Plan, rpi: bool, alpha: float | None,
               seed: int | None) -> Any:
    """Enter eval mode, the PE scale and RPI on ``stack`` (inference mode last); returns the RPI handle."""
    stack.enter_context(eval_mode(model))
    if alpha is not None:
        stack.enter_context(pe_scale(model, alpha))
    permutation = None
    if not rpi:  # inside the caller's token_permutation the tokens would be permuted, reported rpi=False
        check_unpermuted(model, "fragility(rpi=False)")
    if rpi:  # each image's permutation from (seed, its index): _evaluate gives them, step by step
        permutation = stack.enter_context(token_permutation(model, per="given"))
    # last, so that pe_scale's saved copies and rebuilt caches are ordinary tensors, not inference
    # tensors (those would break a later backward through the model)
    stack.enter_context(torch.inference_mode())
    return permutation


def _evaluate(model: nn.Module, loader: DataLoader, plan: _Plan, cfg: dict[str, Any], dev: torch.device,
              permutation: Any, show: bool, seed: int = 0) -> np.ndarray:
    """(images, 1 + shifts) bool: whether each of this process's images, clean then shifted, is classified
    right, in loader order."""
    from tqdm.auto import tqdm

    hits: list[np.ndarray] = []
    for copies, labels, indices in tqdm(loader, desc="fragility", disable=not show, leave=False):
        copies = copies.to(dev, non_blocking=True)  # (B, V_loader, C, H, W) uint8
        variants, it = [copies[:, 0]], iter(range(1, copies.shape[1]))
        for p, d in zip(plan.shifts, plan.on_device):
            variants.append(p.batch(copies[:, 0]) if d else copies[:, next(it)])
        x = torch.stack(variants, dim=1)  # (B, V, C, H, W), V = 1 + len(shifts)
        b, v = x.shape[:2]
        perms = None
        if permutation is not None:  # image i's permutation (of the n tokens the hook sees) for each of its copies
            ids = indices.numpy()

            def perms(n: int, ids=ids, v=v) -> torch.Tensor:
                return image_permutations(n, seed, ids).repeat_interleave(v, dim=0)
        logits = _forward_in_pieces(model, normalize_batch(x.flatten(0, 1), cfg["mean"], cfg["std"]),
                                    plan.forward_size, permutation, perms)
        check_labels(labels, logits.shape[-1])
        hits.append(score_logits(logits, labels.repeat_interleave(v)).reshape(b, v))
    table = np.concatenate(hits) if hits else np.zeros((0, 1 + len(plan.names)), dtype=np.int8)
    expected = plan.n if plan.own is None else sum(len(rows) for rows in plan.own)
    if len(table) != expected:
        raise RuntimeError(f"evaluated {len(table)} images, expected {expected}")
    return table


def score_logits(logits: torch.Tensor, labels: torch.Tensor) -> np.ndarray:
    """(B,) int8 of (B, classes) logits: 1 where the arg-max is the label, 0 where it is not, -1 where the
    logits are not all finite (an arg-max of NaN logits is class 0: never counted as a prediction)."""
    finite = torch.isfinite(logits).all(dim=-1).cpu()
    right = (logits.argmax(dim=-1).cpu() == labels.cpu()).to(torch.int8)
    return torch.where(finite, right, torch.full_like(right, -1)).numpy()


def _gather(plan: _Plan, hits: np.ndarray) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(``"clean"`` and each shift -> (n,) bool correct, and -> (n,) bool logits not finite), in data order;
    with several processes every process's rows put back in data order: exactly the arrays of one process."""
    if plan.own is not None:
        rows = np.concatenate([np.arange(r.start, r.stop) for r in plan.own]) if plan.own else \
            np.zeros(0, dtype=np.int64)
        hits = _dist.gather_in_order(hits, rows, plan.n)
    names = ["clean", *plan.names]
    return ({name: hits[:, j] == 1 for j, name in enumerate(names)},
            {name: hits[:, j] < 0 for j, name in enumerate(names)})


# --------------------------------------------------------------------------------------------
# alpha sweep
# --------------------------------------------------------------------------------------------
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
            "alpha": self.alpha, "delta_ssdc": self.delta_ssdc, "delta_ssdc_ci": list(self.delta_ssdc_ci),
            "ssdc_per_layer": list(self.ssdc_per_layer),
            "ssdc_per_layer_ci": [list(c) for c in self.ssdc_per_layer_ci] if self.ssdc_per_layer_ci else None,
            "ssdc_by_permutation": self.ssdc.by_permutation if self.ssdc is not None else None,
            "permutation_seeds": self.permutation_seeds,
            "clean_accuracy": self.clean_accuracy, "clean_accuracy_ci": list(self.fragility.clean_interval),
            "accuracy": dict(self.accuracy), "fs": dict(self.fs),
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
        return {"shifts": list(self.shifts), "rows": [r.to_dict() for r in self.rows],
                "settings": to_jsonable(self.settings)}

    def to_json(self, path: str | os.PathLike | None = None, indent: int = 2) -> str:
        """The :meth:`to_dict` numbers as strict JSON (NaN written as null); also written to ``path`` if given (atomically)."""
        return dump_json(tagged("alpha-sweep-result", self.to_dict()), path, indent)

    def to_markdown(self, digits: int = 3) -> str:
        """A markdown table: alpha (increasing, as on the figure's axis), delta SSDC under RPI with its 95%
        interval over the RPI permutations, clean top-1 and FS per shift each with its 95% interval (Wilson;
        paired bootstrap), per-layer SSDC under RPI (means over the permutations)."""
        head = ["alpha", "delta SSDC (RPI)", "delta SSDC (RPI) 95% CI", "clean top-1", "clean top-1 95% CI",
                *(c for s in self.shifts for c in (f"FS {s}", f"FS {s} 95% CI")), "SSDC per layer (RPI)"]
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

        def ci(pair: Any) -> str:
            low, high = pair
            return f"[{low:.{digits}f}, {high:.{digits}f}]"

        for r in sorted(self.rows, key=lambda r: r.alpha):
            cells = [f"{r.alpha:g}", f"{r.delta_ssdc:.{digits}f}", ci(r.delta_ssdc_ci), f"{r.clean_accuracy:.{digits}f}",
                     ci(r.fragility.clean_interval),
                     *(c for s in self.shifts for c in (f"{r.fs[s]:.{digits}f}", ci(r.fragility.fs_interval[s]))),
                     ", ".join(f"{v:.{digits}f}" for v in r.ssdc_per_layer)]
            lines.append("| " + " | ".join(cells) + " |")
        return "\n".join(lines)

    def plot(self, path: str | os.PathLike | None = None) -> Any:
        """Against alpha (increasing left to right), two panels sharing the x axis: delta SSDC under RPI
        (top) and FS per shift with its paired-bootstrap 95% interval as a band (bottom); no twin axes.
        Returns the matplotlib Figure; also saved to ``path`` if given."""
        Figure = require("matplotlib.figure", "plotting").Figure

        from .plotting import fit_titles, save_figure

        fig = Figure(figsize=(5.4, 5.4), layout="constrained")
        top, bottom = fig.subplots(2, 1, sharex=True)
        order = np.argsort(self.alphas)
        alphas = np.asarray(self.alphas, dtype=float)[order]
        top.plot(alphas, np.asarray(self.delta_ssdc, dtype=float)[order], "o-", color="k",
                 label=f"delta SSDC under RPI (mean over {self.settings.get('rpi_permutations', '?')} permutations)")
        cis = np.asarray([self.rows[k].delta_ssdc_ci for k in order], dtype=float)
        if np.isfinite(cis).any():
            top.fill_between(alphas, cis[:, 0], cis[:, 1], color="k", alpha=0.15, lw=0,
                             label="its 95% interval over the permutations")
        top.axhline(0, color="0.6", lw=0.5)
        top.set_ylabel("delta SSDC under RPI")
        top.legend(fontsize=7)
        for i, s in enumerate(self.shifts):
            bottom.plot(alphas, np.asarray(self.fs[s], dtype=float)[order], "s-", color=f"C{i}", ms=4, label=f"FS {s}")
            rows = [self.rows[k] for k in order]
            ci = [getattr(r.fragility, "fs_interval", {}).get(s, (math.nan, math.nan)) for r in rows]
            if not all(math.isnan(lo) for lo, _ in ci):
                bottom.fill_between(alphas, [lo for lo, _ in ci], [hi for _, hi in ci], color=f"C{i}", alpha=0.2,
                                    lw=0, label=f"FS {s}: paired bootstrap 95% interval")
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
    ``probe_images`` (int) and ``probe_data`` (a split) are this function's own.

    ``max_images`` bounds all the work: the probe too uses at most that many images unless
    ``probe_images`` says otherwise (default: 1,000, the paper's count, or ``max_images`` if fewer;
    :func:`~timm_posgeom.protocol.probe_count`). ``labels`` is checked (or mapped) once, as in
    :func:`fragility`.

    alpha = 1 reproduces the unscaled model exactly. ``img_size`` sets the input size of both (see
    :func:`fragility`). Launched as several processes, each alpha's probe and evaluation are shared by
    batch and reduced, every process returns the single-process result, and only the main process
    shows progress. Returns an :class:`AlphaSweepResult`.
    """
    from .probes.sites import resolve_site

    settings, own = MeasureSettings.resolve("alpha_sweep", settings, options,
                                            {"probe_images": None, "probe_data": None})
    if settings.distributed not in ("auto", "off"):
        raise ValueError(f"distributed must be 'auto' or 'off', got {settings.distributed!r}")
    site = resolve_site(model, site)
    alphas = [float(a) for a in alphas]
    if not alphas:
        raise ValueError("alphas is empty")
    n_probe, probe_loader, data = _sweep_data(model, data, own, labels, settings)
    if isinstance(shifts, (str, Shift)):
        shifts = (shifts,)
    shift_names = [s if isinstance(s, str) else parse_shift(s).spec for s in shifts]
    dev = _model_device(model, settings.device)
    quiet = settings.replace(device=dev, progress=False)
    from tqdm.auto import tqdm

    world = _dist.setup() if settings.distributed == "auto" else 1
    show = settings.progress and (world == 1 or _dist.is_main())
    ssdcs = sweep_ssdc(model, probe_loader, alphas, site=site, include_prefix=include_prefix,
                       settings=quiet.replace(max_images=n_probe), progress=show)
    rows = []
    for alpha, ssdc in zip(alphas, tqdm(ssdcs, desc="fragility per alpha", disable=not show)):
        with pe_scale(model, alpha, include_prefix=include_prefix):
            frag = fragility(model, data, shifts, settings=quiet, labels="as-is")  # checked (or mapped) above
        rows.append(AlphaSweepRow(
            alpha=alpha, delta_ssdc=float(ssdc.rise), ssdc_per_layer=[float(v) for v in ssdc.per_layer],
            clean_accuracy=frag.clean_accuracy, accuracy=dict(frag.accuracy), fs=dict(frag.fs),
            fragility=frag, ssdc=ssdc, delta_ssdc_ci=ssdc.delta_ci, ssdc_per_layer_ci=ssdc.per_layer_ci,
            permutation_seeds=list(ssdc.settings["permutation_seeds"])))
    k, seed = ssdcs[0].settings["rpi_permutations"], ssdcs[0].settings["seed"]
    recorded = {"model": _model_name(model), "site": site, "probe_images": n_probe, "include_prefix": include_prefix,
                "resize": settings.resize, "seed": seed, "rpi_permutations": k, "permutations_per_alpha": "fresh",
                "num_images": rows[0].fragility.num_images}
    return AlphaSweepResult(rows=rows, shifts=shift_names, settings=recorded)


def sweep_ssdc(model: nn.Module, loader: Any, alphas: Sequence[float], *, site: str = "auto",
               include_prefix: bool = True, settings: MeasureSettings | None = None,
               progress: bool = False) -> list[Any]:
    """SSDC under RPI at each alpha, the SSDC part of :func:`alpha_sweep`: one
    :func:`~timm_posgeom.probes.probe_ssdc` per alpha inside ``pe_scale(model, alpha, include_prefix)``, with
    ``settings.rpi_permutations`` (K) permutations drawn afresh for every alpha, as the paper draws them: alpha
    j (in the order given) takes the seeds ``seed + jK`` .. ``seed + jK + K - 1``. ``loader``: the probe's
    batches (as ``probe_ssdc`` reads them). Returns one :class:`~timm_posgeom.probes.SSDCResult` per alpha."""
    from tqdm.auto import tqdm

    from .probes import probe_ssdc

    settings = settings or MeasureSettings()
    k = rpi_count(settings.rpi_permutations)
    if settings.distributed == "auto":
        _dist.setup()
    seed = _dist.shared_seed(settings.seed)  # None alone: one from torch's global RNG; shared by processes
    seed = seed if seed is not None else int(torch.randint(2 ** 31, ()).item())
    out = []
    for j, alpha in enumerate(tqdm(alphas, desc="alpha sweep", disable=not progress)):
        with pe_scale(model, float(alpha), include_prefix=include_prefix):
            out.append(probe_ssdc(model, loader, site=site, rpi=True,
                                  settings=settings.replace(seed=seed + j * k, rpi_permutations=k, progress=False)))
    return out


def _sweep_data(model: nn.Module, data: Any, own: dict[str, Any], labels: str,
                settings: MeasureSettings) -> tuple[int, Any, Any]:
    """(the probe's image count, its loader, the data with its labels checked or mapped)."""
    probe_images = probe_count(own["probe_images"], settings.max_images)
    # a stream is read once, as far as the fragility part (max_images) or the probe (probe_images) goes
    bound = None if settings.max_images is None else max(settings.max_images, probe_images)
    data = match_labels(model, first_items(data, bound), labels)
    probe_source = data if own["probe_data"] is None else first_items(own["probe_data"], probe_images)
    n_probe = check_split(probe_source, probe_images)
    loader = eval_loader(model, probe_source, max_images=n_probe, batch_size=settings.batch_size,
                         resize=settings.resize, num_workers=settings.num_workers, img_size=settings.img_size)
    return n_probe, loader, data
