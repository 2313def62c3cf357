"""Interventions on any timm ViT: random token permutation (RPI / RPT) and PE scaling (alpha).

Both are context managers that leave the model exactly as they found it, exceptions included.
Definitions: docs/method.md#rpi-and-rpt and docs/method.md#pe-scaling-alpha.
"""
from __future__ import annotations

import contextlib
import re
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
import torch.nn as nn

from .errors import PosgeomError
from .pos.common import check_alpha

__all__ = ["token_permutation", "TokenPermutation", "TokenPermutationError", "TokenPermutationUnsupported",
           "active_permutations", "check_unpermuted", "pe_scale", "PEScaleError", "find_embed_module", "eval_mode",
           "pe_inventory", "PEEntry"]


# --------------------------------------------------------------------------------------------
# token permutation
# --------------------------------------------------------------------------------------------
def find_embed_module(model: nn.Module) -> nn.Module:
    """The module whose output is the patch-token contents before any positional encoding.

    ``patch_embed`` for the flat timm ViT families (vision_transformer, deit, eva incl. RoPE, beit,
    relpos, cait, ours) and hierarchical ones whose ``patch_embed`` is one module (swin, pit, ...);
    ``embeds.norm`` for naflexvit (its ``embeds`` adds the PE after its norm); ``stem`` for the MLP
    models whose patch embedding is called so (mixer, resmlp, gmlp). A ``patch_embed`` that is a
    container (crossvit's ``ModuleList`` of branches) is refused: it is never called itself.
    """
    embeds = getattr(model, "embeds", None)
    if embeds is not None and hasattr(embeds, "norm") and hasattr(embeds, "proj"):
        return embeds.norm
    patch_embed = getattr(model, "patch_embed", None)
    if isinstance(patch_embed, (nn.ModuleList, nn.ModuleDict)):
        raise TokenPermutationUnsupported(f"{type(model).__name__}.patch_embed is a {type(patch_embed).__name__} of "
                        f"{len(patch_embed)} branches (a multi-branch model such as crossvit), never called as one "
                        "module: token permutation does not support it")
    if isinstance(patch_embed, nn.Module):
        return patch_embed
    stem = getattr(model, "stem", None)
    if isinstance(stem, nn.Module) and type(stem).__name__ == "PatchEmbed":
        return stem
    raise TokenPermutationUnsupported(
        f"{type(model).__name__} has no `patch_embed` (nor naflexvit `embeds.norm`, nor a PatchEmbed `stem`): token "
        "permutation (RPI) needs the module that embeds the patches, which CNNs and hybrid models do not have; probe "
        "it without RPI")


def _embed_channels(module: nn.Module) -> int | None:
    """Channels of the patch tokens a patch-embedding module emits (its last conv), or None."""
    convs = [m for m in module.modules() if isinstance(m, nn.Conv2d)]
    return convs[-1].out_channels if convs else None


def _token_layout(x: torch.Tensor, module: nn.Module) -> str:
    """``"NLC"``, ``"NHWC"`` or ``"NCHW"`` for the output of the patch embedding, found from its channel
    count (and its ``output_fmt`` when the shape alone is ambiguous); ValueError when it cannot be told."""
    channels = _embed_channels(module)
    fmt = str(getattr(module, "output_fmt", "") or "").split(".")[-1].upper()
    if x.ndim == 3:
        if channels is not None and x.shape[-1] != channels:
            raise ValueError(f"the patch embedding emits {tuple(x.shape)}, not (B, N, {channels}) tokens")
        return "NLC"
    if x.ndim != 4:
        raise ValueError(f"cannot permute tokens of a tensor of shape {tuple(x.shape)}: expected (B,N,C), (B,H,W,C) "
                         "or (B,C,H,W)")
    last, second = x.shape[-1] == channels, x.shape[1] == channels
    if channels is not None and last != second:
        return "NHWC" if last else "NCHW"
    if fmt in ("NHWC", "NCHW"):
        return fmt
    raise ValueError(f"cannot tell whether the patch embedding's output {tuple(x.shape)} is NHWC or NCHW")


