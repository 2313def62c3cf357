"""The library checks the data's labels against the model's classes as the command line does (timm_posgeom.data.labels).

An ImageNet-1k model scored on 10-class data (Imagenette's WordNet ids) is refused unless a mapping is
chosen; with the mapping the scores are counted on the mapped ImageNet classes."""

from __future__ import annotations

import PIL.Image
import pytest
import timm
import torch
from timm.data import ImageNetInfo

import timm_posgeom  # noqa: F401  (registers the models)
from timm_posgeom.data import ImageSplit
from timm_posgeom.data.labels import LabelMismatchError, map_by_name, match_labels
from timm_posgeom.errors import PosgeomError, one_line
from timm_posgeom.protocol import PROBE_IMAGES, probe_count
from timm_posgeom.robustness import alpha_sweep, fragility
from timm_posgeom.robustness.imagenet_c import imagenet_c_fragility

pytestmark = pytest.mark.usefixtures("one_thread")

# Imagenette's ten classes, by WordNet id, in its label order
IMAGENETTE_WNIDS = [
    "n01440764",
    "n02102040",
    "n02979186",
    "n03000684",
    "n03028079",
    "n03394916",
    "n03417042",
    "n03425413",
    "n03445777",
    "n03888605",
]
CHAIN_SAW = 3  # the data's label of n03000684
LABELS = [3, 3, 3, 0, 1, 2, 5, 9]  # three chain saws among eight images
FAST = dict(num_workers=0, progress=False, batch_size=4)


def _split(classes: list[str], labels: list[int]) -> ImageSplit:
    items = [PIL.Image.new("RGB", (16, 16), (40 * i % 256, 90, 160)) for i in range(len(labels))]
    return ImageSplit(items, classes, labels, "stub-labels", lambda ds, i: (ds[i], labels[i]))


@pytest.fixture(scope="module")
def imagenet_model() -> torch.nn.Module:
    """A 1000-class head (random init) that always answers ImageNet's chain saw."""
    torch.manual_seed(0)
    model = timm.create_model("posgeom_vit_micro_patch8_64_ape", num_classes=1000).eval()
    target = ImageNetInfo("imagenet-1k").label_names().index(IMAGENETTE_WNIDS[CHAIN_SAW])
    with torch.no_grad():
        model.head.weight.zero_()
        model.head.bias.zero_()
        model.head.bias[target] = 1.0
    return model


def test_an_imagenet_head_on_ten_wordnet_classes_is_refused_with_the_remedy(imagenet_model):
    data = _split(IMAGENETTE_WNIDS, LABELS)
    for call in (
        lambda: fragility(imagenet_model, data, ["jpeg:5"], **FAST),
        lambda: alpha_sweep(imagenet_model, data, [1.0], ["jpeg:5"], **FAST),
        lambda: imagenet_c_fragility(imagenet_model, data, ["jpeg_compression"], [1], **FAST),
    ):
        with pytest.raises(LabelMismatchError) as e:
            call()
        message = one_line(e.value)
        assert isinstance(e.value, PosgeomError) and isinstance(e.value, ValueError)
        assert "the model has 1000 classes but the data has 10" in message
        assert "labels='by-name' maps them" in message and "cannot" not in message


def test_with_the_mapping_chosen_the_scores_are_on_the_mapped_classes(imagenet_model):
    data = _split(IMAGENETTE_WNIDS, LABELS)
    mapped = fragility(imagenet_model, data, ["jpeg:5"], labels="by-name", **FAST)
    assert mapped.clean_accuracy == pytest.approx(3 / 8) and mapped.accuracy["jpeg:5"] == pytest.approx(3 / 8)
    # as-is reads label 3 as ImageNet class 3 (a tiger shark): the silent wrong number the check refuses
    with pytest.warns(RuntimeWarning, match="clean accuracy is 0"):
        assert fragility(imagenet_model, data, ["jpeg:5"], labels="as-is", **FAST).clean_accuracy == 0.0
    sweep = alpha_sweep(imagenet_model, data, [1.0], ["jpeg:5"], labels="by-name", **FAST)
    assert sweep.rows[0].clean_accuracy == pytest.approx(3 / 8)
    generated = imagenet_c_fragility(imagenet_model, data, ["jpeg_compression"], [1], labels="by-name", **FAST)
    assert generated.clean_accuracy == pytest.approx(3 / 8)
    relabelled = match_labels(imagenet_model, data, "by-name")
    assert relabelled.labels[0] == ImageNetInfo("imagenet-1k").label_names().index("n03000684")
    assert match_labels(imagenet_model, relabelled) is relabelled  # mapped data passes the check as it is


def test_check_refuses_other_names_or_order_and_passes_the_same_classes():
    model = timm.create_model("posgeom_vit_micro_patch8_64_nope", num_classes=3)
    data = _split(["cat", "dog", "fox"], [0, 1, 2])
    assert match_labels(model, data) is data  # same count, no recorded names: nothing to contradict
    model.pretrained_cfg = {**model.pretrained_cfg, "label_names": ["dog", "cat", "fox"]}
    with pytest.raises(LabelMismatchError, match="the same classes in another order"):
        match_labels(model, data)
    assert match_labels(model, data, "by-name").labels == [1, 0, 2]
    assert match_labels(model, data, "as-is") is data
    model.pretrained_cfg = {**model.pretrained_cfg, "label_names": ["cat", "dog", "fox"]}
    assert match_labels(model, data) is data
    with pytest.raises(ValueError, match="labels must be one of check, by-name, as-is"):
        match_labels(model, data, "by-index")
    wrong = _split(["n01443537", "n01440764"], [0, 1])  # WordNet ids, not ImageNet's order
    imagenet = timm.create_model("posgeom_vit_micro_patch8_64_nope", num_classes=1000)
    with pytest.raises(LabelMismatchError, match="cannot be mapped"):
        match_labels(imagenet, _split(["cat", "dog"], [0, 1]), "by-name")
    assert map_by_name(imagenet, wrong)[0].labels == [1, 0]


def test_max_images_bounds_the_probe_of_an_alpha_sweep_unless_probe_images_says_otherwise(imagenet_model):
    assert probe_count(None, None) == PROBE_IMAGES and probe_count(None, 32) == 32 and probe_count(5000, 32) == 5000
    assert probe_count(None, 5000) == PROBE_IMAGES
    data = _split(IMAGENETTE_WNIDS, LABELS)
    sweep = alpha_sweep(imagenet_model, data, [1.0], ["jpeg:5"], labels="by-name", max_images=4, **FAST)
    assert sweep.settings["probe_images"] == 4 and sweep.settings["num_images"] == 4
    sweep = alpha_sweep(imagenet_model, data, [1.0], ["jpeg:5"], labels="by-name", max_images=4, probe_images=6, **FAST)
    assert sweep.settings["probe_images"] == 6 and sweep.settings["num_images"] == 4
    with pytest.raises(ValueError, match="probe_images must be >= 1"):
        alpha_sweep(imagenet_model, data, [1.0], probe_images=0, **FAST)
