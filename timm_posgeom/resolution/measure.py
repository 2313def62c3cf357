"""``extrapolate``: one model measured at several input sizes, each reached in several modes (a measure).

Per size S and mode (:mod:`.carry`), with the model carried to S in that mode (and restored after):

* top-1 over the first ``max_images`` images with its Wilson interval, and the fragility score of each shift
  asked for (:func:`~timm_posgeom.robustness.fragility`);
* over the first ``probe_images`` of them: SSDC per layer of clean images and under RPI (K shared permutations),
  delta SSDC under RPI (:func:`~timm_posgeom.probes.probe_ssdc`), attention entropy and mean attention distance
  per layer (:func:`~timm_posgeom.probes.attention_measures`).

Every image is resized from its source straight to S (never upsampled from the training size): the images are
decoded once (:class:`~timm_posgeom.data.eval_data.DecodedImages`, up to :data:`DECODE_IMAGES`) and resized once per
size, for every mode. At the
training size every mode is the model itself: the row is measured once and repeated for the other modes (the
same numbers, bit for bit). Definitions: docs/method.md#resolution-extrapolation.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch.nn as nn

from ..defaults import probe_count, rpi_count
from ..measuring.settings import MeasureSettings
from .carry import ExtrapolationError, at_input_size, check_modes, patch_size, training_size
from .result import ExtrapolationResult, ExtrapolationRow

__all__ = ["extrapolate", "check_sizes", "default_sizes", "SETTING_KEYS", "SettingsChangedError"]

SETTING_KEYS = (
    "model",
    "training_size",
    "patch_size",
    "top1_images",
    "probe_images",
    "rpi_permutations",
    "seed",
    "resize",
    "labels",
    "shifts",
    "site",
)
"""The settings every row of a result shares (a ``resume`` with others is refused)."""

DECODE_IMAGES = 5000
"""Up to this many images are decoded once and resized once per size, in memory (5,000 images of 224 px: 750 MB);
more are read from the split again at each size and measure (memory bounded, slower)."""

KEEP_BYTES = 1 << 30
"""The probe images of one size are kept in memory as transformed batches up to this many bytes (1 GiB: 1,000
images at 256 px), read once for every mode and measure; larger, they are transformed again for each."""


class SettingsChangedError(ExtrapolationError):
    """Rows to resume that were measured with other settings than the call's (never mixed with new ones)."""


def default_sizes(model: nn.Module) -> list[int]:
    """Half, one, two, three and four times the training size (square, patch multiples)."""
    train = training_size(model)[0]
    step = patch_size(model)[0]
    return sorted({max(step, round(train * f / step) * step) for f in (0.5, 1, 2, 3, 4)})


def check_sizes(model: nn.Module, sizes: Sequence[int] | str | None) -> list[int]:
    """The input sizes, ascending: ``None`` gives :func:`default_sizes`; a list (or a comma-separated string) of
    square sizes S, each a multiple of the patch size, distinct. ExtrapolationError (one line) otherwise."""
    if sizes is None:
        return default_sizes(model)
    try:
        asked = [int(s) for s in sizes.split(",") if s.strip()] if isinstance(sizes, str) else [int(s) for s in sizes]
    except (TypeError, ValueError):
        raise ExtrapolationError(f"sizes are input sizes in pixels, e.g. 32,64,128, got {sizes!r}") from None
    if not asked:
        raise ExtrapolationError("no input size given")
    ph, pw = patch_size(model)
    bad = [s for s in asked if s < 1 or s % ph or s % pw]
    if bad:
        raise ExtrapolationError(
            f"input size(s) {', '.join(map(str, bad))} are not positive multiples of the patch size {ph}x{pw}"
        )
    if len(set(asked)) != len(asked):
        raise ExtrapolationError(f"sizes must be distinct, got {', '.join(map(str, asked))}")
    return sorted(asked)


@dataclass
class _Plan:
    """What every row of one call shares: the counts, the shifts and the settings of the inner measures."""

    top1_images: int
    probe_images: int
    shifts: list[str]
    settings: MeasureSettings
    probe_batches: dict[int, Any] = field(default_factory=dict)  # the current size's probe batches, made once

    def batches_at(self, model: nn.Module, images: Any, size: int) -> Any:
        """The probe images at ``size`` as transformed batches (the model is at ``size`` already): made once per
        size and kept for every mode and measure while they take at most :data:`KEEP_BYTES`, else a loader that
        reads them again for each (from the decoded images, resized once per size)."""
        if size not in self.probe_batches:
            from ..data.eval_data import eval_loader

            self.probe_batches.clear()
            loader = eval_loader(
                model,
                images,
                max_images=self.probe_images,
                batch_size=int(self.settings.batch_size or 1),
                resize=self.settings.resize,
                num_workers=self.settings.num_workers,
                img_size=size,
            )
            kept = 3 * size * size * 4 * self.probe_images <= KEEP_BYTES  # float32 (3, S, S) images
            self.probe_batches[size] = list(loader) if kept else loader
        return self.probe_batches[size]


