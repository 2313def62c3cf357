"""MeasureSettings (issue 29, step 4): one settings object for every measuring function; the plain keywords
keep working and override it; bad settings refused in one line, wherever they are given."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import timm
import torch
from PIL import Image

import timm_posgeom
from timm_posgeom import MeasureSettings, MeasureSettingsError
from timm_posgeom.data.transforms import RESIZE_MODES
from timm_posgeom.errors import PosgeomError, one_line
from timm_posgeom.probes import SSDCResult, attention_measures, probe_ssdc, run_measures
from timm_posgeom.robustness import alpha_sweep, fragility
from timm_posgeom.robustness.imagenet_c import imagenet_c_released


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return timm.create_model("posgeom_vit_micro_patch8_64_ape", num_classes=3, img_size=32).eval()


@pytest.fixture(scope="module")
def images():
    return torch.randn(6, 3, 32, 32, generator=torch.Generator().manual_seed(1))


def _split(n: int = 6) -> list[tuple[Image.Image, int]]:
    rng = np.random.default_rng(0)
    return [(Image.fromarray(rng.integers(0, 256, (40, 40, 3), dtype=np.uint8)), i % 3) for i in range(n)]


def test_the_settings_are_exported_from_the_root():
    assert "MeasureSettings" in timm_posgeom.__all__ and timm_posgeom.MeasureSettings is MeasureSettings
    assert issubclass(MeasureSettingsError, PosgeomError) and issubclass(MeasureSettingsError, ValueError)
    assert MeasureSettings().to_dict()["batch_size"] == 64
    from timm_posgeom.measuring.settings import RESIZE_MODES as modes

    assert modes == RESIZE_MODES  # one meaning of resize, whichever module checks it


def test_plain_keywords_equal_settings_in_probe_ssdc(model, images):
    plain = probe_ssdc(model, images, rpi=True, reduction="both", batch_size=2, max_images=5, seed=3, progress=False)
    given = probe_ssdc(
        model,
        images,
        rpi=True,
        reduction="both",
        settings=MeasureSettings(batch_size=2, max_images=5, seed=3, progress=False),
    )
    assert plain.per_layer == given.per_layer and plain.settings == given.settings
    assert torch.equal(plain.permutation, given.permutation) and given.settings["n_images"] == 5


def test_a_keyword_overrides_the_settings(model, images):
    settings = MeasureSettings(max_images=2, batch_size=2, progress=False)
    assert probe_ssdc(model, images, settings=settings, max_images=4).settings["n_images"] == 4
    assert probe_ssdc(model, images, settings=settings).settings["n_images"] == 2
    assert settings.max_images == 2  # frozen: the caller's object is unchanged
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.max_images = 3


def test_plain_keywords_equal_settings_in_the_measures(model, images):
    plain = attention_measures(model, images, batch_size=3, max_images=4, progress=False)
    given = attention_measures(model, images, settings=MeasureSettings(batch_size=3, max_images=4, progress=False))
    assert np.array_equal(plain.ssdc, given.ssdc, equal_nan=True) and plain.settings == given.settings


def test_plain_keywords_equal_settings_in_fragility(model):
    data = _split()
    plain = fragility(model, data, ["jpeg:5"], batch_size=4, num_workers=0, max_images=5, seed=2, progress=False)
    given = fragility(
        model,
        data,
        ["jpeg:5"],
        settings=MeasureSettings(batch_size=4, num_workers=0, max_images=5, seed=2, progress=False),
    )
    assert plain.to_dict() == given.to_dict() and given.num_images == 5
    assert (
        fragility(
            model,
            data,
            ["jpeg:5"],
            settings=MeasureSettings(batch_size=4, num_workers=0, progress=False),
            max_images=3,
            forward_size=2,
        ).num_images
        == 3
    )  # a field and the function's own keyword


def test_alpha_sweep_takes_the_settings(model):
    settings = MeasureSettings(batch_size=3, num_workers=0, max_images=4, progress=False)
    plain = alpha_sweep(
        model,
        _split(),
        [1.0, 0.5],
        ["jpeg:5"],
        batch_size=3,
        num_workers=0,
        max_images=4,
        progress=False,
        probe_images=3,
    )
    given = alpha_sweep(model, _split(), [1.0, 0.5], ["jpeg:5"], settings=settings, probe_images=3)
    assert plain.to_dict() == given.to_dict() and given.settings["probe_images"] == 3


@pytest.mark.parametrize(
    "call",
    [
        lambda m, x: probe_ssdc(m, x, progress=False, batch_sise=2),
        lambda m, x: run_measures(m, x, [], progress=False, batch_sise=2),
        lambda m, x: attention_measures(m, x, nosuch=1),
        lambda m, x: fragility(m, _split(), ["jpeg:5"], nosuch=1),
        lambda m, x: alpha_sweep(m, _split(), [1.0], nosuch=1),
        lambda m, x: imagenet_c_released(m, _split(), ".", nosuch=1),
    ],
    ids=["probe_ssdc", "run_measures", "attention_measures", "fragility", "alpha_sweep", "imagenet_c_released"],
)
def test_an_unknown_keyword_is_a_type_error(model, images, call):
    with pytest.raises(TypeError, match="unexpected keyword argument"):
        call(model, images)


@pytest.mark.parametrize(
    "field,value,phrase",
    [
        ("batch_size", 0, "batch_size must be an integer >= 1"),
        ("batch_size", -1, "batch_size must be an integer >= 1"),
        ("max_images", 0, "max_images must be >= 1, got 0"),
        ("num_workers", -2, "num_workers must be from 0 to .* got -2"),
        ("num_workers", 10**6, "num_workers must be from 0 to .* got 1000000"),
        ("img_size", 0, "img_size must be from 1 to 4096"),
        ("img_size", 10**5, "img_size must be from 1 to 4096"),
        ("resize", "stretch", "resize must be one of paper, timm"),
        ("distributed", "yes", "unknown distributed mode 'yes'"),
        ("seed", 1.5, "seed must be an integer of 64 bits or None"),
        ("seed", 10**30, "seed must be an integer of 64 bits or None"),
        ("rpi_permutations", 10**9, "rpi_permutations must be an integer from 1 to 10,000"),
    ],
)
def test_bad_settings_are_refused_in_one_line_wherever_they_are_given(model, images, field, value, phrase):
    with pytest.raises(MeasureSettingsError, match=phrase) as built:
        MeasureSettings(**{field: value})
    assert one_line(built.value) == str(built.value)  # the line the command line prints
    for call in (
        lambda: probe_ssdc(model, images, progress=False, **{field: value}),
        lambda: fragility(model, _split(), ["jpeg:5"], progress=False, **{field: value}),
        lambda: MeasureSettings().replace(**{field: value}),
    ):
        with pytest.raises(MeasureSettingsError, match=phrase):
            call()


def test_the_settings_must_be_a_settings_object(model, images):
    with pytest.raises(TypeError, match="settings must be a MeasureSettings"):
        probe_ssdc(model, images, settings={"batch_size": 2})


def test_each_function_refuses_what_it_cannot_do(model, images):
    with pytest.raises(ValueError, match="distributed must be 'auto' or 'off'"):
        fragility(model, _split(), ["jpeg:5"], settings=MeasureSettings(distributed="presharded"))
    with pytest.raises(ValueError, match="max_images does not apply"):
        imagenet_c_released(model, _split(), ".", settings=MeasureSettings(max_images=3))


def test_results_name_their_settings_settings_and_read_the_old_name(model, images, tmp_path):
    result = probe_ssdc(model, images, batch_size=3, progress=False)
    assert result.metadata is result.settings  # the old attribute name: the same dict
    record = json.loads(result.to_json(tmp_path / "ssdc.json"))
    assert record["settings"] == record["metadata"] == json.loads((tmp_path / "ssdc.json").read_text())["settings"]
    assert SSDCResult.settings_of({"metadata": {"site": "attn_input"}}) == {"site": "attn_input"}  # an older file
    old = SSDCResult(per_layer=[0.5], layers=[0], metadata={"model": "m"})  # the old constructor keyword
    assert old.settings == {"model": "m"} and old.metadata == {"model": "m"}
    with pytest.raises(TypeError, match="both settings and metadata"):
        SSDCResult(per_layer=[0.5], layers=[0], settings={"a": 1}, metadata={"b": 2})


def test_every_result_file_carries_the_record_schemas_tags(model, images, tmp_path):
    """One serialisation: the library's result files are tagged as the application's records are."""
    from timm_posgeom.app.records import SCHEMA_VERSION, RunSummary
    from timm_posgeom.robustness.imagenet_c import ImageNetCResult

    results = {
        "ssdc-result": probe_ssdc(model, images, batch_size=3, progress=False),
        "measure-result": attention_measures(model, images, batch_size=3, progress=False),
        "fragility-result": fragility(model, _split(), ["jpeg:5"], batch_size=3, num_workers=0, progress=False),
        "alpha-sweep-result": alpha_sweep(
            model, _split(), [1.0], ["jpeg:5"], batch_size=3, num_workers=0, progress=False, probe_images=3
        ),
    }
    for kind, result in results.items():
        written = json.loads(result.to_json(tmp_path / f"{kind}.json"))
        assert (written["schema"], written["schema_version"]) == (f"timm-posgeom/{kind}", 1)
        assert json.loads((tmp_path / f"{kind}.json").read_text()) == written
    record = RunSummary(
        model="m", steps=1, epochs=1.0, train_images=1, val_images=1, processes=1, time_s=1.0, val_top1=0.5
    ).to_dict()
    assert (record["schema"], record["schema_version"]) == ("timm-posgeom/run-summary", SCHEMA_VERSION)
    # an ImageNet-C reference is read back from its tagged file, and another kind of file is refused
    c = ImageNetCResult(
        corruptions=["fog"],
        severities=[1],
        num_images=2,
        clean_accuracy=0.5,
        accuracy={"fog": {1: 0.25}},
        fs={"fog": {1: 0.5}},
        counts={"clean": {"correct": 1, "total": 2}, "fog": {1: {"correct": 1, "total": 4}}},
        source="released",
    )
    c.to_json(tmp_path / "imagenet_c.json")
    assert ImageNetCResult.from_json(tmp_path / "imagenet_c.json").fs == {"fog": {1: 0.5}}
    with pytest.raises(ValueError, match="not an ImageNet-C result"):
        ImageNetCResult.from_json(tmp_path / "ssdc-result.json")
