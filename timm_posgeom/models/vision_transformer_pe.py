"""Vision Transformers that differ only in their positional encoding

One architecture (timm's pre-norm ViT, built on timm's ``Eva`` class and its blocks) whose only
variable is the positional encoding (PE):

* ``none``   - no positional information at all (permutation-equivariant over patch tokens)
* ``ape``    - learned absolute table, with a row for the class token as in the paper
* ``sincos`` - fixed 2-D sine-cosine table on patch tokens, rebuilt (never interpolated) for a new grid
* ``rope``   - 2-D axial RoPE (base 10000) on the patch tokens' queries and keys; prefix tokens not rotated

plus ``alpha`` (scale of the PE at inference), ``token_shuffle`` (random permutation of the patch
tokens after the patch embedding and before any PE: ``train`` is the paper's RPT), ``init`` (``timm``'s
initialisation, or ``paper``: the paper code's PyTorch-default initialisation, see
:meth:`PosGeomViT.init_weights_paper`) and ``layout`` (``timm``'s layers, or ``paper``: the layers of the
paper's code, no final norm and dropout only where it drops; see :mod:`timm_posgeom.models.layout`).

Papers:
* `Positional Encodings Anchor Spatial Structure in Vision Transformers: A Geometric Perspective on
  Robustness` - https://arxiv.org/abs/2606.00124
* `An Image is Worth 16x16 Words: Transformers for Image Recognition at Scale` - https://arxiv.org/abs/2010.11929
* `RoFormer: Enhanced Transformer with Rotary Position Embedding` - https://arxiv.org/abs/2104.09864
* `Rotary Position Embedding for Vision Transformer` - https://arxiv.org/abs/2403.13298

List every model of the plugin: ``timm.list_models(module='vision_transformer_pe')``
(or ``timm_posgeom.list_models()``).
"""

import math
from collections.abc import Callable
from typing import Any, Optional, cast

import torch
import torch.nn as nn
from timm.layers import resample_abs_pos_embed
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model
from timm.models.eva import Eva

from ..errors import SettingError
from ..pos.common import PE_TYPES, TOKEN_SHUFFLE_MODES, check_alpha
from ..pos.rope import ScaledRotaryEmbeddingCat
from ..pos.sincos import sincos_2d
from .checkpoint import adapt_state_dict
from .layout import LAYOUTS, apply_layout, eva_layout_kwargs
from .pretrained import hub_weights_file, micro_pretrained_cfgs

__all__ = ["PosGeomViT", "INIT_TYPES", "LAYOUTS"]

# ``timm``: timm's Eva init (trunc-normal std 0.02 for Linear weights, PE and class token, zero biases, the
# depth rescale of attn.proj / mlp.fc2, head scaled by 0.001). ``paper``: the paper's code
# (github.com/mahmoud-mannes/vit-encoding-paper, code/src/main/model.py), which sets no init of its own:
# PyTorch's defaults everywhere (see PosGeomViT.init_weights_paper).
INIT_TYPES = ("timm", "paper")


