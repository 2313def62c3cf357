"""ImageNet-C in full: the maintained imagecorruptions package agrees with our JPEG and blur, every
corruption is seeded, the mean FS is computed as defined in one pass, and released trees are checked
before they are read."""

from __future__ import annotations

import json
import math
import sys

import numpy as np
import PIL.Image
import pytest
import timm
import torch
import torch.nn as nn
from conftest import IMAGENETTE
from torchvision.transforms.v2 import functional as F

import timm_posgeom.data.shifts as shifts_module
from timm_posgeom.data.shifts import (
    IMAGENET_C_CORRUPTIONS,
    IMAGENET_C_EXTRA,
    JPEG,
    Corruption,
    GaussianBlur,
    MissingDependencyError,
    image_seed,
    imagenet_c,
    imagenet_c_shifts,
    parse_shift,
)
from timm_posgeom.data.transforms import eval_transform
from timm_posgeom.interventions import image_permutations, token_permutation
from timm_posgeom.robustness import fragility
from timm_posgeom.robustness.fragility_eval import forward_in_pieces
from timm_posgeom.robustness.imagenet_c import (
    ImageNetCResult,
    ImageNetCTreeError,
    check_imagenet_c_tree,
    frame_like_imagenet_c,
    imagenet_c_fragility,
    imagenet_c_released,
)

pytestmark = pytest.mark.usefixtures("one_thread")
FAST = dict(num_workers=0, progress=False)
needs_package = pytest.importorskip  # the tests that need imagecorruptions (the extra timm-posgeom[imagenet-c])


def _natural(h: int, w: int, seed: int = 0) -> PIL.Image.Image:
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    base = np.stack([128 + 90 * np.sin(xx / (3 + seed % 5) + c) * np.cos(yy / 4 - c) for c in range(3)], -1)
    return PIL.Image.fromarray(np.clip(base + rng.normal(0, 20, base.shape), 0, 255).astype(np.uint8))


class MeanBrightness(nn.Module):
    """Stub 2-class classifier: class 1 when the mean normalised pixel is > 0. Counts its forwards."""

    def __init__(self, size: int = 32):
        super().__init__()
        self.pretrained_cfg = {
            "architecture": "mean_brightness",
            "input_size": (3, size, size),
            "mean": (0.5,) * 3,
            "std": (0.5,) * 3,
            "interpolation": "bilinear",
            "crop_pct": 0.875,
            "crop_mode": "center",
        }
        self.anchor = nn.Parameter(torch.zeros(()))
        self.forwards: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.forwards.append(x.shape[0])
        m = x.mean(dim=(1, 2, 3))
        return torch.stack([-m, m], dim=1)


def _dark_and_bright(n: int = 6, size: int = 40) -> list[tuple[PIL.Image.Image, int]]:
    """Textured images, dark (label 0) and bright (label 1): MeanBrightness gets all of them right."""
    out = []
    for i in range(n):
        img = np.asarray(_natural(size, size, seed=i)).astype(float)
        label = i % 2
        img = img * 0.35 + (150 if label else 15)
        out.append((PIL.Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)), label))
    return out


# ------------------------------------------------------------------------------------------
# the maintained implementation against ours
# ------------------------------------------------------------------------------------------
@pytest.mark.skipif(not IMAGENETTE.exists(), reason="Imagenette copy not present")
def test_imagecorruptions_agrees_with_our_jpeg_and_blur_on_real_images():
    """imagecorruptions' jpeg_compression and gaussian_blur equal our imagenet_c(...) bit for bit, at
    every severity, on real images at their own size and resized to a model's 64 px."""
    ic = needs_package("imagecorruptions")
    datasets = pytest.importorskip("datasets")
    ds = datasets.load_dataset(str(IMAGENETTE), split="validation")
    images = [ds[i]["image"].convert("RGB") for i in range(6)]
    images += [im.resize((64, 64), PIL.Image.BICUBIC) for im in images]
    for name in ("jpeg_compression", "gaussian_blur"):
        for severity in range(1, 6):
            ours = imagenet_c(name, severity)
            assert isinstance(ours, JPEG if name == "jpeg_compression" else GaussianBlur)
            for img in images:
                theirs = ic.corrupt(np.asarray(img), severity=severity, corruption_name=name)
                assert np.array_equal(np.asarray(ours(img)), theirs), (name, severity, img.size)


