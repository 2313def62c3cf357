"""Bad inputs (issue 31): a corpus built here, each case either the right number or one line and exit 2.

Every case runs the command line in this process (``main(argv)``), so a traceback is a failing test, and
checks one of two outcomes:

* ``ok``: exit 0 and the right number: the SSDC per layer equals the one of a clean "twin" of the same data
  (8-bit RGB PNGs of the pixels the bad input should decode to, computed here without the package);
* ``refused``: ``SystemExit(2)`` and one line on stderr (``posgeom CMD: error: ...``) holding a given phrase.

No binary is checked in: images, parquet files, checkpoints and exports are generated into ``tmp_path``.
The library's side (image modes, labels, nested interventions, cards) is checked after the CLI corpus.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
from PIL import Image

from timm_posgeom.cli import main

MODEL = "posgeom_vit_micro_patch8_64_nope"
SIZE = 16  # side of the generated images
CLASSES = ("ant", "bee")


# --------------------------------------------------------------------------------------------
# the generator: pixels, and the files that should decode to them
# --------------------------------------------------------------------------------------------
def _pixels(i: int) -> np.ndarray:
    """(SIZE, SIZE, 3) uint8: a different smooth pattern per image (so the SSDC is not degenerate)."""
    y, x = np.mgrid[0:SIZE, 0:SIZE]
    r = (x * 13 + i * 40) % 256
    g = (y * 11 + x * 3 + i * 70) % 256
    b = ((x - y) * 7 + i * 90) % 256
    return np.stack([r, g, b], -1).astype(np.uint8)


def _gray(i: int) -> np.ndarray:
    return _pixels(i)[..., 1]


def _write(root: Path, kind: str, n: int = 2) -> tuple[Path, Path]:
    """An ImageFolder tree ``root/validation/<class>/<i>.<ext>`` of ``kind`` and its clean 8-bit RGB twin
    (``root.name + '-twin'``, PNG): what each file must decode to."""
    twin = root.with_name(root.name + "-twin")
    for c, cls in enumerate(CLASSES):
        for j in range(n):
            i = 2 * c + j
            image, expected, ext = _encode(kind, i)
            for base, what in ((root, image), (twin, Image.fromarray(expected, "RGB"))):
                (base / "validation" / cls).mkdir(parents=True, exist_ok=True)
                if isinstance(what, bytes):
                    (base / "validation" / cls / f"{j}{ext}").write_bytes(what)
                else:
                    what.save(base / "validation" / cls / (f"{j}{ext}" if base is root else f"{j}.png"))
    return root, twin


def _encode(kind: str, i: int) -> tuple[Image.Image | bytes, np.ndarray, str]:
    """(the image as ``kind`` stores it, the 8-bit RGB it must decode to, file extension)."""
    rgb, gray = _pixels(i), _gray(i)
    gray3 = np.repeat(gray[..., None], 3, -1)
    if kind == "rgb":
        return Image.fromarray(rgb, "RGB"), rgb, ".png"
    if kind == "gray16":  # 16-bit grayscale PNG (mode I;16): v / 257 rounds back to the 8-bit level
        noise = np.random.default_rng(i).integers(-100, 101, gray.shape)
        v16 = np.clip(gray.astype(np.int64) * 257 + noise, 0, 65535).astype(np.uint16)
        expected = np.clip(np.rint(v16 / 257), 0, 255).astype(np.uint8)
        return Image.fromarray(v16), np.repeat(expected[..., None], 3, -1), ".png"
    if kind == "gray8":
        return Image.fromarray(gray, "L"), gray3, ".png"
    if kind == "bilevel":  # mode 1
        bits = gray > 127
        return Image.fromarray(bits), np.repeat((bits * 255).astype(np.uint8)[..., None], 3, -1), ".png"
    if kind == "palette":  # mode P: index -> colour
        palette = np.random.default_rng(7).integers(0, 256, (256, 3)).astype(np.uint8)
        image = Image.fromarray(gray, "P")
        image.putpalette(palette.flatten().tolist())
        return image, palette[gray], ".png"
    if kind in ("rgba", "la"):  # alpha 255 or 0: the colour, or the white background
        opaque = (np.arange(SIZE)[None, :] + np.arange(SIZE)[:, None] + i) % 3 != 0
        alpha = np.where(opaque, 255, 0).astype(np.uint8)
        colour = rgb if kind == "rgba" else gray3
        expected = np.where(opaque[..., None], colour, 255).astype(np.uint8)
        stored = np.dstack([rgb, alpha]) if kind == "rgba" else np.dstack([gray, alpha])
        return Image.fromarray(stored, "RGBA" if kind == "rgba" else "LA"), expected, ".png"
    if kind == "cmyk":  # CMYK TIFF with K = 0: R = 255 - C
        cmyk = np.dstack([255 - rgb, np.zeros(gray.shape, np.uint8)])
        return Image.fromarray(cmyk, "CMYK"), rgb, ".tif"
    if kind == "float":  # mode F TIFF: no fixed range
        return Image.fromarray(gray.astype(np.float32) / 255, "F"), gray3, ".tif"
    if kind in ("truncated", "empty", "text"):
        import io

        buf = io.BytesIO()
        Image.fromarray(rgb, "RGB").save(buf, format="PNG")
        data = {"truncated": buf.getvalue()[:60], "empty": b"", "text": b"not an image at all\n"}[kind]
        return data, rgb, ".png" if kind != "text" else ".jpg"
    raise ValueError(kind)


# --------------------------------------------------------------------------------------------
# running the command line
# --------------------------------------------------------------------------------------------
def _probe(capsys, data: Path | str, out: Path, *extra: str, model: str = MODEL) -> tuple[int, str, list | None]:
    """(exit status, stderr, SSDC per layer or None) of ``posgeom probe`` in this process."""
    argv = [
        "probe",
        model,
        "--data",
        str(data),
        "--img-size",
        "32",
        "--num-workers",
        "0",
        "--no-progress",
        "--reduction",
        "mean_map",
        "--out",
        str(out),
        *extra,
    ]
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err
    ssdc = json.loads((out / "ssdc.json").read_text())["per_layer"] if code == 0 else None
    return code, err, ssdc


def _refused(code: int, err: str, phrase: str) -> None:
    """Exit 2 and one error line (the last on stderr, after any progress bar of a library) holding ``phrase``."""
    lines = [line for line in err.splitlines() if line.strip()]
    errors = [line for line in lines if "error:" in line]
    assert code == 2, f"exit {code}, stderr: {err[-2000:]}"
    assert len(errors) == 1 and lines[-1] == errors[0] and "Traceback" not in err, err
    assert phrase.lower() in errors[0].lower(), errors[0]


# Images of every mode: decoded to the twin's pixels, so the same SSDC as the twin (exactly).
IMAGE_MODES = ["rgb", "gray16", "gray8", "bilevel", "palette", "rgba", "la", "cmyk"]


@pytest.mark.parametrize("kind", IMAGE_MODES)
def test_images_of_any_mode_give_the_numbers_of_their_8_bit_rgb_twin(tmp_path, capsys, kind, one_thread):
    """Issue 31, item 1: 16-bit PNGs were clipped at 255 (99% white) and probed as real, exit 0."""
    root, twin = _write(tmp_path / kind, kind)
    code, err, got = _probe(capsys, root, tmp_path / "out")
    assert code == 0, err
    code, err, want = _probe(capsys, twin, tmp_path / "out-twin")
    assert code == 0, err
    assert got == want


# Files that cannot be read as images, and data that cannot be had: one line, exit 2.
REFUSED_DATA = [
    ("float", "mode F"),  # 32-bit float TIFF: no fixed range
    ("truncated", "cannot decode"),
    ("empty", "cannot decode"),
    ("text", "cannot decode"),
]


@pytest.mark.parametrize("kind,phrase", REFUSED_DATA, ids=[k for k, _ in REFUSED_DATA])
def test_files_that_are_no_readable_image_are_refused_in_one_line(tmp_path, capsys, kind, phrase, one_thread):
    root, _ = _write(tmp_path / kind, kind, n=1)
    code, err, _ = _probe(capsys, root, tmp_path / "out")
    _refused(code, err, phrase)
    assert "0.png" in err or "0.jpg" in err or "0.tif" in err  # the file is named


def test_skipping_bad_files_probes_the_good_ones_exactly(tmp_path, capsys, one_thread):
    root, twin = _write(tmp_path / "d", "rgb")
    (root / "validation" / "ant" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n broken")
    code, err, got = _probe(capsys, root, tmp_path / "out", "--bad-images", "skip")
    assert code == 0 and "left out 1 image" in err
    assert got == _probe(capsys, twin, tmp_path / "out-twin")[2]


def test_unicode_and_spaces_in_paths_change_nothing(tmp_path, capsys, one_thread):
    root, twin = _write(tmp_path / "données d'été ✓", "rgb")
    code, err, got = _probe(capsys, root, tmp_path / "sortie é")
    assert code == 0, err
    assert got == _probe(capsys, twin, tmp_path / "out-twin")[2]


def test_an_empty_class_folder_is_a_class_without_images(tmp_path, capsys, one_thread):
    """torchvision refused the whole tree ("Found no valid file for the classes ..."); the class keeps its index."""
    root, twin = _write(tmp_path / "d", "rgb")
    (root / "validation" / "cat").mkdir()
    (root / "validation" / "cat" / "notes.txt").write_text("no images here")
    code, err, got = _probe(capsys, root, tmp_path / "out")
    assert code == 0, err
    assert got == _probe(capsys, twin, tmp_path / "out-twin")[2]
    from timm_posgeom.data import load_split

    split = load_split(root, "validation")
    assert split.classes == ["ant", "bee", "cat"] and sorted(set(split.labels)) == [0, 1]


def test_odd_image_sizes_are_resized_like_their_resized_twin(tmp_path, capsys, one_thread):
    """1 x 1, 1 x 40 and 40 x 3 images: resized straight to the input, as a pre-resized twin gives."""
    import torchvision.transforms as T

    root, twin = tmp_path / "odd", tmp_path / "odd-twin"
    for k, size in enumerate([(1, 1), (1, 40), (40, 3), (33, 17)]):
        image = Image.fromarray(_pixels(k)[: size[1], : size[0]].copy(), "RGB").resize(size)
        cls = CLASSES[k % 2]
        for base, what in ((root, image), (twin, T.Resize((32, 32), interpolation=T.InterpolationMode.BICUBIC)(image))):
            (base / "validation" / cls).mkdir(parents=True, exist_ok=True)
            what.save(base / "validation" / cls / f"{k}.png")
    code, err, got = _probe(capsys, root, tmp_path / "out")
    assert code == 0, err
    assert got == _probe(capsys, twin, tmp_path / "out-twin")[2]


def _parquet(root: Path, labels: list) -> Path:
    import datasets

    (root / "data").mkdir(parents=True)
    images = [Image.fromarray(_pixels(i), "RGB") for i in range(len(labels))]
    datasets.disable_progress_bars()
    feature = datasets.Value("float64") if any(isinstance(v, float) for v in labels) else datasets.Value("int64")
    ds = datasets.Dataset.from_dict(
        {"image": images, "label": labels}, features=datasets.Features(image=datasets.Image(), label=feature)
    )
    ds.to_parquet(str(root / "data" / "validation-00000-of-00001.parquet"))
    return root


def test_fractional_labels_are_refused_and_whole_float_labels_read(tmp_path, capsys, one_thread):
    """7.7 was truncated to 7 (the class next to it scored as right)."""
    from timm_posgeom.data import load_split

    _refused(*_probe(capsys, _parquet(tmp_path / "frac", [0.0, 7.7, 1.0]), tmp_path / "o1")[:2], "label 7.7")
    split = load_split(_parquet(tmp_path / "whole", [0.0, 7.0, 1.0]), "validation")
    assert split.labels == [0, 7, 1] and split.num_classes == 8
    from timm_posgeom.data.eval_data import split_item

    with pytest.raises(ValueError, match="label 2.5 is not a class index"):
        split_item((Image.new("RGB", (4, 4)), 2.5))


@pytest.fixture
def offline(monkeypatch):
    """No Hub: what a machine without network meets, without waiting for its timeouts."""
    import datasets
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True, raising=False)


def test_an_offline_hub_dataset_is_one_line(tmp_path, capsys, offline):
    """Issue 31, T1: a ConnectionError traceback, exit 1."""
    _refused(
        *_probe(capsys, "nobody-here/no-such-dataset-31", tmp_path / "out")[:2], "cannot reach the Hugging Face Hub"
    )


def _checkpoint_files(tmp_path: Path) -> dict[str, Path]:
    from safetensors.torch import save_file

    files = {
        "text": tmp_path / "notes.pt",
        "empty": tmp_path / "empty.pth",
        "truncated": tmp_path / "cut.safetensors",
        "other_model": tmp_path / "other.safetensors",
        "truncated_pickle": tmp_path / "cut.pth",
    }
    files["text"].write_text("this is not a checkpoint\n")
    files["empty"].write_bytes(b"")
    save_file({"w": torch.zeros(64, 64)}, str(files["other_model"]))
    files["truncated"].write_bytes(files["other_model"].read_bytes()[:100])
    torch.save({"w": torch.zeros(256)}, files["truncated_pickle"])
    files["truncated_pickle"].write_bytes(files["truncated_pickle"].read_bytes()[:300])
    return files


@pytest.mark.parametrize("kind", ["text", "empty", "truncated", "truncated_pickle", "other_model"])
def test_a_checkpoint_that_cannot_be_loaded_is_one_line(tmp_path, capsys, kind, one_thread):
    """Issue 31, T3: torch.load's RuntimeError traceback."""
    root, _ = _write(tmp_path / "d", "rgb", n=1)
    checkpoint = _checkpoint_files(tmp_path)[kind]
    phrase = "another model" if kind == "other_model" else "is not a checkpoint"
    _refused(*_probe(capsys, root, tmp_path / "out", "--checkpoint", str(checkpoint))[:2], phrase)


