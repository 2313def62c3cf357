"""token_permutation and pe_scale on our models and on timm's own ViTs."""

from __future__ import annotations

import pytest
import timm
import torch
import torch.nn as nn

from timm_posgeom import PEScaleError, find_embed_module, pe_scale, token_permutation


def _block_outputs(model: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    outs = []
    hooks = [b.register_forward_hook(lambda m, a, o: outs.append(o)) for b in model.blocks]
    try:
        model(x)
    finally:
        for h in hooks:
            h.remove()
    return outs


def _no_pe_models() -> dict[str, nn.Module]:
    kw = dict(num_classes=3, depth=2)
    return {
        "ours": timm.create_model("posgeom_vit_micro_patch8_64_nope", **kw),
        "ours_dynamic_nhwc": timm.create_model("posgeom_vit_micro_patch8_64_nope", dynamic_img_size=True, **kw),
        "timm_vit_none": timm.create_model("vit_tiny_patch16_224", img_size=64, patch_size=8, pos_embed="none", **kw),
        "timm_vit_none_reg": timm.create_model(
            "vit_tiny_patch16_224", img_size=64, patch_size=8, pos_embed="none", reg_tokens=2, **kw
        ),
        "eva_rope_removed": timm.create_model(
            "vit_small_patch16_rope_224", img_size=64, patch_size=8, use_rot_pos_emb=False, init_values=1.0, **kw
        ),
    }


@pytest.mark.parametrize("key", list(_no_pe_models()))
def test_exact_equivariance_without_pe(key):
    model = _no_pe_models()[key].double().eval()
    npre = model.num_prefix_tokens
    x = torch.randn(2, 3, 64, 64, dtype=torch.float64)
    ref = _block_outputs(model, x)
    with token_permutation(model, seed=5) as handle:
        perm_outs = _block_outputs(model, x)
    p = handle.permutation
    assert sorted(p.tolist()) == list(range(64)) and not torch.equal(p, torch.arange(64))
    for r, o in zip(ref, perm_outs):
        torch.testing.assert_close(o[:, npre:], r[:, npre:][:, p], rtol=0, atol=1e-10)
        torch.testing.assert_close(o[:, :npre], r[:, :npre], rtol=0, atol=1e-10)


@pytest.mark.parametrize(
    "name",
    ["posgeom_vit_micro_patch8_64_ape", "posgeom_vit_micro_patch8_64_sincos", "posgeom_vit_micro_patch8_64_rope"],
)
def test_outputs_change_with_a_pe(name):
    model = timm.create_model(name, num_classes=3).double().eval()
    x = torch.randn(2, 3, 64, 64, dtype=torch.float64)
    ref = _block_outputs(model, x)
    with token_permutation(model, seed=5) as handle:
        outs = _block_outputs(model, x)
    diff = (outs[-1][:, 1:] - ref[-1][:, 1:][:, handle.permutation]).abs().max()
    assert diff > 1e-4


def test_seeded_reproducible_per_call_and_per_batch():
    model = timm.create_model("posgeom_vit_micro_patch8_64_ape", num_classes=3).eval()
    x = torch.randn(1, 3, 64, 64)
    with token_permutation(model, seed=0) as a:
        ya1, ya2 = model(x), model(x)
    with token_permutation(model, seed=0) as b:
        yb = model(x)
    assert torch.equal(a.permutation, b.permutation) and torch.equal(ya1, yb) and torch.equal(ya1, ya2)
    assert a.num_calls == 2
    with token_permutation(model, seed=0, per="batch") as c:
        model(x)
        first = c.permutation.clone()
        model(x)
    assert not torch.equal(first, c.permutation)
    assert torch.equal(first, a.permutation)  # the first draw of the same seed


def test_hook_removed_on_exit_even_after_an_exception():
    model = timm.create_model("posgeom_vit_micro_patch8_64_ape", num_classes=3).eval()
    x = torch.randn(1, 3, 64, 64)
    ref = model(x)
    with pytest.raises(RuntimeError, match="boom"):
        with token_permutation(model, seed=1):
            raise RuntimeError("boom")
    assert not model.patch_embed._forward_hooks
    torch.testing.assert_close(model(x), ref, rtol=0, atol=0)


def test_training_mode_permutes_only_in_training():
    model = timm.create_model("posgeom_vit_micro_patch8_64_ape", num_classes=3)
    x = torch.randn(1, 3, 64, 64)
    ref = model.eval()(x)
    with token_permutation(model, mode="training") as h:
        torch.testing.assert_close(model.eval()(x), ref, rtol=0, atol=0)
        assert h.num_calls == 0
        model.train()(x)
        assert h.num_calls == 1


def test_tuple_outputs_and_unsupported_models():
    class Embed(nn.Module):
        def forward(self, x):
            return x, (2, 2)

    class Toy(nn.Module):
        def __init__(self):
            super().__init__()
            self.patch_embed = Embed()

        def forward(self, x):
            return self.patch_embed(x)

    toy = Toy()
    x = torch.arange(8.0).reshape(1, 4, 2)
    with token_permutation(toy, seed=0) as h:
        out, size = toy(x)
    assert size == (2, 2) and torch.equal(out, x[:, h.permutation])
    with pytest.raises(TypeError, match="patch_embed"):
        with token_permutation(nn.Conv2d(3, 3, 1)):
            pass
    with pytest.raises(ValueError, match="mode"):
        with token_permutation(toy, mode="sometimes"):
            pass


def test_naflexvit_hook_site():
    model = timm.create_model("naflexvit_base_patch16_gap", img_size=64, depth=1, num_classes=3).eval()
    x = torch.randn(1, 3, 64, 64)
    with token_permutation(model, seed=0) as h:
        model(x)
    assert h.num_calls == 1 and h.permutation.numel() == 16


@pytest.mark.parametrize("name", ["qwen3_vit_88m", "deepseek_vit_412m", "gemma4_vit_167m"])
def test_vlm_towers_are_permuted_before_their_position_encoding(name):
    """timm's VLM towers keep the patch embedding in ``encoder.patch_embed``; gemma4's adds its 2-D table inside
    it, so the permutation goes on its projection: the embedding's output under RPI is the content of patch
    p[i] plus the table at index i, never the table moved with the content."""
    torch.manual_seed(0)
    kwargs = dict(embed_dim=64, num_heads=2, depth=1, patch_size=8, img_size=32)
    model = timm.create_model(name, **kwargs, **({"global_pool": "avg"} if "gemma" in name else {})).eval()
    encoder = model.encoder
    embed = encoder.patch_embed
    inputs = []  # what the first block reads: the tokens with their position table added
    hook = encoder.blocks[0].register_forward_pre_hook(lambda m, args: inputs.append(args[0]))
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        model(x)
        with token_permutation(model, seed=0) as h:
            model(x)
        if "gemma" in name:  # the 2-D table at each index of the 4 x 4 grid
            table = embed._position_embeddings(embed._default_patch_coord(2, 4, 4, x.device)[0].flip(-1), None)
        else:  # qwen3 adds its table after the embedding, deepseek has none (RoPE only)
            table = encoder._pos_embed(torch.zeros(2, 4, 4, 64))[0]
    hook.remove()
    plain, permuted = inputs
    p = h.permutation
    assert h.num_calls == 1 and p.numel() == 16
    assert find_embed_module(model) is (embed.input_proj if "gemma" in name else embed)
    assert table.abs().max() > 0 or "deepseek" in name
    torch.testing.assert_close(permuted, (plain - table)[:, p] + table, rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------------------------
def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    out = {k: v.detach().clone() for k, v in model.state_dict().items()}
    out.update({f"buffer:{k}": v.detach().clone() for k, v in model.named_buffers()})
    return out


def _assert_same_state(before, model):
    after = _state(model)
    assert before.keys() == after.keys()
    for k in before:
        assert torch.equal(before[k], after[k]), k


def _beit_with_visible_bias():
    model = timm.create_model("beit_base_patch16_224", img_size=64, patch_size=8, depth=2, num_classes=3)
    with torch.no_grad():  # beit initialises its bias tables to zero, which would hide the effect
        for m in model.modules():
            if hasattr(m, "relative_position_bias_table"):
                m.relative_position_bias_table.normal_(0, 1.0)
    return model


THIRD_PARTY = {
    "vit": lambda: timm.create_model("vit_tiny_patch16_224", img_size=64, patch_size=8, depth=2, num_classes=3),
    "eva_rope": lambda: timm.create_model(
        "vit_small_patch16_rope_224", img_size=64, patch_size=8, depth=2, num_classes=3, init_values=1.0
    ),
    "eva_rope_mixed": lambda: timm.create_model(
        "vit_small_patch16_rope_mixed_224", img_size=64, patch_size=8, depth=2, num_classes=3, init_values=1.0
    ),
    "dinov3": lambda: timm.create_model(
        "vit_small_patch16_dinov3", img_size=64, patch_size=8, depth=2, num_classes=3, init_values=1.0
    ),
    "beit": _beit_with_visible_bias,
    "swin": lambda: timm.create_model(
        "swin_tiny_patch4_window7_224", depths=(1, 1), num_heads=(3, 6), embed_dim=48, num_classes=3
    ),
    "relpos_mlp": lambda: timm.create_model(
        "vit_relpos_small_patch16_224", img_size=64, patch_size=8, depth=2, num_classes=3, init_values=1.0
    ),
}


@pytest.mark.parametrize("key", list(THIRD_PARTY))
def test_pe_scale_third_party_alpha_one_identity_alpha_zero_changes_and_restores(key):
    model = THIRD_PARTY[key]().double().eval()
    size = 224 if key == "swin" else 64
    x = torch.randn(1, 3, size, size, dtype=torch.float64)
    ref = model.forward_features(x)
    before = _state(model)
    with pe_scale(model, 1.0):
        torch.testing.assert_close(model.forward_features(x), ref, rtol=0, atol=1e-12)
    with pe_scale(model, 0.0):
        zero = model.forward_features(x)
    assert not torch.allclose(zero, ref, atol=1e-6)
    _assert_same_state(before, model)
    with pytest.raises(RuntimeError, match="boom"):
        with pe_scale(model, 0.3):
            raise RuntimeError("boom")
    _assert_same_state(before, model)
    torch.testing.assert_close(model.forward_features(x), ref, rtol=0, atol=0)


def test_pe_scale_zero_equals_the_pe_removed_on_timm_models():
    vit = timm.create_model("vit_tiny_patch16_224", img_size=64, patch_size=8, depth=2, num_classes=3).double().eval()
    vit_none = (
        timm.create_model("vit_tiny_patch16_224", img_size=64, patch_size=8, depth=2, num_classes=3, pos_embed="none")
        .double()
        .eval()
    )
    vit_none.load_state_dict({k: v for k, v in vit.state_dict().items() if k != "pos_embed"})
    rope = THIRD_PARTY["eva_rope"]().double().eval()
    rope_none = (
        timm.create_model(
            "vit_small_patch16_rope_224",
            img_size=64,
            patch_size=8,
            depth=2,
            num_classes=3,
            init_values=1.0,
            use_rot_pos_emb=False,
        )
        .double()
        .eval()
    )
    rope_none.load_state_dict(rope.state_dict())
    x = torch.randn(2, 3, 64, 64, dtype=torch.float64)
    for model, removed in ((vit, vit_none), (rope, rope_none)):
        with pe_scale(model, 0.0):
            torch.testing.assert_close(model(x), removed(x), rtol=0, atol=1e-10)


def test_pe_scale_patch_rows_only():
    vit = timm.create_model("vit_tiny_patch16_224", img_size=64, patch_size=8, depth=1, num_classes=3)
    table = vit.pos_embed.detach().clone()
    with pe_scale(vit, 0.5, include_prefix=False):
        torch.testing.assert_close(vit.pos_embed[:, :1], table[:, :1], rtol=0, atol=0)
        torch.testing.assert_close(vit.pos_embed[:, 1:], 0.5 * table[:, 1:], rtol=0, atol=0)
    with pe_scale(vit, 0.5):
        torch.testing.assert_close(vit.pos_embed, 0.5 * table, rtol=0, atol=0)
    assert torch.equal(vit.pos_embed, table)


@pytest.mark.parametrize("pe", ["ape", "sincos", "rope"])
def test_pe_scale_on_our_model_multiplies_the_model_alpha(pe):
    """A model built (or exported) with alpha 0.5: pe_scale(1) leaves it as it is, pe_scale(0.5) gives 0.25, as
    on every timm model (the scale used to be set, not multiplied: alpha 1 changed such a model)."""
    name = f"posgeom_vit_micro_patch8_64_{pe}"
    half = timm.create_model(name, num_classes=3, alpha=0.5).double().eval()
    quarter = timm.create_model(name, num_classes=3, alpha=0.25).double().eval()
    quarter.load_state_dict(half.state_dict())
    x = torch.randn(2, 3, 64, 64, dtype=torch.float64)
    ref = half(x)
    with pe_scale(half, 1.0):
        torch.testing.assert_close(half(x), ref, rtol=0, atol=0)
    with pe_scale(half, 0.5):
        assert half.alpha == 0.25
        torch.testing.assert_close(half(x), quarter(x), rtol=0, atol=1e-12)
    assert half.alpha == 0.5 and torch.equal(half(x), ref)


def test_pe_scale_patch_rows_only_on_our_ape_model():
    """include_prefix=False on our APE model scales the table's patch rows and keeps the class row (it used to
    scale the whole table while the sweep recorded include_prefix False)."""
    model = timm.create_model("posgeom_vit_micro_patch8_64_ape", num_classes=3, depth=1).double().eval()
    assert not model.no_embed_class and model.num_prefix_tokens == 1
    manual = timm.create_model("posgeom_vit_micro_patch8_64_ape", num_classes=3, depth=1).double().eval()
    manual.load_state_dict(model.state_dict())
    with torch.no_grad():
        manual.pos_embed[:, 1:] *= 0.3
    x = torch.randn(2, 3, 64, 64, dtype=torch.float64)
    table, ref = model.pos_embed.detach().clone(), model(x)
    with pe_scale(model, 0.3, include_prefix=False):
        torch.testing.assert_close(model(x), manual(x), rtol=0, atol=0)
        assert not torch.allclose(model(x), ref)
    assert torch.equal(model.pos_embed, table) and torch.equal(model(x), ref) and model.alpha == 1.0


def test_pe_scale_on_our_model_matches_constructor_alpha_and_restores():
    model = timm.create_model("posgeom_vit_micro_patch8_64_rope", num_classes=3).eval()
    half = timm.create_model("posgeom_vit_micro_patch8_64_rope", num_classes=3, alpha=0.5).eval()
    half.load_state_dict(model.state_dict())
    x = torch.randn(1, 3, 64, 64)
    ref = model(x)
    with pe_scale(model, 0.5):
        torch.testing.assert_close(model(x), half(x), rtol=0, atol=0)
    assert model.alpha == 1.0
    torch.testing.assert_close(model(x), ref, rtol=0, atol=0)


def test_pe_scale_errors():
    with pytest.raises(PEScaleError, match="Conv2d.*pos_embed"):
        with pe_scale(nn.Conv2d(3, 3, 1), 0.5):
            pass
    nope = timm.create_model("vit_tiny_patch16_224", img_size=64, patch_size=8, depth=1, pos_embed="none")
    with pytest.raises(PEScaleError, match="VisionTransformer"):
        with pe_scale(nope, 0.5):
            pass
    with pytest.raises(ValueError, match="alpha"):
        with pe_scale(nope, -1):
            pass


@pytest.mark.parametrize("name", ["posgeom_vit_micro_patch8_64_rope", "eva_rope"])
def test_pe_scale_inside_inference_mode_leaves_a_trainable_model(name):
    """After pe_scale inside inference_mode the model trains as one never scaled: same output, same gradients
    (RoPE caches left as inference tensors fail backward; caches left scaled give other values)."""
    import copy

    model = THIRD_PARTY["eva_rope"]() if name == "eva_rope" else timm.create_model(name, num_classes=3)
    model = model.double()
    never_scaled = copy.deepcopy(model)
    x = torch.randn(2, 3, 64, 64, dtype=torch.float64)
    with torch.inference_mode():
        with pe_scale(model, 0.5):
            scaled = model(x)
    for m in (model, never_scaled):
        m.train()
        m(x).square().sum().backward()
    assert not torch.allclose(scaled, never_scaled.eval()(x))  # alpha 0.5 did change the output
    assert torch.equal(model.eval()(x), never_scaled(x))
    grads = {n: p.grad for n, p in model.named_parameters()}
    for n, p in never_scaled.named_parameters():
        assert grads[n] is not None and torch.equal(grads[n], p.grad), n
    assert any(g.abs().sum() > 0 for g in grads.values())


def test_eval_mode_restores_the_mode_even_on_error():
    from timm_posgeom.interventions import eval_mode

    model = nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.5)).train()
    with pytest.raises(RuntimeError, match="boom"):
        with eval_mode(model):
            assert not model.training and not model[1].training
            raise RuntimeError("boom")
    assert model.training and model[1].training
    model.eval()
    with eval_mode(model):
        pass
    assert not model.training
    # each module's own mode comes back, not the top-level one spread over the tree (issue 14, item 8)
    model.train()
    model[1].eval()
    with eval_mode(model):
        assert not any(m.training for m in model.modules())
    assert model.training and model[0].training and not model[1].training