# ------------------------------------------------------------------------------------------
# corruptions
# ------------------------------------------------------------------------------------------
def test_every_corruption_is_seeded_and_keeps_the_image_format():
    needs_package("imagecorruptions")
    img = _natural(48, 40, seed=3)
    before = np.random.get_state()[1].copy()
    for name in (*IMAGENET_C_CORRUPTIONS, *IMAGENET_C_EXTRA):
        for severity in (1, 5):
            shift = imagenet_c(name, severity)
            assert shift.spec == f"imagenet-c:{name}:{severity}" and parse_shift(shift.spec).spec == shift.spec
            a = np.asarray(shift.for_image(img, 7, 0))
            b = np.asarray(shift.for_image(img, 7, 0))
            assert a.shape == (48, 40, 3) and a.dtype == np.uint8
            assert np.array_equal(a, b), name  # the same image, index and seed: the same pixels
            assert not np.array_equal(a, np.asarray(img)), name
            if name in (
                "gaussian_noise",
                "shot_noise",
                "impulse_noise",
                "glass_blur",
                "snow",
                "fog",
                "elastic_transform",
                "motion_blur",
                "speckle_noise",
            ):
                assert not np.array_equal(a, np.asarray(shift.for_image(img, 8, 0))), name  # another image's draws
    assert np.array_equal(np.random.get_state()[1], before)  # NumPy's global generator is left as it was


def test_corruption_object():
    needs_package("imagecorruptions")
    assert isinstance(imagenet_c("fog", 2), Corruption) and not isinstance(
        imagenet_c("jpeg_compression", 2), Corruption
    )
    c = Corruption("gaussian_noise", 3, seed=5)
    img = _natural(32, 36)
    # as a transform every image uses the corruption's own seed; for_image the per-image seed
    assert np.array_equal(np.asarray(c(img)), np.asarray(Corruption("gaussian_noise", 3, seed=5)(img)))
    assert np.array_equal(
        np.asarray(c.for_image(img, 4, 9)),
        np.asarray(Corruption("gaussian_noise", 3, seed=image_seed(9, 4, "gaussian_noise"))(img)),
    )
    t = F.pil_to_tensor(img)
    assert torch.equal(c(t), F.pil_to_tensor(c(img)))  # tensors take the PIL path
    assert torch.equal(c(torch.stack([t, t]))[1], c(t))
    gray = img.convert("L")
    assert c(gray).mode == "L"
    with pytest.raises(ValueError, match="at least 32 x 32"):
        c(_natural(20, 40))
    with pytest.raises(ValueError, match="severity must be an integer from 1 to 5"):
        Corruption("fog", 0)
    with pytest.raises(ValueError, match="unknown ImageNet-C corruption"):
        Corruption("sharpen", 1)
    # severities share the draws (strength is all that changes), corruptions do not
    assert image_seed(0, 3, "fog") == image_seed(0, 3, "fog") != image_seed(0, 3, "frost")
    assert image_seed(0, 3, "fog") != image_seed(1, 3, "fog")


def test_imagenet_c_shifts():
    specs = imagenet_c_shifts()
    assert (
        len(specs) == 75 and specs[0] == "imagenet-c:gaussian_noise:1" and specs[-1] == "imagenet-c:jpeg_compression:5"
    )
    assert imagenet_c_shifts("fog,frost", [2]) == ["imagenet-c:fog:2", "imagenet-c:frost:2"]
    assert len(imagenet_c_shifts("extra")) == 20
    for bad, match in [("fog,fog", "repeat"), ("fog,sharpen", "unknown"), ("", "no ImageNet-C corruptions")]:
        with pytest.raises(ValueError, match=match):
            imagenet_c_shifts(bad)
    with pytest.raises(ValueError, match="from 1 to 5"):
        imagenet_c_shifts("fog", [0])


