"""The model's train / eval modes around a measurement."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch.nn as nn

__all__ = ["eval_mode"]


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """``model`` in eval mode inside the block; every module's own train / eval mode is restored after,
    even on error (a submodule kept in eval mode, e.g. a frozen norm, stays in eval mode)."""
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        yield model
    finally:
        for module, training in modes:
            module.training = training