class PosGeomViT(Eva):
    """ViT whose only architectural variable is the positional encoding.

    Args (beyond timm's ``Eva``, whose other kwargs all pass through):
        pe: one of ``none``, ``ape``, ``sincos``, ``rope``.
        alpha: PE scale, any finite value >= 0 (1 = the PE as trained, 0 = no PE). For ``ape`` the
            whole table is scaled, class-token row included (the paper's convention); for ``sincos``
            the patch table; for ``rope`` the rotation angles.
        token_shuffle: ``none``; ``train`` (RPT: a fresh permutation of the patch tokens at every
            training forward, never in eval); ``eval`` (only in eval mode); ``always``. One
            permutation per forward pass, shared by the batch, drawn from torch's global RNG on the
            tokens' device (so accelerate's RNG checkpointing makes RPT runs resumable).
        rope_temperature: RoPE base (10000 as in the paper).
        init: ``timm`` (timm's Eva initialisation, the default) or ``paper`` (the paper code's
            initialisation, PyTorch's defaults: see :meth:`init_weights_paper`). Applied after timm's
            own init; kept as ``self.init`` and in exported configs. Loading weights overwrites it.
        layout: ``timm`` (timm's Eva layers, the default) or ``paper`` (the paper code's layers: no final
            norm, a fused qkv Linear with its whole bias, dropout only on the embedding sum, inside
            attention and after the MLP's GELU, the paper's drop path rule; :mod:`timm_posgeom.models.layout`).
            Kept as ``self.layout`` and in exported configs: the two hold different parameters.
        mlp_drop_rate: dropout after the MLP's activation (``mlp.drop1``; the paper's "Dropout (MLP)").
            None: ``proj_drop_rate`` under ``layout='timm'`` (timm's), 0 under ``layout='paper'``.

    The defaults give a standard ViT: class token, token pooling, no layer scale, qkv bias.
    """

    sincos_embed: Optional[torch.Tensor]  # a buffer (registered in __init__), None unless pe == 'sincos'

    def __init__(
        self,
        pe: str = "ape",
        alpha: float = 1.0,
        token_shuffle: str = "none",
        rope_temperature: float = 10000.0,
        global_pool: str = "token",
        init: str = "timm",
        layout: str = "timm",
        mlp_drop_rate: Optional[float] = None,
        **kwargs: Any,
    ):
        _check_args(type(self).__name__, pe, token_shuffle, init, layout, global_pool, kwargs)
        alpha = check_alpha(alpha)
        if pe == "none" and alpha != 1.0:
            raise SettingError(f"alpha={alpha} on a model without positional encoding (pe='none') would scale nothing")
        kwargs = eva_layout_kwargs(layout, kwargs)
        # the paper init draws from the CPU generator as it stood before timm's init (see init_weights_paper)
        cpu_rng = torch.random.get_rng_state() if init == "paper" else None
        super().__init__(
            global_pool=global_pool,
            use_abs_pos_emb=pe == "ape",
            use_rot_pos_emb=False,
            **kwargs,
        )
        self.layout = layout
        apply_layout(self, layout, mlp_drop_rate, kwargs.get("drop_path_rate", 0.0))
        self.pe = pe
        self.alpha = alpha
        self.token_shuffle = token_shuffle
        dd = {"device": kwargs.get("device"), "dtype": kwargs.get("dtype")}
        grid = self.patch_embed.grid_size
        # always registered (None unless pe == 'sincos') so the model stays scriptable
        sincos = sincos_2d(grid, self.embed_dim, device=dd["device"]) if pe == "sincos" else None
        self.register_buffer("sincos_embed", sincos, persistent=False)
        if pe == "rope":
            attn: Any = self.blocks[0].attn  # timm's EvaAttention
            self.rope = ScaledRotaryEmbeddingCat(
                self.embed_dim // attn.num_heads,
                alpha=alpha,
                in_pixels=False,
                temperature=rope_temperature,
                feat_shape=None if self.dynamic_img_size else list(grid),
                **dd,
            )
        self.init = init
        if init == "paper":
            if cpu_rng is not None and self.patch_embed.proj.weight.device.type == "cpu":
                torch.random.set_rng_state(cpu_rng)  # rewind past timm's init: the paper's random stream
            self.init_weights_paper()

    # --- initialisation ---------------------------------------------------------------------------
    def init_weights(self, needs_reset: bool = True) -> None:
        """(Re-)initialise the weights with this model's ``init`` (timm's Eva init, then the paper's if asked)."""
        super().init_weights(needs_reset=needs_reset)
        if getattr(self, "init", "timm") == "paper":  # Eva.__init__ calls this before self.init exists
            self.init_weights_paper()

    @torch.no_grad()
    def init_weights_paper(self) -> None:
        """The paper code's initialisation: PyTorch's defaults, nothing of its own.

        The paper's ``VisionTransformer`` (code/src/main/model.py) builds ``nn.Conv2d`` (patches),
        ``nn.Parameter(torch.randn(1, 1, D))`` (class token), ``nn.Embedding(num_patches + 1, D)`` (the
        APE, class-token row included, created for every condition), then per layer ``nn.LayerNorm``,
        ``nn.Linear(D, 3 * D)`` (fused qkv with bias) and ``nn.Linear(D, D)``, then per layer
        ``nn.LayerNorm``, ``nn.Linear(D, 4 * D)``, ``nn.Linear(4 * D, D)``, and ``nn.Linear(D, classes)``;
        it never re-initialises. So here:

        * every ``nn.Linear`` / ``nn.Conv2d``: ``reset_parameters()`` (weights kaiming-uniform a=sqrt(5),
          i.e. U(+-1/sqrt(fan_in)); biases U(+-1/sqrt(fan_in))), with no depth rescale and no head scale;
        * the q and v biases (Eva keeps them outside the bias-free ``qkv`` Linear): U(+-1/sqrt(fan_in)),
          cut from one 3*D draw as the paper's fused bias; the key bias stays Eva's fixed zero (a key
          bias adds the same q.b to every logit of a query, which the softmax cancels);
        * ``pos_embed`` and the class token (and register tokens, if any): N(0, 1). Without an APE the
          table is drawn and discarded, as the paper's model creates it in every condition;
        * every ``nn.LayerNorm``: weight 1, bias 0. RoPE and the sincos table hold nothing learned.

        Draws follow the paper's construction order, so a model built on the CPU right after
        ``torch.manual_seed(s)`` holds the initial weights the paper's code builds after the same seed
        (the constructor rewinds the CPU generator past timm's init). Layer-scale gammas and an
        attention-pooling latent (not in the paper's model) keep timm's init.
        """
        done: set[int] = set()

        def reset(module: Optional[nn.Module]) -> None:
            if module is not None and id(module) not in done:
                done.add(id(module))
                cast(Any, module).reset_parameters()  # Linear, Conv2d and LayerNorm: each has one

        reset(self.patch_embed.proj)
        self._init_tokens_paper()
        for blk in self.blocks:
            _init_attention_paper(blk.attn, reset)
        for blk in self.blocks:
            for module in cast(nn.Module, blk.mlp).modules():
                if isinstance(module, (nn.Linear, nn.Conv2d)):
                    reset(module)
        if isinstance(self.head, nn.Linear):
            reset(self.head)
        for module in self.modules():  # whatever the paper's order did not name (e.g. attention pooling)
            if isinstance(module, (nn.Linear, nn.Conv2d, nn.LayerNorm)):
                reset(module)

    @torch.no_grad()
    def _init_tokens_paper(self) -> None:
        """The paper's class token (and register tokens) and APE table: N(0, 1), in its order; without an APE
        the table is drawn and discarded, as the paper's model creates it in every condition."""
        for token in (self.cls_token, self.reg_token):
            if token is not None:
                token.normal_(0.0, 1.0)
        num_pos = self.patch_embed.num_patches + (0 if self.no_embed_class else self.num_prefix_tokens)
        if self.pos_embed is not None:
            self.pos_embed.normal_(0.0, 1.0)
        else:  # the paper's unused nn.Embedding: same draws, so later layers match it
            torch.empty(
                num_pos,
                self.embed_dim,
                device=self.patch_embed.proj.weight.device,
                dtype=self.patch_embed.proj.weight.dtype,
            ).normal_(0.0, 1.0)

    def init_non_persistent_buffers(self) -> None:
        """Rebuild the computed (non-persistent) sincos table, e.g. after ``to_empty()``."""
        if self.sincos_embed is not None:
            self.sincos_embed = sincos_2d(self.patch_embed.grid_size, self.embed_dim, device=self.sincos_embed.device)

    # --- PE scale -------------------------------------------------------------------------------
    def set_alpha(self, alpha: float) -> None:
        """Set the PE scale in place (see the class docstring for what is scaled)."""
        if self.pe == "none" and check_alpha(alpha) != 1.0:
            raise SettingError(f"alpha={alpha} on a model without positional encoding (pe='none') would scale nothing")
        self.alpha = check_alpha(alpha)
        if self.pe == "rope":
            cast(ScaledRotaryEmbeddingCat, self.rope).set_alpha(self.alpha)

    # --- token shuffling (RPT / RPI built into the model) ----------------------------------------
    def _shuffle_active(self) -> bool:
        mode = self.token_shuffle
        return mode == "always" or (mode == "train" and self.training) or (mode == "eval" and not self.training)

    # --- positional encoding ----------------------------------------------------------------------
    @torch.jit.unused
    def _sincos_for_grid(self, grid: tuple[int, int], device: torch.device) -> torch.Tensor:
        """The sincos table built for a grid other than the default (dynamic image size)."""
        return sincos_2d(grid, self.embed_dim, device=device)

    def _pos_embed(self, x: torch.Tensor) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """x: patch embeddings, (B, N, C) or (B, H, W, C) with dynamic_img_size.

        Returns the token sequence (B, prefix + N, C) with the PE added, and the RoPE table
        (N, 2 * head_dim) or None.
        """
        grid = self.patch_embed.grid_size
        if self.dynamic_img_size:
            B, H, W, C = x.shape
            grid = (H, W)
            x = x.reshape(B, H * W, C)
        same_grid = grid[0] == self.patch_embed.grid_size[0] and grid[1] == self.patch_embed.grid_size[1]
        if self._shuffle_active():
            # one permutation per forward pass, shared by the batch: slot i holds patch perm[i]
            x = x[:, torch.randperm(x.shape[1], device=x.device)]
        scale = self.alpha
        rope: Optional[torch.Tensor] = None
        sincos = self.sincos_embed
        if sincos is not None:
            if not same_grid:
                sincos = self._sincos_for_grid(grid, x.device)
            sincos = sincos.to(x.dtype)
            x = x + (sincos if scale == 1.0 else scale * sincos)
        if self.rope is not None:
            # Eva types self.rope as a plain Module; TorchScript (which scripts this) takes no typing.cast
            if self.dynamic_img_size:
                rope = self.rope.get_embed(shape=[grid[0], grid[1]])  # type: ignore[operator]
            else:
                rope = self.rope.get_embed()  # type: ignore[operator]
        x = self._prefix_and_ape(x, grid[0], grid[1], same_grid)
        x = self.pos_drop(x)
        return x, rope

    def _prefix_and_ape(self, x: torch.Tensor, grid_h: int, grid_w: int, same_grid: bool) -> torch.Tensor:
        """x: patch tokens (B, N, C) -> (B, prefix + N, C): the class and register tokens put first, and the
        APE table (scaled by alpha, resampled to a grid other than the default) added; to the patch tokens
        only with ``no_embed_class``."""
        prefix: list[torch.Tensor] = []
        if self.cls_token is not None:
            prefix.append(self.cls_token.expand(x.shape[0], -1, -1))
        if self.reg_token is not None:
            prefix.append(self.reg_token.expand(x.shape[0], -1, -1))
        table: Optional[torch.Tensor] = self.pos_embed
        if table is None:  # pe != 'ape'
            return torch.cat(prefix + [x], dim=1) if len(prefix) > 0 else x
        if not same_grid:
            table = resample_abs_pos_embed(
                table,
                new_size=[grid_h, grid_w],
                old_size=self.patch_embed.grid_size,
                num_prefix_tokens=0 if self.no_embed_class else self.num_prefix_tokens,
            )
        if self.alpha != 1.0:
            table = self.alpha * table
        if self.no_embed_class:
            x = x + table
        if len(prefix) > 0:
            x = torch.cat(prefix + [x], dim=1)
        return x if self.no_embed_class else x + table

    def set_input_size(self, img_size=None, patch_size=None) -> None:
        """Change the input size; the sincos table is rebuilt for the new grid, never interpolated."""
        if img_size is not None:
            _check_img_size(img_size, patch_size or self.patch_embed.patch_size, False)
        super().set_input_size(img_size=img_size, patch_size=patch_size)
        self.init_non_persistent_buffers()

    def extra_repr(self) -> str:
        init = "" if self.init == "timm" else f", init={self.init!r}"
        layout = "" if self.layout == "timm" else f", layout={self.layout!r}"
        return f"pe={self.pe!r}, alpha={self.alpha}, token_shuffle={self.token_shuffle!r}{init}{layout}"


