"""Parity with the paper's model and optimiser: the ``in100_paper_*`` recipes build the paper's layers and
decay every parameter.

The paper's code (github.com/mahmoud-mannes/vit-encoding-paper, ``code/src/main/model.py``) carries no
licence, so none of it is copied here. ``PaperViT`` below is an independent re-statement of the structure
that file and the paper's appendix table describe, with the paper's attribute names, so that its
parameter names can be mapped onto ours:

* ``patcher.conv``: ``Conv2d(C, D, patch, stride=patch)``; ``cls_token``: ``(1, 1, D)``, N(0, 1);
  ``pos_embedding``: ``Embedding(N + 1, D)`` (a class-token row; created in every condition, added only
  for APE / RPT, after the class token is prepended); dropout on that sum (``embed_drop``);
* per layer ``encoder_layers[i] = [LayerNorm, attention, DropPath]``, the attention one fused
  ``qkv = Linear(D, 3D)`` with bias, split q | k | v and heads, ``scaled_dot_product_attention`` with
  ``dropout_p`` (attention dropout), then ``proj = Linear(D, D)``, nothing after it;
* per layer ``feed_forward[i] = [LayerNorm, Sequential(Linear(D, 4D), GELU, Dropout, Linear(4D, D)),
  DropPath]``; blocks ``x + DropPath(attn(LN(x)))``, ``x + DropPath(mlp(LN(x)))``;
* no final norm: ``final_feed_forward = Linear(D, classes)`` on the class token of the last block;
* drop path of layer i: ``i * drop_path_rate / layers`` (its ``ViTConfig``'s step).
"""

from __future__ import annotations

import re

import pytest
import timm
import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.layers import DropPath

from timm_posgeom.app.recipe import load_recipe

CONDITIONS = ("ape", "nope", "sincos", "rope", "rpt")
PAPER_PE = {"ape": True, "rpt": True, "nope": False, "sincos": False, "rope": False}

pytestmark = pytest.mark.usefixtures("one_thread")


class _PaperAttention(nn.Module):
    def __init__(self, D: int, heads: int, attn_drop: float):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(D, 3 * D)
        self.proj = nn.Linear(D, D)
        self.dropout = nn.Dropout(attn_drop)  # its rate is the dropout_p of the attention

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, D = x.shape
        q, k, v = (t.view(B, T, self.heads, D // self.heads).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1))
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout.p if self.training else 0.0)
        return self.proj(out.transpose(1, 2).reshape(B, T, D))


class _PaperDropPath(nn.Module):
    def __init__(self, p: float):
        super().__init__()
        self.drop_prob = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.drop_prob == 0.0:
            return x
        keep = 1 - self.drop_prob
        return x * (torch.rand((x.shape[0],) + (1,) * (x.ndim - 1), device=x.device) < keep) / keep


class PaperViT(nn.Module):
    """The paper's ``VisionTransformer`` for the conditions with an additive table or none (APE, RPT, no PE)."""

    def __init__(  # noqa: PLR0913
        self,
        ape: bool,
        D=384,
        heads=8,
        layers=12,
        patch=16,
        size=224,
        classes=100,
        *,
        drop=0.15,
        drop_path=0.2,
    ):
        super().__init__()
        n = (size // patch) ** 2
        self.ape = ape
        self.patcher = nn.Module()
        self.patcher.conv = nn.Conv2d(3, D, kernel_size=patch, stride=patch)
        self.cls_token = nn.Parameter(torch.randn(1, 1, D))
        self.pos_embedding = nn.Embedding(n + 1, D)
        self.embed_drop = nn.Dropout(drop)
        self.encoder_layers = nn.ModuleList(
            [
                nn.ModuleList(
                    [nn.LayerNorm(D), _PaperAttention(D, heads, drop), _PaperDropPath(i * drop_path / layers)]
                )
                for i in range(layers)
            ]
        )
        self.feed_forward = nn.ModuleList(
            [
                nn.ModuleList(
                    [
                        nn.LayerNorm(D),
                        nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Dropout(drop), nn.Linear(4 * D, D)),
                        _PaperDropPath(i * drop_path / layers),
                    ]
                )
                for i in range(layers)
            ]
        )
        self.final_feed_forward = nn.Linear(D, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        patches = self.patcher.conv(x).flatten(2).transpose(1, 2)
        x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), patches), dim=1)
        if self.ape:
            x = x + self.pos_embedding.weight
        x = self.embed_drop(x)
        for (ln1, msa, dp1), (ln2, mlp, dp2) in zip(self.encoder_layers, self.feed_forward):
            x = x + dp1(msa(ln1(x)))
            x = x + dp2(mlp(ln2(x)))
        return self.final_feed_forward(x[:, 0])


