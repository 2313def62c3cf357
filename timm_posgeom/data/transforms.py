"""Evaluation transforms with an optional distribution shift between the resize and normalisation.

The order is fixed, as in the paper: RGB -> resize to the model's input -> shift (JPEG, blur) on
the uint8 image -> to tensor -> normalise with the model's mean / std. Two resize conventions:

* ``paper``: straight to the input size (H, W), aspect ratio not kept, no crop (the paper resizes
  every image straight to 224 x 224);
* ``timm``: timm's eval geometry from the data config (resize by ``crop_pct``, ``crop_mode``,
  centre crop), exactly as ``timm.data.create_transform(**cfg, is_training=False)`` builds it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import PIL.Image
import torch
import torch.nn as nn
import torchvision.transforms as T
from timm.data import resolve_data_config, resolve_model_data_config
from timm.data.transforms import MaybePILToTensor, str_to_interp_mode
from timm.data.transforms_factory import transforms_imagenet_eval

from ..errors import DataError, PosgeomError, SettingError
from ..interventions import vlm_encoder
from .shifts import Shift, parse_shift

__all__ = [
    "eval_transform",
    "resize_transform",
    "resolve_config",
    "normalize_batch",
    "RESIZE_MODES",
    "to_rgb",
    "class_index",
    "ImageModeError",
    "ALPHA_BACKGROUND",
]

RESIZE_MODES = ("paper", "timm")


def resolve_config(
    data_config_or_model: Mapping[str, Any] | nn.Module, img_size: int | Sequence[int] | None = None
) -> dict[str, Any]:
    """A full timm data config (input_size, interpolation, mean, std, crop_pct, crop_mode).

    A model gives ``timm.data.resolve_model_data_config(model)``, with ``input_size`` taken from
    ``model.patch_embed.img_size`` (twins: ``patch_embeds[0]``) when the model was built at another size than its pretrained
    config says (``timm.create_model(..., img_size=32)``) and has no dynamic image size; a (partial)
    dict is completed with timm's defaults by ``timm.data.resolve_data_config``.

    ``img_size`` (S or (H, W)) sets the input size: for models that take any size (dynamic-size ViTs
    such as naflexvit, CNNs, ``dynamic_img_size=True``). A model with one fixed input size other than
    ``img_size`` is refused (ValueError): build it at that size instead.
    """
    if isinstance(data_config_or_model, nn.Module):
        cfg = dict(resolve_model_data_config(data_config_or_model))
        patch_embed = getattr(vlm_encoder(data_config_or_model), "patch_embed", None)  # VLM towers: in `encoder`
        if patch_embed is None:  # twins and pvt-style models: one patch embedding per stage, the first sees the image
            embeds = getattr(data_config_or_model, "patch_embeds", None)
            patch_embed = embeds[0] if isinstance(embeds, nn.ModuleList) and len(embeds) else None
        fixed = getattr(patch_embed, "img_size", None)
        dynamic = bool(getattr(data_config_or_model, "dynamic_img_size", False))
        if (
            isinstance(fixed, (tuple, list))
            and len(fixed) == 2
            and all(isinstance(v, int) for v in fixed)
            and not dynamic
        ):
            cfg["input_size"] = (cfg["input_size"][0], *fixed)
            if (
                img_size is not None
                and getattr(patch_embed, "strict_img_size", False)
                and _size_pair(img_size) != tuple(fixed)
            ):
                name = type(data_config_or_model).__name__
                raise SettingError(
                    f"{name} takes only {fixed[0]}x{fixed[1]} images, not {_size_pair(img_size)}: "
                    f"build it for that size (timm.create_model(..., img_size=...), or --img-size on "
                    "the command line) or with dynamic_img_size=True"
                )
    elif isinstance(data_config_or_model, Mapping):
        cfg = dict(resolve_data_config(dict(data_config_or_model)))
    else:
        raise TypeError(f"expected a timm data config (dict) or a model, got {type(data_config_or_model).__name__}")
    if img_size is not None:
        cfg["input_size"] = (cfg["input_size"][0], *_size_pair(img_size))
    return cfg


def _size_pair(img_size: int | Sequence[int]) -> tuple[int, int]:
    """S -> (S, S); (H, W) -> (H, W); ValueError for anything else or a size below 1."""
    pair = (int(img_size), int(img_size)) if isinstance(img_size, int) else tuple(int(v) for v in img_size)
    if len(pair) != 2 or min(pair) < 1:
        raise SettingError(f"img_size must be S or (H, W) with sides >= 1, got {img_size!r}")
    return pair


class ImageModeError(PosgeomError, ValueError):
    """An image whose pixel values cannot be read as colours without a guess (32-bit float, unknown modes)."""


# Background that transparent pixels are composited onto: what they show in most viewers. Dropping the alpha
# channel instead shows whatever colour the file stores under a transparent pixel (often black, or garbage).
ALPHA_BACKGROUND = (255, 255, 255)
_SIXTEEN_BIT = ("I;16", "I;16L", "I;16B", "I;16N", "I")


def to_rgb(image: PIL.Image.Image) -> PIL.Image.Image:
    """``image`` as an 8-bit RGB PIL image, whatever its mode.

    Pillow's ``convert("RGB")`` clips integer images at 255: a 16-bit grayscale PNG (mode ``I;16``, or
    ``I`` from older Pillows) became 99% white. Here 16-bit values are scaled to 8 bit (``v / 257``,
    rounded: 65535 -> 255), an ``I`` image with values outside 0..65535 is refused, images with an alpha
    channel (``RGBA``, ``LA``, ``PA``, palette with transparency) are composited onto white
    (:data:`ALPHA_BACKGROUND`), and the other modes (``1``, ``L``, ``P``, ``CMYK``, ``YCbCr``, ``LAB``,
    ``HSV``) go through Pillow's conversion. 32-bit float images (``F``) have no fixed range and are
    refused (:class:`ImageModeError`), as is any mode Pillow cannot convert.
    """
    mode = image.mode
    if mode == "RGB":
        return image
    if mode in _SIXTEEN_BIT:
        values = np.asarray(image).astype(np.int64)
        if values.size and (values.min() < 0 or values.max() > 65535):
            raise ImageModeError(
                f"a 32-bit integer image (mode I) with values {values.min()}..{values.max()}, "
                "outside the 16-bit range: convert it to 8-bit RGB first"
            )
        eight = ((values * 255 + 32767) // 65535).astype(np.uint8)  # round(v / 257)
        return PIL.Image.fromarray(eight, mode="L").convert("RGB")
    if mode == "F":
        raise ImageModeError("a 32-bit float image (mode F) has no fixed value range: convert it to 8-bit RGB first")
    has_alpha = mode in ("RGBA", "RGBa", "LA", "La", "PA") or (mode == "P" and "transparency" in image.info)
    try:
        if has_alpha:
            rgba = image.convert("RGBA")
            background = PIL.Image.new("RGBA", rgba.size, (*ALPHA_BACKGROUND, 255))
            return PIL.Image.alpha_composite(background, rgba).convert("RGB")
        return image.convert("RGB")
    except ValueError as e:  # Pillow: "conversion from X to RGB not supported"
        raise ImageModeError(f"an image of mode {mode} cannot be converted to RGB ({e})") from None


def class_index(label: Any) -> int:
    """A label as a class index: an int (or a float / numpy number holding a whole number). A fractional
    label such as 7.7 is refused (ValueError): truncating it to 7 would score against the wrong class."""
    if isinstance(label, bool) or label is None:
        raise DataError(f"label {label!r} is not a class index (an integer)")
    if isinstance(label, (int, np.integer)):
        return int(label)
    if isinstance(label, (float, np.floating)) and math.isfinite(label) and float(label).is_integer():
        return int(label)
    if isinstance(label, torch.Tensor) and label.numel() == 1 and not label.is_floating_point():
        return int(label)
    raise DataError(
        f"label {label!r} is not a class index (an integer): the data's label column must hold whole numbers"
    )


class _ToRGB:
    """PIL image to 8-bit RGB with :func:`to_rgb` (16-bit, palette, CMYK and RGBA images happen in real data)."""

    def __call__(self, image: PIL.Image.Image) -> PIL.Image.Image:
        return to_rgb(image)

    def __repr__(self) -> str:
        return "ToRGB()"


def resize_transform(data_config_or_model: Mapping[str, Any] | nn.Module, resize: str = "paper") -> T.Compose:
    """PIL -> PIL RGB image of the model's input size ``(H, W)`` (``resize`` = paper or timm)."""
    if resize not in RESIZE_MODES:
        raise SettingError(f"resize must be one of {', '.join(RESIZE_MODES)}, got {resize!r}")
    cfg = resolve_config(data_config_or_model)
    _, height, width = cfg["input_size"]
    if resize == "paper":
        steps = [T.Resize((height, width), interpolation=str_to_interp_mode(cfg["interpolation"]))]
    else:
        timm_eval = transforms_imagenet_eval(
            img_size=(height, width),
            crop_pct=cfg.get("crop_pct"),
            crop_mode=cfg.get("crop_mode"),
            interpolation=cfg["interpolation"],
            use_prefetcher=True,  # ends with MaybePILToTensor: drop it, keep the geometry
            mean=cfg["mean"],
            std=cfg["std"],
        )
        steps = [t for t in timm_eval.transforms if not isinstance(t, MaybePILToTensor)]
    return T.Compose([_ToRGB(), *steps])


