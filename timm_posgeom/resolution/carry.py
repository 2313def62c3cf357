"""How a ViT is carried to an input size it was not trained at: the modes, and the context manager that applies one.

A *mode* says how each positional encoding (PE) is carried from the training grid G to a new grid G'
(docs/method.md#resolution-extrapolation):

* ``ape-bilinear``, ``ape-bicubic``, ``ape-bilinear-aa``, ``ape-bicubic-aa``: a learned absolute table
  resampled by timm's ``resample_abs_pos_embed`` (bilinear or bicubic, antialias off or on; prefix rows kept);
* ``sincos-rebuild`` (the 2-D sincos table computed at G', as a model built there has it) or ``sincos-interp``
  (the training table resampled bicubic with antialias, as timm resamples any table);
* ``rope-native`` (the rotation positions extend: token (i, j) of G' rotates by (i, j), in the training grid's
  units) or ``rope-interp`` (position interpolation: the coordinates scaled into the trained range, token
  (i, j) rotates by (i G / G', j G / G'); timm's RoPE ``ref_feat_shape``);
* ``timm``: timm's own behaviour: ``set_input_size`` for a model built for one size, nothing for a model that
  takes any size (``dynamic_img_size``, naflexvit); DINOv3's normalised RoPE coordinates, naflexvit's grid;
* ``none``: a model without PE (the control): only the input size changes.

A mode names one encoding; any other encoding of the model (EVA02 holds an APE and a RoPE) is carried as timm
carries it (APE: bicubic with antialias; RoPE: its coordinates unchanged; sincos: rebuilt). At the training size
every mode is the model itself: nothing is changed.

:func:`at_input_size` applies a mode for the ``with`` block and restores the model exactly: every module's
attributes, parameters, buffers, submodules and hooks are put back as they were (the same objects, no copy of
any weight is made), and nothing of the caller's is written in place: the resampled tables are new tensors.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any, cast

import torch
import torch.nn as nn

from ..errors import PosgeomError

__all__ = [
    "MODES",
    "MODE_HELP",
    "ExtrapolationError",
    "at_input_size",
    "model_modes",
    "check_modes",
    "training_size",
    "patch_size",
    "ModuleState",
]

MODE_HELP = {
    "none": "no positional encoding (the control): only the input size changes",
    "timm": "timm's own behaviour: set_input_size, or the model's dynamic size",
    "ape-bilinear": "the APE table resampled bilinearly, no antialias",
    "ape-bicubic": "the APE table resampled bicubically, no antialias",
    "ape-bilinear-aa": "the APE table resampled bilinearly with antialias",
    "ape-bicubic-aa": "the APE table resampled bicubically with antialias (timm's default)",
    "sincos-rebuild": "the sincos table computed at the new grid (a model built there)",
    "sincos-interp": "the training sincos table resampled (bicubic, antialias)",
    "rope-native": "RoPE positions extend past the training grid",
    "rope-interp": "RoPE position interpolation: coordinates scaled into the trained range",
}
MODES = tuple(MODE_HELP)
"""Every mode, in the order the rows of a result list them (:data:`MODE_HELP` says what each does)."""
_TABLE_RESAMPLE = {  # mode -> (interpolation, antialias) of resample_abs_pos_embed
    "ape-bilinear": ("bilinear", False),
    "ape-bicubic": ("bicubic", False),
    "ape-bilinear-aa": ("bilinear", True),
    "ape-bicubic-aa": ("bicubic", True),
}
_TIMM_RESAMPLE = ("bicubic", True)  # what timm's set_input_size and dynamic sizes do to a table


class ExtrapolationError(PosgeomError, ValueError):
    """A model, size or mode that resolution extrapolation cannot use (one line: which, and why)."""


def patch_size(model: nn.Module) -> tuple[int, int]:
    """The (h, w) patch size of a ViT (``patch_embed``, or naflexvit's ``embeds``)."""
    embed = getattr(model, "patch_embed", None) or getattr(model, "embeds", None)
    size = getattr(embed, "patch_size", None)
    if size is None:
        raise ExtrapolationError(
            f"{type(model).__name__} has no patch embedding (patch_embed): resolution extrapolation needs a ViT "
            "whose input size sets its token grid"
        )
    pair = (size, size) if isinstance(size, int) else tuple(size)
    return int(pair[0]), int(pair[1])


def training_size(model: nn.Module) -> tuple[int, int]:
    """The (H, W) input size the model was built for: its patch embedding's ``img_size``, else the input size of
    its data config (naflexvit)."""
    size = getattr(getattr(model, "patch_embed", None), "img_size", None)
    if size is None:
        from timm.data import resolve_model_data_config

        size = resolve_model_data_config(model)["input_size"][1:]
    pair = (size, size) if isinstance(size, int) else tuple(size)
    return int(pair[0]), int(pair[1])


def _dynamic(model: nn.Module) -> bool:
    """Whether the model takes any input size as it is (``dynamic_img_size``, naflexvit)."""
    return bool(getattr(model, "dynamic_img_size", False)) or type(model).__name__ == "NaFlexVit"


def _ape(model: nn.Module) -> torch.Tensor | None:
    """The model's learned absolute table (1, prefix + N, C) when a mode can resample it, else None."""
    table = getattr(model, "pos_embed", None)
    embed = getattr(model, "patch_embed", None)
    if not isinstance(table, nn.Parameter) or table.ndim != 3 or not hasattr(embed, "set_input_size"):
        return None
    return table


def _sincos(model: nn.Module) -> torch.Tensor | None:
    """The fixed 2-D sincos table of a ``PosGeomViT`` (1, N, C), else None."""
    table = getattr(model, "sincos_embed", None)
    return table if isinstance(table, torch.Tensor) else None


def _rope(model: nn.Module) -> Any:
    """The model's axial RoPE on an index grid (timm's ``RotaryEmbedding`` / ``RotaryEmbeddingCat``, ours
    included), whose coordinates a mode can set; None for any other (DINOv3's are normalised to [-1, 1])."""
    from timm.layers import RotaryEmbedding, RotaryEmbeddingCat

    rope = getattr(model, "rope", None)
    if isinstance(rope, (RotaryEmbedding, RotaryEmbeddingCat)) and getattr(rope, "grid_type", None) == "index":
        return rope
    return None


def _has_pe(model: nn.Module) -> bool:
    pe = getattr(model, "pe", None)
    if isinstance(pe, str):  # a PosGeomViT says what it holds
        return pe != "none"
    from ..interventions import pe_inventory

    return bool(pe_inventory(model))


def model_modes(model: nn.Module) -> tuple[str, ...]:
    """The modes that apply to ``model``, in :data:`MODES` order: ``none`` for a model without PE; else each
    mode of the encodings a mode can set, and ``timm`` for a model not of this package (for ours ``timm`` is
    ``ape-bicubic-aa``, ``sincos-rebuild`` or ``rope-native``, the same function: asked by name only)."""
    _check_resizable(model)
    if not _has_pe(model):
        return ("none",)
    ours = isinstance(getattr(model, "pe", None), str)
    found = [m for m in MODES if m not in ("none", "timm") and _reason_not(model, m) is None]
    return tuple(([] if ours and found else ["timm"]) + found)


def _check_resizable(model: nn.Module) -> None:
    """ExtrapolationError (one line) unless the model's input size can change."""
    patch_size(model)
    if not (_dynamic(model) or hasattr(model, "set_input_size")):
        raise ExtrapolationError(
            f"{type(model).__name__} cannot change its input size: it has neither dynamic_img_size nor "
            "set_input_size (timm's ViTs have both)"
        )


def _reason_not(model: nn.Module, mode: str) -> str | None:
    """Why ``mode`` does not apply to ``model``, or None when it does."""
    if mode not in MODE_HELP:
        return f"unknown mode {mode!r}; expected one of {', '.join(MODES)}"
    family = mode.split("-")[0]
    if family == "none" and _has_pe(model):
        return "mode none is the control for a model without positional encoding, and this one has one"
    if family == "ape" and _ape(model) is None:
        return f"mode {mode} resamples a learned absolute table (pos_embed), and this model has none"
    if family == "sincos" and _sincos(model) is None:
        return f"mode {mode} carries a fixed 2-D sincos table (PosGeomViT pe='sincos'), and this model has none"
    if family == "rope" and _rope(model) is None:
        return (
            f"mode {mode} sets the coordinates of an axial RoPE on an index grid, and this model has none "
            "(DINOv3's RoPE coordinates are normalised to [-1, 1] already: mode timm)"
        )
    if family in ("ape", "sincos", "rope") and not hasattr(getattr(model, "patch_embed", None), "set_input_size"):
        return f"mode {mode} needs a patch_embed with set_input_size (timm's PatchEmbed)"
    return None


def check_modes(model: nn.Module, modes: str | Sequence[str] | None) -> tuple[str, ...]:
    """The modes to measure: ``None`` or ``"auto"`` gives :func:`model_modes`; a list (or a comma-separated
    string) is checked against the model, distinct. ExtrapolationError (one line) for a mode that does not apply."""
    if modes is None or modes == "auto":
        return model_modes(model)
    asked = [m.strip() for m in modes.split(",")] if isinstance(modes, str) else [str(m) for m in modes]
    asked = [m for m in asked if m]
    if not asked:
        raise ExtrapolationError("no mode given: name at least one, or 'auto' (every mode the model takes)")
    if len(set(asked)) != len(asked):
        raise ExtrapolationError(f"modes must be distinct, got {', '.join(asked)}")
    _check_resizable(model)
    for mode in asked:
        why = _reason_not(model, mode)
        if why is not None:
            raise ExtrapolationError(f"{why}; {type(model).__name__} takes: {', '.join(model_modes(model))}")
    return tuple(asked)


class ModuleState:
    """Every module's attributes as they are now, put back exactly by :meth:`restore`.

    Kept per module: each entry of its ``__dict__`` (the same objects, tensors included: nothing is copied but
    the containers' lists of entries), and for its dicts and lists (``_parameters``, ``_buffers``, ``_modules``,
    the hook dicts) their entries, restored into the same container objects, so that a handle taken before
    (a hook's ``RemovableHandle``) still reaches its dict. Tens of microseconds a module, taken and restored: about
    a tenth of a ``deepcopy`` of the model, and no weight is copied."""

    def __init__(self, model: nn.Module):
        self.saved = []
        for module in model.modules():
            entries = {}
            for key, value in vars(module).items():
                content = dict(value) if isinstance(value, dict) else list(value) if type(value) is list else None
                entries[key] = (value, content)
            self.saved.append((module, entries))

    def restore(self) -> None:
        for module, entries in self.saved:
            attributes = vars(module)
            for key in [k for k in attributes if k not in entries]:
                del attributes[key]
            for key, (value, content) in entries.items():
                if isinstance(value, dict) and content is not None:
                    value.clear()
                    value.update(content)
                elif isinstance(value, list) and content is not None:
                    value[:] = content
                attributes[key] = value


@contextlib.contextmanager
def at_input_size(model: nn.Module, size: int | Sequence[int], mode: str) -> Iterator[nn.Module]:
    """The model at input size ``size`` (S or (H, W), patch multiples) carried there in ``mode``, for the
    ``with`` block; restored exactly on exit (:class:`ModuleState`), exceptions included.

    At the training size nothing changes, whatever the mode. ExtrapolationError (one line) for a mode that does
    not apply (:func:`check_modes`) or a size that is not a multiple of the patch size."""
    (mode,) = check_modes(model, [mode])
    hw = _check_size(model, size)
    state = ModuleState(model)
    try:
        if hw != training_size(model):
            with torch.no_grad():
                _carry(model, hw, mode)
        yield model
    finally:
        state.restore()


def _check_size(model: nn.Module, size: int | Sequence[int]) -> tuple[int, int]:
    pair = (size, size) if isinstance(size, int) else tuple(size)
    ph, pw = patch_size(model)
    if len(pair) != 2 or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in pair):
        raise ExtrapolationError(f"an input size is S or (H, W) with positive integers, got {size!r}")
    if pair[0] % ph or pair[1] % pw:
        raise ExtrapolationError(
            f"input size {pair[0]}x{pair[1]} is not a multiple of the patch size {ph}x{pw}: the last pixels would "
            "be dropped unseen"
        )
    return int(pair[0]), int(pair[1])


