"""Shifts: JPEG equals PIL's round trip byte for byte, blur equals torchvision / scipy, batched equals
per-image, specs parse, bad input fails clearly."""

from __future__ import annotations

import io

import numpy as np
import PIL.Image
import pytest
import torch
import torchvision.transforms.v2 as T
from conftest import IMAGENETTE
from scipy.ndimage import gaussian_filter
from torchvision import tv_tensors
from torchvision.transforms.v2 import functional as F

from timm_posgeom.data.shifts import (
    IMAGENET_C,
    JPEG,
    PAPER_SHIFTS,
    GaussianBlur,
    gaussian_blur_batch,
    imagenet_c,
    parse_shift,
)

pytestmark = pytest.mark.usefixtures("one_thread")


def _natural_like(h: int, w: int, seed: int = 0, mode: str = "RGB") -> PIL.Image.Image:
    """Smooth gradients + edges + noise: enough structure for JPEG and blur to change many pixels."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    base = np.stack([128 + 100 * np.sin(xx / 5 + c) * np.cos(yy / 7 - c) for c in range(3)], -1)
    base[h // 3 : h // 2, w // 4 : w // 2] = [250, 10, 60]  # a hard-edged block
    img = np.clip(base + rng.normal(0, 20, base.shape), 0, 255).astype(np.uint8)
    out = PIL.Image.fromarray(img)
    return out.convert(mode) if mode != "RGB" else out


def _pil_round_trip(img: PIL.Image.Image, quality: int) -> np.ndarray:
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=quality)
    buf.seek(0)
    return np.asarray(PIL.Image.open(buf))


def _scipy_imagenet_c_blur(img: PIL.Image.Image, sigma: float) -> np.ndarray:
    """ImageNet-C: skimage gaussian(x / 255, sigma, multichannel) = scipy per channel, then uint8."""
    x = np.asarray(img, dtype=np.float64) / 255.0
    if x.ndim == 2:
        y = gaussian_filter(x, sigma, mode="nearest", truncate=4.0)
    else:
        y = np.stack([gaussian_filter(x[..., c], sigma, mode="nearest", truncate=4.0) for c in range(x.shape[-1])], -1)
    return (np.clip(y, 0, 1) * 255).astype(np.uint8)


# ------------------------------------------------------------------------------------------
# JPEG
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("quality", [5, 7, 25, 75, 100])
@pytest.mark.parametrize("size,mode", [((48, 64), "RGB"), ((37, 53), "RGB"), ((40, 40), "L")])
def test_jpeg_equals_pil_round_trip_byte_for_byte(quality, size, mode):
    img = _natural_like(*size, seed=quality, mode=mode)
    expected = _pil_round_trip(img, quality)
    out = JPEG(quality)(img)
    assert isinstance(out, PIL.Image.Image) and out.mode == img.mode
    assert np.array_equal(np.asarray(out), expected)
    assert not np.array_equal(np.asarray(out), np.asarray(img))  # it did compress
    # torchvision's own v2.JPEG on PIL: the same bytes (the semantics we promise)
    assert np.array_equal(np.asarray(T.JPEG(quality)(img)), expected)
    # a uint8 tensor (and a batch of them) takes the same round trip
    t = F.pil_to_tensor(img)
    assert torch.equal(JPEG(quality)(t), F.pil_to_tensor(PIL.Image.fromarray(expected)))
    batch = torch.stack([t, t])
    assert torch.equal(JPEG(quality)(batch), torch.stack([JPEG(quality)(t)] * 2))
    wrapped = JPEG(quality)(tv_tensors.Image(t))
    assert isinstance(wrapped, tv_tensors.Image)


@pytest.mark.skipif(not IMAGENETTE.exists(), reason="Imagenette copy not present")
def test_jpeg_and_blur_on_real_images():
    datasets = pytest.importorskip("datasets")
    ds = datasets.load_dataset(str(IMAGENETTE), split="validation")
    for i in range(3):
        img = ds[i]["image"].convert("RGB")
        assert np.array_equal(np.asarray(JPEG(5)(img)), _pil_round_trip(img, 5))
        diff = np.abs(np.asarray(GaussianBlur(2.0)(img)).astype(int) - _scipy_imagenet_c_blur(img, 2.0))
        assert diff.max() <= 1


def test_jpeg_bad_input():
    for q in (0, 101, -5, 2.5, True, "5"):
        with pytest.raises(ValueError, match="quality must be an integer from 1 to 100"):
            JPEG(q)
    with pytest.raises(TypeError, match="uint8"):
        JPEG(5)(torch.rand(3, 8, 8))


# ------------------------------------------------------------------------------------------
# blur
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("severity,sigma", list(enumerate(IMAGENET_C["gaussian_blur"], start=1)))
def test_imagenet_c_blur_within_one_gray_level_of_scipy(severity, sigma):
    shift = imagenet_c("gaussian_blur", severity)
    assert shift.sigma == sigma and shift.kernel_size is None
    for img in (_natural_like(40, 56, seed=severity), _natural_like(12, 9, seed=1, mode="L")):  # radius > size too
        out = np.asarray(shift(img))
        expected = _scipy_imagenet_c_blur(img, sigma)
        assert out.shape == expected.shape
        assert np.abs(out.astype(int) - expected.astype(int)).max() <= 1


def test_paper_blur_is_torchvision_gaussian_blur():
    img = _natural_like(48, 64)
    shift = parse_shift("blur:2.5:5")
    assert (shift.sigma, shift.kernel_size) == (2.5, 5)
    reference = T.GaussianBlur(kernel_size=5, sigma=2.5)
    assert np.array_equal(np.asarray(shift(img)), np.asarray(reference(img)))
    t = F.pil_to_tensor(img)
    assert torch.equal(shift(t), reference(t))
    assert not torch.equal(shift(t), t)


@pytest.mark.parametrize("sigma,kernel", [(2.5, 5), (1.0, None), (6.0, None), (0.7, 3)])
def test_batched_blur_equals_per_image(sigma, kernel):
    shift = GaussianBlur(sigma, kernel)
    images = [_natural_like(32, 40, seed=s) for s in range(5)]
    batch = torch.stack([F.pil_to_tensor(im) for im in images])  # (5, 3, 32, 40) uint8
    per_image = torch.stack([F.pil_to_tensor(shift(im)) for im in images])
    assert torch.equal(gaussian_blur_batch(batch, sigma, kernel), per_image)
    assert torch.equal(shift.batch(batch[:2]), per_image[:2])  # any batch size
    floats = batch.float() / 255
    assert torch.equal(gaussian_blur_batch(floats, sigma, kernel)[3], shift(floats[3]))
    if torch.cuda.is_available():
        on_device = gaussian_blur_batch(batch.cuda(), sigma, kernel).cpu()
        if kernel is None:  # element-wise in a fixed order: bit-identical on any device
            assert torch.equal(on_device, per_image)
        else:  # torchvision's conv2d: cuDNN may sum in another order, so rare pixels round the other way
            assert (on_device.int() - per_image.int()).abs().max() <= 1


def test_blur_bad_input():
    for sigma in (0, -1.0, float("nan"), "x"):
        with pytest.raises(ValueError, match="sigma must be"):
            GaussianBlur(sigma)
    for kernel in (4, 0, -3, 2.0):
        with pytest.raises(ValueError, match="kernel size must be an odd positive integer"):
            GaussianBlur(1.0, kernel)


# ------------------------------------------------------------------------------------------
# presets and specs
# ------------------------------------------------------------------------------------------
def test_imagenet_c_presets():
    assert [imagenet_c("jpeg_compression", s).quality for s in range(1, 6)] == [25, 18, 15, 10, 7]
    assert [imagenet_c("gaussian_blur", s).sigma for s in range(1, 6)] == [1, 2, 3, 4, 6]
    assert imagenet_c("jpeg_compression", 4).spec == "imagenet-c:jpeg_compression:4"
    for bad in (0, 6, 2.0):
        with pytest.raises(ValueError, match="severity must be an integer from 1 to 5"):
            imagenet_c("gaussian_blur", bad)
    with pytest.raises(ValueError, match="unknown ImageNet-C corruption 'sharpen'; supported: gaussian_noise, "):
        imagenet_c("sharpen", 1)


def test_parse_shift_specs():
    assert PAPER_SHIFTS == ("jpeg:5", "blur:2.5:5")
    s = parse_shift("jpeg:5")
    assert isinstance(s, JPEG) and s.quality == 5 and s.spec == "jpeg:5"
    b = parse_shift("blur:3")
    assert isinstance(b, GaussianBlur) and (b.sigma, b.kernel_size, b.spec) == (3.0, None, "blur:3")
    assert parse_shift("blur:2.5:5").spec == "blur:2.5:5"
    c = parse_shift("imagenet-c:gaussian_blur:5")
    assert isinstance(c, GaussianBlur) and c.sigma == 6 and c.spec == "imagenet-c:gaussian_blur:5"
    assert parse_shift("imagenet-c:jpeg_compression:2").quality == 18
    assert parse_shift(b) is b


@pytest.mark.parametrize(
    "spec", ["gamma:2", "jpeg", "jpeg:5:1", "blur", "blur:1:2:3", "imagenet-c:jpeg_compression", "", 5, "contrast:0.5"]
)
def test_unknown_spec_lists_valid_forms(spec):
    with pytest.raises(ValueError) as err:
        parse_shift(spec)
    msg = str(err.value)
    for form in ("jpeg:Q", "blur:SIGMA[:KERNEL]", "imagenet-c:NAME:SEVERITY"):
        assert form in msg


@pytest.mark.parametrize(
    "spec,match",
    [
        ("jpeg:0", "from 1 to 100"),
        ("jpeg:101", "from 1 to 100"),
        ("jpeg:high", "must be an integer"),
        ("blur:0", "sigma must be"),
        ("blur:-2:5", "sigma must be"),
        ("blur:2:4", "odd positive"),
        ("imagenet-c:gaussian_blur:0", "from 1 to 5"),
        ("imagenet-c:gaussian_blur:6", "from 1 to 5"),
        ("imagenet-c:sharpen:1", "unknown ImageNet-C corruption"),
        ("imagenet-c:fog:6", "from 1 to 5"),
    ],
)
def test_out_of_range_specs(spec, match):
    with pytest.raises(ValueError, match=match):
        parse_shift(spec)


def test_shifts_compose_as_v2_transforms():
    img = _natural_like(32, 32)
    pipeline = T.Compose([T.Resize((24, 24)), parse_shift("jpeg:10"), parse_shift("blur:1:3"), T.PILToTensor()])
    out = pipeline(img)
    expected = F.pil_to_tensor(T.GaussianBlur(3, 1.0)(T.JPEG(10)(T.Resize((24, 24))(img))))
    assert torch.equal(out, expected)
