"""State dicts of timm's ``VisionTransformer`` (``vit_*_patch16_224``) and of this family, adapted to a ``PosGeomViT``.

timm's ViT and ``PosGeomViT`` (timm's ``Eva``) hold the same layers under the same names but two:

* attention biases: the ViT's fused ``attn.qkv.bias`` (3 x D: query, key, value) against Eva's ``attn.q_bias``
  and ``attn.v_bias`` with a fixed zero key bias. The key bias is dropped: it adds q_i . b_k to every logit of
  query i, one constant per softmax row, which the softmax cancels; exactly so unless the keys are rotated
  (RoPE) or normalised (``qk_norm``) after the bias, where a non-zero key bias is refused;
* layer scale: the ViT's ``ls1.gamma`` / ``ls2.gamma`` against Eva's ``gamma_1`` / ``gamma_2``.

The class token, the position table (class-token row included, as in both), patch embedding, norms, MLPs and
head share names. A position table of another grid is resampled as timm's own filters do.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
from timm.layers import resample_abs_pos_embed

from ..errors import SettingError

__all__ = ["adapt_state_dict"]

_LAYER_SCALE = ((".ls1.gamma", ".gamma_1"), (".ls2.gamma", ".gamma_2"))


def adapt_state_dict(state_dict: dict[str, torch.Tensor], model: Any) -> dict[str, torch.Tensor]:
    """``state_dict`` (timm's ViT or this family's) under ``model``'s names and shapes (see the module docstring).

    ``model``: a ``PosGeomViT``. Keys the model does not know pass through unchanged (a strict load names them).
    """
    own = set(model.state_dict())
    out: dict[str, torch.Tensor] = {}
    for key, value in state_dict.items():
        if key.endswith("attn.qkv.bias") and key not in own and key[: -len("qkv.bias")] + "q_bias" in own:
            prefix = key[: -len("qkv.bias")]
            q_bias, k_bias, v_bias = value.chunk(3)
            _check_key_bias(model.get_submodule(prefix.rstrip(".")), model, k_bias, key)
            out[prefix + "q_bias"], out[prefix + "v_bias"] = q_bias, v_bias
            continue
        for theirs, ours in _LAYER_SCALE:
            if key.endswith(theirs) and key not in own:
                key = key[: -len(theirs)] + ours
        if key == "pos_embed" and model.pos_embed is not None and value.shape != model.pos_embed.shape:
            num_prefix = 0 if model.no_embed_class else model.num_prefix_tokens
            value = resample_abs_pos_embed(value, new_size=model.patch_embed.grid_size, num_prefix_tokens=num_prefix)
        out[key] = value
    return out


def _check_key_bias(attn: nn.Module, model: Any, k_bias: torch.Tensor, key: str) -> None:
    """ValueError (one line) when dropping a non-zero key bias would change the attention (see the module docstring)."""
    rotated = getattr(model, "pe", None) == "rope"
    normed = not isinstance(getattr(attn, "k_norm", None), (nn.Identity, type(None)))
    if (rotated or normed) and bool(k_bias.any()):
        raise SettingError(
            f"{key}: a non-zero key bias cannot be dropped from a model whose keys are "
            f"{'rotated (RoPE)' if rotated else 'normalised (qk_norm)'} after it; load it into an "
            "APE or sincos model, or one without qk_norm"
        )