def extrapolate(
    model: nn.Module,
    data: Any,
    sizes: Sequence[int] | str | None = None,
    modes: Sequence[str] | str | None = None,
    *,
    probe_images: int | None = None,
    shifts: Sequence[str] = (),
    labels: str = "check",
    settings: MeasureSettings | None = None,
    **options: Any,
) -> ExtrapolationResult:
    """Top-1, SSDC, delta SSDC under RPI and attention per layer of ``model`` at each input size, in each mode.

    Args:
        model: a timm ViT that can change its input size (``set_input_size`` or ``dynamic_img_size``; this
            package's models, vision_transformer, eva incl. RoPE and DINOv3, naflexvit); any other is refused
            (:class:`~timm_posgeom.resolution.ExtrapolationError`, one line). Never changed: each (size, mode) is
            applied for its measures and undone exactly (:func:`~timm_posgeom.resolution.at_input_size`).
        data: a labelled split (a Hugging Face dataset, an :class:`~timm_posgeom.data.ImageSplit`, any indexable
            of (PIL image, label)); each image is resized from its source to each size.
        sizes: square input sizes in pixels, patch multiples (default: 0.5, 1, 2, 3 and 4 times the training size).
        modes: how the PE is carried to a new size (default ``"auto"``: every mode the model takes,
            :func:`~timm_posgeom.resolution.model_modes`).
        probe_images: images of the SSDC and attention measures (default: 1,000 or ``max_images`` if fewer).
        shifts: shift specs (``jpeg:5``): the fragility score of each at each size and mode (default none).
        labels: how the data's labels meet the model's classes (``check``, ``by-name``, ``as-is``), as
            :func:`~timm_posgeom.robustness.fragility`.
        settings: a :class:`~timm_posgeom.measuring.MeasureSettings`: ``max_images`` (the top-1 images; default
            all), ``batch_size``, ``resize``, ``device``, ``num_workers``, ``seed``, ``rpi_permutations`` (K, default
            10), ``distributed``, ``progress`` (one bar over the rows); its fields may also be given as keywords.

    Keyword Args:
        resume (ExtrapolationResult | None): rows measured before with the same settings: kept, not measured
            again (a resume with other settings is refused).
        on_row (Callable[[ExtrapolationResult], None] | None): called as soon as each row is measured, with the
            result so far (a caller that writes it keeps every measured row through an interruption).

    Returns:
        An :class:`~timm_posgeom.resolution.ExtrapolationResult`: the resumed rows, then the new ones in size
        order, each size's modes in ``modes`` order.
    """
    settings, own = MeasureSettings.resolve("extrapolate", settings, options, {"resume": None, "on_row": None})
    sizes, modes = check_sizes(model, sizes), check_modes(model, modes)
    images, plan = _prepare(model, data, probe_images, shifts, labels, settings)
    recorded = _settings(model, plan, labels)
    kept = _resumed(own["resume"], recorded)
    rows = list(kept)
    todo = [(s, m) for s in sizes for m in modes if (s, m) not in {r.key for r in kept}]
    on_row: Callable[[ExtrapolationResult], None] | None = own["on_row"]
    from tqdm.auto import tqdm

    bar = tqdm(todo, desc="extrapolate", unit="row", disable=not settings.progress)
    for size, mode in bar:
        bar.set_postfix_str(f"{size} px {mode}")
        rows.append(_at_training_size(rows, model, size, mode) or _measure_row(model, images, size, mode, plan))
        if on_row is not None:
            on_row(_result(rows, recorded))
    return _result(rows, recorded)


def _result(rows: list[ExtrapolationRow], recorded: dict[str, Any]) -> ExtrapolationResult:
    layers = list(range(len(rows[0].ssdc))) if rows else []
    return ExtrapolationResult(rows=list(rows), layers=layers, settings=dict(recorded))


def _prepare(
    model: nn.Module, data: Any, probe_images: int | None, shifts: Sequence[str], labels: str, settings: MeasureSettings
) -> tuple[Any, _Plan]:
    """(the images decoded once, the labels matched to the model's; the plan of every row)."""
    from ..data.eval_data import DecodedImages, check_split, first_items
    from ..data.labels import match_labels
    from ..data.shifts import parse_shift

    if settings.batch_size is None:
        raise ExtrapolationError("batch_size must be an integer >= 1 (images per batch), got None")
    shift_list = [shifts] if isinstance(shifts, str) else list(shifts)
    for spec in shift_list:
        parse_shift(spec)
    data = match_labels(model, first_items(data, settings.max_images), labels)
    top1 = check_split(data, settings.max_images)
    probe = min(probe_count(probe_images, settings.max_images), len(data))
    count = max(top1, probe)
    decode = count <= DECODE_IMAGES and not isinstance(data, DecodedImages)
    images = DecodedImages(data, count, keep=1) if decode else data
    quiet = settings.replace(progress=False, rpi_permutations=rpi_count(settings.rpi_permutations))
    return images, _Plan(top1, probe, shift_list, quiet)


