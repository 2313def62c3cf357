"""Distribution shifts for fragility scores: JPEG, Gaussian blur, and all of ImageNet-C.

Our own two corruptions (docs/method.md#fragility-score-and-shifts), as the paper and ImageNet-C define
them, usable as torchvision v2 transforms on PIL images and on uint8 tensors of shape (..., C, H, W):

* :class:`JPEG` ``(quality)``: encode and decode with PIL at ``quality`` (1-100). On a PIL image this
  is exactly what ``torchvision.transforms.v2.JPEG`` does (PIL save / reload); tensors go through
  the same PIL round trip, so every input type gets the same bytes.
* :class:`GaussianBlur` ``(sigma, kernel_size=None)``:

  - with ``kernel_size`` (odd): torchvision's ``GaussianBlur(kernel_size, sigma)`` exactly (kernel
    truncated to ``kernel_size`` taps, reflect padding, rounded back to uint8). The paper's blur is
    ``blur:2.5:5`` = sigma 2.5, kernel 5.
  - without: ImageNet-C's ``gaussian_blur``, i.e. ``skimage.filters.gaussian(x / 255, sigma,
    channel_axis=-1)``: per channel, kernel radius ``int(4 * sigma + 0.5)`` (truncate 4.0), edges
    replicated (mode ``nearest``), float64, then ``uint8(clip(y, 0, 1) * 255)`` (truncation, as
    ImageNet-C's ``np.uint8``). Computed with the same separable sums as
    ``scipy.ndimage.gaussian_filter``.

Text specs (CLI, recipes), parsed by :func:`parse_shift`::

    jpeg:Q                       JPEG at quality Q, e.g. jpeg:5 (the paper)
    blur:SIGMA[:KERNEL]          Gaussian blur, e.g. blur:2.5:5 (the paper; torchvision) or blur:3
    imagenet-c:NAME:SEVERITY     an ImageNet-C corruption at SEVERITY 1-5, e.g. imagenet-c:fog:3

:func:`gaussian_blur_batch` is the batched path for a (B, C, H, W) batch already on the model's
device; it gives the same values as the per-image transform. The ImageNet-C definition uses only
element-wise float64 operations in a fixed order, so it is bit-identical for any batch size and on
any device. The torchvision definition (``kernel_size`` given) is torchvision's own float32
``conv2d``: identical per image and batched on the CPU; on CUDA, cuDNN's summation order may round
rare pixels the other way (one gray level).

ImageNet-C (Hendrycks & Dietterich, 2019): :func:`imagenet_c` gives each of its 15 corruptions
(:data:`IMAGENET_C_CORRUPTIONS`) and its 4 extra ones (:data:`IMAGENET_C_EXTRA`) at severity 1-5.
``jpeg_compression`` and ``gaussian_blur`` are our own :class:`JPEG` (quality 25, 18, 15, 10, 7) and
:class:`GaussianBlur` (sigma 1, 2, 3, 4, 6, ImageNet-C's definition). The other 17 are a
:class:`Corruption`, which calls the maintained ``imagecorruptions`` package (the imaug fork,
PyPI ``imagecorruptions-imaug``, of bethgelab's; the optional extra ``timm-posgeom[imagenet-c]``).
Their random draws come from a seed: in :func:`~timm_posgeom.robustness.fragility` image ``i`` is
corrupted with :func:`image_seed` ``(seed, i, name)``, the same seed at every severity, so a run is
reproducible and the severities of a corruption differ only in strength. The package's
``jpeg_compression`` and ``gaussian_blur`` agree with ours bit for bit (tests/test_imagenet_c.py checks
it on real images at every severity).

Not reproduced from ImageNet-C: its release re-saves every corrupted image as JPEG (quality 85);
here shifts are applied on the fly and the image goes straight to the model. The released images
themselves can be evaluated with :func:`~timm_posgeom.robustness.imagenet_c.imagenet_c_released`.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import io
import math
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import PIL.Image
import torch
from torchvision import tv_tensors
from torchvision.transforms.v2 import Transform
from torchvision.transforms.v2 import functional as F

from ..defaults import PAPER_SHIFTS, SPEC_FORMS
from ..errors import DataError, MissingDependencyError, SettingError, one_line
from .synthetic import seed32

__all__ = [
    "JPEG",
    "GaussianBlur",
    "Corruption",
    "Shift",
    "imagenet_c",
    "imagenet_c_shifts",
    "image_seed",
    "parse_shift",
    "gaussian_blur_batch",
    "PAPER_SHIFTS",
    "IMAGENET_C",
    "IMAGENET_C_CORRUPTIONS",
    "IMAGENET_C_EXTRA",
    "IMAGENET_C_EXTRA_INSTALL",
    "MissingDependencyError",
    "SPEC_FORMS",
]

IMAGENET_C: dict[str, tuple[float, ...]] = {
    "jpeg_compression": (25, 18, 15, 10, 7),  # JPEG quality per severity 1..5
    "gaussian_blur": (1, 2, 3, 4, 6),  # sigma per severity 1..5
}
"""ImageNet-C (Hendrycks & Dietterich, 2019) parameters per severity 1-5 of the two corruptions we
implement ourselves (:class:`JPEG`, :class:`GaussianBlur`)."""

IMAGENET_C_CORRUPTIONS: tuple[str, ...] = (
    "gaussian_noise",
    "shot_noise",
    "impulse_noise",  # noise
    "defocus_blur",
    "glass_blur",
    "motion_blur",
    "zoom_blur",  # blur
    "snow",
    "frost",
    "fog",
    "brightness",  # weather
    "contrast",
    "elastic_transform",
    "pixelate",
    "jpeg_compression",  # digital
)
"""ImageNet-C's 15 corruptions, in its order (noise, blur, weather, digital): the ones mCE averages."""