# the paper's parameter names -> ours (layer index kept)
_NAME_MAP = [
    (r"patcher\.conv\.(weight|bias)", r"patch_embed.proj.\1"),
    (r"cls_token", r"cls_token"),
    (r"pos_embedding\.weight", r"pos_embed"),
    (r"encoder_layers\.(\d+)\.0\.(weight|bias)", r"blocks.\1.norm1.\2"),
    (r"encoder_layers\.(\d+)\.1\.(qkv|proj)\.(weight|bias)", r"blocks.\1.attn.\2.\3"),
    (r"feed_forward\.(\d+)\.0\.(weight|bias)", r"blocks.\1.norm2.\2"),
    (r"feed_forward\.(\d+)\.1\.0\.(weight|bias)", r"blocks.\1.mlp.fc1.\2"),
    (r"feed_forward\.(\d+)\.1\.3\.(weight|bias)", r"blocks.\1.mlp.fc2.\2"),
    (r"final_feed_forward\.(weight|bias)", r"head.\1"),
    # dropout sites
    (r"embed_drop", r"pos_drop"),
    (r"encoder_layers\.(\d+)\.1\.dropout", r"blocks.\1.attn.attn_drop"),
    (r"feed_forward\.(\d+)\.1\.2", r"blocks.\1.mlp.drop1"),
    (r"encoder_layers\.(\d+)\.2", r"blocks.\1.drop_path1"),
    (r"feed_forward\.(\d+)\.2", r"blocks.\1.drop_path2"),
]


def ours(paper_name: str) -> str:
    for pattern, target in _NAME_MAP:
        if re.fullmatch(pattern, paper_name):
            return re.sub(pattern, target, paper_name)
    raise KeyError(paper_name)


def _shapes(model: nn.Module) -> dict[str, tuple[int, ...]]:
    """name -> shape of every parameter, leading 1-dims dropped (our (1, N+1, D) table is the paper's (N+1, D))."""
    out = {}
    for name, p in model.named_parameters():
        shape = tuple(p.shape)
        while len(shape) > 1 and shape[0] == 1 and name != "cls_token":
            shape = shape[1:]
        out[name] = shape
    return out


def dropout_sites(model: nn.Module) -> dict[str, float]:
    """Every place the model drops in training: name -> rate (nn.Dropout and DropPath with a rate > 0)."""
    return {
        name: round(float(m.p if isinstance(m, nn.Dropout) else m.drop_prob), 6)
        for name, m in model.named_modules()
        if isinstance(m, (nn.Dropout, DropPath, _PaperDropPath))
        and (m.p if isinstance(m, nn.Dropout) else m.drop_prob) > 0
    }


def _recipe_model(condition: str, device: str = "meta", **overrides) -> nn.Module:
    recipe = load_recipe(f"in100_paper_{condition}")
    with torch.device(device):
        return timm.create_model(
            recipe.model, num_classes=100, img_size=recipe.img_size, **dict(recipe.model_kwargs, **overrides)
        )


# --------------------------------------------------------------------------------------------
# the recipes' model against the paper's: parameters and dropout sites (ViT-S/16, 100 classes)
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("condition", CONDITIONS)
def test_recipe_model_has_the_papers_parameters(condition):
    """Every parameter of the paper's model, mapped to ours, with the same shape, and nothing more of ours.
    Only the position table of a condition without an APE (the paper creates it unused) has no counterpart."""
    with torch.device("meta"):
        paper = _shapes(PaperViT(ape=PAPER_PE[condition]))
    mine = _shapes(_recipe_model(condition))
    mapped = {ours(name): shape for name, shape in paper.items()}
    unused = {"pos_embed"} if condition in ("nope", "sincos", "rope") else set()
    assert {k: v for k, v in mapped.items() if k not in unused} == mine
    assert sum(torch.Size(s).numel() for s in paper.values()) == 21_703_396  # the paper's ViT-S/16, 100 classes
    assert sum(torch.Size(s).numel() for s in mine.values()) == 21_703_396 - (197 * 384 if unused else 0)


