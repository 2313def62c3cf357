"""pe_scale on the timm families whose PE it scaled only in part (convit's GPSA, samvit's rel_pos_h/w, hiera's
pos_embed_win) or not at all (swinv2's and swinv2-cr's continuous position bias, xcit's Fourier PE, mvitv2's
rel_pos_h/w); refusals of PEs without a scale (twins' PosConv); strict=False and pe_inventory.

Random-init models, tiny and in float64; every PE is made visible on purpose where timm's init hides it
(randn for zero-initialised tables, res-post-norms and layer scales set to one), so that each test could fail.
"""

from __future__ import annotations

import copy

import pytest
import timm
import torch
import torch.nn as nn

from timm_posgeom import PEScaleError, pe_scale, token_permutation

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: one torch thread beats two on a shared CPU


def _randn_(model: nn.Module, *names: str) -> nn.Module:
    """Fill every parameter whose last name is in ``names`` with N(0, 1): zero-initialised PEs hide the effect."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.rsplit(".", 1)[-1] in names:
                p.normal_(0, 1.0)
    return model


def _zero_(model: nn.Module, *names: str) -> nn.Module:
    with torch.no_grad():
        for name, t in model.named_parameters():
            if any(name == n or name.endswith("." + n) for n in names):
                t.zero_()
    return model


def _samvit(**kw) -> nn.Module:
    model = timm.create_model(
        "samvit_base_patch16_224",
        pretrained=False,
        img_size=64,
        embed_dim=64,
        depth=2,
        num_heads=2,
        num_classes=3,
        **kw,
    )
    return _randn_(model, "rel_pos_h", "rel_pos_w", "pos_embed")


def _mvitv2_abs() -> nn.Module:
    from timm.models.mvitv2 import MultiScaleVit, MultiScaleVitCfg

    cfg = MultiScaleVitCfg(depths=(1, 1), embed_dim=32, use_abs_pos=True, use_cls_token=True)
    return _randn_(MultiScaleVit(cfg, img_size=64, num_classes=3), "pos_embed")


def _swinv2() -> nn.Module:
    model = timm.create_model(
        "swinv2_tiny_window8_256",
        pretrained=False,
        img_size=64,
        depths=(1, 1),
        num_heads=(2, 4),
        embed_dim=32,
        num_classes=3,
    )
    with torch.no_grad():  # swinv2 initialises its res-post-norms to zero: every block would be the identity
        for name, p in model.named_parameters():
            if name.endswith(("norm1.weight", "norm2.weight")):
                p.fill_(1.0)
    return model


def _swinv2_bias_hook(fn):
    """A forward hook on swinv2's cpb_mlp that replaces its output z by fn(z) (the reference for its bias)."""
    return lambda module, args, out: fn(out)


def _remove_pe_swinv2(model: nn.Module) -> nn.Module:
    for m in model.modules():  # 16 * sigmoid(-inf) = 0: the bias added to the logits is exactly zero
        if hasattr(m, "cpb_mlp"):
            m.cpb_mlp.register_forward_hook(_swinv2_bias_hook(lambda z: torch.full_like(z, float("-inf"))))
    return model


def _remove_pe_xcit(model: nn.Module) -> nn.Module:
    model.pos_embed = None  # xcit's forward skips the Fourier PE when it is None
    return model


# name: (factory, image size, the same model with every PE removed by hand)
FAMILIES = {
    "convit": (
        lambda: timm.create_model(
            "convit_tiny", pretrained=False, img_size=64, patch_size=8, depth=3, local_up_to_layer=2, num_classes=3
        ),
        64,
        lambda m: _zero_(m, "pos_embed", "pos_proj.weight", "pos_proj.bias"),
    ),
    "samvit_abs_windowed": (
        lambda: _samvit(window_size=2, global_attn_indexes=(1,), use_abs_pos=True),
        64,
        lambda m: _zero_(m, "pos_embed", "rel_pos_h", "rel_pos_w"),
    ),
    "samvit_224": (lambda: _samvit(window_size=0), 64, lambda m: _zero_(m, "rel_pos_h", "rel_pos_w")),
    "hiera_abswin": (
        lambda: timm.create_model(
            "hiera_small_abswin_256", pretrained=False, stages=(1, 1, 1, 1), embed_dim=32, num_classes=3
        ),
        256,
        lambda m: _zero_(m, "pos_embed", "pos_embed_win"),
    ),
    "swinv2": (_swinv2, 64, _remove_pe_swinv2),
    "swinv2_cr": (
        lambda: timm.create_model(
            "swinv2_cr_tiny_ns_224",
            pretrained=False,
            img_size=112,
            depths=(1, 1),
            num_heads=(2, 4),
            embed_dim=32,
            num_classes=3,
            init_values=1.0,
        ),  # 0 (the default) hides every block
        112,
        lambda m: _zero_(m, "meta_mlp.fc2.weight", "meta_mlp.fc2.bias"),
    ),
    "xcit": (
        lambda: timm.create_model("xcit_nano_12_p16_224", pretrained=False, img_size=64, depth=2, num_classes=3),
        64,
        _remove_pe_xcit,
    ),
    "mvitv2": (
        lambda: timm.create_model("mvitv2_tiny", pretrained=False, img_size=64, num_classes=3),
        64,
        lambda m: _zero_(m, "rel_pos_h", "rel_pos_w"),
    ),
    "mvitv2_abs": (_mvitv2_abs, 64, lambda m: _zero_(m, "pos_embed", "rel_pos_h", "rel_pos_w")),
}


