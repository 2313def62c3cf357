"""Where to probe a timm ViT: its blocks, the probe sites in each block, and the token grid.

Supported: the flat timm ViT families, whose ``blocks`` all see the same (B, prefix + H*W, C) token
sequence: vision_transformer (incl. registers, no class token, avg pool, res-post-norm), deit
(incl. distilled), eva (incl. RoPE and dinov3-style), beit, vit_relpos, cait (its patch blocks; the
class token only joins in ``blocks_token_only``, which are not probed), naflexvit (image input),
and this package's ``PosGeomViT``. Hierarchical models (swin, hiera, mvit, pit...) and CNNs change
the grid between stages and are refused with an error that says so.

Sites:
    ``attn_input``   the input of each block's attention (the paper's site: the output of
                     ``norm1`` in a pre-norm block; the block input in a post-norm block);
    ``block_output`` the output of each block (the residual stream).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.utils.hooks import RemovableHandle

__all__ = ["SITES", "SUPPORTED_FAMILIES", "ProbeSites", "find_sites", "UnsupportedModelError"]

SITES = ("attn_input", "block_output")
SUPPORTED_FAMILIES = ("vision_transformer", "deit", "eva (incl. RoPE, dinov3)", "beit", "vit_relpos", "cait",
                      "naflexvit", "timm_posgeom PosGeomViT")


class UnsupportedModelError(TypeError):
    """The model is not a flat ViT that :func:`find_sites` knows how to probe."""


def _unsupported(model: nn.Module, why: str) -> UnsupportedModelError:
    return UnsupportedModelError(
        f"cannot probe {type(model).__name__}: {why}. probe_ssdc supports flat timm ViTs whose blocks all "
        f"see one token grid: {', '.join(SUPPORTED_FAMILIES)}. Hierarchical models (swin, hiera, mvit, pit, "
        "...) and CNNs are not supported.")


@dataclass
class ProbeSites:
    """The probe-able structure of one model.

    blocks: the transformer blocks in depth order (``model.blocks``; cait: its patch blocks).
    num_prefix_tokens: class / register / distillation tokens before the patch tokens (as the model
        declares them; the probe also accepts 0 where they join later, as in cait).
    family: a short name of what was recognised.
    """

    model: nn.Module
    blocks: list[nn.Module]
    num_prefix_tokens: int
    family: str

    def grid_size(self, img_hw: tuple[int, int]) -> tuple[int, int]:
        """The (H, W) token grid for an input image of height/width ``img_hw``.

        Raises ValueError when the model only accepts a fixed input size and ``img_hw`` differs.
        """
        embed = getattr(self.model, "embeds", None) if self.family == "naflexvit" else self.model.patch_embed
        h, w = int(img_hw[0]), int(img_hw[1])
        fixed = getattr(embed, "img_size", None)
        if fixed is not None and getattr(embed, "strict_img_size", False) and (h, w) != tuple(fixed):
            raise ValueError(
                f"{type(self.model).__name__} expects {tuple(fixed)[0]}x{tuple(fixed)[1]} images, got {h}x{w}: "
                "resize the data, or create the model with img_size=... (or dynamic_img_size=True)")
        if hasattr(embed, "dynamic_feat_size"):
            grid = embed.dynamic_feat_size((h, w))
        else:
            grid = tuple(embed.grid_size)
        grid = (int(grid[0]), int(grid[1]))
        if grid[0] < 1 or grid[1] < 1:
            raise ValueError(f"an image of {h}x{w} gives an empty token grid {grid}")
        return grid

    def register(self, site: str, layers: list[int],
                 callback: Callable[[int, torch.Tensor], None]) -> list[RemovableHandle]:
        """Hook ``site`` of the blocks ``layers``; ``callback(layer, tokens)`` gets (B, T, C) tokens."""
        if site not in SITES:
            raise ValueError(f"unknown site {site!r}; expected one of {', '.join(SITES)}")
        handles = []
        try:
            for layer in layers:
                block = self.blocks[layer]
                handles.append(_hook(block, site, layer, callback, self.model))
        except Exception:
            for h in handles:
                h.remove()
            raise
        return handles


def _first_tensor(value) -> torch.Tensor:
    return value[0] if isinstance(value, (tuple, list)) else value


def _hook(block: nn.Module, site: str, layer: int, callback, model: nn.Module) -> RemovableHandle:
    if site == "block_output":
        return block.register_forward_hook(lambda m, args, out: callback(layer, _first_tensor(out)))
    attn = getattr(block, "attn", None)
    if isinstance(attn, nn.Module):
        def pre_hook(m, args, kwargs):
            callback(layer, args[0] if args else kwargs["x"])
        return attn.register_forward_pre_hook(pre_hook, with_kwargs=True)
    for norm_name in ("norm1", "in_norm"):  # pre-norm blocks with a fused attention (ParallelScalingBlock)
        norm = getattr(block, norm_name, None)
        if isinstance(norm, nn.Module):
            return norm.register_forward_hook(lambda m, args, out: callback(layer, _first_tensor(out)))
    raise _unsupported(model, f"block {layer} ({type(block).__name__}) has no `attn`, `norm1` or `in_norm` "
                              "to take the attention input from; use site='block_output'")


def find_sites(model: nn.Module) -> ProbeSites:
    """Recognise a flat timm ViT and return its :class:`ProbeSites`.

    Raises UnsupportedModelError (a TypeError) naming the supported families otherwise.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    blocks = getattr(model, "blocks", None)
    if not isinstance(blocks, (nn.Sequential, nn.ModuleList)) or len(blocks) == 0:
        raise _unsupported(model, "it has no `blocks` (a flat sequence of transformer blocks)")
    embeds = getattr(model, "embeds", None)
    if embeds is not None and hasattr(embeds, "proj") and hasattr(embeds, "dynamic_feat_size"):
        family = "naflexvit"
    elif isinstance(getattr(model, "patch_embed", None), nn.Module):
        pe = model.patch_embed
        if not (hasattr(pe, "dynamic_feat_size") or hasattr(pe, "grid_size")):
            raise _unsupported(model, "its `patch_embed` gives no token grid (no dynamic_feat_size/grid_size)")
        family = "cait" if hasattr(model, "blocks_token_only") else type(model).__name__
    else:
        raise _unsupported(model, "it has no `patch_embed` (or naflexvit `embeds`)")
    num_prefix = int(getattr(model, "num_prefix_tokens", 0) or 0)
    return ProbeSites(model=model, blocks=list(blocks), num_prefix_tokens=num_prefix, family=family)
