"""pe_shuffle, pe_shift and the image-grid shuffle, exactly (float64): what each moves, what it equals, what it
leaves as it was.

Random-init models hide a PE (our APE table is drawn with std 0.02, eva's layer scale is 1e-5): every test that
needs an effect makes it loud on purpose, so that a wrong move would show.
"""

from __future__ import annotations

import pytest
import timm
import torch
import torch.nn as nn
from timm.layers import build_rotary_pos_embed

from timm_posgeom import token_permutation
from timm_posgeom.interventions import (
    PEMoveError,
    check_tile_grid,
    pe_moves,
    pe_shift,
    pe_shuffle,
    read_table,
    shuffle_tiles,
    tile_token_permutation,
)

pytestmark = pytest.mark.usefixtures("one_thread")


def _ours(pe: str, **kw) -> nn.Module:
    model = timm.create_model(f"posgeom_vit_micro_patch8_64_{pe}", num_classes=3, depth=2, **kw)
    if pe == "ape":
        with torch.no_grad():
            model.pos_embed.normal_(0, 1.0)  # as loud as the content, not std 0.02
    return model.double().eval()


def _block_outputs(model: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    outs: list[torch.Tensor] = []
    hooks = [b.register_forward_hook(lambda m, a, o: outs.append(o)) for b in model.blocks]
    try:
        with torch.no_grad():
            model(x)
    finally:
        for h in hooks:
            h.remove()
    return outs


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict(keep_vars=True).items()}


def _same_state(model: nn.Module, before: dict[str, torch.Tensor]) -> bool:
    after = model.state_dict(keep_vars=True)
    return after.keys() == before.keys() and all(torch.equal(after[k].detach(), v) for k, v in before.items())


X = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1), dtype=torch.float64)


def _rpi_and_shuffle(model: nn.Module, components=None) -> tuple[list, list, torch.Tensor]:
    """Block outputs under RPI (seed 3) put back in place, and under pe_shuffle by the inverse permutation."""
    with token_permutation(model, seed=3) as handle:
        rpi = _block_outputs(model, X)
    back = torch.argsort(handle.permutation)
    prefix = model.num_prefix_tokens
    rpi = [torch.cat([o[:, :prefix], o[:, prefix:][:, back]], dim=1) for o in rpi]
    with pe_shuffle(model, back, components=components):
        shuffled = _block_outputs(model, X)
    return rpi, shuffled, back


@pytest.mark.parametrize("pe", ["ape", "sincos", "rope"])
def test_pe_shuffle_is_rpi_by_the_inverse_permutation_with_outputs_put_back(pe):
    """An additive APE: exactly RPI with the outputs permuted back. So are sincos and RoPE: a permutation relabels
    positions, which RoPE sees as well as a table (docs/method.md#pe-shuffle-and-pe-shift)."""
    model = _ours(pe)
    before = _state(model)
    plain = _block_outputs(model, X)
    rpi, shuffled, _ = _rpi_and_shuffle(model)
    for a, b in zip(rpi, shuffled):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    assert (shuffled[-1] - plain[-1]).abs().max() > 1e-3  # the encoding did move
    assert _same_state(model, before) and not vars(getattr(model, "rope", None) or model).get("get_embed")


def test_with_two_encodings_one_shuffled_alone_is_not_rpi():
    """Naver's RoPE + APE ViT: both encodings shuffled is RPI; either alone is not (the other still knows where
    each token is)."""
    model = timm.create_model(
        "vit_small_patch16_rope_ape_224", img_size=64, patch_size=8, depth=2, num_classes=3, init_values=1.0
    )
    with torch.no_grad():
        model.pos_embed.normal_(0, 1.0)
    model = model.double().eval()
    assert [(e.component, ok) for e, ok in pe_moves(model)] == [("ape", True), ("rope", True)]
    rpi, both, _ = _rpi_and_shuffle(model)
    torch.testing.assert_close(rpi[-1], both[-1], rtol=0, atol=1e-12)
    for component in ("ape", "rope"):
        _, alone, _ = _rpi_and_shuffle(model, components=component)
        assert (alone[-1] - rpi[-1]).abs().max() > 1e-4, component


def test_a_relative_bias_is_shuffled_through_its_index():
    model = timm.create_model("beit_base_patch16_224", img_size=64, patch_size=8, depth=2, num_classes=3)
    with torch.no_grad():
        for block in model.blocks:
            block.attn.relative_position_bias_table.normal_(0, 3.0)  # zero at init
    model = model.double().eval()
    index = model.blocks[0].attn.relative_position_index.clone()
    rpi, shuffled, back = _rpi_and_shuffle(model)
    torch.testing.assert_close(rpi[-1], shuffled[-1], rtol=0, atol=1e-12)
    assert torch.equal(model.blocks[0].attn.relative_position_index, index)
    with pytest.raises(PEMoveError, match="offset between two tokens"):
        with pe_shift(model, (1.0, 0.0)):
            pass


def test_a_whole_patch_shift_of_a_table_is_the_shifted_table():
    model = _ours("ape")
    table = model.pos_embed.detach().clone()
    grid = table[0, 1:].reshape(8, 8, -1)
    with pe_shift(model, (2.0, -1.0), edge="wrap"):
        rolled = torch.roll(grid, shifts=(-2, 1), dims=(0, 1)).reshape(64, -1)  # token (r, c) reads (r + 2, c - 1)
        assert torch.equal(model.pos_embed[0, 1:], rolled) and torch.equal(model.pos_embed[0, :1], table[0, :1])
    with pe_shift(model, (2.0, -1.0), edge="clamp"):
        rows, cols = (torch.arange(8) + 2).clamp(max=7), (torch.arange(8) - 1).clamp(min=0)
        assert torch.equal(model.pos_embed[0, 1:], grid[rows][:, cols].reshape(64, -1))
    assert torch.equal(model.pos_embed, table)


