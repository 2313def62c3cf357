"""Shifts applied at a fixed size before the resize to the model's input (``fragility(shift_size=...)``), against
a reference composition on real images (PIL's JPEG at 224 px, then the model's resize)."""

from __future__ import annotations

import io

import numpy as np
import pytest
import timm
import torch
from PIL import Image
from torchvision.transforms import InterpolationMode
from torchvision.transforms import functional as TF

import timm_posgeom  # noqa: F401
from timm_posgeom.data.shifts import parse_shift
from timm_posgeom.data.transforms import resize_transform, resolve_config
from timm_posgeom.robustness import fragility
from timm_posgeom.robustness.shift_size import ShiftedAtSize, pre_resize


@pytest.fixture(scope="module")
def real_images():
    from conftest import IMAGENETTE

    from timm_posgeom.data import load_split

    if not IMAGENETTE.exists():
        pytest.skip("../shared/data/imagenette is not present")
    split = load_split(str(IMAGENETTE), "validation", subset=6)
    return [split[i] for i in range(len(split))]


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return timm.create_model("posgeom_vit_micro_patch8_64_ape", num_classes=10).eval()


def _reference_jpeg(image: Image.Image, quality: int, size: int = 64) -> torch.Tensor:
    """PIL's JPEG at the image's 224 px, then the model's resize (straight to 64, bicubic), written out by hand."""
    buffer = io.BytesIO()
    image.convert("RGB").save(buffer, format="JPEG", quality=quality)
    shifted = Image.open(buffer).convert("RGB")
    return TF.pil_to_tensor(TF.resize(shifted, [size, size], interpolation=InterpolationMode.BICUBIC))


@pytest.mark.slow
def test_shift_then_resize_is_the_reference_and_not_resize_then_shift(real_images, model):
    cfg = resolve_config(model)
    assert cfg["input_size"] == (3, 64, 64) and cfg["interpolation"] == "bicubic"
    shifts = [parse_shift("jpeg:5"), parse_shift("blur:2.5:5")]
    at_224 = ShiftedAtSize(real_images, len(real_images), pre_resize(cfg, 224), resize_transform(cfg), shifts)
    for i, (image, label) in enumerate(real_images):
        assert image.size == (224, 224)  # the copy is 224 px: the pre-resize leaves it as stored
        copies, got_label, index = at_224[i]
        assert copies.shape == (3, 3, 64, 64) and copies.dtype == torch.uint8 and (got_label, index) == (label, i)
        model_input = TF.pil_to_tensor(resize_transform(cfg)(image))
        assert torch.equal(copies[0], model_input)  # the clean copy: the model's own input
        assert torch.equal(copies[1], _reference_jpeg(image, 5))
        # the shift at 64 px (today's default) is another image
        at_64 = TF.pil_to_tensor(parse_shift("jpeg:5")(resize_transform(cfg)(image)))
        assert (copies[1].float() - at_64.float()).abs().mean() > 1.0
        blurred = TF.pil_to_tensor(resize_transform(cfg)(parse_shift("blur:2.5:5")(image)))
        assert torch.equal(copies[2], blurred)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:clean accuracy is 0")  # an untrained model: the correctness arrays are compared
def test_fragility_with_shift_size(real_images, model):
    base = dict(batch_size=3, num_workers=0, seed=0, progress=False)
    at_224 = fragility(model, real_images, ("jpeg:5", "blur:2.5:5"), shift_size=224, **base)
    at_input = fragility(model, real_images, ("jpeg:5", "blur:2.5:5"), **base)
    assert at_224.settings["shift_size"] == 224 and "shift_size" not in at_input.settings
    assert at_224.clean_accuracy == at_input.clean_accuracy  # 224-px images: the same clean inputs
    # each copy classified as the model classifies the reference composition
    for spec, quality in (("jpeg:5", 5),):
        x = torch.stack([_reference_jpeg(image, quality) for image, _ in real_images]).float().div(255)
        cfg = resolve_config(model)
        x = (x - torch.tensor(cfg["mean"]).view(1, 3, 1, 1)) / torch.tensor(cfg["std"]).view(1, 3, 1, 1)
        with torch.no_grad():
            predicted = model(x).argmax(-1).numpy()
        labels = np.array([label for _, label in real_images])
        assert at_224.correct[spec].tolist() == (predicted == labels).tolist()
    with pytest.raises(ValueError, match="shift_size"):
        fragility(model, real_images, ("blur:2.5:5",), shift_size=224, blur_on_device=True, **base)
    with pytest.raises(ValueError, match="shift_size must be"):
        fragility(model, real_images, ("jpeg:5",), shift_size=0, **base)


