"""Where to probe a timm model: its blocks or stages, the probe sites, and the token grid(s).

Two kinds of model:

* **flat ViTs**, whose ``blocks`` all see the same (B, prefix + H*W, C) token sequence:
  vision_transformer (incl. registers, no class token, avg pool, res-post-norm, parallel blocks),
  deit (incl. distilled), eva (incl. RoPE and dinov3-style), beit, vit_relpos, cait (its patch
  blocks; the class token only joins in ``blocks_token_only``, which are not probed), naflexvit
  (image input), convit, xcit, samvit (incl. windowed blocks), timm's VLM towers (qwen3_vit,
  deepseek_vit, gemma4_vit: the blocks of ``model.encoder``) and this package's ``PosGeomViT``.
  Probed at ``attn_input`` or ``block_output`` of each block, on one grid;
* **staged models**, whose grid changes with depth (swin, swinv2, hiera, mvitv2, pit, levit, twins,
  fastvit, crossvit's two branches, ...) and CNNs (resnet, convnext, ...), and the MLP models
  (mixer, resmlp, gmlp): probed at ``stage_output``, each feature map that timm's
  ``forward_intermediates`` returns (one per stage, or per block where timm gives one per block),
  each on its own H x W grid. Any timm model with ``forward_intermediates`` can be probed so,
  flat ViTs included (there it equals ``block_output``).

Sites:
    ``attn_input``   the input of each block's attention (the paper's site: the output of
                     ``norm1`` in a pre-norm block, before any window partition; the block input in
                     a post-norm block; the first branch's in a block of parallel attentions);
    ``block_output`` the output of each block (the residual stream);
    ``stage_output`` each feature map of ``forward_intermediates`` (NCHW), on its own grid.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn as nn
from torch.utils.hooks import RemovableHandle

from ..errors import DataError, PosgeomError, SettingError
from ..interventions import vlm_encoder

__all__ = [
    "SITES",
    "SUPPORTED_FAMILIES",
    "ProbeSites",
    "StageSites",
    "find_sites",
    "find_stages",
    "resolve_site",
    "UnsupportedModelError",
]

SITES = ("attn_input", "block_output", "stage_output")
SUPPORTED_FAMILIES = (
    "vision_transformer",
    "deit",
    "eva (incl. RoPE, dinov3)",
    "beit",
    "vit_relpos",
    "cait",
    "naflexvit",
    "convit",
    "xcit",
    "samvit",
    "qwen3_vit, deepseek_vit, gemma4_vit",
    "timm_posgeom PosGeomViT",
)


class UnsupportedModelError(PosgeomError, TypeError):
    """The model is not a flat ViT that :func:`find_sites` knows how to probe."""


def _unsupported(model: nn.Module, why: str) -> UnsupportedModelError:
    return UnsupportedModelError(
        f"cannot probe {type(model).__name__}: {why}. probe_ssdc supports flat timm ViTs whose blocks all "
        f"see one token grid: {', '.join(SUPPORTED_FAMILIES)}. Hierarchical models (swin, hiera, mvit, pit, "
        "...), CNNs and MLP models are probed per stage: site='stage_output' (or 'auto')"
    )


@dataclass
class ProbeSites:
    """The probe-able structure of one model.

    blocks: the transformer blocks in depth order (``model.blocks``; cait: its patch blocks).
    num_prefix_tokens: class / register / distillation tokens before the patch tokens (as the model
        declares them; the probe also accepts 0 where they join later, as in cait).
    family: a short name of what was recognised.
    patch_embed: the module whose grid the tokens lie on (``model.patch_embed``; naflexvit's ``embeds``; the
        VLM towers' ``encoder.patch_embed``); None: ``model.patch_embed``.
    """

    model: nn.Module
    blocks: list[nn.Module]
    num_prefix_tokens: int
    family: str
    patch_embed: nn.Module | None = None

    def grid_size(self, img_hw: tuple[int, int]) -> tuple[int, int]:
        """The (H, W) token grid for an input image of height/width ``img_hw``.

        Raises ValueError when the model only accepts a fixed input size and ``img_hw`` differs.
        """
        embed = self.patch_embed if self.patch_embed is not None else self.model.patch_embed
        h, w = int(img_hw[0]), int(img_hw[1])
        fixed = getattr(embed, "img_size", None)
        if fixed is not None and getattr(embed, "strict_img_size", False) and (h, w) != tuple(fixed):
            raise DataError(
                f"{type(self.model).__name__} expects {tuple(fixed)[0]}x{tuple(fixed)[1]} images, got {h}x{w}: "
                "resize the data, or create the model with img_size=... (or dynamic_img_size=True)"
            )
        if not isinstance(embed, nn.Module):
            raise _unsupported(self.model, "it has no patch embedding module to give its token grid")
        feat_size = getattr(embed, "dynamic_feat_size", None)  # the grid of any input size, where timm has it
        if feat_size is not None:
            size = feat_size((h, w))
        elif hasattr(embed, "grid_size"):
            size = tuple(cast(Sequence[int], embed.grid_size))
        else:  # gemma4_vit's patch embedding: non-overlapping patches of patch_size, no padding
            ph, pw = cast(Sequence[int], embed.patch_size)
            size = (h // int(ph), w // int(pw))
        grid = (int(size[0]), int(size[1]))
        if grid[0] < 1 or grid[1] < 1:
            raise DataError(f"an image of {h}x{w} gives an empty token grid {grid}")
        return grid

    def register(
        self, site: str, layers: list[int], callback: Callable[[int, torch.Tensor], None]
    ) -> list[RemovableHandle]:
        """Hook ``site`` of the blocks ``layers``; ``callback(layer, tokens)`` gets (B, T, C) tokens."""
        if site not in SITES:
            raise SettingError(f"unknown site {site!r}; expected one of {', '.join(SITES)}")
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
    norm1 = getattr(block, "norm1", None)
    if getattr(block, "window_size", 0) and isinstance(norm1, nn.Module):  # samvit: norm1 -> window partition -> attn
        return norm1.register_forward_hook(lambda m, args, out: callback(layer, _first_tensor(out)))
    attns = getattr(block, "attns", None)  # parallel blocks: (norm -> attn) branches; the first one's input
    attn = (
        attns[0].attn
        if isinstance(attns, nn.ModuleList) and hasattr(attns[0], "attn")
        else getattr(block, "attn", None)
    )
    if isinstance(attn, nn.Module):

        def pre_hook(m, args, kwargs):
            callback(layer, args[0] if args else kwargs["x"])

        return attn.register_forward_pre_hook(pre_hook, with_kwargs=True)
    for norm_name in ("norm1", "in_norm"):  # pre-norm blocks with a fused attention (ParallelScalingBlock)
        norm = getattr(block, norm_name, None)
        if isinstance(norm, nn.Module):
            return norm.register_forward_hook(lambda m, args, out: callback(layer, _first_tensor(out)))
    raise _unsupported(
        model,
        f"block {layer} ({type(block).__name__}) has no `attn`, `attns`, `norm1` or `in_norm` "
        "to take the attention input from; use site='block_output'",
    )


def find_sites(model: nn.Module) -> ProbeSites:
    """Recognise a flat timm ViT and return its :class:`ProbeSites`.

    Raises UnsupportedModelError (a TypeError) naming the supported families otherwise.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    trunk = vlm_encoder(model)  # the VLM towers: a classifier around `encoder`, whose blocks are probed
    blocks = getattr(trunk, "blocks", None)
    if not isinstance(blocks, (nn.Sequential, nn.ModuleList)) or len(blocks) == 0:
        raise _unsupported(model, "it has no `blocks` (a flat sequence of transformer blocks)")
    embeds = getattr(trunk, "embeds", None)
    if embeds is not None and hasattr(embeds, "proj") and hasattr(embeds, "dynamic_feat_size"):
        family, embed = "naflexvit", embeds
    elif isinstance(getattr(trunk, "patch_embed", None), nn.Module):
        embed = trunk.patch_embed
        if not any(hasattr(embed, a) for a in ("dynamic_feat_size", "grid_size", "position_embedding_table")):
            raise _unsupported(model, "its `patch_embed` gives no token grid (no dynamic_feat_size/grid_size)")
        family = "cait" if hasattr(model, "blocks_token_only") else type(model).__name__
    else:
        raise _unsupported(model, "it has no `patch_embed` (or naflexvit `embeds`)")
    reductions = _reductions(model)
    if len(set(reductions)) > 1:
        raise _unsupported(
            model, f"its grid changes between blocks (feature reductions {', '.join(map(str, reductions))})"
        )
    num_prefix = int(getattr(trunk, "num_prefix_tokens", 0) or 0)
    return ProbeSites(model=model, blocks=list(blocks), num_prefix_tokens=num_prefix, family=family, patch_embed=embed)


def _reductions(model: nn.Module) -> list[int]:
    """The stride of each of timm's ``feature_info`` entries (empty when the model declares none)."""
    info = getattr(model, "feature_info", None)
    try:
        return [int(f["reduction"]) for f in info] if info else []
    except (TypeError, KeyError, ValueError):
        return []


@dataclass
class StageSites:
    """The stages (or blocks) of a model whose grid may change with depth, as timm's
    ``forward_intermediates`` gives them: ``names[i]`` is the module of output i (from
    ``feature_info``)."""

    model: nn.Module
    names: list[str]
    family: str

    def forward(self, images: torch.Tensor, layers: list[int]) -> list[torch.Tensor]:
        """The (B, C, H, W) feature maps of outputs ``layers`` for ``images``, in that order."""
        forward = cast(Callable[..., list[torch.Tensor]], self.model.forward_intermediates)  # timm's method
        out = forward(images, indices=list(layers), intermediates_only=True, stop_early=True, output_fmt="NCHW")
        if len(out) != len(layers):
            raise RuntimeError(
                f"{type(self.model).__name__}.forward_intermediates returned {len(out)} feature maps "
                f"for {len(layers)} indices"
            )
        return list(out)


def find_stages(model: nn.Module) -> StageSites:
    """The :class:`StageSites` of any timm model with ``forward_intermediates`` and ``feature_info``."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    info = getattr(model, "feature_info", None)
    if not callable(getattr(model, "forward_intermediates", None)) or not info:
        raise UnsupportedModelError(
            f"cannot probe {type(model).__name__} per stage: it has no timm `forward_intermediates` and "
            "`feature_info` (every timm ViT, hierarchical model and CNN of timm 1.0 has them)"
        )
    names = [str(f.get("module", i)) for i, f in enumerate(info)]
    return StageSites(model=model, names=names, family=type(model).__name__)


def resolve_site(model: nn.Module, site: str) -> str:
    """``auto`` -> ``attn_input`` for a flat ViT (the paper's site), else ``stage_output``; others as given."""
    if site != "auto":
        if site not in SITES:
            raise SettingError(f"unknown site {site!r}; expected auto or one of {', '.join(SITES)}")
        return site
    try:
        find_sites(model)
        return "attn_input"
    except UnsupportedModelError:
        return "stage_output"
