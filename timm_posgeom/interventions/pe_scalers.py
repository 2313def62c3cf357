"""How :func:`~timm_posgeom.interventions.pe_scale` scales each kind of positional encoding in place, and
restores it exactly: a tensor times alpha, a module's output times alpha (a forward hook), a shadowed
``get_bias``, RoPE angles (bands or periods, caches rebuilt), swinv2's continuous position bias
(docs/method.md#pe-scaling-alpha)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn

Undo = list  # restore callbacks, run last first
Apply = Callable[[float, Undo], None]  # scales in place for one alpha and appends its restore callbacks
# The PE modules below are third parties' (timm's RoPE, swinv2's attention, ...), read by duck typing: typed
# ``Any`` (an ``nn.Module`` whose attributes these functions know), as torch types a module's attributes
# ``Tensor | Module``.


def run_undo(undo: Undo) -> None:
    for fn in reversed(undo):
        fn()


def scale_tensor(t: torch.Tensor, rows: slice | None = None) -> Apply:
    """``t`` (or its rows ``t[:, rows]``) times alpha, in place; restored from a saved copy."""

    def apply(alpha: float, undo: Undo) -> None:
        original = t.detach().clone()
        undo.append(lambda: t.copy_(original))
        (t if rows is None else t[:, rows]).mul_(alpha)

    return apply


def undo_with(scale, module: Any) -> Apply:
    """Adapt ``scale(module, alpha) -> restore`` to an :data:`Apply`."""
    return lambda alpha, undo: undo.append(scale(module, alpha))


def scale_output(module: Any) -> Apply:
    """A forward hook multiplying ``module``'s output by alpha (none at alpha = 1: bit-identical)."""

    def apply(alpha: float, undo: Undo) -> None:
        if alpha != 1.0:
            undo.append(module.register_forward_hook(lambda m, args, out: out * alpha).remove)

    return apply


def shadow(module: Any, name: str, method: Callable[..., Any]) -> Callable[[], None]:
    """Set ``method`` as ``module``'s own attribute ``name`` (over its class's method); return what restores the
    attribute as it was: an outer context's shadow, or none."""
    previous = vars(module).get(name)
    setattr(module, name, method)

    def restore() -> None:
        if previous is None:
            delattr(module, name)
        else:
            setattr(module, name, previous)

    return restore


def shadow_get_bias(module: Any) -> Apply:
    """Shadow ``module.get_bias`` (used by both the fused and the explicit attention paths)."""

    def apply(alpha: float, undo: Undo) -> None:
        original = module.get_bias
        undo.append(shadow(module, "get_bias", lambda: original() * alpha))

    return apply


def scale_axial_rope(module: Any, alpha: float):
    """timm axial RoPE: angles = pos * bands, so scale the bands and rebuild the cached table."""
    if alpha == 1.0:  # exact no-op (a rebuilt cache can differ from the stored one in the last bits)
        return lambda: None
    bands = module.bands.detach().clone()
    cache_names = [
        n for n in ("pos_embed", "pos_embed_sin", "pos_embed_cos") if isinstance(getattr(module, n, None), torch.Tensor)
    ]
    caches = {n: getattr(module, n).detach().clone() for n in cache_names}
    with torch.no_grad():
        module.bands.mul_(alpha)
    if caches and module.feat_shape is not None:
        if "pos_embed" in caches:
            module.pos_embed = module._build_embed_cat(module.feat_shape, module.bands).to(caches["pos_embed"])
        else:
            sin, cos = module._build_embed(module.feat_shape, module.bands)
            module.pos_embed_sin, module.pos_embed_cos = (
                sin.to(caches["pos_embed_sin"]),
                cos.to(caches["pos_embed_cos"]),
            )

    def restore():
        with torch.no_grad():
            module.bands.copy_(bands)
        for n, v in caches.items():
            setattr(module, n, v)

    return restore


def scale_dinov3_rope(module: Any, alpha: float):
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


def is_swinv2_attention(module: nn.Module) -> bool:
    """timm swinv2's WindowAttention: adds 16 * sigmoid(cpb_mlp(...)) to its logits, then calls ``softmax``."""
    return (
        isinstance(getattr(module, "cpb_mlp", None), nn.Module)
        and isinstance(getattr(module, "softmax", None), nn.Softmax)
        and hasattr(module, "relative_position_index")
    )


def _swinv2_bias(attn: Any) -> torch.Tensor:
    """The bias swinv2's ``WindowAttention.forward`` adds to its logits (timm 1.0.31), (heads, N, N)."""
    n = attn.window_size[0] * attn.window_size[1]
    table = attn.cpb_mlp(attn.relative_coords_table).view(-1, attn.num_heads)
    bias = table[attn.relative_position_index.view(-1)].view(n, n, -1).permute(2, 0, 1)
    return 16 * torch.sigmoid(bias)


def scale_swinv2_bias(attn: Any) -> Apply:
    """The logits reach ``attn.softmax`` with the bias b added: a pre-hook adds (alpha - 1) * b, so they carry
    alpha * b. (b = 16 * sigmoid(.) is in (0, 16): no output of cpb_mlp gives alpha * b for alpha > 1.)"""

    def apply(alpha: float, undo: Undo) -> None:
        if alpha == 1.0:
            return

        def pre_hook(softmax: nn.Module, args: tuple) -> tuple:
            return (args[0] + (alpha - 1.0) * _swinv2_bias(attn), *args[1:])

        undo.append(attn.softmax.register_forward_pre_hook(pre_hook).remove)

    return apply
