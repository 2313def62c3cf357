"""PE scaling (alpha) on any timm ViT (docs/method.md#pe-scaling-alpha): :func:`pe_scale`, the context that
scales every positional encoding of a model and restores it exactly, and :func:`pe_inventory`, the list of
what it scales and what it cannot."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import torch
import torch.nn as nn

from ..defaults import check_alpha_spec
from ..errors import PosgeomError
from .pe_scalers import Undo, run_undo
from .pe_search import CONV_PES, LOOKED_FOR, PEEntry, find_pes

__all__ = ["pe_scale", "pe_inventory", "PEScaleError", "AlphaOverflowError"]


class PEScaleError(PosgeomError, TypeError):
    """Raised by :func:`pe_scale` when the model has no positional encoding it can scale, or (``strict``, the
    default) when it has one it cannot scale beside ones it can."""


class AlphaOverflowError(PosgeomError, ValueError):
    """Raised by :func:`pe_scale` for an alpha whose scaled PE is not finite in the model's dtype (it overflows):
    every number measured with it would be NaN made from inf, so it is refused."""


def pe_inventory(model: nn.Module, include_prefix: bool = True) -> list[PEEntry]:
    """Every positional encoding of ``model``, in module order, as ``(name, kind, scalable)``.

    This is what :func:`pe_scale` acts on: it scales exactly the ``scalable`` entries, so after
    ``pe_scale(model, alpha, strict=False)`` this list says what was scaled and what was not. ``kind``
    says what alpha scales. Besides what it can scale, it reports convolutional position encodings (no
    scale) and any other position-like module class or tensor name it does not know (``scalable=False``).
    """
    if _is_posgeom(model):
        pe = getattr(model, "pe", None)
        kind = f"our model's PE {pe!r} (set_alpha: see docs/method.md#pe-scaling-alpha)"
        return [] if pe == "none" else [PEEntry("", kind, True)]
    return [pe.entry for pe in find_pes(model, include_prefix)]


@contextlib.contextmanager
def pe_scale(
    model: nn.Module, alpha: float | Mapping[str, float], include_prefix: bool = True, strict: bool = True
) -> Iterator[nn.Module]:
    """Scale the positional encoding of ``model`` by ``alpha`` inside the context (alpha = 0: no PE).

    ``alpha`` is one number for every PE, or a mapping component -> alpha (``{"ape": 0.0, "rope": 1.0}``) for a
    model with several encodings (eva02's APE and RoPE, Naver's ``*_rope_ape``, qwen3_vit, gemma4_vit's table
    and RoPE): each entry of :func:`pe_inventory` is scaled by the alpha of its ``component``, and the components
    not named keep their scale. A component the model does not have raises :class:`PEScaleError`.

    What alpha scales, per kind (:func:`pe_inventory` lists what a model has):
      * our models (``PosGeomViT``): ``model.set_alpha(model.alpha * alpha)`` (APE table incl. class row, sincos
        table, RoPE angles); with ``include_prefix=False`` an APE table's patch rows only;
      * absolute tables added to the tokens, on any module (``pos_embed`` and ``pos_embed_win``,
        ``_window``, ``_spatial``, ``_temporal``, ``_x``, ``_y``, numbered ones, tnt's ``patch_pos`` /
        ``pixel_pos``): the table times alpha. For the model's (or naflexvit ``embeds``') ``pos_embed``,
        prefix rows (class / register tokens) too when ``include_prefix`` (the paper's convention);
      * RoPE (timm ``RotaryEmbedding``/``RotaryEmbeddingCat``: frequency bands; ``RotaryEmbeddingMixed``:
        learned frequencies; ``RotaryEmbeddingDinoV3``: periods / alpha): rotation angles times alpha,
        cached tables rebuilt;
      * relative position tables whose logit bias is linear in them (beit, swin, maxvit:
        ``relative_position_bias_table``; samvit, mvitv2: decomposed ``rel_pos_h`` / ``rel_pos_w``, bias
        q . R): times alpha; vit_relpos's ``RelPosMlp``: the bias ``get_bias()`` returns times alpha;
      * swinv2's continuous position bias: the bias added to the logits, ``16 * sigmoid(cpb_mlp(.))``, times
        alpha (a pre-hook on the attention's softmax adds (alpha - 1) times it); swinv2-cr's: the bias
        ``meta_mlp`` returns times alpha;
      * convit's GPSA: the positional attention logits ``pos_proj(rel_indices)`` times alpha, so the
        positional attention is softmax(alpha * logits): uniform over the tokens at alpha = 0, which carries
        no position;
      * ``PositionalEncodingFourier`` (xcit, edgenext): its output times alpha.

      * gemma4_vit: its factorised ``position_embedding_table`` (one table per axis, their rows summed) times
        alpha, and its 2-D RoPE's angles (``inv_freq``) times alpha; timm's ``RotaryEmbeddingMRope`` likewise.

    Convolutional position encodings (twins' PosConv, coat and davit ConvPosEnc, ...) have no scale, and
    position-like modules or tensors it does not know are not guessed at. A model with some of them and
    some scalable PE (in the components scaled) raises :class:`PEScaleError` naming what cannot be scaled, unless ``strict=False``:
    then only the scalable ones are scaled (``pe_inventory(model)`` says which). A model with nothing
    scalable always raises, saying what it found (or that it found no positional encoding).

    Yields ``model`` itself. Every tensor is restored exactly (saved copies) and every hook removed on exit,
    exceptions included.
    """
    alpha = check_alpha_spec(alpha)
    largest = max(alpha.values()) if isinstance(alpha, dict) else alpha
    # Rebuilt caches and saved copies must be ordinary tensors even when the context is entered
    # under torch.inference_mode(), or a later training step could not use them.
    with torch.inference_mode(False), torch.no_grad():
        before = _nonfinite_tensors(model) if largest > 1 else set()  # only a factor above 1 can overflow
        restore = _apply_pe_scale(model, alpha, include_prefix, strict)
        try:
            if largest > 1:
                _check_finite(model, largest, before)
        except AlphaOverflowError:
            restore()
            raise
    try:
        yield model
    finally:
        with torch.inference_mode(False), torch.no_grad():
            restore()


def _nonfinite_tensors(model: nn.Module) -> set[int]:
    """The ids of the model's floating parameters and buffers that hold a value that is not finite."""
    tensors = [*model.parameters(), *model.buffers()]
    return {id(t) for t in tensors if t.is_floating_point() and not bool(torch.isfinite(t).all())}


def _check_finite(model: nn.Module, alpha: float, before: set[int]) -> None:
    """AlphaOverflowError when scaling made a PE tensor of ``model`` non-finite (a table times alpha beyond its
    dtype's range, RoPE angles whose sine is NaN), or, for our models, whose PE is scaled at each forward,
    when the scaled table would be."""
    scaled = _nonfinite_tensors(model) - before
    if _is_posgeom(model):  # the APE and sincos tables are multiplied by model.alpha in the forward
        factor = float(model.alpha)  # type: ignore[arg-type]  # a float attribute of PosGeomViT
        for table in (getattr(model, "pos_embed", None), getattr(model, "sincos_embed", None)):
            if isinstance(table, torch.Tensor) and not bool(torch.isfinite(table * factor).all()):
                scaled.add(id(table))
    if scaled:
        dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
        raise AlphaOverflowError(
            f"alpha={alpha:g} overflows the positional encoding of {type(model).__name__}: the "
            f"scaled PE is not finite in {str(dtype).removeprefix('torch.')} (inf or NaN), so "
            "every number measured with it would be NaN; use a smaller alpha"
        )


def _is_posgeom(model: nn.Module) -> bool:
    return hasattr(model, "set_alpha") and hasattr(model, "alpha")


def _apply_pe_scale(model: Any, alpha: float | dict[str, float], include_prefix: bool, strict: bool = True):
    """Scale every scalable PE of ``model`` in place (a mapping: each by its component's alpha); return the function
    that restores them exactly."""
    if _is_posgeom(model):
        return _scale_posgeom(model, _posgeom_alpha(model, alpha), include_prefix)
    found = find_pes(model, include_prefix)
    if isinstance(alpha, dict):
        _check_components(model, [pe.entry for pe in found], alpha)
        found = [pe for pe in found if pe.entry.component in alpha]
    _check_scalable(model, [pe.entry for pe in found], strict)
    undo: Undo = []
    try:
        for pe in found:
            if pe.apply is not None:
                pe.apply(alpha[pe.entry.component] if isinstance(alpha, dict) else alpha, undo)
    except BaseException:
        run_undo(undo)
        raise
    return lambda: run_undo(undo)


def _posgeom_alpha(model: Any, alpha: float | dict[str, float]) -> float:
    """Our model's one alpha: ``alpha``, or its PE's entry of a mapping (PEScaleError for a PE it lacks)."""
    if getattr(model, "pe", None) == "none":  # alpha scales nothing: a silent no-op would look like a result
        raise PEScaleError(
            f"pe_scale: {type(model).__name__} has no positional encoding (pe='none'): there is nothing to scale"
        )
    if not isinstance(alpha, dict):
        return alpha
    _check_components(model, pe_inventory(model), alpha)
    return alpha[model.pe]


def _scale_posgeom(model: Any, alpha: float, include_prefix: bool):
    """Our model's PE times ``alpha`` in place (see :func:`pe_scale`); returns the function that restores it."""
    table = getattr(model, "pos_embed", None)
    prefix = 0 if getattr(model, "no_embed_class", False) else int(getattr(model, "num_prefix_tokens", 0))
    if not include_prefix and table is not None and prefix:  # APE with prefix rows: only the patch rows
        saved = table.detach().clone()
        table[:, prefix:] *= alpha
        return lambda: table.copy_(saved)
    # multiplicative, as on every other model: a model built or exported with alpha a gets a * alpha,
    # so alpha = 1 is always the model as it stands
    old = model.alpha
    model.set_alpha(old * alpha)
    return lambda: model.set_alpha(old)


def _check_components(model: nn.Module, entries: list[PEEntry], alpha: dict[str, float]) -> None:
    """PEScaleError when a mapping names a component ``model`` does not have (saying which it has)."""
    have = list(dict.fromkeys(e.component for e in entries))
    missing = [c for c in alpha if c not in have]
    if missing:
        raise PEScaleError(
            f"pe_scale: {type(model).__name__} has no {', '.join(repr(c) for c in missing)} positional encoding: "
            f"its components are {', '.join(have) or 'none'} (pe_inventory(model) lists them)"
        )


def _check_scalable(model: nn.Module, entries: list[PEEntry], strict: bool) -> None:
    """Raise PEScaleError when nothing can be scaled, or (strict) when something cannot."""
    cls = type(model).__name__
    scalable = [e for e in entries if e.scalable]
    unscalable = [e for e in entries if not e.scalable]
    if not entries:
        raise PEScaleError(f"pe_scale found no positional encoding in {cls}: looked for {LOOKED_FOR}")
    if not scalable:
        raise PEScaleError(
            f"pe_scale cannot scale the positional encoding of {cls}: it has {_describe(unscalable)}, "
            f"which cannot be scaled ({_why(unscalable)})"
        )
    if unscalable and strict:
        raise PEScaleError(
            f"pe_scale would scale only part of the positional encoding of {cls}: {_describe(unscalable)} cannot "
            f"be scaled ({_why(unscalable)}); it would scale {_describe(scalable)}. Pass strict=False to scale only "
            "those (pe_inventory(model) lists what is scaled and what is not)"
        )


def _why(unscalable: list[PEEntry]) -> str:
    conv = [e for e in unscalable if e.kind in CONV_PES.values()]
    reasons = ["a convolution of the token contents has no scale"] if conv else []
    if len(conv) < len(unscalable):
        reasons.append("pe_scale does not guess how to scale a PE it does not know")
    return "; ".join(reasons)


def _describe(entries: list[PEEntry]) -> str:
    """``kind in name, name and N more; kind in name`` (entries grouped by kind, in order)."""
    groups: dict[str, list[str]] = {}
    for e in entries:
        groups.setdefault(e.kind, []).append(e.name or "the model")
    parts = []
    for kind, names in groups.items():
        shown = ", ".join(names) if len(names) <= 4 else f"{', '.join(names[:3])} and {len(names) - 3} more"
        parts.append(f"{kind} in {shown}")
    return "; ".join(parts)
