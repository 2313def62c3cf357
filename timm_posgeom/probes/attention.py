"""The attention weights of a flat timm ViT, captured without changing what the model computes.

:func:`capture_attention` hooks each block's attention module and hands a callback the softmax
attention weights ``A`` (B, heads, T, T) of every probed block (rows: queries, columns: keys, each row
summing to 1 over all T tokens, prefix tokens included). Supported attention modules: timm's
``Attention`` (vision_transformer, deit), ``AttentionRope`` and eva's ``EvaAttention`` (eva, with or
without RoPE, and this package's ``PosGeomViT``). Definitions of what is measured on them:
docs/attention.md.

How the weights are captured. timm's fused path (``F.scaled_dot_product_attention``) never forms the
weights. Switching ``fused_attn`` off and hooking ``attn_drop`` would expose them, but it changes the
model's arithmetic (the unfused kernel rounds differently), so the outputs under the probe would not
be those of the model. Instead the weights are recomputed from what the module itself computes: a
forward hook on ``q_norm`` and ``k_norm`` (modules every supported class calls, ``nn.Identity`` when
there is no q/k norm) takes the queries and keys (B, heads, T, d_head) after the projection and the
norm, a forward pre-hook on the attention module takes its ``rope`` argument, and the rotation is
applied exactly as the module applies it (``apply_rot_embed_cat`` on the patch tokens only, in the
module's dtype, with its ``rotate_half`` layout). Then ``A = softmax((q * scale) k^T)`` in float32,
the unfused path's own formula with the module's ``scale`` (= d_head^-1/2, SDPA's default). The hooks
only read tensors, so the model's outputs are bit-for-bit those without the probe. An attention mask
or causal attention is refused (flat ViTs on whole images pass neither).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Iterator
from typing import Any, cast

import torch
import torch.nn as nn

from .sites import ProbeSites, UnsupportedModelError

__all__ = ["capture_attention", "attention_modules", "attention_weights"]


def _supported_classes() -> tuple[type, ...]:
    from timm.layers import Attention, AttentionRope
    from timm.models.eva import EvaAttention

    return Attention, AttentionRope, EvaAttention


def attention_modules(sites: ProbeSites, layers: list[int]) -> list[nn.Module]:
    """The attention module of each block ``layers`` of a flat ViT, or UnsupportedModelError.

    Only the exact classes whose forward is known are accepted (a subclass may change how the weights
    are formed: a relative position bias, a mask, ...)."""
    supported = _supported_classes()
    out = []
    for layer in layers:
        block = sites.blocks[layer]
        attn = getattr(block, "attn", None)
        if not isinstance(attn, nn.Module) or type(attn) not in supported:
            what = type(attn).__name__ if attn is not None else "no `attn` module"
            raise UnsupportedModelError(
                f"cannot capture the attention of {type(sites.model).__name__} block {layer} ({what}): attention "
                "measures support timm's Attention and AttentionRope (vision_transformer, deit) and EvaAttention "
                "(eva incl. RoPE, timm_posgeom PosGeomViT)"
            )
        out.append(attn)
    return out


def attention_weights(
    attn: nn.Module, q: torch.Tensor, k: torch.Tensor, rope: torch.Tensor | None = None
) -> torch.Tensor:
    """softmax((q * scale) k^T) of one supported attention module, float32 (B, heads, T, T).

    q, k: the outputs of ``attn.q_norm`` / ``attn.k_norm``, (B, heads, T, d_head) (k may have fewer,
    grouped, heads: repeated as the module repeats them). rope: the module's ``rope`` argument; when
    given, q and k of the patch tokens (after ``attn.num_prefix_tokens`` prefix tokens) are rotated as
    the module rotates them, in their own dtype, before the float32 logits.
    """
    if rope is not None:
        from timm.layers import apply_rot_embed_cat

        npt = attn.num_prefix_tokens
        half = getattr(attn, "rotate_half", False)
        dtype = q.dtype
        q = torch.cat([q[:, :, :npt, :], apply_rot_embed_cat(q[:, :, npt:, :], rope, half=half)], dim=2).to(dtype)
        k = torch.cat([k[:, :, :npt, :], apply_rot_embed_cat(k[:, :, npt:, :], rope, half=half)], dim=2).to(dtype)
    groups = int(getattr(attn, "num_kv_groups", 1) or 1)
    if groups > 1:
        k = k.repeat_interleave(groups, dim=1)
    scale = cast(float, attn.scale)  # a float attribute of each supported class (a Module's stubs: Tensor | Module)
    logits = (q.float() * scale) @ k.float().transpose(-2, -1)
    return logits.softmax(dim=-1)


class _Capture:
    """The hooks of one attention module: its rope argument, q and k; the weights at its output."""

    def __init__(self, attn: nn.Module, layer: int, callback: Callable[[int, torch.Tensor], None]) -> None:
        self.attn, self.layer, self.callback = attn, layer, callback
        self.q: torch.Tensor | None = None
        self.k: torch.Tensor | None = None
        self.rope: torch.Tensor | None = None

    def register(self) -> list:
        return [
            self.attn.register_forward_pre_hook(self.before, with_kwargs=True),
            cast(nn.Module, self.attn.q_norm).register_forward_hook(self.take_q),
            cast(nn.Module, self.attn.k_norm).register_forward_hook(self.take_k),
            self.attn.register_forward_hook(self.after),
        ]

    def before(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        given = dict(zip(_params(module), args)) | kwargs
        if given.get("attn_mask") is not None or given.get("is_causal"):
            raise UnsupportedModelError(
                f"block {self.layer}'s attention got an attention mask or causal flag: the "
                "attention measures are defined for full attention over whole images"
            )
        self.rope = given.get("rope")
        self.q = self.k = None

    def take_q(self, module: nn.Module, args: tuple, out: torch.Tensor) -> None:
        self.q = out

    def take_k(self, module: nn.Module, args: tuple, out: torch.Tensor) -> None:
        self.k = out

    def after(self, module: nn.Module, args: tuple, out: torch.Tensor) -> None:
        if self.q is None or self.k is None:
            raise RuntimeError(
                f"block {self.layer}'s {type(module).__name__} ran without calling q_norm / k_norm: "
                "its attention weights cannot be recomputed"
            )
        q, k, rope = self.q, self.k, self.rope
        self.q = self.k = self.rope = None
        self.callback(self.layer, attention_weights(module, q, k, rope))


@functools.cache
def _forward_params(forward: Callable[..., Any]) -> tuple[str, ...]:
    return tuple(inspect.signature(forward).parameters)[1:]  # without self


def _params(module: nn.Module) -> tuple[str, ...]:
    """The names of ``module.forward``'s parameters, in order (cached per class)."""
    return _forward_params(type(module).forward)


@contextlib.contextmanager
def capture_attention(
    sites: ProbeSites, layers: list[int], callback: Callable[[int, torch.Tensor], None]
) -> Iterator[None]:
    """Inside the block, every forward pass of the model calls ``callback(layer, A)`` once per probed
    block, in depth order, with ``A`` (B, heads, T, T) float32 its attention weights (see the module
    docstring). Raises UnsupportedModelError for an attention module it cannot read. The hooks are
    removed on exit; the model's outputs are unchanged."""
    captures = [_Capture(attn, layer, callback) for attn, layer in zip(attention_modules(sites, layers), layers)]
    handles: list = []
    try:
        for c in captures:
            handles += c.register()
        yield
    finally:
        for h in handles:
            h.remove()