def _permute_tokens(x: torch.Tensor, perm: torch.Tensor, layout: str) -> torch.Tensor:
    """Permute the token axis of (B, N, C), (B, H, W, C) or (B, C, H, W) so that slot i holds token perm[i]."""
    if layout == "NLC":
        return x[:, perm]
    if layout == "NHWC":  # as timm's PatchEmbed(output_fmt='NHWC') emits with dynamic_img_size
        B, H, W, C = x.shape
        return x.reshape(B, H * W, C)[:, perm].reshape(B, H, W, C).contiguous()
    B, C, H, W = x.shape  # NCHW: swin-v2-cr, pit, ...
    return x.reshape(B, C, H * W)[:, :, perm].reshape(B, C, H, W).contiguous()


def _num_tokens(x: torch.Tensor, layout: str) -> int:
    return x.shape[1] if layout == "NLC" else x.shape[1] * x.shape[2] if layout == "NHWC" else x.shape[2] * x.shape[3]


def _check_grid(n: int, module: nn.Module, model: nn.Module) -> None:
    """A permutation must cover exactly the grid's tokens (a static grid; dynamic sizes are not checked)."""
    grid = getattr(module, "grid_size", None)
    if grid is None or not getattr(module, "strict_img_size", False) or getattr(model, "dynamic_img_size", False):
        return  # models that accept other input sizes (pit, dynamic_img_size) have no one grid to check against
    expected = int(grid[0]) * int(grid[1])
    if n != expected:
        raise ValueError(f"{n} tokens found but the patch grid {tuple(grid)} has {expected}: the token layout was "
                         "not understood")


class TokenPermutationError(PosgeomError, RuntimeError):
    """A forward pass of the model ran without the permutation being applied (a silent no-op), or with two
    permutations applied at once (nested contexts: neither result would say what was applied)."""


class TokenPermutationUnsupported(PosgeomError, TypeError):
    """A model without a patch embedding to permute the tokens of (CNNs, multi-branch models)."""


# The token_permutation contexts open on each patch-embedding module (weakly held: a model deleted inside a
# context leaves nothing behind). Two contexts on one module would compose (slot i holds p1[p2[i]]) while each
# handle, and any result built from it, reports only its own permutation: nesting is refused.
_ACTIVE: weakref.WeakKeyDictionary[nn.Module, list[TokenPermutation]] = weakref.WeakKeyDictionary()


def active_permutations(model: nn.Module) -> list[TokenPermutation]:
    """The :func:`token_permutation` contexts open on ``model`` (outermost first); empty for a model without a
    patch embedding or with none open."""
    try:
        target = find_embed_module(model)
    except TokenPermutationUnsupported:
        return []
    return list(_ACTIVE.get(target, ()))


def check_unpermuted(model: nn.Module, what: str) -> None:
    """Refuse to run ``what`` (a measurement that reports whether tokens were permuted) while a
    ``token_permutation(mode="inference")`` context is open on ``model``: its tokens would be permuted by a
    permutation the result does not report. A ``mode="training"`` context does not permute in eval mode."""
    active = [h for h in active_permutations(model) if h.mode == "inference"]
    if active:
        raise TokenPermutationError(
            f"{what} ran inside token_permutation(seed={active[-1].seed}) on {type(model).__name__}: its tokens would "
            "be permuted by a permutation the result does not report; leave that context and ask the measurement "
            "for the permutation itself (rpi=True, seed=...)")


@dataclass
class TokenPermutation:
    """Handle yielded by :func:`token_permutation`.

    ``permutation`` is the LongTensor p of the last forward pass: token slot i holds the content of
    patch p[i] (row-major patch order), so for a model without PE every block output under
    permutation equals the unpermuted output indexed ``[:, p]``. None before the first forward.
    ``num_calls`` counts the forward passes that were permuted.
    """

    seed: int | None
    per: str
    mode: str
    permutation: torch.Tensor | None = None
    num_calls: int = 0
    _generator: torch.Generator | None = field(default=None, repr=False)

    def _draw(self, n: int, device: torch.device) -> torch.Tensor:
        if self.per == "call" and self.permutation is not None:
            if self.permutation.numel() != n:
                raise ValueError(
                    f"the token count changed inside one token_permutation(per='call') context "
                    f"({self.permutation.numel()} -> {n}); use per='batch' for inputs of several sizes")
            return self.permutation.to(device)
        if self._generator is None:
            return torch.randperm(n, device=device)  # global RNG: reproducible under accelerate/torch seeding
        return torch.randperm(n, generator=self._generator).to(device)


