"""Create a model to measure from any source: a timm name, ``hf-hub:ORG/NAME`` or ``local-dir:PATH``.

Our own models are registered with timm by importing :mod:`timm_posgeom.models` (this module's package), so
``local-dir:`` exports of our runs and ``hf-hub:`` repos of them load like any timm model.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch.nn as nn

from ..errors import PathNotFoundError, PosgeomError, SettingError
from ..measuring.settings import MAX_CLASSES, MAX_IMG_SIZE

__all__ = [
    "create_model",
    "unknown_model_message",
    "WEIGHTED_PREFIXES",
    "ModelLoadError",
    "check_patch_multiple",
    "load_checkpoint_file",
    "cached_hub_source",
    "check_export_config",
]

# Sources that always load their weights (a Hub repo or an exported folder is its weights).
WEIGHTED_PREFIXES = ("hf-hub:", "hf_hub:", "local-dir:")


def unknown_model_message(name: str) -> str:
    """One line for a name timm does not know, with the closest known names (ours included)."""
    import difflib

    import timm

    close = difflib.get_close_matches(name.split(".")[0], timm.list_models(), n=3, cutoff=0.6)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    return (
        f"unknown model {name!r}: {hint}(timm.list_models('*pattern*') lists timm's names, `posgeom models` "
        "ours; hf-hub:ORG/NAME and local-dir:PATH load saved models)"
    )


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
        ValueError: an unknown model name, or an ``img_size`` that is not a multiple of a ViT's patch size
            (one line, no traceback).
        ModelLoadError: weights that cannot be loaded (not a checkpoint, truncated, another model's, a Hub
            repo out of reach).
        FileNotFoundError: a missing checkpoint or ``local-dir:`` folder.
    """
    import timm
    from safetensors import SafetensorError

    if checkpoint is not None and not Path(checkpoint).is_file():
        raise PathNotFoundError(f"checkpoint not found: {checkpoint}")
    _check_counts(img_size, num_classes)
    weighted = name.startswith(WEIGHTED_PREFIXES)
    if name.startswith("local-dir:"):
        folder = Path(name.split(":", 1)[1]).expanduser()
        if not (folder / "config.json").is_file():
            raise PathNotFoundError(
                f"{name}: no config.json in {folder} (an exported run holds config.json and "
                "model.safetensors, e.g. RUN_DIR/export)"
            )
        check_export_config(folder / "config.json")
    elif not weighted and not timm.is_model(name):
        raise ModelLoadError(unknown_model_message(name))
    if num_classes is not None:
        kwargs["num_classes"] = num_classes
    try:
        model = _create(cached_hub_source(name), pretrained or weighted, img_size, kwargs)
    except (TypeError, KeyError, AttributeError) as e:
        if not name.startswith("local-dir:"):
            raise
        # config.json read (check_export_config) but naming arguments or values its model does not take
        raise ModelLoadError(
            f"{Path(name.split(':', 1)[1]) / 'config.json'} does not describe a model timm can build "
            f"({type(e).__name__}: {_first_line(e)}): {_EXPORT_HINT}"
        ) from e
    except (OSError, RuntimeError, SafetensorError) as e:
        if not weighted or isinstance(e, FileNotFoundError):
            raise
        # a Hub repo that cannot be reached offline, a truncated or foreign model.safetensors in an export
        raise ModelLoadError(f"cannot load the weights of {name}: {type(e).__name__}: {_first_line(e)}") from e
    if img_size is not None:
        check_patch_multiple(model, img_size)
    if checkpoint is not None:
        load_checkpoint_file(model, checkpoint)
    return model


def _check_counts(img_size: Any, num_classes: Any) -> None:
    """Refuse, before anything is built, an input size or a class count that would build a model of absurd size
    (a position table, a head): at most :data:`~timm_posgeom.measuring.MAX_IMG_SIZE` px and
    :data:`~timm_posgeom.measuring.MAX_CLASSES` classes (0: no head, timm's features)."""
    for name, value, low, top in (
        ("img_size", img_size, 1, MAX_IMG_SIZE),
        ("num_classes", num_classes, 0, MAX_CLASSES),
    ):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not low <= value <= top):
            raise SettingError(f"{name} must be an integer from {low} to {top:,}, got {value!r}")


class ModelLoadError(PosgeomError, ValueError):
    """Weights that cannot be loaded: not a checkpoint, truncated, for another model, or out of reach offline."""