def _check_args(
    cls: str, pe: str, token_shuffle: str, init: str, layout: str, global_pool: str, kwargs: dict[str, Any]
) -> None:
    """ValueError (one line) for a constructor argument ``PosGeomViT`` cannot take."""
    for name, value, allowed in (
        ("init", init, INIT_TYPES),
        ("positional encoding", pe, PE_TYPES),
        ("token_shuffle", token_shuffle, TOKEN_SHUFFLE_MODES),
        ("layout", layout, LAYOUTS),
    ):
        if value not in allowed:
            raise SettingError(f"unknown {name} {value!r}; expected one of {', '.join(allowed)}")
    for key in ("use_abs_pos_emb", "use_rot_pos_emb", "rope_type"):
        if key in kwargs:
            raise SettingError(f"{key} is set by pe={pe!r}; do not pass it to {cls}")
    if kwargs.get("patch_drop_rate", 0.0):
        raise SettingError("patch_drop_rate is not supported: it would drop tokens before the PE analysis")
    if layout == "paper" and global_pool != "token":
        raise SettingError(f"layout='paper' classifies the class token (global_pool='token'), got {global_pool!r}")
    _check_img_size(kwargs.get("img_size", 224), kwargs.get("patch_size", 16), kwargs.get("dynamic_img_pad", False))


