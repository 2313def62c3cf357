"""One alpha per positional encoding: pe_inventory's components, pe_scale(model, {component: alpha}) on models with
two encodings (Naver's RoPE + APE ViT, qwen3_vit, gemma4_vit), gemma4_vit scaled at all, and the sweep and the
command line that take them.

Random-init models hide a PE (gemma4's table is drawn with std 0.02, eva's layer scale is 1e-5): each test makes
the encoding it checks visible on purpose, so that it could fail.
"""

from __future__ import annotations

import copy

import pytest
import timm
import torch
import torch.nn as nn

from timm_posgeom import PEScaleError, pe_inventory, pe_scale
from timm_posgeom.protocol import check_alpha_spec, parse_alpha_spec

pytestmark = pytest.mark.usefixtures("one_thread")


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict(keep_vars=True).items()}


def _assert_restored(before: dict[str, torch.Tensor], model: nn.Module) -> None:
    after = model.state_dict(keep_vars=True)
    assert after.keys() == before.keys() and all(torch.equal(after[k].detach(), v) for k, v in before.items())


def _rope_ape() -> nn.Module:
    """Naver's RoPE + APE ViT, tiny, float64, layer scale 1 and a loud table: both encodings visible."""
    model = timm.create_model(
        "vit_small_patch16_rope_ape_224", img_size=32, patch_size=8, depth=2, num_classes=3, init_values=1.0
    )
    with torch.no_grad():
        model.pos_embed.normal_(0, 1.0)
    return model.double().eval()


def _gemma4() -> nn.Module:
    model = timm.create_model("gemma4_vit_167m", depth=1, img_size=32, embed_dim=64, num_heads=2, head_dim=32)
    with torch.no_grad():
        model.encoder.patch_embed.position_embedding_table.normal_(0, 1.0)
    return model.double().eval()


def test_inventory_names_each_encoding_of_a_model_with_two():
    components = {
        "rope_ape": [e.component for e in pe_inventory(_rope_ape())],
        "gemma4": [(e.name, e.component, e.scalable) for e in pe_inventory(_gemma4())],
        "qwen3": [e.component for e in pe_inventory(timm.create_model("qwen3_vit_88m", depth=1, img_size=32))],
        "beit": {e.component for e in pe_inventory(timm.create_model("beit_base_patch16_224", depth=1, img_size=32))},
        "ours": [e.component for e in pe_inventory(timm.create_model("posgeom_vit_micro_patch8_64_sincos"))],
    }
    assert components["rope_ape"] == ["ape", "rope"] and components["qwen3"] == ["ape", "rope"]
    assert components["gemma4"] == [
        ("encoder.patch_embed.position_embedding_table", "ape", True),
        ("encoder.rotary_emb", "rope", True),
    ]
    assert components["beit"] == {"relative"} and components["ours"] == ["sincos"]


def test_one_alpha_per_component_scales_that_encoding_alone():
    model = _rope_ape()
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    before = _state(model)
    no_table = copy.deepcopy(model)
    features = model.forward_features  # the tokens: the random head's logits are too small to compare
    with torch.no_grad():
        no_table.pos_embed.zero_()
        plain = features(x)
        with pe_scale(model, {"ape": 0.0}):
            torch.testing.assert_close(features(x), no_table.forward_features(x), rtol=0, atol=1e-12)
        with pe_scale(model, {"rope": 0.0}):
            without_rope = features(x)
        with pe_scale(model, {"ape": 0.5, "rope": 0.5}):
            both = features(x)
        with pe_scale(model, 0.5):
            torch.testing.assert_close(both, features(x), rtol=0, atol=0)  # a mapping of every component = one alpha
        with pe_scale(model, {"ape": 0.5}), pe_scale(model, {"rope": 0.5}):
            torch.testing.assert_close(both, features(x), rtol=0, atol=1e-12)
    assert (without_rope - plain).abs().max() > 1e-3 and (both - plain).abs().max() > 1e-3
    _assert_restored(before, model)