def cached_hub_source(name: str) -> str:
    """``hf-hub:ORG/NAME`` as ``local-dir:`` of its snapshot in the Hugging Face Hub cache when both its
    ``config.json`` and its weights are there (a download or ``posgeom weights restore`` left them): the same files,
    read without the network (timm would ask the Hub first, whose retries take about 25 s offline before it reads
    the same cache). Any other name, a pinned revision (``@REV``) or a repository not cached is returned as it is."""
    from .pretrained import WEIGHTS_FILE, cached_hub_file

    prefix = next((p for p in ("hf-hub:", "hf_hub:") if name.startswith(p)), None)
    if prefix is None or "@" in name:
        return name
    repo_id = name[len(prefix) :]
    config, weights = cached_hub_file(repo_id, "config.json"), cached_hub_file(repo_id, WEIGHTS_FILE)
    if config is None or weights is None or Path(config).parent != Path(weights).parent:
        return name
    return f"local-dir:{Path(config).parent}"


_EXPORT_HINT = "export the model again (timm's save_for_hf, or posgeom train at the end of a run)"
# what timm reads from an export's config.json, and its type
_CONFIG_FIELDS: dict[str, Any] = {"architecture": str, "model_args": dict, "pretrained_cfg": dict, "num_classes": int}


def check_export_config(path: str | os.PathLike) -> None:
    """Refuse an export's ``config.json`` that timm would choke on with a parser's traceback: not text, not JSON,
    not an object, no ``architecture`` name, or ``model_args`` / ``pretrained_cfg`` / ``num_classes`` of the
    wrong type (damaged, truncated, edited by hand): :class:`ModelLoadError`, one line naming the file."""
    import json

    path = Path(path)
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelLoadError(
            f"{path} is not valid JSON (damaged or truncated? {_first_line(e)}): {_EXPORT_HINT}"
        ) from None
    if not isinstance(config, dict):
        raise ModelLoadError(f"{path} holds a JSON {type(config).__name__}, not an object: {_EXPORT_HINT}")
    if "architecture" not in config:
        raise ModelLoadError(f"{path} names no architecture: {_EXPORT_HINT}")
    for key, tp in _CONFIG_FIELDS.items():
        value = config.get(key, tp())
        if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
            raise ModelLoadError(f"{path}: {key} holds {value!r}, not a {tp.__name__} (edited?): {_EXPORT_HINT}")


def _first_line(error: BaseException) -> str:
    lines = [line for line in str(error).strip().splitlines() if line.strip()]
    return lines[0].strip() if lines else ""


def _create(name: str, pretrained: bool, img_size: int | None, kwargs: dict[str, Any]) -> nn.Module:
    import timm

    if img_size is None:
        return timm.create_model(name, pretrained=pretrained, **kwargs)
    try:
        return timm.create_model(name, pretrained=pretrained, **kwargs, img_size=img_size)
    except TypeError as e:  # a constructor without img_size (CNNs, MLP models with a conv stem): any size runs
        if "img_size" not in str(e):
            raise
    return timm.create_model(name, pretrained=pretrained, **kwargs)


def check_patch_multiple(model: nn.Module, img_size: int) -> None:
    """Refuse an input size that is not a multiple of a ViT's patch size: its patch embedding (a strided
    convolution) would silently drop the last ``img_size % patch`` rows and columns of every image."""
    embed = getattr(model, "patch_embed", None)
    patch = getattr(embed, "patch_size", None)
    if not isinstance(patch, (tuple, list)) or len(patch) != 2:
        return
    ph, pw = (int(v) for v in patch)
    if img_size % ph or img_size % pw:
        step = max(ph, pw)
        lower, upper = img_size // step * step, (img_size // step + 1) * step
        raise SettingError(
            f"image size {img_size} is not a multiple of the patch size {ph}x{pw} of "
            f"{type(model).__name__}: the last {img_size % step} pixel rows and columns would be dropped "
            f"unseen; use {lower or upper} or {upper}"
        )


def load_checkpoint_file(model: nn.Module, checkpoint: str | os.PathLike) -> None:
    """Load a checkpoint file into ``model`` (timm's ``load_checkpoint``: a state dict, a training checkpoint
    with ``state_dict`` / ``model`` / ``state_dict_ema``, or safetensors); :class:`ModelLoadError` in one line
    for a file that is not a checkpoint, is truncated, or holds another model's weights."""
    from timm.models import load_checkpoint

    try:
        load_checkpoint(model, str(checkpoint))
    except Exception as e:  # noqa: BLE001  garbage fed to an unpickler raises anything (IndexError, KeyError, ...)
        if isinstance(e, FileNotFoundError):
            raise
        mismatch = isinstance(e, RuntimeError) and ("Missing key" in str(e) or "size mismatch" in str(e))
        if not mismatch:
            raise ModelLoadError(
                f"{checkpoint} is not a checkpoint this model can load ({type(e).__name__}: "
                f"{_first_line(e)}): pass a file written by torch.save or safetensors, such as a "
                "run's checkpoints/*/model.safetensors or export/model.safetensors"
            ) from e
        raise ModelLoadError(
            f"{checkpoint} holds the weights of another model than {type(model).__name__} "
            f"({_first_line(e)[:200]}): build the model it was trained as (name, --num-classes, "
            "--img-size)"
        ) from e