@torch.no_grad()
def _init_attention_paper(attn: Any, reset: Callable[[Optional[nn.Module]], None]) -> None:
    """One attention layer (timm's ``EvaAttention``) as the paper's: ``reset`` (PyTorch's default init) on the fused qkv Linear, the q and
    v biases cut from one 3*D draw as the paper's fused bias (the key bias stays Eva's zero), or on the q, k,
    v Linears; then on the output projection."""
    if attn.qkv is not None:
        reset(attn.qkv)  # timm's AttentionRope (layout='paper'): the whole bias, as the paper's
        if getattr(attn, "q_bias", None) is not None:  # eva's EvaAttention: q and v biases outside the Linear
            bound = 1.0 / math.sqrt(attn.qkv.in_features)
            bias = torch.empty(3 * attn.q_bias.numel(), device=attn.q_bias.device, dtype=attn.q_bias.dtype).uniform_(
                -bound, bound
            )
            q, _, v = bias.chunk(3)
            attn.q_bias.copy_(q)
            attn.v_bias.copy_(v)
    else:
        for proj in (attn.q_proj, attn.k_proj, attn.v_proj):
            reset(proj)
    reset(attn.proj)


def _check_img_size(img_size, patch_size, dynamic_img_pad: bool) -> None:
    sizes = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
    patches = (patch_size, patch_size) if isinstance(patch_size, int) else tuple(patch_size)
    if dynamic_img_pad:
        return
    for s, p in zip(sizes, patches):
        if s % p:
            raise SettingError(f"image size {tuple(sizes)} is not divisible by the patch size {tuple(patches)}")


