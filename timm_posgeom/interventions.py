"""Interventions on any timm ViT: random token permutation (RPI / RPT) and PE scaling (alpha).

Both are context managers that leave the model exactly as they found it, exceptions included.
Definitions: docs/method.md#rpi-and-rpt and docs/method.md#pe-scaling-alpha.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
import torch.nn as nn

from .pos.common import check_alpha

__all__ = ["token_permutation", "TokenPermutation", "pe_scale", "PEScaleError", "find_embed_module", "eval_mode"]


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
        raise TypeError(f"{type(model).__name__}.patch_embed is a {type(patch_embed).__name__} of "
                        f"{len(patch_embed)} branches (a multi-branch model such as crossvit), never called as one "
                        "module: token permutation does not support it")
    if isinstance(patch_embed, nn.Module):
        return patch_embed
    stem = getattr(model, "stem", None)
    if isinstance(stem, nn.Module) and type(stem).__name__ == "PatchEmbed":
        return stem
    raise TypeError(
        f"{type(model).__name__} has no `patch_embed` (nor naflexvit `embeds.norm`, nor a PatchEmbed `stem`): token "
        "permutation needs the module that embeds the patches")


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


class TokenPermutationError(RuntimeError):
    """A forward pass of the model ran without the permutation being applied (a silent no-op)."""


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
    generator = None
    if seed is not None:
        generator = torch.Generator().manual_seed(int(seed))
    handle = TokenPermutation(seed=seed, per=per, mode=mode, _generator=generator)

    def hook(module: nn.Module, args, output):
        if mode == "training" and not model.training:
            return output
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
    try:
        yield handle
    finally:
        for removable in removables:
            removable.remove()


# --------------------------------------------------------------------------------------------
# PE scaling
# --------------------------------------------------------------------------------------------
class PEScaleError(TypeError):
    """Raised when :func:`pe_scale` finds no positional encoding it knows how to scale."""


_REL_POS_TABLES = ("relative_position_bias_table",)


def _abs_tables(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """Learned / fixed absolute tables: ``pos_embed`` on the model or naflexvit's ``embeds``."""
    found = []
    for owner_name, owner in (("", model), ("embeds.", getattr(model, "embeds", None))):
        if owner is None:
            continue
        for name in ("pos_embed", "pos_embed_y", "pos_embed_x"):
            t = getattr(owner, name, None)
            if isinstance(t, torch.Tensor):
                found.append((owner_name + name, t))
    return found


@contextlib.contextmanager
def pe_scale(model: nn.Module, alpha: float, include_prefix: bool = True) -> Iterator[nn.Module]:
    """Scale the positional encoding of ``model`` by ``alpha`` inside the context.

    What is scaled:
      * our models (``PosGeomViT``): ``model.set_alpha`` (APE table incl. class row, sincos table,
        RoPE angles);
      * absolute tables (``pos_embed``; naflexvit ``embeds.pos_embed``): patch rows times alpha;
        prefix rows (class / register tokens) too when ``include_prefix`` (the paper's convention);
      * RoPE (timm ``RotaryEmbedding``/``RotaryEmbeddingCat``: frequency bands; ``RotaryEmbeddingMixed``:
        learned frequencies; ``RotaryEmbeddingDinoV3``: periods / alpha): rotation angles times
        alpha, cached tables rebuilt;
      * additive relative-position bias tables (beit, swin: ``relative_position_bias_table``)
        times alpha; relpos-ViT's ``RelPosMlp`` output times alpha.

    Every tensor is restored exactly (saved copies) on exit, exceptions included. A model with
    nothing to scale raises :class:`PEScaleError` naming its class and what was looked for.
    """
    alpha = check_alpha(alpha)
    # Rebuilt caches and saved copies must be ordinary tensors even when the context is entered
    # under torch.inference_mode(), or a later training step could not use them.
    with torch.inference_mode(False), torch.no_grad():
        restore = _apply_pe_scale(model, alpha, include_prefix)
    try:
        yield model
    finally:
        with torch.inference_mode(False), torch.no_grad():
            restore()


def _apply_pe_scale(model: nn.Module, alpha: float, include_prefix: bool):
    """Scale every PE found in ``model`` in place; return the function that restores them exactly."""
    if hasattr(model, "set_alpha") and hasattr(model, "alpha"):
        if getattr(model, "pe", None) == "none":  # alpha scales nothing: a silent no-op would look like a result
            raise PEScaleError(f"pe_scale: {type(model).__name__} has no positional encoding (pe='none'): there is "
                               "nothing to scale")
        old = model.alpha
        model.set_alpha(alpha)
        return lambda: model.set_alpha(old)

    saved: list[tuple[torch.Tensor, torch.Tensor]] = []
    restore_fns = []

    def scale_(t: torch.Tensor, factor: float, rows: slice | None = None) -> None:
        saved.append((t, t.detach().clone()))
        if rows is None:
            t.mul_(factor)
        else:
            t[:, rows].mul_(factor)

    num_prefix = int(getattr(model, "num_prefix_tokens", 0) or 0)
    for name, table in _abs_tables(model):
        if name.endswith("pos_embed") and table.ndim == 3 and not include_prefix and num_prefix \
                and not getattr(model, "no_embed_class", False) and _has_prefix_rows(model, table):
            scale_(table, alpha, slice(num_prefix, None))
        else:
            scale_(table, alpha)

    for module in model.modules():
        kind = type(module).__name__
        if kind in ("RotaryEmbedding", "RotaryEmbeddingCat") and hasattr(module, "bands"):
            restore_fns.append(_scale_axial_rope(module, alpha))
        elif kind == "RotaryEmbeddingMixed":
            scale_(module.freqs, alpha)
        elif kind == "RotaryEmbeddingDinoV3":
            restore_fns.append(_scale_dinov3_rope(module, alpha))
        elif kind == "RelPosMlp":  # bias from an MLP of offsets: scale what it returns
            restore_fns.append(_scale_get_bias(module, alpha))
        for tname in _REL_POS_TABLES:
            t = getattr(module, tname, None)
            if isinstance(t, torch.Tensor) and t.is_floating_point():
                scale_(t, alpha)

    if not (saved or restore_fns):
        raise PEScaleError(
            f"pe_scale found no positional encoding in {type(model).__name__}: looked for `pos_embed` "
            "(model or embeds), timm RoPE modules (RotaryEmbedding, RotaryEmbeddingCat, RotaryEmbeddingMixed, "
            "RotaryEmbeddingDinoV3), `relative_position_bias_table` and RelPosMlp")

    def restore() -> None:
        for fn in reversed(restore_fns):
            fn()
        for t, original in reversed(saved):
            t.copy_(original)
    return restore


def _has_prefix_rows(model: nn.Module, table: torch.Tensor) -> bool:
    grid = getattr(getattr(model, "patch_embed", None), "num_patches", None)
    return grid is None or table.shape[1] != grid


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


def _scale_get_bias(module: nn.Module, alpha: float):
    """Shadow ``module.get_bias`` (used by both the fused and the explicit attention paths)."""
    original = module.get_bias
    module.get_bias = lambda: original() * alpha

    def restore():
        del module.get_bias
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