def _without_package(monkeypatch, module=None):
    monkeypatch.setitem(sys.modules, "imagecorruptions", module)
    shifts_module._corruption_functions.cache_clear()


def test_missing_package_is_one_clear_line(monkeypatch, tmp_path, capsys):
    _without_package(monkeypatch)
    try:
        with pytest.raises(MissingDependencyError, match=r"pip install 'timm-posgeom\[imagenet-c\]'"):
            imagenet_c("fog", 1)
        assert isinstance(imagenet_c("jpeg_compression", 1), JPEG)  # ours need nothing
        assert isinstance(imagenet_c("gaussian_blur", 1), GaussianBlur)
        from timm_posgeom.cli import main

        with pytest.raises(SystemExit) as exit_info:
            main(
                [
                    "fragility",
                    "posgeom_vit_micro_patch8_64_ape",
                    "--data",
                    "synthetic",
                    "--imagenet-c",
                    "--out",
                    str(tmp_path),
                ]
            )
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and len(err.strip().splitlines()) == 1 and "timm-posgeom[imagenet-c]" in err
        # bethgelab's imagecorruptions 1.1.2: imports on an old setuptools, but its glass_blur takes no seed
        fake = type(sys)("imagecorruptions")
        fake.corruption_dict = {"glass_blur": lambda x, severity=1: x}
        _without_package(monkeypatch, fake)
        with pytest.raises(MissingDependencyError, match="cannot be seeded.*pip uninstall imagecorruptions"):
            Corruption("glass_blur", 1)
        # a package that fails to import: bethgelab's under setuptools >= 81, or OpenCV without libGL
        for body, match in [
            (
                "raise ModuleNotFoundError(\"No module named 'pkg_resources'\", name='pkg_resources')",
                "bethgelab's 1.1.2.*pip uninstall imagecorruptions",
            ),
            (
                "raise ImportError('libGL.so.1: cannot open shared object file\\nmore')",
                r"does not import here \(libGL.so.1: cannot open shared object file\); .*headless",
            ),
        ]:
            folder = tmp_path / f"fake{len(match)}" / "imagecorruptions"
            folder.mkdir(parents=True)
            (folder / "__init__.py").write_text(body + "\n")
            monkeypatch.delitem(sys.modules, "imagecorruptions")
            monkeypatch.syspath_prepend(str(folder.parent))
            shifts_module._corruption_functions.cache_clear()
            with pytest.raises(MissingDependencyError, match=match):
                imagenet_c("frost", 2)
            monkeypatch.setitem(sys.modules, "imagecorruptions", None)
            sys.path.remove(str(folder.parent))
    finally:
        shifts_module._corruption_functions.cache_clear()


# ------------------------------------------------------------------------------------------
# mean FS
# ------------------------------------------------------------------------------------------
def _result(fs: dict[str, dict[int, float]], clean: float = 0.8) -> ImageNetCResult:
    names, sev = list(fs), sorted(next(iter(fs.values())))
    acc = {c: {s: clean * (1 - fs[c][s]) for s in sev} for c in names}
    counts = {"clean": {"correct": 8, "total": 10}, **{c: {s: {"correct": 0, "total": 10} for s in sev} for c in names}}
    return ImageNetCResult(names, sev, 10, clean, acc, fs, counts, "generated")