def test_a_truncated_local_export_is_one_line(tmp_path, capsys, one_thread):
    from timm_posgeom.app.hub import export_for_hub

    root, _ = _write(tmp_path / "d", "rgb", n=1)
    export = export_for_hub(timm.create_model(MODEL, num_classes=2, img_size=32, depth=1), tmp_path / "export")
    weights = export / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    code, err, _ = _probe(capsys, root, tmp_path / "out", model=f"local-dir:{export}")
    _refused(code, err, "cannot load the weights")


# Counts and sizes no run can use, and models that cannot do what is asked.
REFUSED_ARGS = [
    (("--batch-size", "-1"), "--batch-size must be >= 1"),
    (("--batch-size", "0"), "--batch-size must be >= 1"),
    (("--max-images", "0"), "--max-images must be >= 1"),
    (("--img-size", "36"), "patch size"),  # 4 px of each image would be dropped unseen
    (("--img-size", "0"), "--img-size must be >= 1"),
    (("--num-workers", "-2"), "--num-workers must be >= 0"),
    (("--alpha", "2"), "nothing to scale"),  # the model has no PE
]


@pytest.mark.parametrize("extra,phrase", REFUSED_ARGS, ids=[" ".join(a) for a, _ in REFUSED_ARGS])
def test_unusable_options_are_refused_in_one_line(tmp_path, capsys, extra, phrase, one_thread):
    root, _ = _write(tmp_path / "d", "rgb", n=1)
    code, err, _ = _probe(capsys, root, tmp_path / "out", *extra)  # a second --img-size wins over _probe's
    _refused(code, err, phrase)