IMAGENET_C_EXTRA: tuple[str, ...] = ("speckle_noise", "gaussian_blur", "spatter", "saturate")
"""ImageNet-C's 4 extra ("held-out") corruptions, not part of its mCE."""

IMAGENET_C_EXTRA_INSTALL = "pip install 'timm-posgeom[imagenet-c]'"
"""How to install what the ImageNet-C corruptions other than ours need (the imagecorruptions package)."""

_SKIMAGE_TRUNCATE = 4.0


class Shift(Transform):
    """Base class of the shifts: a torchvision v2 transform with a canonical text ``spec``."""

    spec: str = ""

    def extra_repr(self) -> str:
        return f"spec={self.spec!r}"

    def for_image(self, image: Any, index: int, seed: int) -> Any:
        """The shifted ``image``, item ``index`` of a data split, in a run seeded by ``seed``.

        Deterministic shifts ignore ``index`` and ``seed``; random ones (:class:`Corruption`) draw from
        a seed made of both, so every image gets its own draws and a run is reproducible."""
        return self(image)


# --------------------------------------------------------------------------------------------
# JPEG
# --------------------------------------------------------------------------------------------
def _check_quality(quality: Any) -> int:
    if isinstance(quality, bool) or not isinstance(quality, (int, np.integer)) or not 1 <= int(quality) <= 100:
        raise SettingError(f"JPEG quality must be an integer from 1 to 100, got {quality!r}")
    return int(quality)


def _jpeg_pil(image: PIL.Image.Image, quality: int) -> PIL.Image.Image:
    """PIL save / reload at ``quality``: the kernel of ``torchvision.transforms.v2.JPEG`` on PIL."""
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=quality)
    buffer.seek(0)
    return PIL.Image.open(buffer).copy()


def _jpeg_tensor(image: torch.Tensor, quality: int) -> torch.Tensor:
    """(..., C, H, W) uint8 with C in {1, 3}, through PIL one image at a time."""
    if image.dtype != torch.uint8:
        raise TypeError(f"JPEG needs uint8 images, got a tensor of dtype {image.dtype}")
    if image.ndim < 3 or image.shape[-3] not in (1, 3):
        raise ValueError(f"JPEG needs images of shape (..., 1 or 3, H, W), got {tuple(image.shape)}")
    flat = image.reshape((-1, *image.shape[-3:]))
    out = torch.empty_like(flat)
    for i, img in enumerate(flat):
        out[i] = F.pil_to_tensor(_jpeg_pil(F.to_pil_image(img.cpu()), quality)).to(image.device)
    return out.reshape(image.shape)