@pytest.mark.slow
def test_the_cli_takes_shift_size(tmp_path, imagenette_path, capsys):
    from timm_posgeom.cli import main

    code = main(
        [
            "fragility",
            "posgeom_vit_micro_patch8_64_ape",
            "--data",
            str(imagenette_path),
            "--max-images",
            "4",
            "--batch-size",
            "4",
            "--num-workers",
            "0",
            "--shift",
            "jpeg:5",
            "--shift-size",
            "224",
            "--labels",
            "as-is",
            "--out",
            str(tmp_path),
        ]
    )
    assert code == 0 and "shift at 224 px" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        main(
            [
                "fragility",
                "posgeom_vit_micro_patch8_64_ape",
                "--data",
                str(imagenette_path),
                "--shift-size",
                "224",
                "--blur-on-device",
                "--out",
                str(tmp_path),
            ]
        )
    assert e.value.code == 2


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:clean accuracy is 0")
def test_the_study_measures_it_beside_the_model_input_numbers_and_reports_both(tmp_path):
    from studies import one_run_study

    from timm_posgeom.app.records import StudyResults
    from timm_posgeom.app.report.shift_size import fragility_at_size_lines
    from timm_posgeom.app.study import preset_config
    from timm_posgeom.app.study.config import PART_SETTINGS
    from timm_posgeom.app.study.fragility_at_size import fragility_at_size
    from timm_posgeom.app.study.measure import eval_settings
    from timm_posgeom.data import load_split

    assert preset_config("imagenette-cpu").shift_size == 224 and preset_config("imagenette-cpu-14").shift_size == 224
    assert preset_config("demo").shift_size is None and preset_config("in100").shift_size is None
    # the Imagenette presets read the folder the fastai archive unpacks to (docs/guide.md), not a developers' path
    assert {preset_config(p).data for p in ("imagenette-cpu", "imagenette-cpu-14")} == {"imagenette2-320"}
    config = preset_config("demo", shift_size=96, max_images=8, batch_size=4)
    val = load_split("synthetic", "validation", synthetic_size=8)
    assert eval_settings(config, val)["shift_size"] == 96 and PART_SETTINGS["shift_size"] == "fragility_at_size"
    torch.manual_seed(0)
    tiny = timm.create_model("posgeom_vit_micro_patch8_64_ape", num_classes=10, embed_dim=32, num_heads=2).eval()
    record = fragility_at_size(tiny, val, config)
    direct = fragility(
        tiny, val, list(config.shifts), shift_size=96, batch_size=4, num_workers=0, seed=0, progress=False
    )
    assert record.shift_size == 96 and record.num_images == 8 and record.fs.keys() == set(config.shifts)
    assert record.clean_accuracy == direct.clean_accuracy and record.accuracy == direct.accuracy
    results = one_run_study()
    results.runs[0].eval.fragility_at_size = record
    results.recipes = {"ape": {"img_size": 64}}
    again = StudyResults.from_dict(results.to_dict())
    assert again.runs[0].eval.fragility_at_size.to_dict() == record.to_dict()  # schema 6: read back
    lines = "\n".join(fragility_at_size_lines(again))
    assert "applied at 96 px, before the resize to the model's input (64 px)" in lines
    assert "jpeg:5 FS at 64 px | jpeg:5 FS at 96 px" in lines and "| APE |" in lines
    assert fragility_at_size_lines(one_run_study()) == []