def test_an_input_size_off_a_timm_vits_patch_grid_is_one_line(tmp_path, capsys, one_thread):
    """--img-size 72 on a patch-16 timm ViT silently dropped the last 8 pixel rows and columns."""
    root, _ = _write(tmp_path / "d", "rgb", n=1)
    code, err, _ = _probe(capsys, root, tmp_path / "out", "--img-size", "72", model="vit_tiny_patch16_224")
    _refused(code, err, "not a multiple of the patch size 16x16")
    from timm_posgeom.models.factory import create_model

    assert create_model("vit_tiny_patch16_224", img_size=80, depth=1).patch_embed.grid_size == (5, 5)


@pytest.mark.parametrize("model", ["resnet18", "levit_128s"])
def test_rpi_on_a_model_without_a_patch_embedding_is_one_line(tmp_path, capsys, model, one_thread):
    """Issue 31, T2: a TypeError traceback (CNNs and hybrid models have no patch tokens to permute)."""
    root, _ = _write(tmp_path / "d", "rgb", n=1)
    code, err, _ = _probe(capsys, root, tmp_path / "out", "--rpi", model=model)
    _refused(code, err, "probe it without RPI")


# The ten families issue 31 named (T2), each the smallest variant: the CLI's check is the library's own
T2_FAMILIES = [
    "resnet18",
    "nextvit_small",
    "davit_tiny",
    "coat_lite_tiny",
    "fastvit_t8",
    "repvit_m0_9",
    "mambaout_femto",
    "hgnetv2_b0",
    "levit_128s",
    "twins_svt_small",
]