class JPEG(Shift):
    """JPEG compression and decompression at a fixed ``quality`` (1 = worst, 100 = best).

    On PIL images: ``image.save(buf, "JPEG", quality=quality)`` and reload, exactly as
    ``torchvision.transforms.v2.JPEG`` and ImageNet-C's ``jpeg_compression`` do (4:2:0 chroma
    subsampling, PIL's libjpeg). uint8 tensors (..., C, H, W), C in {1, 3}, take the same PIL
    round trip, so a tensor and its PIL image give identical pixels. Returns the input's type.
    """

    def __init__(self, quality: int):
        super().__init__()
        self.quality = _check_quality(quality)
        self.spec = f"jpeg:{self.quality}"

    def transform(self, inpt: Any, params: dict[str, Any]) -> Any:
        if isinstance(inpt, PIL.Image.Image):
            return _jpeg_pil(inpt, self.quality)
        if isinstance(inpt, torch.Tensor):
            out = _jpeg_tensor(inpt.as_subclass(torch.Tensor), self.quality)
            return tv_tensors.wrap(out, like=inpt) if isinstance(inpt, tv_tensors.TVTensor) else out
        return inpt


# --------------------------------------------------------------------------------------------
# Gaussian blur
# --------------------------------------------------------------------------------------------
def _check_sigma(sigma: Any) -> float:
    try:
        value = float(sigma)
    except (TypeError, ValueError):
        raise SettingError(f"blur sigma must be a number > 0, got {sigma!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise SettingError(f"blur sigma must be a finite number > 0, got {sigma!r}")
    return value


def _check_kernel_size(kernel_size: Any) -> int | None:
    if kernel_size is None:
        return None
    if (
        isinstance(kernel_size, bool)
        or not isinstance(kernel_size, (int, np.integer))
        or kernel_size < 1
        or kernel_size % 2 == 0
    ):
        raise SettingError(f"blur kernel size must be an odd positive integer, got {kernel_size!r}")
    return int(kernel_size)


def _skimage_kernel1d(sigma: float) -> np.ndarray:
    """scipy.ndimage's Gaussian taps for truncate 4.0: length 2r+1, r = int(4 sigma + 0.5), sum 1."""
    radius = int(_SKIMAGE_TRUNCATE * sigma + 0.5)
    x = np.arange(-radius, radius + 1)
    phi = np.exp(-0.5 / (sigma * sigma) * x**2)
    return phi / phi.sum()


def _blur_axis_nearest(x: torch.Tensor, weights: np.ndarray, dim: int) -> torch.Tensor:
    """Correlate ``x`` with a symmetric kernel along ``dim``, edges replicated (scipy mode 'nearest').

    Same order of operations as scipy's symmetric ``correlate1d``:
    ``y[i] = w0 * x[i] + sum_j w_j * (x[i - j] + x[i + j])``, j = r down to 1, element-wise only, so the
    result does not depend on the batch size or the device.
    """
    radius = (len(weights) - 1) // 2
    n = x.shape[dim]
    # replicate-pad by gathering clamped indices: works for any radius, even r >= n
    index = torch.arange(-radius, n + radius, device=x.device).clamp_(0, n - 1)
    padded = x.index_select(dim, index)
    out = padded.narrow(dim, radius, n) * float(weights[radius])
    for j in range(radius, 0, -1):
        pair = padded.narrow(dim, radius - j, n) + padded.narrow(dim, radius + j, n)
        out = out + pair * float(weights[radius + j])
    return out


def _blur_skimage(images: torch.Tensor, sigma: float) -> torch.Tensor:
    """ImageNet-C / skimage Gaussian blur of (..., C, H, W) uint8 (or float in [0, 1]) images."""
    is_uint8 = images.dtype == torch.uint8
    if not (is_uint8 or images.is_floating_point()):
        raise TypeError(f"blur needs uint8 or floating images, got {images.dtype}")
    x = images.to(torch.float64)
    if is_uint8:
        x = x / 255.0
    weights = _skimage_kernel1d(sigma)
    x = _blur_axis_nearest(x, weights, dim=-2)  # rows (H), then columns (W), as scipy's axis order
    x = _blur_axis_nearest(x, weights, dim=-1)
    x = x.clamp(0.0, 1.0)
    if is_uint8:
        return (x * 255.0).to(torch.uint8)  # truncation, as ImageNet-C's np.uint8
    return x.to(images.dtype)


def gaussian_blur_batch(images: torch.Tensor, sigma: float, kernel_size: int | None = None) -> torch.Tensor:
    """Gaussian blur of a batch (B, C, H, W) (or any (..., C, H, W)) on its own device.

    Args:
        images: uint8 (0-255) or floating (0-1) tensor, any device.
        sigma: standard deviation in pixels, > 0.
        kernel_size: odd size for torchvision's blur (reflect padding, rounded); None for
            ImageNet-C's definition (truncate 4.0, edges replicated, truncated to uint8).

    Returns:
        The blurred images, same shape, dtype and device. Equal to :class:`GaussianBlur` applied
        image by image (tests check it): the ImageNet-C path on any device (element-wise, batch- and
        device-independent); the torchvision path on the CPU, within one gray level on CUDA.
    """
    sigma = _check_sigma(sigma)
    kernel_size = _check_kernel_size(kernel_size)
    if images.ndim < 3:
        raise ValueError(f"blur needs images of shape (..., C, H, W), got {tuple(images.shape)}")
    if kernel_size is None:
        return _blur_skimage(images, sigma)
    return F.gaussian_blur_image(images, kernel_size=[kernel_size, kernel_size], sigma=[sigma, sigma])


class GaussianBlur(Shift):
    """Gaussian blur with standard deviation ``sigma`` (pixels).

    ``kernel_size`` given (odd): torchvision's ``GaussianBlur(kernel_size, sigma)`` (reflect
    padding; uint8 results rounded). ``kernel_size=None``: ImageNet-C / skimage's definition
    (radius ``int(4 sigma + 0.5)``, edges replicated, per channel, float64, truncated to uint8).
    Works on PIL images and on tensors (..., C, H, W), uint8 or float in [0, 1].
    """

    def __init__(self, sigma: float, kernel_size: int | None = None):
        super().__init__()
        self.sigma = _check_sigma(sigma)
        self.kernel_size = _check_kernel_size(kernel_size)
        self.spec = f"blur:{self.sigma:g}" + (f":{self.kernel_size}" if self.kernel_size else "")

    def batch(self, images: torch.Tensor) -> torch.Tensor:
        """The batched path: :func:`gaussian_blur_batch` with this transform's parameters."""
        return gaussian_blur_batch(images, self.sigma, self.kernel_size)

    def transform(self, inpt: Any, params: dict[str, Any]) -> Any:
        if isinstance(inpt, PIL.Image.Image):
            mode = inpt.mode
            out = self.batch(F.pil_to_tensor(inpt))
            return F.to_pil_image(out, mode=mode)
        if isinstance(inpt, torch.Tensor):
            out = self.batch(inpt.as_subclass(torch.Tensor))
            return tv_tensors.wrap(out, like=inpt) if isinstance(inpt, tv_tensors.TVTensor) else out
        return inpt


# --------------------------------------------------------------------------------------------
# ImageNet-C through the imagecorruptions package
# --------------------------------------------------------------------------------------------
_SEEDED_BY_ARGUMENT = ("glass_blur", "impulse_noise")  # draw from their own generator, given a seed argument


@functools.lru_cache(maxsize=1)
def _corruption_functions() -> dict[str, Any]:
    """imagecorruptions' ``corruption_dict``, or one clear line on what to install.

    The package is the imaug fork (PyPI ``imagecorruptions-imaug``), imported as ``imagecorruptions``.
    bethgelab's ``imagecorruptions`` 1.1.2 (2020, the last release) installs under the same name but does
    not run here: it imports ``pkg_resources`` (gone from setuptools 81), and its ``gaussian_blur``,
    ``glass_blur`` (``multichannel=``, gone from scikit-image 0.21) and ``fog`` (``np.float_``, gone from
    NumPy 2) fail; its ``glass_blur`` also takes no seed. Both are refused with the same advice.
    """
    fix = f"{IMAGENET_C_EXTRA_INSTALL} (the imagecorruptions-imaug package)"
    try:
        module = importlib.import_module("imagecorruptions")
    except ModuleNotFoundError as e:
        if e.name == "imagecorruptions":
            raise MissingDependencyError(
                f"ImageNet-C corruptions other than jpeg_compression and gaussian_blur "
                f"need the imagecorruptions package: {fix}"
            ) from None
        if e.name == "pkg_resources":
            raise MissingDependencyError(
                f"the installed imagecorruptions does not import ({e}): it is bethgelab's "
                f"1.1.2, which needs an old setuptools, NumPy 1 and scikit-image < 0.21: "
                f"pip uninstall imagecorruptions, then {fix}"
            ) from None
        raise MissingDependencyError(f"imagecorruptions does not import here ({e}): {fix}") from None
    except ImportError as e:  # e.g. opencv-python without libGL: opencv-python-headless provides the same cv2
        raise MissingDependencyError(
            f"imagecorruptions does not import here ({one_line(e, first_line=True)}); if OpenCV's "
            "libraries are missing, pip install opencv-python-headless"
        ) from None
    functions = dict(getattr(module, "corruption_dict", {}))
    glass = functions.get("glass_blur")
    if glass is None or "seed" not in inspect.signature(glass).parameters:
        raise MissingDependencyError(
            "the installed imagecorruptions cannot be seeded (its glass_blur takes no "
            f"seed; bethgelab's 1.1.2?): pip uninstall imagecorruptions, then {fix}"
        )
    return functions


def image_seed(seed: int, index: int, name: str) -> int:
    """The 32-bit seed of corruption ``name`` on image ``index`` of a run seeded by ``seed``.

    A hash of the three (``blake2b``, see :func:`~timm_posgeom.data.synthetic.seed32`); it leaves out the
    severity, so the five severities of a corruption make the same random draws on an image (the
    noise, the frost crop, the snow and elastic fields, the glass-blur swaps) and differ in strength only.
    """
    return seed32(seed, index, zlib.crc32(name.encode()))


def _corrupt_array(array: np.ndarray, name: str, severity: int, seed: int) -> np.ndarray:
    """imagecorruptions' ``name`` at ``severity`` on an (H, W, 3) uint8 array, seeded; uint8 out.

    Most corruptions draw from NumPy's global generator: it is seeded with ``seed`` for the call and
    its state restored afterwards (so this is not thread-safe, but the DataLoader's workers are
    processes). glass_blur (numba) and impulse_noise (scikit-image) take the seed as an argument.
    Like imagecorruptions' ``corrupt``, the float result is truncated to uint8 (``np.uint8``).
    """
    function = _corruption_functions()[name]
    state = np.random.get_state()
    try:
        np.random.seed(seed)
        kwargs = {"seed": int(seed)} if name in _SEEDED_BY_ARGUMENT else {}
        out = function(PIL.Image.fromarray(array), severity, **kwargs)
    finally:
        np.random.set_state(state)
    return np.uint8(out)


class Corruption(Shift):
    """ImageNet-C corruption ``name`` at ``severity`` 1-5, computed by the imagecorruptions package.

    ``seed`` (default 0) seeds the random corruptions (noise, glass, motion, snow, frost, fog, elastic):
    the same image and seed give the same pixels. Called as a transform, every image uses ``seed``
    itself; :meth:`for_image` (what :func:`~timm_posgeom.robustness.fragility` calls) uses
    :func:`image_seed` ``(seed, index, name)``, one seed per image. Works on PIL images (returned in
    their mode; RGB in between, as imagecorruptions needs 3 channels) and uint8 tensors (..., C, H, W)
    with C in {1, 3}. imagecorruptions refuses images under 32 x 32 pixels, and so does this.

    Raises :class:`MissingDependencyError` (one line, naming the extra to install) when the package is
    missing, and ValueError for an unknown name or severity.
    """

    def __init__(self, name: str, severity: int, seed: int = 0):
        super().__init__()
        self.name = _check_corruption_name(name)
        self.severity = check_severity(severity)
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise SettingError(f"the corruption seed must be an integer, got {seed!r}")
        self.seed = int(seed)
        self.spec = f"imagenet-c:{self.name}:{self.severity}"
        _corruption_functions()  # fail here, at construction, when the package is missing

    def _pil(self, image: PIL.Image.Image, seed: int) -> PIL.Image.Image:
        if min(image.size) < 32:
            raise DataError(
                f"ImageNet-C corruptions need images of at least 32 x 32 pixels (imagecorruptions' "
                f"limit), got {image.size[0]} x {image.size[1]}"
            )
        out = PIL.Image.fromarray(_corrupt_array(np.asarray(image.convert("RGB")), self.name, self.severity, seed))
        return out if image.mode == "RGB" else out.convert(image.mode)

    def _tensor(self, images: torch.Tensor, seed: int) -> torch.Tensor:
        if images.dtype != torch.uint8:
            raise TypeError(f"ImageNet-C corruptions need uint8 images, got a tensor of dtype {images.dtype}")
        if images.ndim < 3 or images.shape[-3] not in (1, 3):
            raise ValueError(
                f"ImageNet-C corruptions need images of shape (..., 1 or 3, H, W), got {tuple(images.shape)}"
            )
        flat = images.reshape((-1, *images.shape[-3:]))
        out = torch.empty_like(flat)
        for i, img in enumerate(flat):
            out[i] = F.pil_to_tensor(self._pil(F.to_pil_image(img.cpu()), seed)).to(images.device)
        return out.reshape(images.shape)

    def _apply(self, inpt: Any, seed: int) -> Any:
        if isinstance(inpt, PIL.Image.Image):
            return self._pil(inpt, seed)
        if isinstance(inpt, torch.Tensor):
            out = self._tensor(inpt.as_subclass(torch.Tensor), seed)
            return tv_tensors.wrap(out, like=inpt) if isinstance(inpt, tv_tensors.TVTensor) else out
        return inpt

    def transform(self, inpt: Any, params: dict[str, Any]) -> Any:
        return self._apply(inpt, self.seed)

    def for_image(self, image: Any, index: int, seed: int) -> Any:
        """``image`` corrupted with the seed :func:`image_seed` ``(seed, index, name)``."""
        return self._apply(image, image_seed(seed, index, self.name))


# --------------------------------------------------------------------------------------------
# presets and specs
# --------------------------------------------------------------------------------------------
def _check_corruption_name(name: Any) -> str:
    known = (*IMAGENET_C_CORRUPTIONS, *IMAGENET_C_EXTRA)
    if name not in known:
        raise SettingError(f"unknown ImageNet-C corruption {name!r}; supported: {', '.join(known)}")
    return str(name)


def check_severity(severity: Any) -> int:
    if isinstance(severity, bool) or not isinstance(severity, (int, np.integer)) or not 1 <= severity <= 5:
        raise SettingError(f"ImageNet-C severity must be an integer from 1 to 5, got {severity!r}")
    return int(severity)


def imagenet_c(name: str, severity: int) -> Shift:
    """ImageNet-C's corruption ``name`` at ``severity`` 1-5.

    ``jpeg_compression``: :class:`JPEG` at quality 25, 18, 15, 10, 7 (PIL, as ImageNet-C).
    ``gaussian_blur``: :class:`GaussianBlur` at sigma 1, 2, 3, 4, 6, ``kernel_size=None``
    (skimage's definition: truncate 4.0, mode nearest, per channel).
    Any other of :data:`IMAGENET_C_CORRUPTIONS` and :data:`IMAGENET_C_EXTRA`: a :class:`Corruption`
    (the imagecorruptions package; :class:`MissingDependencyError` when it is not installed).
    """
    name = _check_corruption_name(name)
    severity = check_severity(severity)
    if name not in IMAGENET_C:
        return Corruption(name, severity)
    value = IMAGENET_C[name][severity - 1]
    shift: Shift = JPEG(int(value)) if name == "jpeg_compression" else GaussianBlur(float(value))
    shift.spec = f"imagenet-c:{name}:{severity}"
    return shift


def imagenet_c_shifts(
    corruptions: str | Sequence[str] = "all", severities: Sequence[int] = (1, 2, 3, 4, 5)
) -> list[str]:
    """The specs ``imagenet-c:NAME:SEVERITY`` of ``corruptions`` x ``severities``, corruption-major.

    ``corruptions``: ``"all"`` (ImageNet-C's 15, :data:`IMAGENET_C_CORRUPTIONS`), ``"extra"`` (its 4
    extras), a comma-separated string or a sequence of names. Names are checked, duplicates refused.
    """
    names = corruption_list(corruptions)
    levels = [check_severity(s) for s in severities]
    if not levels:
        raise SettingError("no ImageNet-C severities given")
    if len(set(levels)) != len(levels):
        raise SettingError(f"ImageNet-C severities repeat: {levels}")
    return [f"imagenet-c:{name}:{s}" for name in names for s in levels]


def corruption_list(corruptions: str | Sequence[str]) -> list[str]:
    if isinstance(corruptions, str):
        key = corruptions.strip().lower()
        if key == "all":
            return list(IMAGENET_C_CORRUPTIONS)
        if key == "extra":
            return list(IMAGENET_C_EXTRA)
        corruptions = [c for c in key.split(",") if c.strip()]
    names = [_check_corruption_name(str(c).strip().replace("-", "_")) for c in corruptions]
    if not names:
        raise SettingError("no ImageNet-C corruptions given")
    if len(set(names)) != len(names):
        raise SettingError(f"ImageNet-C corruptions repeat: {names}")
    return names


def _bad_spec(spec: Any, why: str = "") -> SettingError:
    return SettingError(
        f"invalid shift spec {spec!r}{': ' + why if why else ''}; valid forms: " + "; ".join(SPEC_FORMS)
    )


def _to_int(text: str, spec: str, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise _bad_spec(spec, f"{what} must be an integer, got {text!r}") from None


def parse_shift(spec: str | Shift) -> Shift:
    """Parse a text spec (``jpeg:Q``, ``blur:SIGMA[:KERNEL]``, ``imagenet-c:NAME:SEVERITY``).

    A :class:`Shift` passes through unchanged. Raises ValueError listing the valid forms for an
    unknown spec, and a clear ValueError for an out-of-range quality, sigma, kernel or severity.
    """
    if isinstance(spec, Shift):
        return spec
    if not isinstance(spec, str):
        raise _bad_spec(spec, "expected a string")
    parts = spec.strip().split(":")
    kind = parts[0].lower()
    if kind == "jpeg" and len(parts) == 2:
        return JPEG(_to_int(parts[1], spec, "JPEG quality"))
    if kind == "blur" and len(parts) in (2, 3):
        try:
            sigma = float(parts[1])
        except ValueError:
            raise _bad_spec(spec, f"sigma must be a number, got {parts[1]!r}") from None
        kernel = _to_int(parts[2], spec, "kernel size") if len(parts) == 3 else None
        return GaussianBlur(sigma, kernel)
    if kind in ("imagenet-c", "imagenet_c", "imagenetc") and len(parts) == 3:
        return imagenet_c(parts[1].replace("-", "_"), _to_int(parts[2], spec, "severity"))
    raise _bad_spec(spec)
