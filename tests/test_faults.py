"""Faults and mismatches a user meets: each refused with one clear line, never a silent wrong number."""
from __future__ import annotations

import json

import pytest
import timm
from PIL import Image

from timm_posgeom.cli import main
from timm_posgeom.hub import export_for_hub
from timm_posgeom.robustness import fragility

NAMES = ["tench", "springer", "cassette", "chainsaw", "church", "horn", "truck", "pump", "ball", "parachute"]


def _export(tmp_path, names=NAMES):
    model = timm.create_model("posgeom_vit_micro_patch8_64_nope", num_classes=len(names), img_size=32,
                              depth=1).eval()
    cfg = dict(input_size=(3, 32, 32), num_classes=len(names), label_names=list(names))
    return export_for_hub(model, tmp_path / "export", dict(img_size=32, num_classes=len(names), depth=1), cfg)


def _folder(root, classes, per_class=2):
    for i, cls in enumerate(classes):
        (root / "validation" / cls).mkdir(parents=True)
        for j in range(per_class):
            Image.new("RGB", (40, 40), color=(20 * i, 10 * j, 90)).save(root / "validation" / cls / f"{j}.png")
    return root


def test_fragility_refuses_data_with_other_classes(tmp_path, capsys):
    """Issue 14, item 6: a 10-class model scored on a 3-class folder gave accuracy 0.056, FS 0.000, exit 0."""
    export = _export(tmp_path)
    data = _folder(tmp_path / "three", ["ball", "church", "tench"])
    argv = ["fragility", f"local-dir:{export}", "--data", str(data), "--shift", "jpeg:50", "--num-workers", "0",
            "--no-progress", "--out", str(tmp_path / "out")]
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and "the model has 10 classes but the data has 3" in err
    assert not (tmp_path / "out").exists()
    # mapped by name, the same images are scored against the model's own class indices
    assert main(argv + ["--labels", "by-name"]) == 0
    written = json.loads((tmp_path / "out" / "fragility.json").read_text())
    assert written["num_images"] == 6
    with pytest.raises(SystemExit):
        main(argv[:3] + [str(_folder(tmp_path / "other", ["ball", "zebra", "tench"]))] + argv[4:] + ["--labels", "by-name"])
    assert "lack 1 of the data's (zebra)" in capsys.readouterr().err


def test_same_classes_in_another_order_are_refused_unless_mapped(tmp_path, capsys):
    export = _export(tmp_path, names=["dog", "cat"])
    data = _folder(tmp_path / "d", ["dog", "cat"])  # ImageFolder sorts: ["cat", "dog"], the other order
    argv = ["fragility", f"local-dir:{export}", "--data", str(data), "--shift", "jpeg:50", "--num-workers", "0",
            "--no-progress", "--out", str(tmp_path / "out")]
    with pytest.raises(SystemExit):
        main(argv)
    assert "--labels by-name maps them" in capsys.readouterr().err
    assert main(argv + ["--labels", "by-name"]) == 0


def test_library_fragility_refuses_labels_beyond_the_model_outputs():
    model = timm.create_model("posgeom_vit_micro_patch8_64_nope", num_classes=3, img_size=32, depth=1).eval()
    data = [(Image.new("RGB", (32, 32)), 7)]
    with pytest.raises(ValueError, match="label 7 is out of range for a model with 3 outputs"):
        fragility(model, data, shifts=("jpeg:50",), num_workers=0, progress=False)