# --------------------------------------------------------------------------------------------
# token layouts of third-party patch embeddings (issue 13, part 1: never silently wrong)
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name,kwargs,size,tokens",
    [
        pytest.param("swinv2_cr_tiny_224", dict(depths=(1, 1, 1, 1)), 224, 56 * 56, marks=pytest.mark.slow),  # NCHW
        ("pit_ti_224", dict(img_size=96), 96, 11 * 11),  # NCHW conv embedding
        ("mixer_s16_224", {}, 224, 14 * 14),  # `stem`, flattened NLC
        ("vit_tiny_patch16_224", dict(depth=1, dynamic_img_size=True), 96, 6 * 6),  # NHWC with a dynamic size
    ],
)
def test_permutation_follows_the_token_layout(name, kwargs, size, tokens):
    """swinv2_cr gave a 5376-element (96 x 56) permutation, pit at 96 px 704 (64 x 11): (channel, row) pairs."""
    model = timm.create_model(name, num_classes=3, **kwargs).eval()
    x = torch.randn(1, 3, size, size)
    with torch.no_grad(), token_permutation(model, seed=0) as rpi:
        model(x)
        permuted = model.forward_features(x)  # (heads may be zero-initialised)
    assert rpi.permutation.numel() == tokens and sorted(rpi.permutation.tolist()) == list(range(tokens))
    with torch.no_grad():
        assert not torch.allclose(permuted, model.forward_features(x))