@contextlib.contextmanager
def token_permutation(
        model: nn.Module,
        seed: int | None = None,
        mode: str = "inference",
        per: str | None = None,
) -> Iterator[TokenPermutation]:
    """Permute patch-token contents after the patch embedding and before any PE, on any timm ViT.

    A forward hook on ``patch_embed`` (``embeds.norm`` for naflexvit) replaces its output x by
    ``x[:, p]``: positional encodings stay bound to token indices while contents move. Handles
    (B, N, C), NHWC (B, H, W, C; kept contiguous) and tuple outputs (first element permuted).

    Args:
        model: a timm ViT.
        seed: seeds a private CPU generator (reproducible, leaves the global RNG alone); None draws
            from torch's global RNG.
        mode: ``inference`` (RPI: every forward inside the context is permuted) or ``training``
            (RPT for a third-party model: only forwards in training mode are permuted).
        per: ``call`` (one permutation for the whole context, shared by every batch: the paper's
            RPI when the context wraps one evaluation) or ``batch`` (a fresh permutation every
            forward). Default: ``call`` for inference, ``batch`` for training.

    Yields:
        A :class:`TokenPermutation` handle; ``handle.permutation`` is the permutation last applied.
        The hook is removed on exit, exceptions included.
    """
    if mode not in ("inference", "training"):
        raise ValueError(f"mode must be 'inference' or 'training', got {mode!r}")
    per = per or ("call" if mode == "inference" else "batch")
    if per not in ("call", "batch"):
        raise ValueError(f"per must be 'call' or 'batch', got {per!r}")
    target = find_embed_module(model)
    clash = [h for h in _ACTIVE.get(target, ()) if h.mode == mode]
    if clash:
        raise TokenPermutationError(
            f"token_permutation(seed={seed}) inside another token_permutation(seed={clash[-1].seed}, mode={mode!r}) "
            f"on the same {type(model).__name__}: both permutations would apply (slot i holding p1[p2[i]]) while each "
            "reports only its own; use one context (a probe's rpi=True draws its own permutation: do not wrap it "
            "in token_permutation)")
    generator = None
    if seed is not None:
        generator = torch.Generator().manual_seed(int(seed))
    handle = TokenPermutation(seed=seed, per=per, mode=mode, _generator=generator)

    def hook(module: nn.Module, args, output):
        if mode == "training" and not model.training:
            return output
        others = [h for h in _ACTIVE.get(target, ()) if h is not handle and (h.mode == "inference" or model.training)]
        if others:  # an inference context inside a training one (or the reverse), in a training-mode forward
            raise TokenPermutationError(
                f"two token permutations (seeds {others[0].seed} and {seed}) would both apply to this forward pass "
                f"of {type(model).__name__}: nested token_permutation contexts are refused")
        x = output[0] if isinstance(output, tuple) else output
        layout = _token_layout(x, module)
        n = _num_tokens(x, layout)
        _check_grid(n, module, model)
        perm = handle._draw(n, x.device)
        handle.permutation = perm
        handle.num_calls += 1
        x = _permute_tokens(x, perm, layout)
        return (x, *output[1:]) if isinstance(output, tuple) else x

    calls_before = []

    def before(module, args):
        calls_before.append(handle.num_calls)

    def after(module, args, output):
        if calls_before.pop() == handle.num_calls and (mode == "inference" or model.training):
            raise TokenPermutationError(f"a forward pass of {type(model).__name__} ran without calling "
                                        f"{type(target).__name__}, where the permutation is applied: its outputs "
                                        "would not be permuted")

    removables = [target.register_forward_hook(hook), model.register_forward_pre_hook(before),
                  model.register_forward_hook(after)]
    _ACTIVE.setdefault(target, []).append(handle)
    try:
        yield handle
    finally:
        for removable in removables:
            removable.remove()
        opened = [h for h in _ACTIVE.get(target, ()) if h is not handle]  # by identity (handles hold tensors)
        if opened:
            _ACTIVE[target] = opened
        else:
            _ACTIVE.pop(target, None)