def test_mean_fs_and_normalised_mean():
    r = _result({"fog": {1: 0.1, 2: 0.3}, "frost": {1: 0.2, 2: 0.6}})
    assert r.corruption_fs == pytest.approx({"fog": 0.2, "frost": 0.4})
    assert r.mean_fs == pytest.approx(0.3) and not r.complete
    ref = _result({"fog": {1: 0.2, 2: 0.2}, "frost": {1: 0.4, 2: 0.4}})
    assert r.relative_fs(ref) == pytest.approx({"fog": 1.0, "frost": 1.0})  # sum_s FS / sum_s FS_ref
    assert r.mean_relative_fs(ref.fs) == pytest.approx(1.0)
    harmless = _result({"fog": {1: 0.0, 2: -0.1}, "frost": {1: 0.1, 2: 0.1}})  # fog does not hurt the reference
    with pytest.warns(RuntimeWarning, match="sums to -0.1"):
        assert math.isnan(r.relative_fs(harmless)["fog"])
        assert math.isnan(r.mean_relative_fs(harmless))
        assert r.mean_relative_fs(harmless, defined_only=True) == pytest.approx(0.8 / 0.2)
        assert (
            "mean rFS over the 1 corruption(s) where it is defined (left out, the reference's FS sums to <= 0: "
            "fog): 4.000" in r.to_markdown(reference=harmless)
        )
    with pytest.raises(ValueError, match="lacks 2"):
        r.relative_fs(_result({"fog": {1: 0.1, 2: 0.1}}))
    back = ImageNetCResult.from_dict(json.loads(r.to_json()))
    assert back.fs == r.fs and back.severities == [1, 2] and back.mean_fs == pytest.approx(r.mean_fs)
    table = r.to_markdown(reference=ref)
    assert (
        "| fog | 0.100 | 0.300 | 0.200 |" in table and "mean FS over 2 corruption(s)" in table and "mean rFS" in table
    )
    with pytest.raises(ValueError, match="not an ImageNet-C result"):
        ImageNetCResult.from_dict({"corruptions": ["fog"]})


def test_generated_run_is_one_pass_and_reproducible():
    needs_package("imagecorruptions")
    data = _dark_and_bright(6)
    model = MeanBrightness()
    r = imagenet_c_fragility(model, data, "brightness,contrast,fog", batch_size=10, **FAST)
    v = 1 + 15  # clean + 3 corruptions x 5 severities
    assert sum(model.forwards) == 6 * v and max(model.forwards) <= 10  # every copy once, in pieces of <= 10
    assert r.clean_accuracy == 1.0 and r.num_images == 6 and r.source == "generated"
    f = r.fragility
    assert f.shifts == imagenet_c_shifts("brightness,contrast,fog")
    for c in r.corruptions:
        for s in r.severities:
            assert r.fs[c][s] == f.fs[f"imagenet-c:{c}:{s}"] == 1 - r.accuracy[c][s] / r.clean_accuracy
    assert r.corruption_fs["brightness"] == pytest.approx(np.mean([r.fs["brightness"][s] for s in range(1, 6)]))
    assert r.mean_fs == pytest.approx(np.mean(list(r.corruption_fs.values())))
    assert r.fs["brightness"][5] > 0  # brighter dark images cross the threshold
    again = imagenet_c_fragility(MeanBrightness(), data, ["brightness", "contrast", "fog"], batch_size=64, **FAST)
    assert all(np.array_equal(f.correct[k], again.fragility.correct[k]) for k in f.correct)
    saved = json.loads(r.to_json())
    assert saved["mean_fs"] == pytest.approx(r.mean_fs) and saved["fragility"]["num_images"] == 6