@pytest.mark.parametrize("model", T2_FAMILIES)
def test_the_library_refuses_rpi_on_every_family_without_a_patch_embedding(model, one_thread):
    from timm_posgeom import probe_ssdc
    from timm_posgeom.errors import USER_ERRORS, one_line

    net = timm.create_model(model, pretrained=False).eval()
    with pytest.raises(USER_ERRORS) as e:
        probe_ssdc(net, torch.rand(1, 3, 224, 224), rpi=True, progress=False)
    assert "probe it without RPI" in one_line(e.value)


# The same corpus through the library (load_split -> eval_loader / fragility), as a script would read it
def _library_numbers(root: Path) -> tuple[list[float], float, dict]:
    from timm_posgeom import eval_loader, fragility, probe_ssdc
    from timm_posgeom.data import load_split

    torch.manual_seed(0)
    net = timm.create_model(MODEL, num_classes=len(CLASSES), img_size=32).eval()
    split = load_split(root, "validation")
    ssdc = probe_ssdc(net, eval_loader(net, split, batch_size=2, num_workers=0), progress=False)
    frag = fragility(net, split, ["jpeg:5"], batch_size=2, num_workers=0, seed=0, progress=False)
    return list(ssdc.per_layer), frag.clean_accuracy, dict(frag.accuracy)