def test_permuting_an_nchw_embedding_moves_whole_tokens():
    """Each spatial position keeps its channel vector: slot i holds the content of patch p[i]."""
    from timm_posgeom.interventions.permutation import permute_tokens

    x = torch.arange(2 * 3 * 2 * 2, dtype=torch.float32).reshape(2, 3, 2, 2)  # (B, C, H, W)
    perm = torch.tensor([3, 0, 2, 1])
    y = permute_tokens(x, perm, "NCHW")
    assert torch.equal(y.flatten(2)[:, :, 0], x.flatten(2)[:, :, 3])
    assert torch.equal(y.flatten(2)[:, :, 1], x.flatten(2)[:, :, 0])


def test_a_permutation_that_is_never_applied_is_an_error():
    """crossvit's patch_embed is a ModuleList never called: its 'permuted' outputs equaled the plain ones."""
    crossvit = timm.create_model("crossvit_tiny_240", num_classes=3).eval()
    with pytest.raises(TypeError, match="ModuleList of 2 branches"):
        with token_permutation(crossvit):
            pass
    model = timm.create_model("vit_tiny_patch16_224", img_size=64, patch_size=8, depth=1, num_classes=3).eval()
    model.forward_features = lambda x, **kw: torch.zeros(x.shape[0], 65, 192)  # bypasses patch_embed
    from timm_posgeom.interventions import TokenPermutationError

    with pytest.raises(TokenPermutationError, match="without calling PatchEmbed"):
        with token_permutation(model, seed=0):
            model(torch.randn(1, 3, 64, 64))


def test_alpha_on_our_model_without_pe_is_refused_not_a_silent_no_op():
    """pe_scale and --alpha on posgeom_*_nope changed nothing and said nothing (timm's pos_embed='none' raises)."""
    from timm_posgeom.interventions import PEScaleError

    nope = timm.create_model("posgeom_vit_micro_patch8_64_nope", num_classes=3).eval()
    with pytest.raises(PEScaleError, match="no positional encoding"):
        with pe_scale(nope, 0.5):
            pass
    assert nope.alpha == 1.0
    with pytest.raises(ValueError, match="would scale nothing"):
        timm.create_model("posgeom_vit_micro_patch8_64_nope", alpha=0.5)
    with pytest.raises(ValueError, match="would scale nothing"):
        nope.set_alpha(0.0)