def _state(model: nn.Module) -> dict[str, torch.Tensor | frozenset]:
    """Every tensor (state dict and buffers) and each module's attribute names (a shadowing method shows)."""
    out: dict[str, torch.Tensor | frozenset] = {k: v.detach().clone() for k, v in model.state_dict().items()}
    out.update({f"buffer:{k}": v.detach().clone() for k, v in model.named_buffers()})
    out.update({f"attrs:{k}": frozenset(vars(m)) for k, m in model.named_modules()})
    return out


def _assert_restored(before: dict[str, torch.Tensor | frozenset], model: nn.Module) -> None:
    after = _state(model)
    assert before.keys() == after.keys()
    for k in before:
        same = before[k] == after[k] if k.startswith("attrs:") else torch.equal(before[k], after[k])
        assert same, k
    for name, m in model.named_modules():  # no hook left behind
        assert not m._forward_hooks and not m._forward_pre_hooks, name


def _build(key: str) -> tuple[nn.Module, torch.Tensor]:
    factory, size, _ = FAMILIES[key]
    model = factory().double().eval()
    return model, torch.randn(1, 3, size, size, dtype=torch.float64)


@pytest.mark.parametrize("key", list(FAMILIES))
def test_alpha_one_is_bit_identical_zero_changes_and_everything_is_restored(key):
    model, x = _build(key)
    with torch.no_grad():
        ref = model.forward_features(x)
        before = _state(model)
        with pe_scale(model, 1.0):
            assert torch.equal(model.forward_features(x), ref)
        with pe_scale(model, 0.0) as yielded:
            assert yielded is model
            zero = model.forward_features(x)
        assert (zero - ref).abs().max() > 1e-4
        _assert_restored(before, model)
        with pytest.raises(RuntimeError, match="boom"):
            with pe_scale(model, 0.3):
                model.forward_features(x)
                raise RuntimeError("boom")
        _assert_restored(before, model)
        assert torch.equal(model.forward_features(x), ref)


@pytest.mark.parametrize("key", list(FAMILIES))
def test_alpha_zero_equals_every_pe_removed_by_hand(key):
    """The regression: convit kept its GPSA positional attention, samvit its rel_pos_h/w, hiera its
    pos_embed_win; swinv2, swinv2-cr, xcit and mvitv2 (without pos_embed) were refused as having no PE."""
    model, x = _build(key)
    removed = FAMILIES[key][2](copy.deepcopy(model))
    with torch.no_grad(), pe_scale(model, 0.0):
        out = model.forward_features(x)
    with torch.no_grad():
        torch.testing.assert_close(out, removed.forward_features(x), rtol=0, atol=1e-10)


@pytest.mark.parametrize(
    "key,tables",
    [
        ("samvit_abs_windowed", ("pos_embed", "rel_pos_h", "rel_pos_w")),
        ("hiera_abswin", ("pos_embed", "pos_embed_win")),
        ("mvitv2_abs", ("pos_embed", "rel_pos_h", "rel_pos_w")),
    ],
)
def test_every_table_is_scaled_by_alpha(key, tables):
    model, _ = _build(key)
    found = {n: p.detach().clone() for n, p in model.named_parameters() if n.rsplit(".", 1)[-1] in tables}
    assert {n.rsplit(".", 1)[-1] for n in found} == set(tables)
    with pe_scale(model, 0.5):
        for n, p in model.named_parameters():
            if n in found:
                assert torch.equal(p, 0.5 * found[n]), n


