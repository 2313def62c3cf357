"""Resolution extrapolation (issue 50): each mode exactly against what it claims to be (a model built at the new
size, timm's own resampling, timm's own set_input_size), the model restored exactly, the measure's rows and
intervals, resuming, the command line."""

from __future__ import annotations

import json
import math

import pytest
import timm
import torch
from timm.layers import resample_abs_pos_embed

import timm_posgeom
from timm_posgeom.resolution import (
    MODES,
    ExtrapolationError,
    ExtrapolationResult,
    SettingsChangedError,
    at_input_size,
    check_modes,
    check_sizes,
    extrapolate,
    model_modes,
)

MICRO = dict(embed_dim=32, depth=2, num_heads=2, num_classes=10)
VARIANTS = ("nope", "ape", "sincos", "rope", "ape_rpt")


def micro(variant: str, **kwargs) -> torch.nn.Module:
    """A micro model (64 px, 8 x 8 patches) whose PE is visible: random init draws the APE table with std 0.02,
    which the patch embeddings swamp (here: std 1, as the paper initialises it), and its queries and keys so small
    that attention is near uniform whatever RoPE rotates (here: 8 times larger)."""
    model = timm.create_model(f"posgeom_vit_micro_patch8_64_{variant}", **{**MICRO, **kwargs}).eval()
    with torch.no_grad():
        if model.pos_embed is not None:
            model.pos_embed.normal_(0.0, 1.0)
        for block in model.blocks:
            block.attn.qkv.weight[: 2 * model.embed_dim] *= 8.0
    return model


def built_at(model: torch.nn.Module, variant: str, size: int) -> torch.nn.Module:
    """The same weights in a model built for ``size`` (a learned table resampled there by timm's checkpoint filter)."""
    other = timm.create_model(f"posgeom_vit_micro_patch8_64_{variant}", img_size=size, **MICRO).eval()
    state = model.state_dict()
    if "pos_embed" in state:  # loaded separately below: the new model's table has the new grid's rows
        state = {k: v for k, v in state.items() if k != "pos_embed"}
    other.load_state_dict(state, strict=False)
    return other


def images(size: int, n: int = 2) -> torch.Tensor:
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(size))


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_mode_at_the_training_size_is_the_plain_model_bit_for_bit(variant):
    model = micro(variant)
    x = images(64)
    plain = model(x)
    for mode in set(model_modes(model)) | ({"timm"} if variant != "nope" else set()):
        with at_input_size(model, 64, mode):
            assert torch.equal(model(x), plain), mode


@pytest.mark.parametrize("mode", ["sincos-rebuild", "timm"])
def test_sincos_rebuilt_at_a_grid_is_the_model_built_at_that_grid(mode):
    model = micro("sincos")
    x = images(128)
    with at_input_size(model, 128, mode):
        carried = model(x)
        tokens = model.forward_features(x)
    assert torch.equal(carried, built_at(model, "sincos", 128)(x))
    with at_input_size(model, 128, "sincos-interp"):
        assert not torch.allclose(model.forward_features(x), tokens, atol=1e-3)  # the interpolated table is another


@pytest.mark.parametrize("size", [32, 128, 256])
def test_rope_native_at_a_grid_is_the_model_created_with_that_image_size(size):
    model = micro("rope")
    x = images(size)
    for mode in ("rope-native", "timm"):
        with at_input_size(model, size, mode):
            assert torch.equal(model(x), built_at(model, "rope", size)(x)), mode
    with at_input_size(model, size, "rope-interp"):
        tokens = model.forward_features(x)
    assert not torch.allclose(tokens, built_at(model, "rope", size).forward_features(x), atol=1e-3)


def test_rope_interpolated_at_2x_gives_token_2i_2j_the_rotation_of_i_j():
    model = micro("rope")
    trained = model.rope.get_embed().view(8, 8, -1)  # (N, 2 * head_dim / 2 ...): sin and cos per token
    with at_input_size(model, 128, "rope-interp"):
        interp = model.rope.get_embed().view(16, 16, -1).clone()
    with at_input_size(model, 128, "rope-native"):
        native = model.rope.get_embed().view(16, 16, -1).clone()
    assert torch.equal(interp[::2, ::2], trained)  # coordinate 2i / 16 * 8 = i exactly
    assert torch.equal(native[:8, :8], trained)  # positions extend: the first 8 x 8 tokens as trained
    assert not torch.allclose(native[8:, 8:], interp[8:, 8:])
    with at_input_size(model, 32, "rope-interp"):  # 0.5x: token i of 4 rotates by 2i
        assert torch.equal(model.rope.get_embed().view(4, 4, -1), trained[::2, ::2])