@pytest.mark.parametrize("condition", CONDITIONS)
def test_recipe_model_drops_where_the_paper_drops(condition):
    """Dropout 0.15 on the embedding sum, inside attention, after the MLP's GELU; drop path i * 0.2 / 12;
    nowhere else (no dropout after attn.proj or mlp.fc2, none on the head)."""
    with torch.device("meta"):
        paper = {ours(name): p for name, p in dropout_sites(PaperViT(ape=PAPER_PE[condition])).items()}
    model = _recipe_model(condition)
    assert dropout_sites(model) == paper
    assert len(paper) == 1 + 12 * 2 + 11 * 2 and paper["blocks.11.drop_path2"] == round(11 * 0.2 / 12, 6)
    assert isinstance(model.norm, nn.Identity) and isinstance(model.fc_norm, nn.Identity)  # no final norm
    with torch.device("meta"):
        paper_norms = {m.eps for m in PaperViT(ape=PAPER_PE[condition]).modules() if isinstance(m, nn.LayerNorm)}
    assert {m.eps for m in model.modules() if isinstance(m, nn.LayerNorm)} == paper_norms == {1e-5}


# --------------------------------------------------------------------------------------------
# the same function: initial weights, eval outputs and train-mode dropout draws (a small model)
# --------------------------------------------------------------------------------------------
SMALL = dict(D=64, heads=4, layers=3, patch=8, size=32, classes=10, drop=0.15)


def _small_pair(ape: bool, drop_path: float = 0.0):
    torch.manual_seed(7)
    paper = PaperViT(ape=ape, drop_path=drop_path, **SMALL)
    torch.manual_seed(7)
    mine = timm.create_model(
        "posgeom_vit_micro_patch8_64_ape" if ape else "posgeom_vit_micro_patch8_64_nope",
        img_size=32,
        embed_dim=64,
        depth=3,
        num_heads=4,
        num_classes=10,
        layout="paper",
        init="paper",
        pos_drop_rate=0.15,
        attn_drop_rate=0.15,
        mlp_drop_rate=0.15,
        drop_path_rate=drop_path,
    )
    return paper, mine


@pytest.mark.parametrize("ape", [True, False])
def test_paper_layout_and_init_build_the_papers_initial_weights(ape):
    paper, mine = _small_pair(ape)
    state = mine.state_dict()
    for name, value in paper.state_dict().items():
        if name == "pos_embedding.weight" and not ape:
            continue  # drawn by both (the same random stream), kept only by the paper's
        assert torch.equal(state[ours(name)].reshape(value.shape), value), name


@pytest.mark.parametrize("ape", [True, False])
def test_paper_layout_computes_the_papers_function(ape):
    """The same outputs in eval, and in training (dropout 0.15 at every site) the same outputs from the same
    random stream: the dropout sites are the paper's, drawn in its order."""
    paper, mine = _small_pair(ape)
    x = torch.randn(4, 3, 32, 32)
    torch.testing.assert_close(
        mine.eval()(x), paper.eval()(x), rtol=0, atol=1e-7
    )  # a LayerNorm epsilon of 1e-6 moves them by 1e-6
    paper.train(), mine.train()
    torch.manual_seed(11)
    a = paper(x)
    torch.manual_seed(11)
    b = mine(x)
    torch.testing.assert_close(b, a, rtol=0, atol=1e-7)  # a LayerNorm epsilon of 1e-6 moves them by 1e-6
    torch.manual_seed(12)
    assert not torch.allclose(mine(x), b)  # dropout is active: another stream, other outputs


def test_paper_layout_refuses_the_sites_the_paper_has_not():
    for key in ("proj_drop_rate", "drop_rate"):
        with pytest.raises(ValueError, match=f"layout='paper' has no dropout .*{key}"):
            timm.create_model("posgeom_vit_micro_patch8_64_ape", layout="paper", **{key: 0.1})
    with pytest.raises(ValueError, match="layout='paper' sets use_fc_norm=False"):
        timm.create_model("posgeom_vit_micro_patch8_64_ape", layout="paper", use_fc_norm=True)
    with pytest.raises(ValueError, match="unknown layout 'Paper'; expected one of timm, paper"):
        timm.create_model("posgeom_vit_micro_patch8_64_ape", layout="Paper")
    with pytest.raises(ValueError, match="global_pool='token'"):
        timm.create_model("posgeom_vit_micro_patch8_64_ape", layout="paper", global_pool="avg")