def test_swinv2_scales_the_bias_added_to_the_logits_not_the_mlp_output():
    """swinv2 adds 16 * sigmoid(cpb_mlp(.)): alpha scales that bias, i.e. 16 * sigmoid(z') = alpha * 16 * sigmoid(z)."""
    model, x = _build("swinv2")
    reference = copy.deepcopy(model)
    for m in reference.modules():
        if hasattr(m, "cpb_mlp"):
            m.cpb_mlp.register_forward_hook(_swinv2_bias_hook(lambda z: torch.logit(0.5 * torch.sigmoid(z))))
    with torch.no_grad(), pe_scale(model, 0.5):
        out = model.forward_features(x)
    with torch.no_grad():
        torch.testing.assert_close(out, reference.forward_features(x), rtol=0, atol=1e-10)
        with pe_scale(model, 2.0):  # above 1 too (the bias leaves sigmoid's range: no other way to express it)
            assert not torch.allclose(model.forward_features(x), out)


def test_convit_gpsa_positional_attention_is_uniform_at_alpha_zero():
    model, x = _build("convit")
    gpsa = model.blocks[0].attn
    with torch.no_grad(), pe_scale(model, 0.0):
        tokens = model.pos_drop(model.patch_embed(x))
        pos_logits = gpsa.pos_proj(gpsa.get_rel_indices(tokens.shape[1]))
    assert torch.equal(pos_logits, torch.zeros_like(pos_logits))  # softmax of zeros: uniform attention


# --------------------------------------------------------------------------------------------
# permutation equivariance of global-attention models at alpha = 0
# --------------------------------------------------------------------------------------------
def _beit() -> nn.Module:
    model = timm.create_model(
        "beit_base_patch16_224",
        pretrained=False,
        img_size=64,
        patch_size=8,
        depth=2,
        embed_dim=64,
        num_heads=2,
        num_classes=3,
        use_abs_pos_emb=True,
    )
    return _randn_(model, "relative_position_bias_table")  # zero-initialised by beit


GLOBAL_ATTENTION = {
    "convit": FAMILIES["convit"][0],
    "vit": lambda: timm.create_model(
        "vit_tiny_patch16_224", pretrained=False, img_size=64, patch_size=8, depth=2, num_classes=3
    ),
    "deit_distilled": lambda: timm.create_model(
        "deit_tiny_distilled_patch16_224", pretrained=False, img_size=64, patch_size=8, depth=2, num_classes=3
    ),
    "beit_rel_pos_bias": _beit,
    "vit_relpos": lambda: timm.create_model(
        "vit_relpos_small_patch16_224",
        pretrained=False,
        img_size=64,
        patch_size=8,
        depth=2,
        embed_dim=64,
        num_heads=2,
        num_classes=3,
        init_values=1.0,
    ),
    "samvit_global": lambda: _samvit(window_size=0, use_abs_pos=True),
}


def _tokens(x: torch.Tensor) -> torch.Tensor:
    return x.flatten(1, 2) if x.ndim == 4 else x  # samvit's blocks emit NHWC


def _equivariance_gap(model: nn.Module, x: torch.Tensor, alpha: float) -> float:
    """Max |permuted run's last block output - unpermuted one indexed by the permutation| (prefix tokens kept)."""
    outs = []
    hook = model.blocks[-1].register_forward_hook(lambda m, a, o: outs.append(_tokens(o)))
    try:
        with torch.no_grad(), pe_scale(model, alpha):
            model(x)
            with token_permutation(model, seed=0) as rpi:
                model(x)
    finally:
        hook.remove()
    ref, permuted = outs
    p = rpi.permutation
    npre = ref.shape[1] - p.numel()
    expected = torch.cat([ref[:, :npre], ref[:, npre:][:, p]], dim=1)
    return (permuted - expected).abs().max().item()


@pytest.mark.parametrize("key", list(GLOBAL_ATTENTION))
def test_global_attention_blocks_are_exactly_permutation_equivariant_at_alpha_zero(key):
    """convit's GPSA kept its positional attention under pe_scale(model, 0): not equivariant (the regression)."""
    model = GLOBAL_ATTENTION[key]().double().eval()
    x = torch.randn(2, 3, 64, 64, dtype=torch.float64)
    assert _equivariance_gap(model, x, 1.0) > 1e-6  # the PE is visible, so the test could fail
    assert _equivariance_gap(model, x, 0.0) < 1e-10


# --------------------------------------------------------------------------------------------
# refusals, strict, pe_inventory
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["twins_pcpvt_small", "twins_svt_small"])
def test_twins_conv_position_generator_is_refused_by_name(name):
    model = timm.create_model(name, pretrained=False, depths=(1, 1, 1, 1), num_classes=3)
    before = _state(model)
    for strict in (True, False):  # strict=False would scale nothing: still refused
        with pytest.raises(PEScaleError) as info:
            with pe_scale(model, 0.5, strict=strict):
                pass
        message = str(info.value)
        assert "Twins" in message and "PosConv" in message and "pos_block" in message
        assert "cannot be scaled" in message and "no positional encoding" not in message
    _assert_restored(before, model)