def checkpoint_filter_fn(state_dict: dict[str, torch.Tensor], model: PosGeomViT) -> dict[str, torch.Tensor]:
    """Adapt a checkpoint to ``model``: this family's (a learned table resampled to a new grid) or timm's
    ``VisionTransformer`` (``vit_*_patch16_224``: its fused qkv bias split, layer-scale names); see
    :mod:`timm_posgeom.models.checkpoint`."""
    return adapt_state_dict(state_dict, model)


def _create_posgeom_vit(variant: str, pretrained: bool = False, **kwargs) -> PosGeomViT:
    out_indices = kwargs.pop("out_indices", 3)
    if pretrained:
        kwargs = _with_weights_file(variant, kwargs)
    return build_model_with_cfg(
        PosGeomViT,
        variant,
        pretrained,
        pretrained_filter_fn=checkpoint_filter_fn,
        feature_cfg=dict(out_indices=out_indices, feature_cls="getter"),
        **kwargs,
    )


def _with_weights_file(variant: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` whose ``pretrained_cfg_overlay`` names the weights file of a trained tag of ours (the Hub cache's
    copy, looked up without the network; else a download; else one line saying how to get it:
    :func:`~timm_posgeom.models.pretrained.hub_weights_file`). timm would ask the Hub first, whose retries take
    about 25 s offline before it reads the same cache. Another source the caller gave (a file, a state dict, a
    url) is left to timm."""
    tag = kwargs.get("pretrained_cfg")
    entry = PRETRAINED.get(f"{variant}.{tag}") if isinstance(tag, str) else None
    overlay = dict(kwargs.get("pretrained_cfg_overlay") or {})
    if entry is None or any(overlay.get(k) for k in ("file", "state_dict", "url", "hf_hub_id")):
        return kwargs
    overlay["file"] = hub_weights_file(f"{variant}.{tag}", entry["hf_hub_id"], kwargs.get("cache_dir"))
    return dict(kwargs, pretrained_cfg_overlay=overlay)


def _cfg(url: str = "", **kwargs) -> dict[str, Any]:
    return {
        "url": url,
        "num_classes": 1000,
        "input_size": (3, 224, 224),
        "pool_size": None,
        "crop_pct": 0.9,
        "interpolation": "bicubic",
        "fixed_input_size": True,
        "mean": (0.485, 0.456, 0.406),
        "std": (0.229, 0.224, 0.225),
        "first_conv": "patch_embed.proj",
        "classifier": "head",
        "license": "apache-2.0",
        **kwargs,
    }


_SIZES = {
    "tiny": dict(patch_size=16, embed_dim=192, depth=12, num_heads=3),
    "small": dict(patch_size=16, embed_dim=384, depth=12, num_heads=6),
    "base": dict(patch_size=16, embed_dim=768, depth=12, num_heads=12),
    # CPU scale: 64 px, 8x8 grid, 0.8M parameters; a pilot with stock timm ViTs found this width and depth
    # forms a PE reference frame in ~40 epochs of Imagenette on 2 cores.
    "micro": dict(img_size=64, patch_size=8, embed_dim=128, depth=4, num_heads=4),
}
_VARIANTS = {
    "nope": dict(pe="none"),
    "ape": dict(pe="ape"),
    "sincos": dict(pe="sincos"),
    "rope": dict(pe="rope"),
    "ape_rpt": dict(pe="ape", token_shuffle="train"),
}


def _name(size: str, variant: str) -> str:
    stem = "posgeom_vit_micro_patch8_64" if size == "micro" else f"posgeom_vit_{size}_patch16_224"
    return f"{stem}_{variant}"


# Trained weights, "<model>.<tag>": cfg with its "hf_hub_id" (and what else differs from the model's base cfg):
# the trained micro models (timm_posgeom/models/pretrained.py), under the Hub names they are pushed to.
PRETRAINED: dict[str, Any] = micro_pretrained_cfgs()


def _base_cfg(name: str) -> dict[str, Any]:
    return _cfg(input_size=(3, 64, 64), crop_pct=1.0) if name.startswith("posgeom_vit_micro") else _cfg()


def build_default_cfgs(pretrained: dict[str, Any]) -> dict[str, Any]:
    """One tagged cfg per trained weight (``"<model>.<tag>"``: a Hub id, or a dict of cfg entries with its
    ``hf_hub_id``), then every model's untagged cfg, marked the default (timm's ``.*``): a bare name stays what it
    was (no weights, 1000 classes) and ``pretrained=True`` loads weights only for a name with a tag."""
    names = [_name(size, variant) for size in _SIZES for variant in _VARIANTS]
    cfgs: dict[str, Any] = {}
    for tagged, entry in pretrained.items():
        name, _, tag = tagged.partition(".")
        if name not in names or not tag or tag.endswith("*"):
            raise ValueError(f"pretrained entry {tagged!r} must be '<registered model>.<tag>'")
        extra = dict(hf_hub_id=entry) if isinstance(entry, str) else dict(entry)
        if not extra.get("hf_hub_id"):
            raise ValueError(f"pretrained entry {tagged!r} has no hf_hub_id")
        cfgs[tagged] = dict(_base_cfg(name), **extra)
    # after the tagged ones: timm makes the first tag with weights the default unless a later '.*' takes it back
    cfgs.update({f"{name}.*": _base_cfg(name) for name in names})
    return cfgs


default_cfgs = generate_default_cfgs(build_default_cfgs(PRETRAINED))


def _build(size: str, variant: str, pretrained: bool, kwargs: dict[str, Any]) -> PosGeomViT:
    model_args = dict(_SIZES[size], **_VARIANTS[variant])
    return _create_posgeom_vit(_name(size, variant), pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def posgeom_vit_tiny_patch16_224_nope(pretrained: bool = False, **kwargs) -> PosGeomViT:
    """ViT-Ti/16 without positional encoding."""
    return _build("tiny", "nope", pretrained, kwargs)


@register_model
def posgeom_vit_tiny_patch16_224_ape(pretrained: bool = False, **kwargs) -> PosGeomViT:
    """ViT-Ti/16 with a learned absolute position table (class-token row included)."""
    return _build("tiny", "ape", pretrained, kwargs)


@register_model
def posgeom_vit_tiny_patch16_224_sincos(pretrained: bool = False, **kwargs) -> PosGeomViT:
    """ViT-Ti/16 with a fixed 2-D sincos table on the patch tokens."""
    return _build("tiny", "sincos", pretrained, kwargs)


@register_model
def posgeom_vit_tiny_patch16_224_rope(pretrained: bool = False, **kwargs) -> PosGeomViT:
    """ViT-Ti/16 with 2-D axial RoPE (base 10000) on the patch tokens' queries and keys."""
    return _build("tiny", "rope", pretrained, kwargs)


@register_model
def posgeom_vit_tiny_patch16_224_ape_rpt(pretrained: bool = False, **kwargs) -> PosGeomViT:
    """ViT-Ti/16, learned absolute PE, random patch-token permutation in training (RPT)."""
    return _build("tiny", "ape_rpt", pretrained, kwargs)


@register_model
def posgeom_vit_small_patch16_224_nope(pretrained: bool = False, **kwargs) -> PosGeomViT:
    """ViT-S/16 without positional encoding. The paper's setup: ``num_heads=8, layout="paper", pos_drop_rate=0.15,
    attn_drop_rate=0.15, mlp_drop_rate=0.15, drop_path_rate=0.2, init="paper"``."""
    return _build("small", "nope", pretrained, kwargs)


@register_model
def posgeom_vit_small_patch16_224_ape(pretrained: bool = False, **kwargs) -> PosGeomViT:
    """ViT-S/16 with a learned absolute position table (class-token row included)."""
    return _build("small", "ape", pretrained, kwargs)


@register_model
def posgeom_vit_small_patch16_224_sincos(pretrained: bool = False, **kwargs) -> PosGeomViT:
    """ViT-S/16 with a fixed 2-D sincos table on the patch tokens."""
    return _build("small", "sincos", pretrained, kwargs)


@register_model
def posgeom_vit_small_patch16_224_rope(pretrained: bool = False, **kwargs) -> PosGeomViT:
    """ViT-S/16 with 2-D axial RoPE (base 10000) on the patch tokens' queries and keys."""
    return _build("small", "rope", pretrained, kwargs)


@register_model
def posgeom_vit_small_patch16_224_ape_rpt(pretrained: bool = False, **kwargs) -> PosGeomViT:
    """ViT-S/16, learned absolute PE, random patch-token permutation in training (RPT)."""
    return _build("small", "ape_rpt", pretrained, kwargs)


@register_model
def posgeom_vit_base_patch16_224_nope(pretrained: bool = False, **kwargs) -> PosGeomViT:
    """ViT-B/16 without positional encoding."""
    return _build("base", "nope", pretrained, kwargs)


@register_model
def posgeom_vit_base_patch16_224_ape(pretrained: bool = False, **kwargs) -> PosGeomViT:
    """ViT-B/16 with a learned absolute position table (class-token row included)."""
    return _build("base", "ape", pretrained, kwargs)


@register_model
def posgeom_vit_base_patch16_224_sincos(pretrained: bool = False, **kwargs) -> PosGeomViT:
    """ViT-B/16 with a fixed 2-D sincos table on the patch tokens."""
    return _build("base", "sincos", pretrained, kwargs)


@register_model
def posgeom_vit_base_patch16_224_rope(pretrained: bool = False, **kwargs) -> PosGeomViT:
    """ViT-B/16 with 2-D axial RoPE (base 10000) on the patch tokens' queries and keys."""
    return _build("base", "rope", pretrained, kwargs)


@register_model
def posgeom_vit_base_patch16_224_ape_rpt(pretrained: bool = False, **kwargs) -> PosGeomViT:
    """ViT-B/16, learned absolute PE, random patch-token permutation in training (RPT)."""
    return _build("base", "ape_rpt", pretrained, kwargs)


@register_model
def posgeom_vit_micro_patch8_64_nope(pretrained: bool = False, **kwargs) -> PosGeomViT:
    """CPU-scale ViT (64 px, patch 8, dim 128, depth 4, 4 heads) without positional encoding."""
    return _build("micro", "nope", pretrained, kwargs)


@register_model
def posgeom_vit_micro_patch8_64_ape(pretrained: bool = False, **kwargs) -> PosGeomViT:
    """CPU-scale ViT (64 px, patch 8, dim 128, depth 4, 4 heads) with a learned absolute table."""
    return _build("micro", "ape", pretrained, kwargs)


@register_model
def posgeom_vit_micro_patch8_64_sincos(pretrained: bool = False, **kwargs) -> PosGeomViT:
    """CPU-scale ViT (64 px, patch 8, dim 128, depth 4, 4 heads) with a fixed 2-D sincos table."""
    return _build("micro", "sincos", pretrained, kwargs)


@register_model
def posgeom_vit_micro_patch8_64_rope(pretrained: bool = False, **kwargs) -> PosGeomViT:
    """CPU-scale ViT (64 px, patch 8, dim 128, depth 4, 4 heads) with 2-D axial RoPE."""
    return _build("micro", "rope", pretrained, kwargs)


@register_model
def posgeom_vit_micro_patch8_64_ape_rpt(pretrained: bool = False, **kwargs) -> PosGeomViT:
    """CPU-scale ViT (64 px, patch 8, dim 128, depth 4, 4 heads), learned absolute PE, trained with RPT."""
    return _build("micro", "ape_rpt", pretrained, kwargs)