def test_forward_in_pieces_equals_one_forward_with_rpi():
    """Under RPI each image keeps its own permutation whatever the pieces: the same predictions as one forward."""
    torch.manual_seed(0)
    model = timm.create_model(
        "vit_small_patch16_224", img_size=32, patch_size=8, depth=1, embed_dim=32, num_heads=2, num_classes=3
    )
    data = [(_natural(40, 40, seed=s), s % 3) for s in range(5)]
    shifts = ["jpeg:5", "blur:1", "jpeg:20"]
    whole = fragility(model, data, shifts, batch_size=3, rpi=True, seed=1, **FAST)
    pieces = fragility(model, data, shifts, batch_size=3, rpi=True, seed=1, forward_size=2, **FAST)
    assert all(np.array_equal(whole.correct[k], pieces.correct[k]) for k in whole.correct)
    with pytest.raises(ValueError, match="forward_size must be >= 1"):
        fragility(model, data, shifts, forward_size=0, **FAST)
    # under RPI every row carries its own permutation (one per image): the pieces apply exactly those rows'
    model.eval()
    with torch.no_grad():
        model.pos_embed.normal_(0, 1)  # a PE strong enough for the permutation to show in the outputs
    model.head = nn.Identity()  # the class token's features (the random head squashes the differences)
    x = torch.randn(7, 3, 32, 32)
    perms = image_permutations(16, 3, range(7))  # (7, 16): 4 x 4 patches of 8 px

    def rows(n):
        return perms

    with torch.no_grad(), token_permutation(model, per="given") as handle:
        pieces = forward_in_pieces(model, x, 3, handle, rows)
        whole = forward_in_pieces(model, x, None, handle, rows)
        shared = forward_in_pieces(model, x, None, handle, lambda n: perms[:1].expand(7, -1))
    assert (pieces - whole).abs().max() < 1e-6
    assert (shared - whole).abs().max() > 1e-4  # another permutation for the other images shows


# ------------------------------------------------------------------------------------------
# released images
# ------------------------------------------------------------------------------------------
class _Split(list):
    """A list of (PIL, label) with class names, like an ImageSplit."""

    def __init__(self, items, classes):
        super().__init__(items)
        self.classes = list(classes)
        self.labels = [label for _, label in items]


def _write_tree(root, data, classes, corruptions=("fog", "jpeg_compression"), severities=(1, 2), size=None):
    """The released layout ROOT/CORRUPTION/SEVERITY/CLASS/IMAGE: each image corrupted by us and saved
    as JPEG quality 85, as ImageNet-C's release."""
    for c in corruptions:
        for s in severities:
            shift = imagenet_c(c, s)
            for i, (img, label) in enumerate(data):
                folder = root / c / str(s) / classes[label]
                folder.mkdir(parents=True, exist_ok=True)
                img = frame_like_imagenet_c(img) if size is None else img.resize((size, size))  # as the release
                shift.for_image(img, i, 0).save(folder / f"ILSVRC2012_val_{i:08d}.JPEG", quality=85)
    return root


def _tree_data():
    """Real Imagenette images, the first of each class (class names as folders), when present; else
    textured ones."""
    if IMAGENETTE.exists():
        datasets = pytest.importorskip("datasets")
        ds = datasets.load_dataset(str(IMAGENETTE), split="validation")
        classes = ds.features["label"].names
        labels = ds["label"]
        first = [labels.index(k) for k in range(len(classes))]
        return _Split([(ds[i]["image"].convert("RGB").resize((48, 48)), labels[i]) for i in first], classes)
    return _Split([(_natural(48, 48, seed=i), i % 3) for i in range(6)], ["tench", "church", "parachute"])


@pytest.mark.filterwarnings("ignore:clean accuracy is 0")
def test_released_tree_gives_the_accuracy_of_its_images(tmp_path):
    needs_package("imagecorruptions")
    data = _tree_data()
    classes = data.classes
    root = _write_tree(tmp_path / "c", data, classes, severities=(1, 2, 3, 4, 5))
    torch.manual_seed(0)
    model = timm.create_model("posgeom_vit_micro_patch8_64_ape", num_classes=len(classes), img_size=32)
    r = imagenet_c_released(model, data, root, "fog,jpeg_compression", batch_size=8, **FAST)
    assert r.source == "released" and r.fragility is None and r.num_images == len(data)
    clean = fragility(model, [(frame_like_imagenet_c(img), y) for img, y in data], (), **FAST)
    assert r.clean_accuracy == clean.clean_accuracy and r.settings["clean_framing"] == "imagenet-c"
    transform = eval_transform(model)
    model.eval()
    for c in ("fog", "jpeg_compression"):
        for s in range(1, 6):
            files = sorted((root / c / str(s)).rglob("*.JPEG"))
            with torch.no_grad():
                preds = [int(model(transform(PIL.Image.open(p).convert("RGB"))[None]).argmax()) for p in files]
            labels = [classes.index(p.parent.name) for p in files]
            k = sum(p == y for p, y in zip(preds, labels))
            assert r.counts[c][s] == {"correct": k, "total": len(data)}
            assert r.accuracy[c][s] == k / len(data)
            if r.clean_accuracy:
                assert r.fs[c][s] == pytest.approx(1 - r.accuracy[c][s] / r.clean_accuracy)
    assert r.mean_fs == pytest.approx(np.mean(list(r.corruption_fs.values()))) or math.isnan(r.mean_fs)


