"""The PE-variant ViTs: registration, PE semantics, alpha, RPT, input sizes, Hub loading."""

from __future__ import annotations

import pytest
import timm
import torch

import timm_posgeom
from timm_posgeom.pos import sincos_2d

MICRO = [
    "posgeom_vit_micro_patch8_64_nope",
    "posgeom_vit_micro_patch8_64_ape",
    "posgeom_vit_micro_patch8_64_sincos",
    "posgeom_vit_micro_patch8_64_rope",
    "posgeom_vit_micro_patch8_64_ape_rpt",
]


def _micro(pe: str, **kwargs) -> timm_posgeom.PosGeomViT:
    name = {"none": "nope"}.get(pe, pe)
    return timm.create_model(f"posgeom_vit_micro_patch8_64_{name}", num_classes=7, **kwargs).eval()


def test_every_name_is_registered_with_a_cfg_and_docstring():
    names = timm_posgeom.list_models()
    expected = {
        f"posgeom_vit_{s}_patch16_224_{v}"
        for s in ("tiny", "small", "base")
        for v in ("nope", "ape", "sincos", "rope", "ape_rpt")
    }
    expected |= set(MICRO)
    assert set(names) == expected
    for name in names:
        assert timm.models.get_pretrained_cfg(name) is not None
        assert timm.models.model_entrypoint(name).__doc__


@pytest.mark.parametrize(
    "name,dim,depth,heads",
    [
        ("posgeom_vit_tiny_patch16_224_ape", 192, 12, 3),
        ("posgeom_vit_small_patch16_224_rope", 384, 12, 6),
        ("posgeom_vit_base_patch16_224_sincos", 768, 12, 12),
        ("posgeom_vit_micro_patch8_64_nope", 128, 4, 4),
    ],
)
def test_standard_widths(name, dim, depth, heads):
    with torch.device("meta"):
        m = timm.create_model(name)
    assert (m.embed_dim, len(m.blocks), m.blocks[0].attn.num_heads) == (dim, depth, heads)


def test_micro_models_are_small_and_only_the_pe_differs():
    params = {n: {k: v.shape for k, v in timm.create_model(n).state_dict().items()} for n in MICRO}
    for p in params.values():
        assert sum(s.numel() for s in p.values()) < 5e6
    base = params["posgeom_vit_micro_patch8_64_nope"]
    for n, p in params.items():
        assert {k: v for k, v in p.items() if k != "pos_embed"} == base, n
    assert params["posgeom_vit_micro_patch8_64_ape"]["pos_embed"] == (1, 65, 128)  # class-token row included


def test_timm_layout_dropout_kwargs():
    m = timm.create_model(
        "posgeom_vit_small_patch16_224_ape",
        num_classes=100,
        num_heads=8,
        drop_rate=0.15,
        proj_drop_rate=0.15,
        attn_drop_rate=0.15,
        pos_drop_rate=0.15,
        drop_path_rate=0.2,
    )
    assert m.blocks[0].attn.num_heads == 8
    assert m.blocks[0].attn.attn_drop.p == 0.15 and m.blocks[0].attn.proj_drop.p == 0.15
    assert m.pos_drop.p == 0.15 and m.head_drop.p == 0.15
    assert abs(m.blocks[-1].drop_path1.drop_prob - 0.2) < 1e-6


def test_paper_configuration_through_kwargs():
    """The paper's ViT-S as the README writes it (tests/test_paper_parity.py checks it against the paper's)."""
    m = timm.create_model(
        "posgeom_vit_small_patch16_224_ape",
        num_classes=100,
        num_heads=8,
        layout="paper",
        pos_drop_rate=0.15,
        attn_drop_rate=0.15,
        mlp_drop_rate=0.15,
        drop_path_rate=0.2,
        init="paper",
    )
    assert m.blocks[0].attn.num_heads == 8 and m.blocks[0].attn.head_dim == 48
    assert m.blocks[0].attn.attn_drop.p == m.blocks[0].mlp.drop1.p == m.pos_drop.p == 0.15
    assert m.blocks[0].attn.proj_drop.p == m.blocks[0].mlp.drop2.p == m.head_drop.p == 0.0
    assert abs(m.blocks[-1].drop_path1.drop_prob - 11 * 0.2 / 12) < 1e-6
    assert isinstance(m.norm, torch.nn.Identity) and sum(p.numel() for p in m.parameters()) == 21_703_396


@pytest.mark.parametrize("pe", ["ape", "sincos", "rope"])
def test_alpha_zero_equals_the_pe_removed_and_alpha_one_is_default(pe):
    torch.manual_seed(1)
    model = _micro(pe).double()
    nope = _micro("none").double()
    nope.load_state_dict({k: v for k, v in model.state_dict().items() if k != "pos_embed"})
    x = torch.randn(2, 3, 64, 64, dtype=torch.float64)
    ref = model(x)
    assert not torch.allclose(ref, nope(x), atol=1e-6), "the PE must change the output"
    model.set_alpha(0.0)
    torch.testing.assert_close(model(x), nope(x), rtol=0, atol=1e-12)
    model.set_alpha(1.0)
    torch.testing.assert_close(model(x), ref, rtol=0, atol=0)
    scaled = _micro(pe, alpha=0.5).double()
    scaled.load_state_dict(model.state_dict())
    out_half = scaled(x)
    assert not torch.allclose(out_half, ref) and not torch.allclose(out_half, nope(x))