@pytest.mark.parametrize("kind", IMAGE_MODES)
def test_the_library_reads_images_of_any_mode_as_their_8_bit_rgb_twin(tmp_path, kind, one_thread):
    root, twin = _write(tmp_path / kind, kind)
    assert _library_numbers(root) == _library_numbers(twin)


@pytest.mark.parametrize("kind,phrase", REFUSED_DATA, ids=[k for k, _ in REFUSED_DATA])
def test_the_library_refuses_unreadable_files_with_the_clis_line(tmp_path, kind, phrase, one_thread):
    from timm_posgeom.errors import USER_ERRORS, one_line

    root, _ = _write(tmp_path / kind, kind, n=1)
    with pytest.raises(USER_ERRORS) as e:
        _library_numbers(root)
    assert phrase.lower() in one_line(e.value).lower() and "0." in one_line(e.value)


def test_a_missing_data_folder_is_one_line(tmp_path, capsys):
    _refused(*_probe(capsys, tmp_path / "nowhere" / "data", tmp_path / "out")[:2], "does not exist")


def test_an_empty_split_is_one_line(tmp_path, capsys):
    (tmp_path / "d" / "validation" / "ant").mkdir(parents=True)
    (tmp_path / "d" / "train" / "ant").mkdir(parents=True)
    Image.new("RGB", (8, 8)).save(tmp_path / "d" / "train" / "ant" / "0.png")
    _refused(*_probe(capsys, tmp_path / "d", tmp_path / "out")[:2], "is empty")


