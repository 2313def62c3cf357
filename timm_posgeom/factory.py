"""Create a model to measure from any source: a timm name, ``hf-hub:ORG/NAME`` or ``local-dir:PATH``.

Our own models are registered with timm by importing :mod:`timm_posgeom.models` (done here), so
``local-dir:`` exports of our runs and ``hf-hub:`` repos of them load like any timm model.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch.nn as nn

from . import models as _models  # noqa: F401  (registers this package's models with timm)

__all__ = ["create_model", "unknown_model_message", "WEIGHTED_PREFIXES"]

# Sources that always load their weights (a Hub repo or an exported folder is its weights).
WEIGHTED_PREFIXES = ("hf-hub:", "hf_hub:", "local-dir:")


def unknown_model_message(name: str) -> str:
    """One line for a name timm does not know, with the closest known names (ours included)."""
    import difflib

    import timm

    close = difflib.get_close_matches(name.split(".")[0], timm.list_models(), n=3, cutoff=0.6)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    return (f"unknown model {name!r}: {hint}(timm.list_models('*pattern*') lists timm's names, `posgeom models` "
            "ours; hf-hub:ORG/NAME and local-dir:PATH load saved models)")


def create_model(
        name: str,
        *,
        pretrained: bool = False,
        checkpoint: str | None = None,
        img_size: int | None = None,
        num_classes: int | None = None,
        **kwargs: Any,
) -> nn.Module:
    """``timm.create_model`` for a name, ``hf-hub:`` or ``local-dir:`` (those two load their weights).

    Args:
        name: a timm model name (ours included), ``hf-hub:ORG/NAME`` or ``local-dir:PATH``.
        pretrained: load the timm name's pretrained weights.
        checkpoint: a checkpoint file loaded into the model (``timm``'s ``checkpoint_path``).
        img_size: build the model for ``img_size x img_size`` inputs (ViTs with a fixed grid); a model
            whose constructor takes no ``img_size`` (CNNs, ...) is built without it: it takes any size.
        num_classes: classifier size.

    Raises:
        ValueError: an unknown model name (one line, no traceback).
        FileNotFoundError: a missing checkpoint or ``local-dir:`` folder.
    """
    import timm

    if checkpoint is not None and not Path(checkpoint).is_file():
        raise FileNotFoundError(f"checkpoint not found: {checkpoint}")
    weighted = name.startswith(WEIGHTED_PREFIXES)
    if name.startswith("local-dir:"):
        folder = Path(name.split(":", 1)[1]).expanduser()
        if not (folder / "config.json").is_file():
            raise FileNotFoundError(f"{name}: no config.json in {folder} (an exported run holds config.json and "
                                    "model.safetensors, e.g. RUN_DIR/export)")
    elif not weighted and not timm.is_model(name):
        raise ValueError(unknown_model_message(name))
    if num_classes is not None:
        kwargs["num_classes"] = num_classes
    create = dict(pretrained=pretrained or weighted, checkpoint_path=checkpoint or "")
    if img_size is None:
        return timm.create_model(name, **create, **kwargs)
    try:
        return timm.create_model(name, **create, **kwargs, img_size=img_size)
    except TypeError as e:  # a constructor without img_size (CNNs, MLP models with a conv stem): any size runs
        if "img_size" not in str(e):
            raise
    return timm.create_model(name, **create, **kwargs)