def eval_transform(
    data_config_or_model: Mapping[str, Any] | nn.Module,
    resize: str = "paper",
    shift: str | Shift | None = None,
) -> Callable[[PIL.Image.Image], torch.Tensor]:
    """PIL image -> normalised float tensor (3, H, W) for evaluation, with an optional shift.

    Steps: RGB, resize (``paper``: straight to (H, W); ``timm``: timm's resize + centre crop), the
    shift on the uint8 image (a spec such as ``"jpeg:5"`` or a :class:`~timm_posgeom.data.shifts.Shift`),
    ``ToTensor`` (x / 255), ``Normalize(mean, std)`` of the data config.

    Args:
        data_config_or_model: a timm data config (dict) or a model (its config is resolved).
        resize: ``paper`` or ``timm``.
        shift: None for clean images.
    """
    cfg = resolve_config(data_config_or_model)
    steps: list[Callable] = list(resize_transform(cfg, resize).transforms)
    if shift is not None:
        steps.append(parse_shift(shift))
    steps += [T.ToTensor(), T.Normalize(mean=cfg["mean"], std=cfg["std"])]
    return T.Compose(steps)


def normalize_batch(images: torch.Tensor, mean: tuple[float, ...], std: tuple[float, ...]) -> torch.Tensor:
    """uint8 (B, C, H, W) -> float32 ``(x / 255 - mean) / std``, the same operations as
    ``ToTensor`` + ``Normalize`` (so the same values bit for bit), on the batch's device."""
    x = images.to(torch.float32).div(255)
    mean_t = torch.as_tensor(mean, dtype=x.dtype, device=x.device).view(-1, 1, 1)
    std_t = torch.as_tensor(std, dtype=x.dtype, device=x.device).view(-1, 1, 1)
    return x.sub(mean_t).div(std_t)