def _carry(model: nn.Module, hw: tuple[int, int], mode: str) -> None:
    """Set the model to input size ``hw`` in ``mode`` (under no_grad; the caller restores it)."""
    if mode == "timm":
        if not _dynamic(model):
            cast(Any, model).set_input_size(img_size=hw)
        return
    embed: Any = model.patch_embed
    old = tuple(embed.grid_size)
    embed.set_input_size(img_size=hw)
    new = tuple(embed.grid_size)
    family = mode.split("-")[0]
    ape = _ape(model)
    if ape is not None:
        from timm.layers import resample_abs_pos_embed

        interpolation, antialias = _TABLE_RESAMPLE.get(mode, _TIMM_RESAMPLE)
        prefix = 0 if getattr(model, "no_embed_class", False) else int(getattr(model, "num_prefix_tokens", 0))
        table = resample_abs_pos_embed(ape, list(new), list(old), prefix, interpolation, antialias)
        model.pos_embed = nn.Parameter(table, requires_grad=ape.requires_grad)
    sincos = _sincos(model)
    if sincos is not None:
        model.sincos_embed = _sincos_at(model, sincos, old, new, interpolate=mode == "sincos-interp")
    rope = _rope(model)
    if rope is not None and family == "rope":
        rope.ref_feat_shape = _rope_reference(rope.ref_feat_shape, old, new, interpolate=mode == "rope-interp")
    if rope is not None and rope.feat_shape is not None:  # a cached table (a model of one size): rebuilt at G'
        _rebuild_rope_cache(rope, new)