# --------------------------------------------------------------------------------------------
# the library: image modes, 16 and 32 bit
# --------------------------------------------------------------------------------------------
def test_to_rgb_scales_16_bit_and_refuses_what_has_no_range():
    from timm_posgeom.data.transforms import ImageModeError, to_rgb

    v = np.array([[0, 128, 257, 32896, 65535, 65278]], dtype=np.uint16)
    assert Image.fromarray(v).mode == "I;16"
    assert np.asarray(to_rgb(Image.fromarray(v)))[0, :, 0].tolist() == [0, 0, 1, 128, 255, 254]
    as_i = Image.fromarray(v.astype(np.int32))
    assert as_i.mode == "I" and np.asarray(to_rgb(as_i))[0, :, 0].tolist() == [0, 0, 1, 128, 255, 254]
    with pytest.raises(ImageModeError, match="outside the 16-bit range"):
        to_rgb(Image.fromarray(np.array([[-5, 70000]], dtype=np.int32)))
    with pytest.raises(ImageModeError, match="mode F"):
        to_rgb(Image.fromarray(np.zeros((2, 2), np.float32)))
    transparent = Image.new("P", (2, 2), 0)
    transparent.putpalette([10, 20, 30] * 256)
    transparent.info["transparency"] = 0
    assert np.asarray(to_rgb(transparent)).tolist() == [[[255, 255, 255]] * 2] * 2


# --------------------------------------------------------------------------------------------
# nested interventions (issue 31, item 5)
# --------------------------------------------------------------------------------------------
def _vit():
    model = timm.create_model("posgeom_vit_micro_patch8_64_ape", img_size=32, depth=2, num_classes=2).eval()
    with torch.no_grad():
        model.pos_embed.normal_(0, 1)
    return model


def test_a_probe_inside_a_token_permutation_is_refused_not_misreported(one_thread):
    """p1[p2] was applied and p2 reported; without rpi, permuted tokens were reported as rpi=False."""
    from timm_posgeom import probe_ssdc, token_permutation
    from timm_posgeom.errors import PosgeomError

    model, x = _vit(), torch.randn(3, 3, 32, 32)
    for rpi in (True, False):
        with pytest.raises(PosgeomError, match="token_permutation"):
            with token_permutation(model, seed=1):
                probe_ssdc(model, x, rpi=rpi, seed=2, progress=False)
        assert not model.patch_embed._forward_hooks  # every context removed its hook
    with pytest.raises(PosgeomError, match="both permutations would apply"):
        with token_permutation(model, seed=1), token_permutation(model, seed=2):
            pass
    # a training-mode (RPT) context permutes nothing in eval mode: the probe's own RPI is the only one, exactly
    alone = probe_ssdc(model, x, rpi=True, seed=2, progress=False)
    with token_permutation(model, seed=1, mode="training"):
        inside = probe_ssdc(model, x, rpi=True, seed=2, progress=False)
    assert inside.per_layer == alone.per_layer and torch.equal(inside.permutation, alone.permutation)
    with token_permutation(model, seed=1, mode="training"), token_permutation(model, seed=2):
        with pytest.raises(PosgeomError, match="would both apply"):
            model.train()(x)


def test_library_probe_refuses_a_batch_size_below_one(one_thread):
    from timm_posgeom import probe_ssdc

    with pytest.raises(ValueError, match="batch_size must be an integer >= 1"):
        probe_ssdc(_vit(), torch.randn(2, 3, 32, 32), batch_size=-1, progress=False)