def test_found_nothing_is_said_only_when_nothing_was_found():
    vit_none = timm.create_model(
        "vit_tiny_patch16_224", pretrained=False, img_size=64, patch_size=8, depth=1, pos_embed="none", num_classes=3
    )
    with pytest.raises(PEScaleError, match="found no positional encoding in VisionTransformer"):
        with pe_scale(vit_none, 0.5):
            pass


class _PegPlusTable(nn.Module):
    """A pos_embed table plus a twins PosConv (PEG) after the first block: partly scalable."""

    def __init__(self):
        super().__init__()
        from timm.models.twins import PosConv

        self.patch_embed = nn.Conv2d(3, 8, 4, 4)
        self.pos_embed = nn.Parameter(torch.randn(1, 16, 8))
        self.pos_block = PosConv(8, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        x = self.patch_embed(x).flatten(2).transpose(1, 2) + self.pos_embed
        return self.head(self.pos_block(x, (4, 4)))


def test_partly_scalable_model_strict_raises_and_non_strict_scales_what_it_can():
    from timm_posgeom.interventions import pe_inventory

    model = _PegPlusTable().double().eval()
    x = torch.randn(1, 3, 16, 16, dtype=torch.float64)
    table, before = model.pos_embed.detach().clone(), _state(model)
    with pytest.raises(PEScaleError, match=r"(?s)PosConv.*pos_block.*cannot be scaled.*strict=False"):
        with pe_scale(model, 0.0):
            pass
    _assert_restored(before, model)
    with torch.no_grad(), pe_scale(model, 0.0, strict=False) as yielded:
        assert yielded is model and torch.equal(model.pos_embed, torch.zeros_like(table))
        assert not torch.equal(model.pos_block.proj[0].weight, torch.zeros_like(model.pos_block.proj[0].weight))
        model(x)
    _assert_restored(before, model)
    inventory = pe_inventory(model)
    assert [(name, scalable) for name, _, scalable in inventory] == [("pos_embed", True), ("pos_block", False)]
    assert "PosConv" in inventory[1].kind


def test_inventory_lists_every_pe_of_the_families():
    from timm_posgeom.interventions import pe_inventory

    names = [(name, scalable) for name, _, scalable in pe_inventory(_build("hiera_abswin")[0])]
    assert names == [("pos_embed", True), ("pos_embed_win", True)]
    convit, _ = _build("convit")
    names = [name for name, _, _ in pe_inventory(convit)]
    assert names == ["pos_embed", "blocks.0.attn", "blocks.1.attn"]
    for key in ("samvit_abs_windowed", "swinv2", "swinv2_cr", "xcit", "mvitv2"):
        entries = pe_inventory(_build(key)[0])
        assert entries and all(scalable for _, _, scalable in entries), key


def test_hiera_video_separate_spatial_and_temporal_tables():
    from timm.models.hiera import Hiera

    from timm_posgeom.interventions import pe_inventory

    model = (
        Hiera(
            img_size=(4, 32, 32),
            embed_dim=32,
            stages=(1, 1, 1, 1),
            num_classes=3,
            sep_pos_embed=True,
            patch_kernel=(3, 7, 7),
            patch_stride=(2, 4, 4),
            patch_padding=(1, 3, 3),
            mask_unit_size=(1, 4, 4),
            q_stride=(1, 2, 2),
        )
        .double()
        .eval()
    )
    assert [name for name, _, _ in pe_inventory(model)] == ["pos_embed_spatial", "pos_embed_temporal"]
    x = torch.randn(1, 3, 4, 32, 32, dtype=torch.float64)
    removed = _zero_(copy.deepcopy(model), "pos_embed_spatial", "pos_embed_temporal")
    with torch.no_grad(), pe_scale(model, 0.0):
        torch.testing.assert_close(model.forward_features(x), removed.forward_features(x), rtol=0, atol=1e-10)


@pytest.mark.parametrize("key", ["vit_relpos", "convit", "swinv2"])
def test_an_inner_context_restores_the_outer_one(key):
    """vit_relpos: the inner exit deleted the outer context's get_bias shadow, and the outer exit then failed."""
    model = {**GLOBAL_ATTENTION, "swinv2": FAMILIES["swinv2"][0]}[key]().double().eval()
    x = torch.randn(1, 3, 64, 64, dtype=torch.float64)
    with torch.no_grad():
        ref = model.forward_features(x)
        before = _state(model)  # after a first forward: convit fills its rel_indices buffer there
        with pe_scale(model, 0.5):
            half = model.forward_features(x)
            with pe_scale(model, 0.0):
                assert not torch.equal(model.forward_features(x), half)
            assert torch.equal(model.forward_features(x), half)
        assert torch.equal(model.forward_features(x), ref)
    _assert_restored(before, model)