def _sincos_at(
    model: nn.Module, table: torch.Tensor, old: tuple[int, ...], new: tuple[int, ...], interpolate: bool
) -> torch.Tensor:
    """The sincos table at grid ``new``: the training table ``table`` (1, N, C) resampled, or rebuilt."""
    if interpolate:
        from timm.layers import resample_abs_pos_embed

        return resample_abs_pos_embed(table, list(new), list(old), 0, *_TIMM_RESAMPLE)
    from ..pos import sincos_2d

    return sincos_2d((new[0], new[1]), table.shape[-1], device=table.device).to(table.dtype)


def _rope_reference(
    reference: Sequence[float] | None, old: tuple[int, ...], new: tuple[int, ...], interpolate: bool
) -> list[float] | None:
    """timm's ``ref_feat_shape`` at grid ``new`` (coordinate x of an axis of size f is x / f * ref): the
    trained coordinates are x (None) or x / G * r (r the reference at the training grid G).

    Interpolated: the reference stays r (or becomes G), so G' maps onto the trained range. Native: the unit of
    the training grid is kept, r G' / G (None stays None: x itself)."""
    if interpolate:
        return list(reference) if reference is not None else [float(g) for g in old]
    if reference is None:
        return None
    return [r * n / o for r, n, o in zip(reference, new, old)]


def _rebuild_rope_cache(rope: Any, new: tuple[int, ...]) -> None:
    """A cached RoPE table computed at grid ``new`` from the module's own bands (as pe_scale left them), into new
    tensors: timm's ``update_feat_shape`` would also write recomputed bands into the existing buffer. The
    builders are timm's (tests/test_internals.py checks them, as pe_scale uses them too)."""
    shape = [int(g) for g in new]
    if isinstance(getattr(rope, "pos_embed", None), torch.Tensor):
        rope.pos_embed = rope._build_embed_cat(shape, rope.bands).to(rope.pos_embed)
    else:
        sin, cos = rope._build_embed(shape, rope.bands)
        rope.pos_embed_sin, rope.pos_embed_cos = sin.to(rope.pos_embed_sin), cos.to(rope.pos_embed_cos)
    rope.feat_shape = shape