@pytest.mark.parametrize("size", [32, 128, 192])
@pytest.mark.parametrize("mode", ["ape-bilinear", "ape-bicubic", "ape-bilinear-aa", "ape-bicubic-aa"])
def test_an_interpolated_ape_is_timms_resample_abs_pos_embed(mode, size):
    model = micro("ape")
    table = model.pos_embed.detach().clone()
    interpolation, antialias = mode.split("-")[1], mode.endswith("-aa")
    grid = size // 8
    expected = resample_abs_pos_embed(table, [grid, grid], [8, 8], 1, interpolation, antialias)
    x = images(size)
    with at_input_size(model, size, mode):
        assert torch.equal(model.pos_embed, expected)
        carried = model(x)
    other = built_at(model, "ape", size)
    with torch.no_grad():
        other.pos_embed.copy_(expected)
    assert torch.equal(carried, other(x))


def test_the_ape_modes_differ_where_they_should():
    """A visible table: every pair of modes gives other outputs at 0.5x (antialias acts when shrinking); at 2x
    bilinear and bicubic differ."""
    model = micro("ape")
    outputs = {}
    for mode in model_modes(model):
        with at_input_size(model, 32, mode):
            outputs[mode] = model.forward_features(images(32))
    modes = list(outputs)
    for i, a in enumerate(modes):
        for b in modes[i + 1 :]:
            assert not torch.allclose(outputs[a], outputs[b], atol=1e-3), (a, b)
    with at_input_size(model, 128, "ape-bilinear"):
        bilinear = model.forward_features(images(128))
    with at_input_size(model, 128, "ape-bicubic"):
        assert not torch.allclose(model.forward_features(images(128)), bilinear, atol=1e-3)