def test_a_fractional_shift_interpolates_between_rows():
    table = torch.randn(4, 5, 3, dtype=torch.float64)
    positions = torch.tensor([[0.0, 0.0], [1.0, 2.5], [2.25, 3.0], [3.0, 4.5]], dtype=torch.float64)
    out = read_table(table, positions, "clamp")
    assert torch.equal(out[0], table[0, 0])
    torch.testing.assert_close(out[1], (table[1, 2] + table[1, 3]) / 2)
    torch.testing.assert_close(out[2], 0.75 * table[2, 3] + 0.25 * table[3, 3])
    assert torch.equal(out[3], table[3, 4])  # beyond the edge: the edge
    torch.testing.assert_close(read_table(table, positions[3:], "wrap")[0], (table[3, 4] + table[3, 0]) / 2)


@pytest.mark.parametrize("pe", ["ape", "sincos", "rope"])
def test_a_zero_shift_is_the_identity_bit_for_bit(pe):
    model = timm.create_model(f"posgeom_vit_micro_patch8_64_{pe}", num_classes=3, depth=2).eval()
    x = X.float()
    with torch.no_grad():
        plain = model(x)
        with pe_shift(model, (0.0, 0.0)):
            assert torch.equal(model(x), plain)
        with pe_shift(model, (0.5, 1.0)):
            moved = model(x)
    assert not torch.equal(moved, plain)


def test_a_shift_tells_a_relative_encoding_from_an_absolute_one():
    """Without a class token (which RoPE leaves unrotated) RoPE sees only offsets between tokens: a shift of its
    coordinates, fractions included, changes nothing; it moves an APE or a sincos table."""
    for pe, unchanged in (("rope", True), ("ape", False), ("sincos", False)):
        model = _ours(pe, class_token=False, global_pool="avg")
        plain = _block_outputs(model, X)[-1]
        with pe_shift(model, (1.5, -2.25)):
            moved = _block_outputs(model, X)[-1]
        difference = (moved - plain).abs().max()
        assert (difference < 1e-10) if unchanged else (difference > 1e-4), (pe, float(difference))


def test_refusals_and_restores():
    ape = _ours("ape")
    before = _state(ape)
    with pytest.raises(ValueError, match="permutation of the 64 patch tokens"):
        with pe_shuffle(ape, torch.arange(63)):
            pass
    with pytest.raises(PEMoveError, match="no 'rope' positional encoding"):
        with pe_shuffle(ape, torch.arange(64), components="rope"):
            pass
    with pytest.raises(ValueError, match="shift must be two finite numbers"):
        with pe_shift(ape, (float("nan"), 0.0)):
            pass
    with pytest.raises(RuntimeError), pe_shift(ape, (1.0, 1.0)):
        raise RuntimeError("inside")
    assert _same_state(ape, before)
    with pytest.raises(PEMoveError, match="no positional encoding it can move"):
        with pe_shuffle(timm.create_model("posgeom_vit_micro_patch8_64_nope", num_classes=3), torch.arange(64)):
            pass


def test_tiles_move_as_said_and_one_tile_per_patch_is_rpi():
    image = torch.arange(16).reshape(1, 1, 4, 4)
    moved = shuffle_tiles(image, 2, torch.tensor([3, 2, 1, 0]))
    assert moved[0, 0, :2, :2].tolist() == [[10, 11], [14, 15]] and moved[0, 0, 2:, 2:].tolist() == [[0, 1], [4, 5]]
    assert torch.equal(tile_token_permutation((4, 4), 2, torch.tensor([3, 2, 1, 0])), moved.flatten())
    assert tile_token_permutation((4, 4), 3, torch.arange(9)) is None
    with pytest.raises(ValueError, match="does not divide"):
        check_tile_grid((64, 64), 3)
    for pe in ("nope", "ape"):  # the patch embedding sees each patch alone: tiles of one patch are RPI exactly
        model = _ours(pe)
        with token_permutation(model, seed=5) as handle:
            rpi = _block_outputs(model, X)[-1]
        tiled = _block_outputs(model, shuffle_tiles(X, 8, handle.permutation))[-1]
        torch.testing.assert_close(tiled, rpi, rtol=0, atol=1e-12)
        if pe == "nope":  # and without a PE, the plain outputs permuted (exact equivariance)
            plain = _block_outputs(model, X)[-1]
            torch.testing.assert_close(tiled[:, 1:], plain[:, 1:][:, handle.permutation], rtol=0, atol=1e-12)


def test_a_timm_rope_shift_matches_its_own_table_at_zero():
    """timm's axial RoPE (eva, ref_feat_shape and all): its table rebuilt at the moved coordinates is its own at a
    zero shift, and a whole-patch shift of an index grid is its table on a grid one patch further."""
    model = timm.create_model("vit_small_patch16_rope_224", img_size=64, patch_size=8, depth=1, num_classes=3).eval()
    rope = model.rope
    own = rope.get_embed().clone()
    with pe_shift(model, (0.0, 0.0)):
        assert torch.equal(rope.get_embed(), own)
    assert rope.ref_feat_shape is None and rope.grid_type == "index" and rope.grid_indexing == "xy"
    with pe_shift(model, (1.0, 0.0)):
        moved = rope.get_embed().reshape(8, 8, -1)
    sin, cos = build_rotary_pos_embed(
        [9, 8], bands=rope.bands, in_pixels=False, grid_indexing="xy", grid_type="index"
    )  # timm's own table on a grid one row taller: rows 1-8 are rows 0-7 moved down one patch
    torch.testing.assert_close(moved, torch.cat([sin, cos], -1).reshape(9, 8, -1)[1:])
