"""The block layout of a ``PosGeomViT``: timm's (the default) or the paper's.

``timm``: timm's pre-norm ViT as its ``Eva`` builds it: a final LayerNorm before the head, dropout after
``attn.proj``, after the MLP's activation and after ``mlp.fc2`` (all ``proj_drop_rate``), on the pooled
token before the head (``drop_rate``), q and v biases outside the fused ``qkv`` Linear with a fixed zero
key bias, and drop path rising linearly from 0 to ``drop_path_rate`` over the blocks.

``paper``: the layers of the paper's code (github.com/mahmoud-mannes/vit-encoding-paper,
``code/src/main/model.py``):

* the same pre-norm blocks ``x + DropPath(MSA(LN(x)))``, ``x + DropPath(MLP(LN(x)))``, each LayerNorm with
  PyTorch's default epsilon 1e-5 (timm's is 1e-6);
* **no final LayerNorm**: the class token of the last block goes straight to one ``Linear`` head;
* one fused ``qkv`` Linear **with its whole bias** (key bias included: with RoPE the key bias is rotated
  per position, so a zero key bias is not equivalent there), timm's ``AttentionRope``;
* dropout only on the embedding sum (``pos_drop_rate``), inside attention (``attn_drop_rate``, the
  ``dropout_p`` of ``scaled_dot_product_attention``) and after the MLP's GELU (``mlp_drop_rate``); none
  after ``attn.proj`` or ``mlp.fc2``, none on the head;
* drop path ``i * drop_path_rate / depth`` in block ``i`` (0, ..., 11/12 of the rate for 12 blocks):
  the rule of the paper's ``ViTConfig`` (``initial_drop + i * (drop_path_rate - initial_drop) /
  n_encoder_layers`` with ``initial_drop = 0``); timm's rule reaches the full rate in the last block.

Everything else is timm's ``Eva`` with the kwargs set here: this module writes code only for what timm's
kwargs cannot express (per-site dropout in the MLP and attention output, the paper's drop path rule).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch.nn as nn
from timm.layers import DropPath, LayerNorm

from ..errors import SettingError

__all__ = ["LAYOUTS", "eva_layout_kwargs", "apply_layout"]

LAYOUTS = ("timm", "paper")

# Eva kwargs the paper's layout sets itself: a different value would build another model
_PAPER_EVA = dict(
    attn_type="rope",
    qkv_fused=True,
    qkv_bias=True,
    use_post_transformer_norm=False,
    use_fc_norm=False,
    use_pre_transformer_norm=False,
    use_post_norm=False,
    init_values=None,
    scale_attn_inner=False,
    scale_mlp=False,
    swiglu_mlp=False,
    qk_norm=False,
    class_token=True,
    no_embed_class=False,
    num_reg_tokens=0,
    norm_layer=partial(LayerNorm, eps=1e-5),
)
# dropout sites the paper's model does not have
_PAPER_NO_DROP = {"proj_drop_rate": "after attn.proj and mlp.fc2", "drop_rate": "on the head"}


def eva_layout_kwargs(layout: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` (those of timm's ``Eva``) for ``layout``; ValueError for a value the layout cannot have.

    For ``paper``: ``attn_type='rope'`` (a fused qkv Linear with its whole bias), no final or fc norm, and
    no ``proj_drop_rate`` / ``drop_rate`` (sites the paper's model has no dropout at)."""
    if layout not in LAYOUTS:
        raise SettingError(f"unknown layout {layout!r}; expected one of {', '.join(LAYOUTS)}")
    if layout == "timm":
        return kwargs
    for key, value in _PAPER_EVA.items():
        if key in kwargs and kwargs[key] != value:
            shown = "LayerNorm(eps=1e-5)" if key == "norm_layer" else repr(value)
            raise SettingError(f"layout='paper' sets {key}={shown}; got {kwargs[key]!r}")
    for key, where in _PAPER_NO_DROP.items():
        if kwargs.get(key, 0.0):
            raise SettingError(
                f"layout='paper' has no dropout {where} ({key}={kwargs[key]}): the paper's model "
                "drops only on the embedding (pos_drop_rate), inside attention (attn_drop_rate) and "
                "after the MLP's GELU (mlp_drop_rate)"
            )
    return dict(kwargs, **_PAPER_EVA)


def apply_layout(model: nn.Module, layout: str, mlp_drop_rate: float | None, drop_path_rate: float) -> None:
    """Set the dropout after each MLP's activation (``mlp.drop1``) and, for ``paper``, the drop path of each
    block (the paper's rule, module docstring) on a built ``Eva``; ``mlp_drop_rate`` None leaves timm's
    (``proj_drop_rate``) under ``timm`` and means 0 under ``paper``."""
    if mlp_drop_rate is not None and not 0.0 <= mlp_drop_rate < 1.0:
        raise SettingError(f"mlp_drop_rate must be in [0, 1), got {mlp_drop_rate}")
    blocks = model.blocks
    if not isinstance(blocks, nn.ModuleList):
        raise TypeError(f"apply_layout takes a model with a ModuleList of blocks, got {type(blocks).__name__}")
    depth = len(blocks)
    for i, blk in enumerate(blocks):
        if mlp_drop_rate is not None or layout == "paper":
            blk.get_submodule("mlp").drop1 = nn.Dropout(mlp_drop_rate or 0.0)
        if layout == "paper":
            rate = i * drop_path_rate / depth
            blk.drop_path1 = DropPath(rate) if rate > 0 else nn.Identity()
            blk.drop_path2 = DropPath(rate) if rate > 0 else nn.Identity()