@pytest.mark.parametrize("size", [32, 128])
def test_a_model_without_pe_is_the_same_function_at_every_size(size):
    """The same weights built at ``size``: the same outputs; and at that size it is exactly permutation-equivariant
    (patches of the image shuffled: the class token's output unchanged, the patch tokens shuffled with them), so
    its SSDC can change with the size only through the images."""
    model = micro("nope")
    x = images(size)
    with at_input_size(model, size, "none"):
        carried = model(x)
        tokens = model.forward_features(x)
        g = size // 8
        perm = torch.randperm(g * g, generator=torch.Generator().manual_seed(1))
        patches = x.unfold(2, 8, 8).unfold(3, 8, 8).reshape(2, 3, g * g, 8, 8)[:, :, perm]
        shuffled = patches.reshape(2, 3, g, g, 8, 8).permute(0, 1, 2, 4, 3, 5).reshape(2, 3, size, size)
        moved = model.forward_features(shuffled)
    assert torch.equal(carried, built_at(model, "nope", size)(x))
    torch.testing.assert_close(moved[:, 0], tokens[:, 0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(moved[:, 1:], tokens[:, 1:][:, perm], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_model_is_restored_exactly_and_its_weights_never_written(variant):
    model = micro(variant)
    before = {k: (v, v.clone(), v.data_ptr()) for k, v in model.state_dict(keep_vars=True).items()}
    seen = []
    handle = model.blocks[0].register_forward_hook(lambda *a: seen.append(1))
    x = images(64)
    plain = model(x)
    for mode in set(model_modes(model)) | ({"timm"} if variant != "nope" else set()):
        for size in (32, 128):
            with at_input_size(model, size, mode):
                model(images(size))
        with pytest.raises(RuntimeError, match="inside"), at_input_size(model, 128, mode):
            raise RuntimeError("inside")  # restored on an exception too
    after = model.state_dict(keep_vars=True)
    assert list(after) == list(before)
    for k, (tensor, values, pointer) in before.items():
        assert after[k] is tensor and torch.equal(tensor, values) and tensor.data_ptr() == pointer, k
    assert tuple(model.patch_embed.grid_size) == (8, 8) and model.patch_embed.img_size == (64, 64)
    assert torch.equal(model(x), plain)
    handle.remove()  # a hook registered before is still reached by its handle
    seen.clear()
    model(x)
    assert not seen


def test_timm_vits_take_their_modes_and_timms_own_behaviour_is_one_of_them():
    """timm's RoPE ViT (index grid, no reference shape): timm's set_input_size extends positions (rope-native);
    EVA02 (a reference shape, and an APE): timm interpolates (rope-interp, its APE bicubic with antialias)."""
    rope_vit = timm.create_model("vit_small_patch16_rope_224", img_size=32, embed_dim=32, depth=1, num_heads=2).eval()
    eva02 = timm.create_model("eva02_tiny_patch14_224", img_size=28, embed_dim=32, depth=1, num_heads=2).eval()
    assert model_modes(rope_vit) == ("timm", "rope-native", "rope-interp")
    assert model_modes(eva02) == ("timm", *(m for m in MODES if m.startswith(("ape", "rope"))))
    for model, size, same in ((rope_vit, 64, "rope-native"), (eva02, 56, "rope-interp")):
        with at_input_size(model, size, "timm"):
            timms = model(images(size))
        with at_input_size(model, size, same):
            assert torch.equal(model(images(size)), timms)
    vit = timm.create_model("vit_tiny_patch16_224", img_size=32, depth=1, dynamic_img_size=True).eval()
    with at_input_size(vit, 64, "timm"):  # a dynamic model resamples its table itself: bicubic, antialias
        timms = vit(images(64))
    with at_input_size(vit, 64, "ape-bicubic-aa"):
        assert torch.equal(vit(images(64)), timms)


def test_what_cannot_be_extrapolated_is_refused_in_one_line():
    model = micro("ape")
    cases = [
        (lambda: check_modes(model, ["rope-native"]), "has none"),
        (lambda: check_modes(model, "ape-nearest"), "unknown mode"),
        (lambda: check_modes(model, ["ape-bicubic", "ape-bicubic"]), "distinct"),
        (lambda: check_modes(micro("nope"), ["timm", "ape-bicubic"]), "has none"),
        (lambda: check_modes(model, ["none"]), "without positional encoding"),
        (lambda: check_sizes(model, [60]), "multiples of the patch size"),
        (lambda: check_sizes(model, "32,x"), "input sizes in pixels"),
        (lambda: model_modes(timm.create_model("resnet10t")), "no patch embedding"),
        (
            lambda: check_modes(
                timm.create_model("vit_small_patch16_dinov3", embed_dim=32, depth=1, num_heads=2), "rope-interp"
            ),
            "normalised",
        ),
    ]
    for call, words in cases:
        with pytest.raises(ExtrapolationError, match=words) as e:
            call()
        assert "\n" not in str(e.value)

    class Fixed(torch.nn.Module):  # a patch grid it cannot change
        patch_embed = torch.nn.Module()

    Fixed.patch_embed.patch_size = (8, 8)
    with pytest.raises(ExtrapolationError, match="cannot change its input size"):
        model_modes(Fixed())
    assert check_sizes(model, None) == [32, 64, 128, 192, 256]
    assert model_modes(timm.create_model("vit_small_patch16_dinov3", embed_dim=32, depth=1, num_heads=2)) == ("timm",)


@pytest.fixture(scope="module")
def synthetic():
    return timm_posgeom.SyntheticShapes(12, img_size=64, split="validation")


@pytest.fixture(scope="module")
def measured(synthetic):
    model = micro("rope")
    rows = []
    result = extrapolate(
        model,
        synthetic,
        [32, 64, 128],
        None,
        probe_images=6,
        max_images=12,
        rpi_permutations=2,
        batch_size=6,
        num_workers=0,
        progress=False,
        on_row=lambda partial: rows.append(len(partial.rows)),
    )
    return model, result, rows


@pytest.mark.slow
def test_extrapolate_measures_every_size_and_mode_with_intervals(measured, synthetic, tmp_path):
    model, result, rows = measured
    assert rows == [1, 2, 3, 4, 5, 6] and [r.key for r in result.rows] == [
        (s, m) for s in (32, 64, 128) for m in ("rope-native", "rope-interp")
    ]
    for r in result.rows:
        assert r.grid == [r.size // 8] * 2 and r.scale == r.size / 64 and r.top1_images == 12 and r.probe_images == 6
        assert r.top1_ci[0] <= r.top1 <= r.top1_ci[1] and len(r.ssdc) == len(r.rpi_ssdc) == len(r.entropy) == 2
        assert r.delta_ssdc == pytest.approx(r.rpi_ssdc[1] - r.rpi_ssdc[0])
        assert r.delta_ssdc_ci[0] <= r.delta_ssdc <= r.delta_ssdc_ci[1]  # over 2 permutations
        assert 0 < r.entropy[-1] <= r.uniform_entropy == pytest.approx(math.log(r.grid[0] ** 2 + 1))
    a, b = result.row(64, "rope-native"), result.row(64, "rope-interp")
    assert {**a.to_dict(), "mode": "", "seconds": 0} == {**b.to_dict(), "mode": "", "seconds": 0}  # one function
    assert result.row(128, "rope-native").rpi_ssdc != result.row(128, "rope-interp").rpi_ssdc
    # the top-1 and probe of a row are those of the model carried there, measured by the library's own functions
    with at_input_size(model, 128, "rope-interp"):
        fragility = timm_posgeom.fragility(
            model, synthetic, (), max_images=12, img_size=128, batch_size=6, progress=False
        )
    assert result.row(128, "rope-interp").top1 == fragility.clean_accuracy
    # written and read back the same; CSV and table; the figure
    back = ExtrapolationResult.read(tmp_path / "r.json") if result.to_json(tmp_path / "r.json") else None
    assert json.dumps(back.to_dict(), sort_keys=True) == json.dumps(result.to_dict(), sort_keys=True)
    assert result.to_csv().splitlines()[0].startswith("size,mode,scale,grid,top1,top1_low,top1_high,delta_ssdc")
    assert len(result.to_csv().splitlines()) == 7 and "| rope-interp | 128 | 2 |" in result.table()
    result.plot(tmp_path / "f.png")
    assert 10_000 < (tmp_path / "f.png").stat().st_size < 300_000


@pytest.mark.slow
def test_a_resume_measures_only_what_is_missing_and_never_mixes_settings(measured, synthetic):
    model, result, _ = measured
    kwargs = dict(probe_images=6, max_images=12, rpi_permutations=2, batch_size=6, num_workers=0, progress=False)
    calls = []
    again = extrapolate(model, synthetic, [32, 64, 128], None, resume=result, on_row=calls.append, **kwargs)
    assert not calls and again.to_dict() == result.to_dict()
    with pytest.raises(SettingsChangedError, match="rpi_permutations: 2 -> 3"):
        extrapolate(model, synthetic, [32], None, resume=result, **{**kwargs, "rpi_permutations": 3})


@pytest.mark.slow
def test_images_read_again_when_too_many_to_keep_give_the_same_rows(measured, synthetic, monkeypatch):
    """Too many images to decode once (DECODE_IMAGES), probe batches too large to keep (KEEP_BYTES): each is read
    again from the split, and the numbers are the same."""
    from timm_posgeom.resolution import measure

    model, result, _ = measured
    monkeypatch.setattr(measure, "KEEP_BYTES", 0)
    monkeypatch.setattr(measure, "DECODE_IMAGES", 0)
    kwargs = dict(probe_images=6, max_images=12, rpi_permutations=2, batch_size=6, num_workers=0, progress=False)
    again = extrapolate(model, synthetic, [128], ["rope-interp"], **kwargs)
    assert {**again.rows[0].to_dict(), "seconds": 0} == {**result.row(128, "rope-interp").to_dict(), "seconds": 0}


@pytest.mark.slow
def test_the_command_writes_row_by_row_resumes_and_never_mixes_settings(tmp_path, capsys):
    from timm_posgeom.cli.main import main

    out = tmp_path / "ex"
    args = ["extrapolate", "posgeom_vit_micro_patch8_64_rope", "--num-classes", "10", "--data", "synthetic"]
    args += ["--max-images", "8", "--probe-images", "4", "--rpi-permutations", "2", "--batch-size", "4"]
    args += ["--num-workers", "0", "--no-progress", "--out", str(out)]
    assert main([*args, "--sizes", "32,64"]) == 0
    assert sorted(p.name for p in out.iterdir()) == [
        "extrapolate.csv",
        "extrapolate.json",
        "extrapolate.md",
        "extrapolate.png",
    ]
    first = ExtrapolationResult.read(out / "extrapolate.json")
    assert [r.key for r in first.rows] == [(s, m) for s in (32, 64) for m in ("rope-native", "rope-interp")]
    assert first.settings["model_name"] == "posgeom_vit_micro_patch8_64_rope" and first.settings["data"] == "synthetic"
    capsys.readouterr()
    assert main([*args, "--sizes", "32,64,128", "--modes", "rope-interp"]) == 0  # only the missing row is measured
    assert "1 row(s) measured now, 4 kept from before" in capsys.readouterr().err
    again = ExtrapolationResult.read(out / "extrapolate.json")
    assert [r.to_dict() for r in again.rows[:4]] == [r.to_dict() for r in first.rows]
    assert [r.key for r in again.rows[4:]] == [(128, "rope-interp")]
    for changed, words in ((["--max-images", "6"], "max_images: 8 -> 6"), (["--seed", "1"], "seed: 0 -> 1")):
        with pytest.raises(SystemExit) as e:
            main([*args, *changed, "--sizes", "32"])
        err = capsys.readouterr().err.strip().splitlines()
        assert e.value.code == 2 and len(err) == 1 and words in err[0] and "--allow-changes" in err[0]
    assert main([*args, "--seed", "1", "--sizes", "32", "--allow-changes"]) == 0
    assert "kept the former extrapolate.json as extrapolate.json.replaced-1" in capsys.readouterr().err
    assert (out / "extrapolate.json.replaced-1").is_file()
    assert [r.key for r in ExtrapolationResult.read(out / "extrapolate.json").rows] == [
        (32, "rope-native"),
        (32, "rope-interp"),
    ]
    for bad, words in ((["--sizes", "36"], "not positive multiples"), (["--modes", "ape-bicubic"], "has none")):
        with pytest.raises(SystemExit) as e:
            main([*args, *bad])
        err = capsys.readouterr().err.strip().splitlines()
        assert e.value.code == 2 and len(err) == 1 and words in err[0]
