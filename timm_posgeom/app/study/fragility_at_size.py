"""The study's fragility with the shifts at a fixed size (``StudyConfig.shift_size``, the paper's 224 px), measured
beside the model-input numbers (``eval.json``'s ``fs``), which it never replaces: its record."""

from __future__ import annotations

from typing import Any

import torch

from ...protocol import Protocol, measure_model
from ..records import FragilityAtSize
from .config import StudyConfig, StudyError

__all__ = ["fragility_at_size", "at_size_record"]


def at_size_record(res: Any, protocol: Protocol) -> FragilityAtSize:
    """The record of a fragility measured with the shifts at ``protocol.shift_size`` px (a
    :class:`~timm_posgeom.robustness.FragilityResult`): clean top-1, top-1 and FS per shift with FS's interval."""
    assert protocol.shift_size is not None  # measured only when the protocol asks for it
    return FragilityAtSize(
        shift_size=int(protocol.shift_size),
        clean_accuracy=res.clean_accuracy,
        accuracy=dict(res.accuracy),
        fs=dict(res.fs),
        fs_interval={k: list(v) for k, v in res.fs_interval.items()},
        num_images=res.num_images,
    )


def fragility_at_size(model: torch.nn.Module, val: Any, config: StudyConfig) -> FragilityAtSize:
    """Clean top-1, top-1 and FS per shift applied at ``config.shift_size`` px (:func:`timm_posgeom.robustness.
    fragility`'s ``shift_size``), on the images the model-input fragility reads, under the study's protocol."""
    protocol = config.protocol()
    measured = measure_model(model, val, protocol, parts=("fragility_at_size",))
    if measured.fragility_at_size is None:
        raise StudyError(f"fragility at {config.shift_size} px not measured: {'; '.join(measured.notes)}")
    return at_size_record(measured.fragility_at_size, protocol)