# --------------------------------------------------------------------------------------------
# cards: every number tied to the weights it was measured on (issue 31, items 2, 3 and T4)
# --------------------------------------------------------------------------------------------
def _run(tmp_path: Path, hashed: bool = True) -> Path:
    """A run directory: an export, summary.json (with the export's SHA-1 when ``hashed``) and eval.json."""
    from timm_posgeom.app.hub import export_for_hub
    from timm_posgeom.app.records import RunEval, RunSummary
    from timm_posgeom.models.pretrained import weights_sha1

    run = tmp_path / "run"
    export_for_hub(timm.create_model(MODEL, num_classes=2, img_size=32, depth=1), run / "export")
    sha1 = weights_sha1(run / "export" / "model.safetensors")
    RunSummary(
        model=MODEL,
        steps=120,
        epochs=3.0,
        train_images=64,
        val_images=16,
        processes=1,
        time_s=42.5,
        val_top1=0.6125,
        pe_ssdc=0.4321,
        **(dict(export_sha1=sha1) if hashed else {}),
    ).write(run / "summary.json")
    RunEval(clean_accuracy=0.5875, fs={"jpeg:5": 0.3125}, weights_sha1=sha1).write(run / "eval.json")
    return run


NUMBERS = ("0.6125", "0.4321", "0.5875", "0.3125")


def _card(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        code = main(["card", *argv])
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


def test_a_card_states_the_numbers_of_the_weights_it_ships(tmp_path, capsys):
    run = _run(tmp_path)
    code, card, _ = _card(capsys, str(run))
    assert code == 0 and all(n in card for n in NUMBERS)


def _other_weights(path: Path) -> None:
    from timm_posgeom.app.hub import export_for_hub

    torch.manual_seed(123)
    export_for_hub(timm.create_model(MODEL, num_classes=2, img_size=32, depth=1), path)


def test_a_card_for_replaced_weights_states_none_of_the_runs_numbers(tmp_path, capsys):
    """Issue 31, item 2: same shapes, other weights: eval.json hidden, but top-1 and table SSDC still stated."""
    run = _run(tmp_path)
    _other_weights(tmp_path / "other")
    (run / "export" / "model.safetensors").write_bytes((tmp_path / "other" / "model.safetensors").read_bytes())
    code, card, _ = _card(capsys, str(run))
    assert code == 0 and not any(n in card for n in NUMBERS)
    assert "measured on other weights than these: not shown" in card
    try:
        code = main(["push", str(run), "--repo-id", "me/x", "--dry-run"])
    except SystemExit as e:
        code = e.code
    assert code == 0


def test_a_card_for_another_export_states_none_of_the_runs_numbers(tmp_path, capsys):
    """Issue 31, item 3: --weights OTHER_EXPORT showed RUN's numbers for it."""
    run = _run(tmp_path)
    _other_weights(tmp_path / "elsewhere")
    code, card, _ = _card(capsys, str(run), "--weights", str(tmp_path / "elsewhere"))
    assert code == 0 and not any(n in card for n in NUMBERS)
    same = tmp_path / "copy"  # a byte-identical copy of the run's export is the same weights: numbers shown
    same.mkdir()
    for f in ("config.json", "model.safetensors"):
        (same / f).write_bytes((run / "export" / f).read_bytes())
    code, card, _ = _card(capsys, str(run), "--weights", str(same))
    assert code == 0 and all(n in card for n in NUMBERS)


def test_a_card_of_a_version_1_summary_reads_it_and_states_no_unhashed_number(tmp_path, capsys):
    run = _run(tmp_path)
    raw = json.loads((run / "summary.json").read_text())
    del raw["export_sha1"], raw["export_ema_sha1"]
    (run / "summary.json").write_text(json.dumps(dict(raw, schema_version=1)))
    code, card, _ = _card(capsys, str(run))
    assert code == 0 and "0.6125" not in card and "recorded without the weights' hash" in card


@pytest.mark.parametrize("cut", [0, 7, 100, -16])
def test_a_card_of_a_truncated_export_is_one_line(tmp_path, capsys, cut):
    """Issue 31, T4: a SafetensorError traceback."""
    run = _run(tmp_path, hashed=False)
    weights = run / "export" / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[:cut] if cut >= 0 else data[:cut])
    code, _, err = _card(capsys, str(run))
    _refused(code, err, "is not a whole safetensors file")