# --------------------------------------------------------------------------------------------
# PE scaling
# --------------------------------------------------------------------------------------------
class PEScaleError(PosgeomError, TypeError):
    """Raised by :func:`pe_scale` when the model has no positional encoding it can scale, or (``strict``, the
    default) when it has one it cannot scale beside ones it can."""


class PEEntry(NamedTuple):
    """One positional encoding found by :func:`pe_inventory`: ``name`` (dotted path of the tensor or module in
    the model, ``""`` for the model itself), ``kind`` (what it is and what alpha scales) and ``scalable``
    (whether :func:`pe_scale` scales it)."""

    name: str
    kind: str
    scalable: bool


_Undo = list  # restore callbacks, run last first
_Apply = Callable[[float, _Undo], None]  # scales in place for one alpha and appends its restore callbacks


@dataclass(frozen=True)
class _PE:
    entry: PEEntry
    apply: _Apply | None = None  # None: cannot be scaled


# Additive absolute tables, on any module: pos_embed (vit, deit, beit, cait, convit, pit, eva, samvit, hiera,
# mvitv2 use_abs_pos, nest levels, ...), naflexvit pos_embed_x / _y, hiera pos_embed_win / _spatial / _temporal,
# sam2-hiera pos_embed_window, visformer pos_embed1..3, crossvit pos_embed_0 / _1, tnt patch_pos / pixel_pos.
_ABS_TABLE = re.compile(r"pos_embed(_?\d+|_x|_y|_win|_window|_spatial|_temporal)?|patch_pos|pixel_pos")
_TABLE_KINDS = {
    "relative_position_bias_table": "a relative position bias table (alpha scales the table, added to the logits)",
    "rel_pos_h": "a decomposed relative position table (alpha scales the table, so the logit bias q . R)",
    "rel_pos_w": "a decomposed relative position table (alpha scales the table, so the logit bias q . R)",
}
# Position encodings computed by a convolution of the token contents: there is no alpha to set.
_CONV_PES = {
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
_LOOKED_FOR = (
    "absolute tables (`pos_embed` and its variants, on any module), timm RoPE modules (RotaryEmbedding, "
    "RotaryEmbeddingCat, RotaryEmbeddingMixed, RotaryEmbeddingDinoV3), relative position tables "
    "(`relative_position_bias_table`, `rel_pos_h` / `rel_pos_w`), RelPosMlp, convit's GPSA, the continuous "
    "position bias of swinv2 and swinv2-cr, PositionalEncodingFourier, convolutional position encodings "
    f"({', '.join(_CONV_PES)}) and any other position-like module or tensor")


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
    return [pe.entry for pe in _find_pes(model, include_prefix)]


@contextlib.contextmanager
def pe_scale(model: nn.Module, alpha: float, include_prefix: bool = True, strict: bool = True) -> Iterator[nn.Module]:
    """Scale the positional encoding of ``model`` by ``alpha`` inside the context (alpha = 0: no PE).

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

    Convolutional position encodings (twins' PosConv, coat and davit ConvPosEnc, ...) have no scale, and
    position-like modules or tensors it does not know are not guessed at. A model with some of them and
    some scalable PE raises :class:`PEScaleError` naming what cannot be scaled, unless ``strict=False``:
    then only the scalable ones are scaled (``pe_inventory(model)`` says which). A model with nothing
    scalable always raises, saying what it found (or that it found no positional encoding).

    Yields ``model`` itself. Every tensor is restored exactly (saved copies) and every hook removed on exit,
    exceptions included.
    """
    alpha = check_alpha(alpha)
    # Rebuilt caches and saved copies must be ordinary tensors even when the context is entered
    # under torch.inference_mode(), or a later training step could not use them.
    with torch.inference_mode(False), torch.no_grad():
        restore = _apply_pe_scale(model, alpha, include_prefix, strict)
    try:
        yield model
    finally:
        with torch.inference_mode(False), torch.no_grad():
            restore()


def _is_posgeom(model: nn.Module) -> bool:
    return hasattr(model, "set_alpha") and hasattr(model, "alpha")


def _apply_pe_scale(model: nn.Module, alpha: float, include_prefix: bool, strict: bool = True):
    """Scale every scalable PE of ``model`` in place; return the function that restores them exactly."""
    if _is_posgeom(model):
        if getattr(model, "pe", None) == "none":  # alpha scales nothing: a silent no-op would look like a result
            raise PEScaleError(f"pe_scale: {type(model).__name__} has no positional encoding (pe='none'): there is "
                               "nothing to scale")
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
    found = _find_pes(model, include_prefix)
    _check_scalable(model, [pe.entry for pe in found], strict)
    undo: _Undo = []
    try:
        for pe in found:
            if pe.apply is not None:
                pe.apply(alpha, undo)
    except BaseException:
        _run_undo(undo)
        raise
    return lambda: _run_undo(undo)


def _run_undo(undo: _Undo) -> None:
    for fn in reversed(undo):
        fn()


def _check_scalable(model: nn.Module, entries: list[PEEntry], strict: bool) -> None:
    """Raise PEScaleError when nothing can be scaled, or (strict) when something cannot."""
    cls = type(model).__name__
    scalable = [e for e in entries if e.scalable]
    unscalable = [e for e in entries if not e.scalable]
    if not entries:
        raise PEScaleError(f"pe_scale found no positional encoding in {cls}: looked for {_LOOKED_FOR}")
    if not scalable:
        raise PEScaleError(f"pe_scale cannot scale the positional encoding of {cls}: it has {_describe(unscalable)}, "
                           f"which cannot be scaled ({_why(unscalable)})")
    if unscalable and strict:
        raise PEScaleError(
            f"pe_scale would scale only part of the positional encoding of {cls}: {_describe(unscalable)} cannot "
            f"be scaled ({_why(unscalable)}); it would scale {_describe(scalable)}. Pass strict=False to scale only "
            "those (pe_inventory(model) lists what is scaled and what is not)")


def _why(unscalable: list[PEEntry]) -> str:
    conv = [e for e in unscalable if e.kind in _CONV_PES.values()]
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


def _under(name: str, prefixes: list[str]) -> bool:
    """Whether module ``name`` is one of ``prefixes`` or inside one of them."""
    return any(p == "" or name == p or name.startswith(p + ".") for p in prefixes)


def _find_pes(model: nn.Module, include_prefix: bool) -> list[_PE]:
    """Every PE of ``model`` (not one of ours), in module order, then what only looks like one."""
    found: list[_PE] = []
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


def _module_pe(name: str, module: nn.Module) -> _PE | None:
    """The PE that ``module`` is (by its class), or None."""
    kind = type(module).__name__
    if kind in _CONV_PES:
        return _PE(PEEntry(name, _CONV_PES[kind], False))
    scaler = _module_scaler(module, kind)
    return None if scaler is None else _PE(PEEntry(name, scaler[0], True), scaler[1])


def _module_scaler(module: nn.Module, kind: str) -> tuple[str, _Apply] | None:
    """(what alpha scales, how) for a PE module pe_scale knows, or None."""
    if kind in ("RotaryEmbedding", "RotaryEmbeddingCat") and hasattr(module, "bands"):
        return "axial RoPE (alpha scales the rotation angles: bands)", _undo_with(_scale_axial_rope, module)
    if kind == "RotaryEmbeddingMixed":
        return "mixed RoPE (alpha scales the rotation angles: learned frequencies)", _scale_tensor(module.freqs)
    if kind == "RotaryEmbeddingDinoV3":
        return ("DINOv3 RoPE (alpha scales the rotation angles: periods / alpha)",
                _undo_with(_scale_dinov3_rope, module))
    if kind == "RelPosMlp":
        return "a relative position MLP, RelPosMlp (alpha scales its bias)", _shadow_get_bias(module)
    if kind == "GPSA" and isinstance(getattr(module, "pos_proj", None), nn.Module):
        return ("GPSA positional attention (alpha scales its logits pos_proj(rel_indices): uniform at 0)",
                _scale_output(module.pos_proj))
    if _is_swinv2_attention(module):
        return ("a continuous position bias, swinv2 (alpha scales 16 * sigmoid(cpb_mlp), the bias added to the "
                "logits)", _scale_swinv2_bias(module))
    if isinstance(getattr(module, "meta_mlp", None), nn.Module) and hasattr(module, "relative_coordinates_log"):
        return ("a continuous position bias, swinv2-cr (alpha scales meta_mlp's output, the bias added to the "
                "logits)", _scale_output(module.meta_mlp))
    if kind == "PositionalEncodingFourier":
        return ("a Fourier position encoding, PositionalEncodingFourier (alpha scales its output)",
                _scale_output(module))
    return None


def _direct_tensors(module: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """The tensors ``module`` holds itself: parameters, buffers and plain tensor attributes."""
    out = list(module.named_parameters(recurse=False)) + list(module.named_buffers(recurse=False))
    return out + [(k, v) for k, v in vars(module).items() if isinstance(v, torch.Tensor)]


def _table_pes(model: nn.Module, name: str, module: nn.Module, include_prefix: bool, seen: set[int]) -> list[_PE]:
    """The absolute and relative position tables ``module`` holds itself."""
    out = []
    for leaf, t in _direct_tensors(module):
        if id(t) in seen or not t.is_floating_point():
            continue
        kind = "an absolute position table (alpha scales the table, added to the tokens)" \
            if _ABS_TABLE.fullmatch(leaf) else _TABLE_KINDS.get(leaf)
        if kind is None:
            continue
        seen.add(id(t))
        rows = None if include_prefix else _patch_rows(model, module, leaf, t)
        if rows is not None:
            kind = "an absolute position table (alpha scales its patch rows, added to the patch tokens)"
        out.append(_PE(PEEntry(f"{name}.{leaf}" if name else leaf, kind, True), _scale_tensor(t, rows)))
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


def _unknown_pes(model: nn.Module, known: list[str], claimed: list[str], seen: set[int]) -> list[_PE]:
    """Position-like modules (by class) and tensors (by name) outside everything recognised: never scaled."""
    out = []
    for name, module in model.named_modules():
        kind = type(module).__name__
        if not name or _under(name, claimed) or not _PE_CLASS.search(kind) or _NOT_A_PE_CLASS.search(kind):
            continue
        if not any(_under(k, [name]) for k in known):  # e.g. RelPosBias: its table was found
            out.append(_PE(PEEntry(name, f"a position module pe_scale does not know ({kind})", False)))
            claimed.append(name)
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        owner, _, leaf = name.rpartition(".")
        if id(t) in seen or not t.is_floating_point() or _under(owner, claimed) or not _pe_like(leaf):
            continue
        seen.add(id(t))
        out.append(_PE(PEEntry(name, f"a position-like tensor pe_scale does not know ({leaf})", False)))
    return out


def _scale_tensor(t: torch.Tensor, rows: slice | None = None) -> _Apply:
    """``t`` (or its rows ``t[:, rows]``) times alpha, in place; restored from a saved copy."""
    def apply(alpha: float, undo: _Undo) -> None:
        original = t.detach().clone()
        undo.append(lambda: t.copy_(original))
        (t if rows is None else t[:, rows]).mul_(alpha)
    return apply


def _undo_with(scale, module: nn.Module) -> _Apply:
    """Adapt ``scale(module, alpha) -> restore`` to an :data:`_Apply`."""
    return lambda alpha, undo: undo.append(scale(module, alpha))


def _scale_output(module: nn.Module) -> _Apply:
    """A forward hook multiplying ``module``'s output by alpha (none at alpha = 1: bit-identical)."""
    def apply(alpha: float, undo: _Undo) -> None:
        if alpha != 1.0:
            undo.append(module.register_forward_hook(lambda m, args, out: out * alpha).remove)
    return apply


def _shadow_get_bias(module: nn.Module) -> _Apply:
    """Shadow ``module.get_bias`` (used by both the fused and the explicit attention paths)."""
    def apply(alpha: float, undo: _Undo) -> None:
        previous = vars(module).get("get_bias")  # an outer pe_scale's shadow, kept for its own exit
        original = module.get_bias
        module.get_bias = lambda: original() * alpha

        def restore() -> None:
            if previous is None:
                del module.get_bias
            else:
                module.get_bias = previous
        undo.append(restore)
    return apply


def _scale_axial_rope(module: nn.Module, alpha: float):
    """timm axial RoPE: angles = pos * bands, so scale the bands and rebuild the cached table."""
    if alpha == 1.0:  # exact no-op (a rebuilt cache can differ from the stored one in the last bits)
        return lambda: None
    bands = module.bands.detach().clone()
    cache_names = [n for n in ("pos_embed", "pos_embed_sin", "pos_embed_cos")
                   if isinstance(getattr(module, n, None), torch.Tensor)]
    caches = {n: getattr(module, n).detach().clone() for n in cache_names}
    with torch.no_grad():
        module.bands.mul_(alpha)
    if caches and module.feat_shape is not None:
        if "pos_embed" in caches:
            module.pos_embed = module._build_embed_cat(module.feat_shape, module.bands).to(caches["pos_embed"])
        else:
            sin, cos = module._build_embed(module.feat_shape, module.bands)
            module.pos_embed_sin, module.pos_embed_cos = sin.to(caches["pos_embed_sin"]), cos.to(
                caches["pos_embed_cos"])

    def restore():
        with torch.no_grad():
            module.bands.copy_(bands)
        for n, v in caches.items():
            setattr(module, n, v)
    return restore


def _scale_dinov3_rope(module: nn.Module, alpha: float):
    """DINOv3 RoPE: angles = 2 pi coords / periods, so divide the periods by alpha."""
    if alpha == 1.0:
        return lambda: None
    periods = module.periods.detach().clone()
    cache = getattr(module, "pos_embed_cached", None)
    cache = cache.detach().clone() if isinstance(cache, torch.Tensor) else None
    with torch.no_grad():
        module.periods.div_(alpha) if alpha > 0 else module.periods.fill_(float("inf"))
    if cache is not None and getattr(module, "feat_shape", None) is not None:
        module.pos_embed_cached = module._create_embed(module.feat_shape, no_aug=True).to(cache)

    def restore():
        with torch.no_grad():
            module.periods.copy_(periods)
        if cache is not None:
            module.pos_embed_cached = cache
    return restore


def _is_swinv2_attention(module: nn.Module) -> bool:
    """timm swinv2's WindowAttention: adds 16 * sigmoid(cpb_mlp(...)) to its logits, then calls ``softmax``."""
    return isinstance(getattr(module, "cpb_mlp", None), nn.Module) and isinstance(
        getattr(module, "softmax", None), nn.Softmax) and hasattr(module, "relative_position_index")


def _swinv2_bias(attn: nn.Module) -> torch.Tensor:
    """The bias swinv2's ``WindowAttention.forward`` adds to its logits (timm 1.0.31), (heads, N, N)."""
    n = attn.window_size[0] * attn.window_size[1]
    table = attn.cpb_mlp(attn.relative_coords_table).view(-1, attn.num_heads)
    bias = table[attn.relative_position_index.view(-1)].view(n, n, -1).permute(2, 0, 1)
    return 16 * torch.sigmoid(bias)


def _scale_swinv2_bias(attn: nn.Module) -> _Apply:
    """The logits reach ``attn.softmax`` with the bias b added: a pre-hook adds (alpha - 1) * b, so they carry
    alpha * b. (b = 16 * sigmoid(.) is in (0, 16): no output of cpb_mlp gives alpha * b for alpha > 1.)"""
    def apply(alpha: float, undo: _Undo) -> None:
        if alpha == 1.0:
            return

        def pre_hook(softmax: nn.Module, args: tuple) -> tuple:
            return (args[0] + (alpha - 1.0) * _swinv2_bias(attn), *args[1:])
        undo.append(attn.softmax.register_forward_pre_hook(pre_hook).remove)
    return apply


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