def test_released_images_and_clean_images_are_framed_alike(tmp_path):
    """The released images are ImageNet's resized to 256 and centre-cropped to 224, then corrupted; the clean
    ones were given only the model's resize, so FS held the other framing too. Here the framing alone flips a
    brightness classifier (white border, black centre): a tree of uncorrupted framed copies gave FS 1; with
    the clean images framed alike it is 0, and 'as-is' keeps the old comparison."""
    image = PIL.Image.new("RGB", (400, 300), (255, 255, 255))
    image.paste((0, 0, 0), (80, 30, 320, 270))  # 48% black: brighter than mid-grey whole, dark once framed
    dark = PIL.Image.new("RGB", (400, 300), (0, 0, 0))  # class 0 however it is framed
    data = _Split([(image, 1), (dark, 0)], ["tench", "church"])
    root = tmp_path / "c"
    for c in ("fog", "snow"):
        for i, (img, label) in enumerate(data):
            folder = root / c / "1" / data.classes[label]
            folder.mkdir(parents=True)
            frame_like_imagenet_c(img).save(folder / f"{i}.png")  # lossless: the very pixels, no corruption
    model = MeanBrightness()
    r = imagenet_c_released(model, data, root, "fog,snow", (1,), **FAST)
    assert frame_like_imagenet_c(image).size == (224, 224) and r.settings["clean_framing"] == "imagenet-c"
    assert r.clean_accuracy == 0.5 and r.fs["fog"][1] == 0.0 and r.fs["snow"][1] == 0.0  # both see the dark centre
    old = imagenet_c_released(model, data, root, "fog,snow", (1,), clean_framing="as-is", **FAST)
    assert old.clean_accuracy == 1.0 and old.fs["fog"][1] == 0.5  # the framing alone
    with pytest.raises(ValueError, match="clean_framing must be one of"):
        imagenet_c_released(model, data, root, "fog", (1,), clean_framing="crop", **FAST)


def test_released_tree_refusals(tmp_path):
    needs_package("imagecorruptions")
    data = _Split([(_natural(40, 40, seed=i), i % 2) for i in range(4)], ["tench", "church"])
    root = _write_tree(tmp_path / "c", data, data.classes)
    ok = check_imagenet_c_tree(root, data.classes, "fog,jpeg_compression", (1, 2))
    assert ok == [
        ("tench/ILSVRC2012_val_00000000.JPEG", 0),
        ("tench/ILSVRC2012_val_00000002.JPEG", 0),
        ("church/ILSVRC2012_val_00000001.JPEG", 1),
        ("church/ILSVRC2012_val_00000003.JPEG", 1),
    ]
    model = MeanBrightness()

    def refused(match, **kw):
        with pytest.raises(ImageNetCTreeError, match=match):
            args = dict(corruptions="fog,jpeg_compression", severities=(1, 2))
            args.update(kw)
            check_imagenet_c_tree(args.pop("root", root), args.pop("classes", data.classes), **args)

    refused("lacks the corruption folder.*frost", corruptions="fog,frost")
    refused("lacks the severity folder.*fog/3", severities=(1, 2, 3))
    refused("no folder for 1 of the 3 classes.*parachute", classes=[*data.classes, "parachute"])
    refused("is not a folder", root=tmp_path / "nowhere")
    (root / "fog" / "1" / "golf ball").mkdir()
    refused("folder.*that are none of the classes.*golf ball")
    check_imagenet_c_tree(root, data.classes, "fog,jpeg_compression", (1, 2), extra_classes="ignore")
    (root / "fog" / "1" / "golf ball").rmdir()
    for p in (root / "fog" / "2" / "church").iterdir():
        p.rename(tmp_path / p.name)
    refused(r"fog/2/church holds no image")
    moved = sorted(tmp_path.glob("*.JPEG"))
    moved[0].rename(root / "fog" / "2" / "church" / moved[0].name)  # one of the two back: an incomplete copy
    refused(r"fog/2/church and fog/1/church hold different images \(1 vs 2")
    for p in moved[1:]:
        p.rename(root / "fog" / "2" / "church" / p.name)
    check_imagenet_c_tree(root, data.classes, "fog,jpeg_compression", (1, 2))
    # the tree must be the clean split's images: a subset of the clean split is refused
    with pytest.raises(ImageNetCTreeError, match="the clean split has 1 images of 'church' but .* has 2"):
        imagenet_c_released(model, _Split(data[:3], data.classes), root, "fog", (1, 2), **FAST)
    # class folders named otherwise (wnids): refused, with a hint; accepted when named
    with pytest.raises(ImageNetCTreeError, match="pass the class folders"):
        check_imagenet_c_tree(root, ["n01440764", "n03028079"], "fog", (1,))
    ok = check_imagenet_c_tree(root, ["a", "b"], "fog", (1,), class_folders=["tench", "church"])
    assert [label for _, label in ok] == [0, 0, 1, 1]