def _settings(model: nn.Module, plan: _Plan, labels: str) -> dict[str, Any]:
    """What every row is measured with (:data:`SETTING_KEYS`)."""
    from ..probes import find_sites

    name = getattr(model, "pretrained_cfg", {}).get("architecture") or type(model).__name__
    return {
        "model": name,
        "family": find_sites(model).family,
        "training_size": training_size(model)[0],
        "patch_size": patch_size(model)[0],
        "top1_images": plan.top1_images,
        "probe_images": plan.probe_images,
        "rpi_permutations": plan.settings.rpi_permutations,
        "seed": plan.settings.seed,
        "resize": plan.settings.resize,
        "labels": labels,
        "shifts": list(plan.shifts),
        "site": "attn_input",
        "definitions": "docs/method.md#resolution-extrapolation",
    }


def _resumed(resume: ExtrapolationResult | None, recorded: dict[str, Any]) -> list[ExtrapolationRow]:
    """The rows of ``resume`` (none without one); ExtrapolationError when it was measured with other settings."""
    if resume is None:
        return []
    changed = [k for k in SETTING_KEYS if resume.settings.get(k) != recorded[k]]
    if changed:
        diff = "; ".join(f"{k}: {resume.settings.get(k)!r} -> {recorded[k]!r}" for k in changed)
        raise SettingsChangedError(f"the rows to resume were measured with other settings ({diff}): never mixed")
    return list(resume.rows)


def _at_training_size(rows: list[ExtrapolationRow], model: nn.Module, size: int, mode: str) -> ExtrapolationRow | None:
    """At the training size every mode is the model itself: a row measured there already, under this mode's
    name (the same numbers); None elsewhere or before the first."""
    if (size, size) != training_size(model):
        return None
    done = next((r for r in rows if r.size == size), None)
    if done is None:
        return None
    from dataclasses import replace

    return replace(done, mode=mode, seconds=0.0)


def _measure_row(model: nn.Module, images: Any, size: int, mode: str, plan: _Plan) -> ExtrapolationRow:
    """Every measure of one (size, mode), the model carried there for them."""
    from ..probes import attention_measures, probe_ssdc
    from ..probes.attention_measures import AttentionEntropy, MeanAttentionDistance
    from ..robustness import fragility

    started = time.perf_counter()
    at_size = plan.settings.replace(img_size=size)
    probe = at_size.replace(max_images=plan.probe_images)
    with at_input_size(model, size, mode):
        top1 = fragility(
            model, images, plan.shifts, labels="as-is", settings=at_size.replace(max_images=plan.top1_images)
        )
        loader = plan.batches_at(model, images, size)
        clean = probe_ssdc(model, loader, settings=probe)
        rpi = probe_ssdc(model, loader, rpi=True, settings=probe)
        # the two measures a row holds: attention SSDC per head (the third default) costs a float64 sum of every
        # head's map and its ranking, as much again as these two at a 28 x 28 grid
        attention = attention_measures(
            model, loader, measures=[MeanAttentionDistance(), AttentionEntropy()], settings=probe
        )
    tokens = attention.settings["grid_size"][0] * attention.settings["grid_size"][1]
    return ExtrapolationRow(
        size=size,
        mode=mode,
        scale=size / training_size(model)[0],
        grid=list(attention.settings["grid_size"]),
        top1=top1.clean_accuracy,
        top1_ci=top1.clean_interval,
        top1_images=plan.top1_images,
        ssdc=list(clean.per_layer),
        ssdc_ci=list(clean.per_layer_ci or []),
        rpi_ssdc=list(rpi.per_layer),
        rpi_ssdc_ci=list(rpi.per_layer_ci or []),
        delta_ssdc=rpi.delta,
        delta_ssdc_ci=rpi.delta_ci,
        entropy=[float(v) for v in attention.head_mean("entropy")],
        uniform_entropy=math.log(tokens + attention.settings["num_prefix_tokens"]),
        mean_distance=[float(v) for v in attention.head_mean("mean_distance")],
        probe_images=plan.probe_images,
        fs=dict(top1.fs),
        fs_ci={k: (float(v[0]), float(v[1])) for k, v in top1.fs_interval.items()},
        seconds=time.perf_counter() - started,
    )
