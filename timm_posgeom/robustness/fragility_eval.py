"""fragility: top-1 accuracy on clean and shifted copies of every image, in one pass, and the FS of each shift.

Each batch is decoded and resized once (:class:`ShiftedCopies`, in the loader's workers), the clean image
and each shifted copy go through the model in one forward (or in pieces of ``forward_size``), and every
image's (clean, shifted...) correctness is kept, in data order, for the exact counts and the paired
bootstrap of :class:`~timm_posgeom.robustness.scores.FragilityResult`. Definitions: the package docstring
(:mod:`timm_posgeom.robustness`) and docs/method.md#fragility-score-and-shifts.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset
from torchvision.transforms.v2 import functional as F

from ..data.eval_data import check_split, default_workers, first_items, prepare_shared, resized_item
from ..data.labels import match_labels
from ..data.shifts import PAPER_SHIFTS, GaussianBlur, Shift, parse_shift
from ..data.transforms import normalize_batch, resize_transform, resolve_config
from ..errors import DataError, SettingError
from ..interventions import check_unpermuted, eval_mode, image_permutations, pe_scale, token_permutation
from ..measuring import distributed as _dist
from ..measuring.settings import MeasureSettings
from ..probes.streaming import model_name
from .scores import FragilityResult
from .shift_size import ShiftedAtSize, check_shift_size, pre_resize

__all__ = ["fragility", "check_labels", "score_logits"]


# --------------------------------------------------------------------------------------------
# data
# --------------------------------------------------------------------------------------------
class ShiftedCopies(Dataset):
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


def device_of(model: nn.Module, device: str | torch.device | None) -> torch.device:
    if device is not None:
        device = torch.device(device)
        model.to(device)
        return device
    param = next(model.parameters(), None)
    return param.device if param is not None else torch.device("cpu")


def forward_in_pieces(
    model: nn.Module, x: torch.Tensor, size: int | None, permutation: Any = None, perms: Any = None
) -> torch.Tensor:
    """``model(x)`` in pieces of at most ``size`` images, concatenated; under RPI (``permutation``, a
    ``per="given"`` handle) row i of ``x`` is permuted by ``perms(n)[i]`` (n: the tokens the patch embedding
    emits)."""
    size = size or max(x.shape[0], 1)
    pieces = []
    for i in range(0, x.shape[0], size):
        if permutation is not None:
            permutation.give(lambda n, i=i: perms(n)[i : i + size])
        pieces.append(model(x[i : i + size]))
    return torch.cat(pieces) if pieces else model(x)


def check_labels(labels: torch.Tensor, outputs: int) -> None:
    """Raise ValueError unless every label (B,) indexes one of the model's ``outputs`` classes: a label out of
    range, or -1 (Hugging Face's unlabelled test rows), could never match a prediction and would count as wrong."""
    if not labels.numel():
        return
    if int(labels.max()) >= outputs:
        raise DataError(
            f"label {int(labels.max())} is out of range for a model with {outputs} "
            "outputs: the data's labels do not index this model's classes"
        )
    if int(labels.min()) < 0:
        raise DataError(
            f"label {int(labels.min())}: the data has unlabelled images (a test split?), which "
            "would count as wrong; use a labelled split"
        )


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
    :func:`~timm_posgeom.data.transforms.eval_transform` gives, bit for bit). Counts are exact over all
    images; clean accuracy is computed once. FS and its intervals: :mod:`timm_posgeom.robustness`.

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
        blur_on_device: run blur shifts batched on ``device`` (:func:`~timm_posgeom.data.shifts.gaussian_blur_batch`,
            same values) instead of in the loader workers.
        labels: how the data's labels meet the model's classes (:func:`~timm_posgeom.data.labels.match_labels`):
            ``"check"`` (default) raises :class:`~timm_posgeom.data.labels.LabelMismatchError` when they differ
            (e.g. a 1000-class ImageNet model on 10-class data), ``"by-name"`` maps the data's classes onto
            the model's (recorded class names, or an ImageNet head's WordNet ids and names), ``"as-is"``
            uses the indices unchecked.

    Keyword Args:
        batch_size (int): images per step; each step forwards ``batch_size * (1 + len(shifts))`` copies
            (in pieces of ``forward_size``).
        num_workers (int | None): DataLoader workers (default ``min(4, cpu_count - 1)``); each applies the shifts.
        seed (int | None): seeds the RPI permutations, the bootstrap, and the random shifts (image i of the data is
            corrupted with :func:`~timm_posgeom.data.shifts.image_seed` ``(seed, i, name)``).
        max_images (int | None): evaluate only the first ``max_images`` images.
        device (str | torch.device | None): where to run (the model is moved there); default the model's device.
        progress (bool): show a tqdm bar.
        img_size (int | tuple[int, int] | None): input size S or (H, W) for models that take any size (dynamic-size ViTs, CNNs);
            default the model's own. A model with one fixed other size is refused.
        distributed (str): ``auto`` (default) or ``off`` (``presharded`` is refused): alone, nothing changes; launched as W > 1 processes
            (``accelerate launch``, ``torchrun``: :mod:`timm_posgeom.measuring.distributed`), the batches of
            ``batch_size`` images of the first ``max_images`` are shared, global batch k to process
            k mod W (each loads and shifts only its own images); the per-image correctness arrays
            are gathered back into data order, so every process returns exactly the single-process
            result (counts, accuracies, FS, Wilson and bootstrap intervals). Under RPI each batch gets
            the permutation one process would draw for it. ``off``: this process evaluates all the
            data alone. A ``seed`` of None is replaced by one drawn on the main process.
        forward_size (int | None): at most this many copies per model forward (memory: many shifts times a large
            batch); default None, every copy of a step in one forward.
        shift_size (int | None): apply each shift at ``shift_size`` x ``shift_size`` px (the image resized straight
            to it first, with the model's interpolation), then resize every copy, the clean one too, to the model's
            input (:mod:`timm_posgeom.robustness.shift_size`; the paper's 224 px for a model that reads fewer); default None,
            each shift on the image at the model's input. Not with ``blur_on_device`` for a blur.

    Returns:
        A :class:`FragilityResult`.
    """
    settings, own = MeasureSettings.resolve("fragility", settings, options, {"forward_size": None, "shift_size": None})
    shift_list, names, batch_size = _check_fragility(shifts, settings, own["forward_size"])
    on_device = [blur_on_device and isinstance(p, GaussianBlur) for p in shift_list]
    shift_size = check_shift_size(own["shift_size"], any(on_device))
    data = match_labels(model, first_items(data, settings.max_images), labels)
    plan = _Plan(
        names,
        shift_list,
        on_device,
        check_split(data, settings.max_images),
        batch_size,
        own["forward_size"],
        shift_size=shift_size,
    )
    seed = _share(plan, settings, (len(data), rpi, alpha, blur_on_device, shift_size))
    dev = device_of(model, settings.device)
    cfg = resolve_config(model, settings.img_size)
    # random shifts: image i from a seed of (seed, i); no seed: one drawn from torch's global RNG (as RPI's)
    shift_seed = seed if seed is not None else int(torch.randint(2**31, ()).item())
    loader = _loader(data, plan, settings, cfg, shift_seed, dev)
    recorded = {
        "model": model_name(model),
        "resize": settings.resize,
        "rpi": rpi,
        "alpha": alpha,
        "seed": seed,
        "input_size": list(cfg["input_size"]),
        "shift_objects": [repr(p) for p in shift_list],
        **({"shift_size": shift_size} if shift_size else {}),
    }
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
    shift_size: int | None = None  # each shift applied at this size, before the resize to the model's input


def _check_fragility(
    shifts: Sequence[str | Shift] | str | Shift, settings: MeasureSettings, forward_size: int | None
) -> tuple[list[Shift], list[str], int]:
    """The shifts parsed (and their names, distinct), and what fragility adds to the settings' checks; returns
    (the shifts, their names, the batch size: images per step)."""
    if isinstance(shifts, (str, Shift)):
        shifts = (shifts,)
    shift_list = [parse_shift(s) for s in shifts]
    names = [s if isinstance(s, str) else p.spec for s, p in zip(shifts, shift_list)]
    if len(set(names)) != len(names):
        raise SettingError(f"shifts must be distinct, got {names}")
    if settings.batch_size is None:
        raise SettingError("batch_size must be an integer >= 1 (images per step), got None")
    if settings.distributed not in ("auto", "off"):
        raise SettingError(f"distributed must be 'auto' or 'off', got {settings.distributed!r}")
    if forward_size is not None and forward_size < 1:
        raise SettingError(f"forward_size must be >= 1, got {forward_size}")
    return shift_list, names, settings.batch_size


def _share(plan: _Plan, settings: MeasureSettings, agreed: tuple) -> int | None:
    """Launched as several processes: the same call everywhere (or an error everywhere, not a wait in a
    collective), the seed shared, this process's batches in ``plan.own``. Returns the seed to use."""
    world = _dist.setup() if settings.distributed == "auto" else 1
    if world == 1:
        return settings.seed
    _dist.check_same(
        (
            plan.names,
            [repr(p) for p in plan.shifts],
            plan.n,
            settings.resize,
            plan.batch_size,
            settings.seed,
            settings.img_size,
            *agreed,
        ),
        "fragility settings or data",
    )
    plan.own = _dist.sequential_batches(plan.n, plan.batch_size)
    return _dist.shared_seed(settings.seed)


def _loader(
    data: Any, plan: _Plan, settings: MeasureSettings, cfg: dict[str, Any], shift_seed: int, dev: torch.device
) -> DataLoader:
    """Batches ((B, V_loader, C, H, W) uint8 copies, labels) of this process's images: each image resized
    once to the model's input (``cfg``), then every shift that runs in the loader's workers (with
    ``plan.shift_size``: each shift at that size, then every copy resized, :mod:`~timm_posgeom.robustness.shift_size`)."""
    loader_shifts = [p for p, d in zip(plan.shifts, plan.on_device) if not d]
    resize = resize_transform(cfg, settings.resize)
    shifted = (
        ShiftedCopies(data, plan.n, resize, loader_shifts, seed=shift_seed)
        if not plan.shift_size
        else ShiftedAtSize(data, plan.n, pre_resize(cfg, plan.shift_size), resize, loader_shifts, seed=shift_seed)
    )
    batching = (
        dict(batch_size=plan.batch_size, shuffle=False)
        if plan.own is None
        else dict(batch_sampler=_dist.IndexBatches(plan.own))
    )  # this process's batches only
    workers = default_workers() if settings.num_workers is None else int(settings.num_workers)
    return DataLoader(shifted, **batching, num_workers=workers, pin_memory=dev.type == "cuda", persistent_workers=False)


def _intervene(
    stack: contextlib.ExitStack, model: nn.Module, plan: _Plan, rpi: bool, alpha: float | None, seed: int | None
) -> Any:
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


def _evaluate(
    model: nn.Module,
    loader: DataLoader,
    plan: _Plan,
    cfg: dict[str, Any],
    dev: torch.device,
    permutation: Any,
    show: bool,
    seed: int = 0,
) -> np.ndarray:
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

        logits = forward_in_pieces(
            model, normalize_batch(x.flatten(0, 1), cfg["mean"], cfg["std"]), plan.forward_size, permutation, perms
        )
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
        rows = (
            np.concatenate([np.arange(r.start, r.stop) for r in plan.own]) if plan.own else np.zeros(0, dtype=np.int64)
        )
        hits = _dist.gather_in_order(hits, rows, plan.n)
    names = ["clean", *plan.names]
    return (
        {name: hits[:, j] == 1 for j, name in enumerate(names)},
        {name: hits[:, j] < 0 for j, name in enumerate(names)},
    )