def test_timm_layout_is_unchanged_by_default():
    m = timm.create_model("posgeom_vit_micro_patch8_64_ape", proj_drop_rate=0.1, drop_rate=0.1, drop_path_rate=0.3)
    assert m.layout == "timm" and isinstance(m.norm, nn.LayerNorm) and m.blocks[0].attn.q_bias is not None
    sites = dropout_sites(m)
    assert sites["blocks.0.attn.proj_drop"] == sites["blocks.0.mlp.drop2"] == sites["head_drop"] == 0.1
    assert sites["blocks.3.drop_path1"] == 0.3  # timm's rule: the full rate in the last block


# --------------------------------------------------------------------------------------------
# the optimiser: L2 0.05 on every parameter, class token and position table included
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("condition", CONDITIONS)
def test_paper_recipes_decay_every_parameter(condition):
    from timm_posgeom.app.train.build import build_optimizer

    recipe = load_recipe(f"in100_paper_{condition}")
    model = _recipe_model(condition, device="cpu", init="timm")  # the init does not matter here: faster
    optimizer = build_optimizer(recipe, model)
    assert type(optimizer) is torch.optim.Adam  # coupled L2: weight_decay is added to the gradient
    decay = {id(p): g["weight_decay"] for g in optimizer.param_groups for p in g["params"]}
    names = {id(p): n for n, p in model.named_parameters()}
    assert decay.keys() == names.keys()
    assert {names[i]: wd for i, wd in decay.items() if wd != 0.05} == {}
    assert {"cls_token", "blocks.0.norm1.weight", "head.bias"} <= set(names.values())
    if condition in ("ape", "rpt"):
        assert "pos_embed" in names.values()


def test_export_records_the_layout_and_local_dir_rebuilds_it(tmp_path):
    """The two layouts hold different parameters: a config without ``layout`` could not load the weights."""
    import json

    from timm_posgeom.app.hub import export_for_hub, render_card
    from timm_posgeom.models.factory import create_model

    _, mine = _small_pair(ape=True)
    export_for_hub(mine, tmp_path / "run" / "export")
    config = json.loads((tmp_path / "run" / "export" / "config.json").read_text())
    assert config["model_args"]["layout"] == "paper"
    loaded = create_model(f"local-dir:{tmp_path / 'run' / 'export'}")
    assert loaded.layout == "paper" and isinstance(loaded.norm, nn.Identity)
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(loaded.eval()(x), mine.eval()(x))
    card = render_card(tmp_path / "run")
    assert "layout-paper" in card and "no final LayerNorm" in card


@pytest.mark.parametrize("variant", ["nope", "ape", "sincos", "rope", "ape_rpt"])
def test_every_variant_runs_and_probes_in_the_papers_layout(variant):
    """The paper's layers under every PE (RoPE rotates q and k in timm's AttentionRope), probed under RPI."""
    from timm_posgeom import probe_ssdc

    torch.manual_seed(0)
    m = timm.create_model(
        f"posgeom_vit_micro_patch8_64_{variant}",
        num_classes=10,
        img_size=32,
        embed_dim=32,
        depth=2,
        num_heads=2,
        layout="paper",
        init="paper",
        pos_drop_rate=0.1,
        mlp_drop_rate=0.1,
    )
    x = torch.randn(4, 3, 32, 32)
    m.train()(x).sum().backward()
    assert all(p.grad is not None for n, p in m.named_parameters() if n != "pos_embed" or m.pe == "ape")
    res = probe_ssdc(m.eval(), x, rpi=True, seed=0, rpi_permutations=2, batch_size=4)
    assert len(res.per_layer) == 2
    if variant == "rope":  # a key bias changes the output under RoPE (rotated with the key's position)
        ref = m(x)
        with torch.no_grad():
            m.blocks[0].attn.qkv.bias[32:64] += 1.0
        assert not torch.allclose(m(x), ref, atol=1e-4)
