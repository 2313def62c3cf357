"""Evaluation transforms with an optional distribution shift between the resize and normalisation.

The order is fixed, as in the paper: RGB -> resize to the model's input -> shift (JPEG, blur) on
the uint8 image -> to tensor -> normalise with the model's mean / std. Two resize conventions:

* ``paper``: straight to the input size (H, W), aspect ratio not kept, no crop (the paper resizes
  every image straight to 224 x 224);
* ``timm``: timm's eval geometry from the data config (resize by ``crop_pct``, ``crop_mode``,
  centre crop), exactly as ``timm.data.create_transform(**cfg, is_training=False)`` builds it.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import PIL.Image
import torch
import torch.nn as nn
import torchvision.transforms as T
from timm.data import resolve_data_config, resolve_model_data_config
from timm.data.transforms import MaybePILToTensor, str_to_interp_mode
from timm.data.transforms_factory import transforms_imagenet_eval

from .shifts import Shift, parse_shift

__all__ = ["eval_transform", "resize_transform", "resolve_config", "normalize_batch", "RESIZE_MODES"]

RESIZE_MODES = ("paper", "timm")


def resolve_config(data_config_or_model: Mapping[str, Any] | nn.Module,
                   img_size: int | Sequence[int] | None = None) -> dict[str, Any]:
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
        patch_embed = getattr(data_config_or_model, "patch_embed", None)
        if patch_embed is None:  # twins and pvt-style models: one patch embedding per stage, the first sees the image
            embeds = getattr(data_config_or_model, "patch_embeds", None)
            patch_embed = embeds[0] if isinstance(embeds, nn.ModuleList) and len(embeds) else None
        fixed = getattr(patch_embed, "img_size", None)
        dynamic = bool(getattr(data_config_or_model, "dynamic_img_size", False))
        if isinstance(fixed, (tuple, list)) and len(fixed) == 2 and all(isinstance(v, int) for v in fixed) \
                and not dynamic:
            cfg["input_size"] = (cfg["input_size"][0], *fixed)
            if img_size is not None and getattr(patch_embed, "strict_img_size", False) \
                    and _size_pair(img_size) != tuple(fixed):
                name = type(data_config_or_model).__name__
                raise ValueError(f"{name} takes only {fixed[0]}x{fixed[1]} images, not {_size_pair(img_size)}: "
                                 f"build it for that size (timm.create_model(..., img_size=...), or --img-size on "
                                 "the command line) or with dynamic_img_size=True")
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
        raise ValueError(f"img_size must be S or (H, W) with sides >= 1, got {img_size!r}")
    return pair


class _ToRGB:
    """PIL image to mode RGB (grayscale, CMYK, palette and RGBA images happen in real datasets)."""

    def __call__(self, image: PIL.Image.Image) -> PIL.Image.Image:
        return image if image.mode == "RGB" else image.convert("RGB")

    def __repr__(self) -> str:
        return "ToRGB()"


def resize_transform(data_config_or_model: Mapping[str, Any] | nn.Module, resize: str = "paper") -> T.Compose:
    """PIL -> PIL RGB image of the model's input size ``(H, W)`` (``resize`` = paper or timm)."""
    if resize not in RESIZE_MODES:
        raise ValueError(f"resize must be one of {', '.join(RESIZE_MODES)}, got {resize!r}")
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
    shift on the uint8 image (a spec such as ``"jpeg:5"`` or a :class:`~timm_posgeom.shifts.Shift`),
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
