"""The positional encodings of a model, as :func:`~timm_posgeom.interventions.pe_inventory` lists them and
:func:`~timm_posgeom.interventions.pe_scale` scales them: known PE modules (by class), absolute and relative
position tables (by name, on any module), convolutional PEs (no scale) and what only looks like a PE
(reported, never guessed at)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.nn as nn

from .pe_scalers import (
    Apply,
    is_swinv2_attention,
    scale_axial_rope,
    scale_dinov3_rope,
    scale_output,
    scale_swinv2_bias,
    scale_tensor,
    shadow_get_bias,
    undo_with,
)

__all__ = ["PEEntry", "component_of", "FoundPE", "find_pes", "CONV_PES", "LOOKED_FOR"]

# The component of each kind of encoding, by the start of its ``kind`` text (the kinds below and in
# :func:`_module_scaler`); our models' kind names its PE: ``our model's PE 'ape' ...``.
_KIND_COMPONENTS = (
    ("an absolute position table", "ape"),
    ("a factorised x / y position table", "ape"),
    ("axial RoPE", "rope"),
    ("mixed RoPE", "rope"),
    ("DINOv3 RoPE", "rope"),
    ("2-D RoPE", "rope"),
    ("multimodal RoPE", "rope"),
    ("a relative position", "relative"),
    ("a decomposed relative position", "relative"),
    ("a continuous position bias", "relative"),
    ("GPSA", "gpsa"),
    ("a Fourier position encoding", "fourier"),
    ("a convolutional", "conv"),
)
_OURS = re.compile(r"our model's PE '(\w+)'")


def component_of(kind: str) -> str:
    """The component (one of :data:`~timm_posgeom.protocol.PE_COMPONENTS`) of an encoding of ``kind`` (a :class:`PEEntry`'s text)."""
    ours = _OURS.match(kind)
    if ours:
        return ours.group(1)
    return next((component for start, component in _KIND_COMPONENTS if kind.startswith(start)), "unknown")


class PEEntry(NamedTuple):
    """One positional encoding found by :func:`pe_inventory`: ``name`` (dotted path of the tensor or module in
    the model, ``""`` for the model itself), ``kind`` (what it is and what alpha scales) and ``scalable``
    (whether :func:`pe_scale` scales it). :attr:`component` names the encoding it belongs to."""

    name: str
    kind: str
    scalable: bool

    @property
    def component(self) -> str:
        """Which of the model's encodings this is (:data:`~timm_posgeom.protocol.PE_COMPONENTS`): ``ape``, ``rope``, ``relative``, ...;
        the key of this entry's alpha in ``pe_scale(model, {component: alpha})``."""
        return component_of(self.kind)


@dataclass(frozen=True)
class FoundPE:
    """A PE of a model: its inventory entry and how to scale it in place (None: it cannot be scaled)."""

    entry: PEEntry
    apply: Apply | None = None


# Additive absolute tables, on any module: pos_embed (vit, deit, beit, cait, convit, pit, eva, samvit, hiera,
# mvitv2 use_abs_pos, nest levels, ...), naflexvit pos_embed_x / _y, hiera pos_embed_win / _spatial / _temporal,
# sam2-hiera pos_embed_window, visformer pos_embed1..3, crossvit pos_embed_0 / _1, tnt patch_pos / pixel_pos.
_ABS_TABLE = re.compile(r"pos_embed(_?\d+|_x|_y|_win|_window|_spatial|_temporal)?|patch_pos|pixel_pos")
_TABLE_KINDS = {
    "relative_position_bias_table": "a relative position bias table (alpha scales the table, added to the logits)",
    "rel_pos_h": "a decomposed relative position table (alpha scales the table, so the logit bias q . R)",
    "rel_pos_w": "a decomposed relative position table (alpha scales the table, so the logit bias q . R)",
    # gemma4_vit's patch embedding: one table per axis, (2, P, D), the x row plus the y row added to each token
    "position_embedding_table": "a factorised x / y position table (alpha scales both: their sum is added to the "
    "tokens)",
}
# Position encodings computed by a convolution of the token contents: there is no alpha to set.
CONV_PES = {
    "PosConv": "a convolutional position generator (PosConv)",
    "ConvPosEnc": "a convolutional position encoding (ConvPosEnc)",
    "ConvRelPosEnc": "a convolutional relative position encoding (ConvRelPosEnc)",
    "RepConditionalPosEnc": "a convolutional conditional position encoding (RepConditionalPosEnc)",
    "RepCPE": "a convolutional conditional position encoding (RepCPE)",
}
# What else looks like a PE (reported, never guessed at): module classes and tensor names.
_PE_CLASS = re.compile(r"Rotary|Rope|Pos(ition(al)?)?(Enc|Emb|Bias|Conv|Gen)|PEG|CPE")
_NOT_A_PE_CLASS = re.compile(r"Attn|Attention|Block|Stage|Layer|Transformer|Model")
_PE_WORDS = {"pos", "position", "positional", "rel", "relative", "rpe", "cpb"}
LOOKED_FOR = (
    "absolute tables (`pos_embed` and its variants, on any module; gemma4's `position_embedding_table`), timm RoPE "
    "modules (RotaryEmbedding, RotaryEmbeddingCat, RotaryEmbeddingMixed, RotaryEmbeddingDinoV3, "
    "RotaryEmbeddingMRope, Gemma4RotaryEmbedding2D), relative position tables "
    "(`relative_position_bias_table`, `rel_pos_h` / `rel_pos_w`), RelPosMlp, convit's GPSA, the continuous "
    "position bias of swinv2 and swinv2-cr, PositionalEncodingFourier, convolutional position encodings "
    f"({', '.join(CONV_PES)}) and any other position-like module or tensor"
)


def _under(name: str, prefixes: list[str]) -> bool:
    """Whether module ``name`` is one of ``prefixes`` or inside one of them."""
    return any(p == "" or name == p or name.startswith(p + ".") for p in prefixes)


def find_pes(model: nn.Module, include_prefix: bool) -> list[FoundPE]:
    """Every PE of ``model`` (not one of ours), in module order, then what only looks like one."""
    found: list[FoundPE] = []
    claimed: list[str] = []  # recognised modules: what is inside them is theirs
    seen: set[int] = set()  # tensors already found (a tied table is scaled once)
    for name, module in model.named_modules():
        if _under(name, claimed):
            continue
        pe = _module_pe(name, module)
        if pe is not None:
            found.append(pe)
            claimed.append(name)
            continue
        found += _table_pes(model, name, module, include_prefix, seen)
    return found + _unknown_pes(model, [pe.entry.name for pe in found], claimed, seen)


def _module_pe(name: str, module: nn.Module) -> FoundPE | None:
    """The PE that ``module`` is (by its class), or None."""
    kind = type(module).__name__
    if kind in CONV_PES:
        return FoundPE(PEEntry(name, CONV_PES[kind], False))
    scaler = _module_scaler(module, kind)
    return None if scaler is None else FoundPE(PEEntry(name, scaler[0], True), scaler[1])


def _module_scaler(module: Any, kind: str) -> tuple[str, Apply] | None:
    """(what alpha scales, how) for a PE module pe_scale knows, or None."""
    if kind in ("RotaryEmbedding", "RotaryEmbeddingCat") and hasattr(module, "bands"):
        return "axial RoPE (alpha scales the rotation angles: bands)", undo_with(scale_axial_rope, module)
    if kind == "RotaryEmbeddingMixed":
        return "mixed RoPE (alpha scales the rotation angles: learned frequencies)", scale_tensor(module.freqs)
    if kind in ("Gemma4RotaryEmbedding2D", "RotaryEmbeddingMRope") and isinstance(
        getattr(module, "inv_freq", None), torch.Tensor
    ):  # angles = position * inv_freq, computed at every forward (no cache)
        what = "2-D RoPE" if kind.startswith("Gemma4") else "multimodal RoPE"
        return f"{what} (alpha scales the rotation angles: inv_freq)", scale_tensor(module.inv_freq)
    if kind == "RotaryEmbeddingDinoV3":
        return (
            "DINOv3 RoPE (alpha scales the rotation angles: periods / alpha)",
            undo_with(scale_dinov3_rope, module),
        )
    if kind == "RelPosMlp":
        return "a relative position MLP, RelPosMlp (alpha scales its bias)", shadow_get_bias(module)
    if kind == "GPSA" and isinstance(getattr(module, "pos_proj", None), nn.Module):
        return (
            "GPSA positional attention (alpha scales its logits pos_proj(rel_indices): uniform at 0)",
            scale_output(module.pos_proj),
        )
    if is_swinv2_attention(module):
        return (
            "a continuous position bias, swinv2 (alpha scales 16 * sigmoid(cpb_mlp), the bias added to the logits)",
            scale_swinv2_bias(module),
        )
    if isinstance(getattr(module, "meta_mlp", None), nn.Module) and hasattr(module, "relative_coordinates_log"):
        return (
            "a continuous position bias, swinv2-cr (alpha scales meta_mlp's output, the bias added to the logits)",
            scale_output(module.meta_mlp),
        )
    if kind == "PositionalEncodingFourier":
        return (
            "a Fourier position encoding, PositionalEncodingFourier (alpha scales its output)",
            scale_output(module),
        )
    return None


def _direct_tensors(module: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """The tensors ``module`` holds itself: parameters, buffers and plain tensor attributes."""
    out = list(module.named_parameters(recurse=False)) + list(module.named_buffers(recurse=False))
    return out + [(k, v) for k, v in vars(module).items() if isinstance(v, torch.Tensor)]


def _table_pes(model: nn.Module, name: str, module: nn.Module, include_prefix: bool, seen: set[int]) -> list[FoundPE]:
    """The absolute and relative position tables ``module`` holds itself."""
    out = []
    for leaf, t in _direct_tensors(module):
        if id(t) in seen or not t.is_floating_point():
            continue
        kind = (
            "an absolute position table (alpha scales the table, added to the tokens)"
            if _ABS_TABLE.fullmatch(leaf)
            else _TABLE_KINDS.get(leaf)
        )
        if kind is None:
            continue
        seen.add(id(t))
        rows = None if include_prefix else _patch_rows(model, module, leaf, t)
        if rows is not None:
            kind = "an absolute position table (alpha scales its patch rows, added to the patch tokens)"
        out.append(FoundPE(PEEntry(f"{name}.{leaf}" if name else leaf, kind, True), scale_tensor(t, rows)))
    return out


def _patch_rows(model: nn.Module, module: nn.Module, leaf: str, table: torch.Tensor) -> slice | None:
    """The patch rows of the model's (or naflexvit ``embeds``') ``pos_embed`` when it has prefix rows."""
    if leaf != "pos_embed" or table.ndim != 3 or not (module is model or module is getattr(model, "embeds", None)):
        return None
    num_prefix = int(getattr(model, "num_prefix_tokens", 0) or 0)
    if num_prefix and not getattr(model, "no_embed_class", False) and _has_prefix_rows(model, table):
        return slice(num_prefix, None)
    return None


def _has_prefix_rows(model: nn.Module, table: torch.Tensor) -> bool:
    grid = getattr(getattr(model, "patch_embed", None), "num_patches", None)
    return grid is None or table.shape[1] != grid


def _pe_like(leaf: str) -> bool:
    return leaf == "attention_biases" or any(w in _PE_WORDS for w in re.split(r"[_\d]+", leaf.lower()))


def _unknown_pes(model: nn.Module, known: list[str], claimed: list[str], seen: set[int]) -> list[FoundPE]:
    """Position-like modules (by class) and tensors (by name) outside everything recognised: never scaled."""
    out = []
    for name, module in model.named_modules():
        kind = type(module).__name__
        if not name or _under(name, claimed) or not _PE_CLASS.search(kind) or _NOT_A_PE_CLASS.search(kind):
            continue
        if not any(_under(k, [name]) for k in known):  # e.g. RelPosBias: its table was found
            out.append(FoundPE(PEEntry(name, f"a position module pe_scale does not know ({kind})", False)))
            claimed.append(name)
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        owner, _, leaf = name.rpartition(".")
        if id(t) in seen or not t.is_floating_point() or _under(owner, claimed) or not _pe_like(leaf):
            continue
        seen.add(id(t))
        out.append(FoundPE(PEEntry(name, f"a position-like tensor pe_scale does not know ({leaf})", False)))
    return out
