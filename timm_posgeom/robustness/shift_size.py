"""Shifts applied at a fixed resolution, before the resize to the model's input
(docs/method.md#fragility-score-and-shifts).

The paper applies JPEG and blur to 224-px images, the model's input. A model that reads fewer pixels (the 8 x 8
studies: 64-px inputs made from 224-px Imagenette) sees a shift applied to its own input change more of the image:
a JPEG block is 8 x 8 px, 1/64 of a 64-px image against 1/784 of a 224-px one, and a blur of sigma 2.5 px
covers 3.5 times more of the scene. With ``shift_size=S``, :func:`~timm_posgeom.robustness.fragility` makes
every copy of image i as

    clean_i   = model_resize(pre_S(image_i))
    shifted_i = model_resize(shift(pre_S(image_i)))

where ``pre_S`` resizes straight to S x S with the model's interpolation (PIL's resize; an image already S x S
is left as it is, so at S = 224 the 224-px Imagenette images are shifted as stored) and ``model_resize`` is the
model's own eval geometry (``resize="paper"`` or ``"timm"``). The clean copy takes the same two resizes as the
shifted ones, so the pairs differ by the shift alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import PIL.Image
import torch
from torch.utils.data import Dataset
from torchvision.transforms.v2 import functional as F

from ..data.eval_data import prepare_shared, resized_item
from ..data.shifts import Shift
from ..data.transforms import resize_transform
from ..errors import SettingError
from ..measuring.settings import MAX_IMG_SIZE

__all__ = ["check_shift_size", "pre_resize", "ShiftedAtSize"]


def check_shift_size(shift_size: Any, on_device: bool = False) -> int | None:
    """``shift_size`` as an int >= 1 or None; ValueError otherwise, or with shifts run on the device (those
    shift the batch at the model's input)."""
    if shift_size is None:
        return None
    if isinstance(shift_size, bool) or not isinstance(shift_size, int) or not 1 <= shift_size <= MAX_IMG_SIZE:
        raise SettingError(f"shift_size must be a size in px from 1 to {MAX_IMG_SIZE} or None, got {shift_size!r}")
    if on_device:
        raise SettingError("blur_on_device blurs the batch at the model's input: it cannot apply a shift at shift_size")
    return int(shift_size)


def pre_resize(cfg: Mapping[str, Any], shift_size: int) -> Any:
    """PIL -> PIL RGB ``shift_size`` x ``shift_size``, straight, with the interpolation of ``cfg`` (a resolved
    timm data config): the geometry :func:`~timm_posgeom.data.transforms.resize_transform` gives a model of that size."""
    return resize_transform(dict(cfg, input_size=(3, shift_size, shift_size)), "paper")


def _as_pil(image: Any, mode: str) -> PIL.Image.Image:
    return image if isinstance(image, PIL.Image.Image) else F.to_pil_image(image, mode=mode)


class ShiftedAtSize(Dataset):
    """Item i -> ((V, C, H, W) uint8, label, i): image i resized straight to ``shift_size`` (``pre``), clean and
    through each shift (``shift.for_image(image, i, seed)``), then each copy through the model's ``resize``
    (see the module docstring). The pre-resized image of a :class:`~timm_posgeom.data.eval_data.DecodedImages`
    is computed once and shared, as the model-input images are."""

    def __init__(self, data: Any, n: int, pre: Any, resize: Any, shifts: Sequence[Shift], seed: int = 0):
        self.data, self.n, self.pre, self.resize = data, n, pre, resize
        self.shifts, self.seed = list(shifts), seed
        prepare_shared(data, pre)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int, int]:
        image, label = resized_item(self.data, index, self.pre)
        copies = [image, *(_as_pil(s.for_image(image, index, self.seed), image.mode) for s in self.shifts)]
        return torch.stack([F.pil_to_tensor(self.resize(c)) for c in copies]), label, index
