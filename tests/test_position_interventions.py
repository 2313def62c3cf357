"""The measures of the interventions on positions (PE shuffle, PE shift, image-grid shuffle), their result and the
``posgeom intervene`` command, on a tiny model and a few synthetic images.

Each number is checked against what it must equal: the PE shuffle's SSDC against RPI's, permutation by permutation
(the same permutations); the tile shuffle's at one tile per patch against RPI's too; the shift 0 row against the
model as it is; the means and intervals against the replicates they are made of.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import timm
import torch

from timm_posgeom import SyntheticShapes, fragility
from timm_posgeom.interventions import shuffle_tiles
from timm_posgeom.results.intervals import t_interval
from timm_posgeom.robustness.position_interventions import (
    default_tile_grids,
    measure_pe_shift,
    measure_pe_shuffle,
    measure_tile_shuffle,
)

pytestmark = pytest.mark.usefixtures("one_thread")

KW = dict(max_images=8, probe_images=8, batch_size=8, num_workers=0, rpi_permutations=3, seed=2, progress=False)


@pytest.fixture(scope="module")
def data():
    return SyntheticShapes(8, img_size=64, seed=0, split="validation")


def _model(pe: str = "ape"):
    torch.manual_seed(0)
    model = timm.create_model(f"posgeom_vit_micro_patch8_64_{pe}", num_classes=10, depth=2)
    if pe == "ape":
        with torch.no_grad():
            model.pos_embed.normal_(0, 1.0)  # loud: the random init's std 0.02 hides it
    return model.eval()


def test_pe_shuffle_gives_rpi_numbers_permutation_by_permutation(data):
    result = measure_pe_shuffle(_model("ape"), data, labels="as-is", **KW)
    assert [r.condition for r in result.rows] == ["clean", "rpi", "pe shuffle"]
    rpi, shuffled, clean = result.row("rpi"), result.row("pe shuffle"), result.row("clean")
    # q_k = argsort(p_k): the encoding grid of the shuffle is RPI's index grid, its content grid RPI's content grid
    np.testing.assert_allclose(shuffled.ssdc_encoding, rpi.ssdc_encoding, atol=1e-5)
    np.testing.assert_allclose(shuffled.ssdc_content, rpi.ssdc_content, atol=1e-5)
    assert shuffled.replicates == 3 and shuffled.top1_interval.startswith("permutations")
    mean, low, high = t_interval(np.asarray(shuffled.by_replicate["ssdc_content"]).mean(axis=1))
    assert shuffled.mean_content == pytest.approx(float(mean)) and shuffled.mean_content_ci == pytest.approx(
        (low, high)
    )
    assert shuffled.top1 == pytest.approx(np.mean(shuffled.by_replicate["top1"]))
    assert abs(clean.mean_content - shuffled.mean_content) > 1e-3 and clean.ssdc_encoding is None
    assert result.settings["permutation_seeds"] == [2, 3, 4] and result.settings["probe_images"] == 8


def test_tile_shuffle_at_one_tile_per_patch_is_rpi(data):
    model = _model("ape")
    result = measure_tile_shuffle(model, data, [1, 2, 8], labels="as-is", **KW)
    reference = measure_pe_shuffle(model, data, labels="as-is", **KW).row("rpi")
    assert [r.value for r in result.rows] == [1.0, 2.0, 8.0]
    eight = result.row("grid 8")
    np.testing.assert_allclose(eight.ssdc_encoding, reference.ssdc_encoding, atol=1e-5)
    np.testing.assert_allclose(eight.ssdc_content, reference.ssdc_content, atol=1e-5)
    # its top-1 under permutation k is the model's on the images tiled by permutation k, counted by hand
    images = torch.stack([result_image(data, i) for i in range(8)])
    labels = torch.tensor([data[i][1] for i in range(8)])
    for k, seed in enumerate(result.settings["permutation_seeds"]):
        perm = torch.randperm(64, generator=torch.Generator().manual_seed(seed))
        with torch.no_grad():
            hits = (model(shuffle_tiles(images, 8, perm)).argmax(-1) == labels).float().mean()
        assert eight.by_replicate["top1"][k] == pytest.approx(float(hits))
    one = result.row("grid 1")
    assert one.replicates == 1 and one.top1_interval == "images (Wilson)" and one.ssdc_encoding is None
    assert default_tile_grids((64, 64), (8, 8)) == [1, 2, 4, 8] and default_tile_grids((224, 224), (14, 14)) == [
        1,
        2,
        4,
        8,
        14,
    ]


def result_image(data, index: int) -> torch.Tensor:
    """Image ``index`` as the measures read it: the model's eval transform (64 px, ImageNet mean and std)."""
    from timm_posgeom import eval_transform

    return eval_transform(_model("ape"))(data[index][0])