def test_alpha_scales_ape_table_including_the_class_row():
    model = _micro("ape", alpha=0.25)
    seen = {}
    model.norm_pre.register_forward_hook(lambda m, a, out: seen.setdefault("tokens", out))
    x = torch.randn(1, 3, 64, 64)
    model(x)
    patches = model.patch_embed(x)
    cls = model.cls_token
    expected = torch.cat([cls, patches], dim=1) + 0.25 * model.pos_embed
    torch.testing.assert_close(seen["tokens"], expected)


def test_rope_alpha_scales_rotation_angles():
    m1, m2 = _micro("rope"), _micro("rope", alpha=0.5)
    torch.testing.assert_close(m2.rope.bands, 0.5 * m1.rope.bands)
    m0 = _micro("rope", alpha=0.0)
    emb = m0.rope.get_embed()  # cat(sin, cos): sin 0, cos 1 -> identity rotation
    half = emb.shape[-1] // 2
    assert torch.all(emb[:, :half] == 0) and torch.all(emb[:, half:] == 1)


@pytest.mark.parametrize("bad", [-0.1, float("nan"), float("inf"), "x"])
def test_bad_alpha(bad):
    with pytest.raises(ValueError, match="alpha"):
        _micro("ape", alpha=bad)
    with pytest.raises(ValueError, match="alpha"):
        _micro("ape").set_alpha(bad)


def test_bad_pe_and_shuffle_and_image_size():
    with pytest.raises(ValueError, match="unknown positional encoding 'learned'.*none, ape, sincos, rope"):
        timm.create_model("posgeom_vit_micro_patch8_64_ape", pe="learned")
    with pytest.raises(ValueError, match="token_shuffle"):
        timm.create_model("posgeom_vit_micro_patch8_64_ape", token_shuffle="sometimes")
    with pytest.raises(ValueError, match="not divisible by the patch size"):
        timm.create_model("posgeom_vit_micro_patch8_64_ape", img_size=60)
    with pytest.raises(ValueError, match="not divisible by the patch size"):
        timm.create_model("posgeom_vit_micro_patch8_64_sincos").set_input_size(img_size=(70, 64))


def test_rpt_permutes_in_training_and_never_in_eval():
    torch.manual_seed(3)
    rpt = _micro("ape_rpt")
    ape = _micro("ape")
    ape.load_state_dict(rpt.state_dict())
    x = torch.randn(2, 3, 64, 64)
    # eval: identical to the same weights without shuffling, every time
    torch.testing.assert_close(rpt.eval()(x), ape.eval()(x), rtol=0, atol=0)
    # training: the same permutation a token_permutation hook draws from the same RNG state
    rpt.train(), ape.train()
    torch.manual_seed(11)
    out_rpt = rpt(x)
    torch.manual_seed(11)
    with timm_posgeom.token_permutation(ape, mode="training") as handle:
        out_hook = ape(x)
    torch.testing.assert_close(out_rpt, out_hook, rtol=0, atol=0)
    assert not torch.equal(handle.permutation, torch.arange(64))
    torch.manual_seed(12)
    assert not torch.allclose(rpt(x), out_rpt), "a fresh permutation at every training forward"


def test_sincos_is_rebuilt_for_a_new_grid_never_interpolated():
    model = _micro("sincos")
    model.set_input_size(img_size=(96, 64))
    torch.testing.assert_close(model.sincos_embed, sincos_2d((12, 8), 128), rtol=0, atol=0)
    fresh = timm.create_model("posgeom_vit_micro_patch8_64_sincos", img_size=(96, 64), num_classes=7).eval()
    torch.testing.assert_close(fresh.sincos_embed, model.sincos_embed, rtol=0, atol=0)
    # dynamic image size: the table for each input's own grid
    dyn = timm.create_model("posgeom_vit_micro_patch8_64_sincos", dynamic_img_size=True, num_classes=7).eval()
    fresh.load_state_dict(dyn.state_dict())
    x = torch.randn(1, 3, 96, 64)
    torch.testing.assert_close(dyn(x), fresh(x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", MICRO)
def test_timm_feature_apis(name):
    model = timm.create_model(name, num_classes=5).eval()
    x = torch.randn(2, 3, 64, 64)
    feats = model.forward_features(x)
    assert feats.shape == (2, 65, 128)
    assert model.forward_head(feats).shape == (2, 5)
    final, inter = model.forward_intermediates(x, indices=2, output_fmt="NCHW")
    assert [t.shape for t in inter] == [(2, 128, 8, 8)] * 2
    inter_nlc = model.forward_intermediates(x, indices=[0], output_fmt="NLC", intermediates_only=True)
    assert inter_nlc[0].shape == (2, 64, 128)  # prefix token split off
    fo = timm.create_model(name, features_only=True, out_indices=(1, 3))
    assert [t.shape for t in fo(x)] == [(2, 128, 8, 8)] * 2
    model.reset_classifier(3)
    assert model(x).shape == (2, 3)
    model.set_grad_checkpointing(True)
    model.train()
    model(x).sum().backward()


# Loading from a (local) Hub cache with HF_HUB_OFFLINE=1 is tested for every PE type in test_hub.py.