@pytest.mark.filterwarnings("ignore:the reference's FS")  # a random model: the reference's FS may sum to 0
@pytest.mark.filterwarnings("ignore:clean accuracy is 0")
def test_cli_imagenet_c(tmp_path, capsys):
    needs_package("imagecorruptions")
    from timm_posgeom.cli import main

    data = _Split([(_natural(40, 40, seed=i), i % 2) for i in range(4)], ["church", "tench"])
    clean = tmp_path / "clean" / "validation"
    for i, (img, label) in enumerate(data):
        (clean / data.classes[label]).mkdir(parents=True, exist_ok=True)
        img.save(clean / data.classes[label] / f"{i}.png")
    root = _write_tree(tmp_path / "c", data, data.classes, corruptions=("fog", "snow"), severities=(1, 2))
    common = [
        "fragility",
        "posgeom_vit_micro_patch8_64_ape",
        "--num-classes",
        "2",
        "--img-size",
        "32",
        "--data",
        str(tmp_path / "clean"),
        "--batch-size",
        "8",
        "--num-workers",
        "0",
        "--no-progress",
        "--device",
        "cpu",
        "--imagenet-c",
        "fog,snow",
        "--severities",
        "1,2",
    ]
    assert main([*common, "--out", str(tmp_path / "gen")]) == 0
    out = capsys.readouterr().out
    assert "| fog |" in out and "mean FS over 2 corruption(s) x severities 1,2" in out
    saved = json.loads((tmp_path / "gen" / "imagenet_c.json").read_text())
    assert saved["source"] == "generated" and saved["corruptions"] == ["fog", "snow"]
    assert len(json.loads((tmp_path / "gen" / "fragility.json").read_text())["shifts"]) == 4
    assert (
        main(
            [
                *common,
                "--imagenet-c-root",
                str(root),
                "--reference",
                str(tmp_path / "gen" / "imagenet_c.json"),
                "--out",
                str(tmp_path / "rel"),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "ImageNet-C released from" in out and "mean rFS" in out
    assert json.loads((tmp_path / "rel" / "imagenet_c.json").read_text())["source"] == "released"
    for extra, match in [
        (["--imagenet-c-root", str(tmp_path / "clean")], "lacks the corruption folder"),
        (["--shift", "jpeg:5"], "exclude each other"),
        (["--severities", "1,7"], "from 1 to 5"),
    ]:
        with pytest.raises(SystemExit) as exit_info:
            main([*common, *extra, "--out", str(tmp_path / "bad")])
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and match in err and len(err.strip().splitlines()) == 1