def test_pe_shift_rows_follow_the_shifts_and_zero_is_the_model_as_it_is(data):
    model = _model("sincos")
    result = measure_pe_shift(model, data, [0, 0.5, 2], direction="x", labels="as-is", **KW)
    clean = fragility(model, data, (), labels="as-is", **{k: v for k, v in KW.items() if k != "probe_images"})
    assert [r.value for r in result.rows] == [0.0, 0.5, 2.0] and result.settings["direction"] == "x"
    assert result.rows[0].top1 == clean.clean_accuracy
    assert all(r.ssdc_interval.startswith("images") and math.isfinite(r.mean_content_ci[0]) for r in result.rows)
    assert result.rows[2].ssdc_content != result.rows[0].ssdc_content
    with pytest.raises(ValueError, match="direction"):
        measure_pe_shift(model, data, [1], direction="z", labels="as-is", **KW)


def test_a_model_without_a_movable_encoding_is_refused_before_reading_data():
    from timm_posgeom.interventions import PEMoveError

    class NoData:
        def __len__(self):
            raise AssertionError("the data was read")

    with pytest.raises(PEMoveError, match="no positional encoding it can move"):
        measure_pe_shift(_model("nope"), NoData(), [1], **KW)


def test_result_json_markdown_and_figure(data, tmp_path):
    result = measure_tile_shuffle(_model("ape"), data, [1, 2], labels="as-is", **KW)
    result.rows[1].ssdc_content[0] = float("nan")  # NaN is written as null, never as a number
    record = json.loads(result.to_json(tmp_path / "r.json"))
    assert record["schema"] == "timm-posgeom/intervention-result" and record["rows"][1]["ssdc_content"][0] is None
    table = result.to_markdown()
    assert "| grid 2 |" in table and "n/a" in table
    result.plot(tmp_path / "r.png")
    assert 1000 < (tmp_path / "r.png").stat().st_size < 300_000


def test_the_command_writes_each_measure(tmp_path, capsys):
    from timm_posgeom.cli.main import main

    out = tmp_path / "iv"
    common = ["posgeom_vit_micro_patch8_64_rope", "--data", "synthetic", "--num-classes", "10", "--max-images", "4"]
    common += ["--batch-size", "4"]
    common += ["--rpi-permutations", "2", "--num-workers", "0", "--no-progress", "--out", str(out)]
    rc = main(["intervene", *common, "--measure", "pe-shift", "--shifts", "0,1", "--measure", "tile-shuffle"])
    assert rc == 0
    assert {p.name for p in out.iterdir()} == {
        f"{m}.{e}" for m in ("pe-shift", "tile-shuffle") for e in ("json", "md", "png")
    }
    assert json.loads((out / "pe-shift.json").read_text())["settings"]["model"] == "posgeom_vit_micro_patch8_64_rope"
    for bad, said in ((["--grids", "3"], "does not divide"), (["--components", "ape"], "no 'ape' positional")):
        with pytest.raises(SystemExit) as info:
            main(["intervene", *common, "--measure", "tile-shuffle" if "--grids" in bad else "pe-shift", *bad])
        assert info.value.code == 2 and said in capsys.readouterr().err


def test_a_tile_shuffle_of_a_pil_image_is_shuffle_tiles():
    import PIL.Image

    from timm_posgeom.robustness import TileShuffle

    pixels = torch.randint(0, 256, (3, 64, 64), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    perm = torch.randperm(16, generator=torch.Generator().manual_seed(1))
    shifted = TileShuffle(4, perm, "tiles:4:0")(PIL.Image.fromarray(pixels.permute(1, 2, 0).numpy()))
    assert torch.equal(torch.from_numpy(np.array(shifted)).permute(2, 0, 1), shuffle_tiles(pixels[None], 4, perm)[0])
    with pytest.raises(ValueError, match="permutation of the 16 tiles"):
        TileShuffle(4, torch.arange(15), "bad")


def test_nan_comes_out_as_nan_with_a_warning(data):
    from timm_posgeom.errors import NonFiniteWarning

    model = _model("ape")
    with torch.no_grad():
        model.pos_embed[0, 6] = float("nan")  # patch (0, 5): token (0, 5) reads it at shift 0, no token at (1, 1)
    with pytest.warns(NonFiniteWarning):
        result = measure_pe_shift(model, data, [0, 1], labels="as-is", **KW)
    zero, one = result.rows
    assert math.isnan(zero.top1) and all(math.isnan(v) for v in zero.ssdc_content + [zero.mean_content])
    assert math.isfinite(one.top1) and all(math.isfinite(v) for v in one.ssdc_content)


def test_the_command_leaves_out_what_does_not_apply_unless_asked(tmp_path, capsys):
    from timm_posgeom.cli.main import main

    common = ["posgeom_vit_micro_patch8_64_nope", "--data", "synthetic", "--num-classes", "10", "--max-images", "4"]
    common += ["--batch-size", "4", "--rpi-permutations", "2", "--num-workers", "0", "--no-progress"]
    assert main(["intervene", *common, "--grids", "1,2", "--out", str(tmp_path / "a")]) == 0
    err = capsys.readouterr().err
    assert "pe-shuffle not measured" in err and "pe-shift not measured" in err
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == [
        "tile-shuffle.json",
        "tile-shuffle.md",
        "tile-shuffle.png",
    ]
    with pytest.raises(SystemExit) as info:
        main(["intervene", *common, "--measure", "pe-shuffle", "--out", str(tmp_path / "b")])
    assert info.value.code == 2 and "no positional encoding it can move" in capsys.readouterr().err
