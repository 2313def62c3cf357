"""The study's fragility with the shifts at a fixed size (``StudyConfig.shift_size``, the paper's 224 px), measured
beside the model-input numbers (``eval.json``'s ``fs``), which it never replaces."""

from __future__ import annotations

from typing import Any

import torch

from ..records import FragilityAtSize
from .config import StudyConfig

__all__ = ["fragility_at_size"]


def fragility_at_size(model: torch.nn.Module, val: Any, config: StudyConfig) -> FragilityAtSize:
    """Clean top-1, top-1 and FS per shift of ``config.shifts`` applied at ``config.shift_size`` px
    (:func:`timm_posgeom.robustness.fragility`'s ``shift_size``), on the images the model-input fragility reads."""
    from ... import robustness

    assert config.shift_size is not None  # measured only when the study asks for it
    res = robustness.fragility(
        model,
        val,
        list(config.shifts),
        batch_size=config.batch_size,
        max_images=config.eval_images,
        num_workers=config.workers,
        device=config.device,
        progress=False,
        shift_size=config.shift_size,
    )
    return FragilityAtSize(
        shift_size=int(config.shift_size),
        clean_accuracy=res.clean_accuracy,
        accuracy=dict(res.accuracy),
        fs=dict(res.fs),
        fs_interval={k: list(v) for k, v in res.fs_interval.items()},
        num_images=res.num_images,
    )