def test_gemma4_vit_is_scaled_each_encoding_exactly():
    model = _gemma4()
    x = torch.rand(2, 3, 32, 32, dtype=torch.float64)
    before = _state(model)
    no_table, no_rope = copy.deepcopy(model), copy.deepcopy(model)
    with torch.no_grad():
        no_table.encoder.patch_embed.position_embedding_table.zero_()
        no_rope.encoder.rotary_emb.inv_freq.zero_()  # angle 0 everywhere: no rotation
        plain = model(x)
        with pe_scale(model, {"ape": 0.0}):
            torch.testing.assert_close(model(x), no_table(x), rtol=0, atol=1e-12)
        with pe_scale(model, {"rope": 0.0}):
            torch.testing.assert_close(model(x), no_rope(x), rtol=0, atol=1e-12)
        with pe_scale(model, 1.0):
            torch.testing.assert_close(model(x), plain, rtol=0, atol=0)
    assert (no_table(x) - plain).abs().max() > 1e-3 and (no_rope(x) - plain).abs().max() > 1e-6
    _assert_restored(before, model)


def test_a_component_the_model_lacks_or_an_unknown_name_is_refused():
    ours = timm.create_model("posgeom_vit_micro_patch8_64_rope", num_classes=3)
    with pe_scale(ours, {"rope": 0.5}):
        assert ours.alpha == 0.5
    assert ours.alpha == 1.0
    with pytest.raises(PEScaleError, match=r"no 'ape' positional encoding: its components are rope"):
        with pe_scale(ours, {"ape": 0.5}):
            pass
    with pytest.raises(PEScaleError, match=r"no 'rope' positional encoding: its components are ape"):
        with pe_scale(timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=1), {"rope": 0}):
            pass
    for bad in ({}, {"table": 1.0}, {"ape": -1.0}, {"ape": float("nan")}):
        with pytest.raises(ValueError):
            check_alpha_spec(bad)


def test_the_command_line_alpha_reads_a_number_or_pairs():
    assert parse_alpha_spec("0.5") == 0.5
    assert parse_alpha_spec("ape=0, rope=1") == {"ape": 0.0, "rope": 1.0}
    for bad in ("ape", "ape=0,ape=1", "=1", "ape=x", "rotary=1", "ape=0,"):
        if bad == "ape=0,":
            assert parse_alpha_spec(bad) == {"ape": 0.0}  # a trailing comma is nothing more
            continue
        with pytest.raises(ValueError):
            parse_alpha_spec(bad)


def test_the_sweep_scales_the_named_components_alone():
    from timm_posgeom import SyntheticShapes, alpha_sweep, probe_ssdc
    from timm_posgeom.data.eval_data import eval_loader

    model = _rope_ape().float()
    data = SyntheticShapes(16, img_size=32, seed=0)
    model.reset_classifier(10)  # the synthetic set has 10 classes
    kw = dict(max_images=8, batch_size=8, num_workers=0, rpi_permutations=2, seed=3, progress=False)
    sweep = alpha_sweep(model, data, [0.0], components=["ape"], labels="as-is", **kw)
    assert sweep.settings["components"] == ["ape"]
    loader = eval_loader(model, data, max_images=8, batch_size=8, num_workers=0)
    direct = probe_ssdc(model, loader, rpi=True, alpha={"ape": 0.0}, **{k: kw[k] for k in kw if k != "num_workers"})
    everything = probe_ssdc(model, loader, rpi=True, alpha=0.0, **{k: kw[k] for k in kw if k != "num_workers"})
    assert sweep.rows[0].ssdc_per_layer == pytest.approx(direct.per_layer, abs=1e-6)
    # removing the RoPE too changes SSDC (by 2e-4 here, at random init), far beyond rounding (1e-7)
    assert max(abs(a - b) for a, b in zip(direct.per_layer, everything.per_layer)) > 1e-5
    with pytest.raises(PEScaleError, match="no 'sincos'"):
        alpha_sweep(model, data, [0.5], components=["sincos"], labels="as-is", **kw)


def test_the_zoo_option_is_checked_and_recorded_only_when_given():
    from timm_posgeom.app.zoo import ZooConfig
    from timm_posgeom.app.zoo.config import config_from_settings

    assert "alpha_components" not in ZooConfig(data="synthetic").settings()  # older zoos' settings stay the same
    config = ZooConfig(data="synthetic", alphas=(1.0, 0.5), alpha_components=("rope",))
    assert config.settings()["alpha_components"] == ["rope"]
    assert config_from_settings(config.settings()).alpha_components == ("rope",)
    with pytest.raises(ValueError, match="give alphas too"):
        ZooConfig(data="synthetic", alpha_components=("rope",))
    with pytest.raises(ValueError, match="unknown PE component"):
        ZooConfig(data="synthetic", alphas=(0.5,), alpha_components=("rotary",))
