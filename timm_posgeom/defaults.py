"""The protocol's default values, plain: the paper's shifts and alphas, the probe's image count, the RPI
permutations, the shift spec forms, the probe sites and reductions, the label policies.

Nothing here imports torch (or anything else of weight), so the command line can show them in ``--help``
without loading the library. The measuring packages (:mod:`timm_posgeom.probes`, :mod:`timm_posgeom.robustness`,
:mod:`timm_posgeom.data.shifts`) read them from here; :mod:`timm_posgeom.protocol`, which composes those packages into
one measurement, re-exports them. Definitions: docs/method.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .errors import SettingError

__all__ = [
    "PAPER_SHIFTS",
    "DEFAULT_ALPHAS",
    "PROBE_IMAGES",
    "RPI_PERMUTATIONS",
    "JACKKNIFE_GROUPS",
    "SPEC_FORMS",
    "IMAGENET_C_JPEG_BLUR",
    "SITES",
    "REDUCTIONS",
    "LABEL_POLICIES",
    "probe_count",
    "rpi_count",
    "PE_COMPONENTS",
    "check_alpha",
    "check_alpha_spec",
    "parse_alpha_spec",
]

PAPER_SHIFTS = ("jpeg:5", "blur:2.5:5")
"""The paper's two shifts: JPEG quality 5 and Gaussian blur sigma 2.5 with a 5x5 kernel."""

DEFAULT_ALPHAS = (1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1)
"""The PE scales of an alpha sweep: the paper's grid (its appendix table: 1.0 down to 0.1, no alpha 0), the one
default of every sweep (:class:`~timm_posgeom.protocol.Protocol`, ``alpha_sweep``, ``posgeom sweep``, the study)."""

PROBE_IMAGES = 1000
"""Images for SSDC under RPI in an alpha sweep or a zoo when no count is given (the paper's 1,000
validation images), never more than the limit on all the work (``max_images``)."""

RPI_PERMUTATIONS = 10
"""RPI permutations of every measurement under RPI by default: SSDC (and the attention measures) under RPI is the
mean over this many shared permutations (seeds ``seed`` .. ``seed + 9``), with a Student t interval over them.
The permutation is the largest source of spread in SSDC under RPI (one permutation's no-PE floor reads about
+-0.05 at 8 x 8), so one alone hides its own variance (docs/method.md#rpi-and-rpt)."""

JACKKNIFE_GROUPS = 20
"""Random groups of images of the delete-a-group jackknife that gives the SSDC of the mean map (without RPI) its
interval over images (docs/method.md#intervals)."""

SPEC_FORMS = (
    "jpeg:Q (JPEG quality Q, integer 1-100, e.g. jpeg:5)",
    "blur:SIGMA[:KERNEL] (Gaussian blur, sigma > 0, optional odd kernel size, e.g. blur:2.5:5)",
    "imagenet-c:NAME:SEVERITY (NAME one of ImageNet-C's 15 corruptions or 4 extras, e.g. fog, "
    "gaussian_noise, jpeg_compression, gaussian_blur; SEVERITY 1-5, e.g. imagenet-c:fog:3)",
)
"""The forms of a shift spec, as ``parse_shift`` reads them."""

LABEL_POLICIES = ("check", "by-name", "as-is")
"""How the data's labels meet the model's classes (:func:`~timm_posgeom.data.labels.match_labels`): refuse a
mismatch, map by name, or use the indices unchecked."""

IMAGENET_C_JPEG_BLUR = tuple(
    f"imagenet-c:{name}:{s}" for name in ("jpeg_compression", "gaussian_blur") for s in range(1, 6)
)
"""ImageNet-C's JPEG and blur at severities 1-5 (the two corruptions :mod:`timm_posgeom.data.shifts` implements itself),
corruption-major: what ``--imagenet-c-jpeg-blur`` adds to the shifts of the zoo and the study."""

SITES = ("auto", "attn_input", "block_output", "stage_output")
"""Where SSDC reads the tokens (:func:`~timm_posgeom.probes.probe_ssdc`'s ``site``; docs/method.md#ssdc)."""

REDUCTIONS = ("mean_map", "per_image", "both")
"""How SSDC reduces over images: the SSDC of the mean map (the paper's), the mean of per-image SSDC, or both."""


def probe_count(probe_images: int | None, max_images: int | None) -> int:
    """How many images an SSDC probe inside a bigger measurement uses: ``probe_images`` when given (the
    more specific option wins), else :data:`PROBE_IMAGES` bounded by ``max_images`` (the limit on all the
    work). ValueError for a count below 1."""
    for name, value in (("probe_images", probe_images), ("max_images", max_images)):
        if value is not None and value < 1:
            raise SettingError(f"{name} must be >= 1, got {value}")
    if probe_images is not None:
        return probe_images
    return PROBE_IMAGES if max_images is None else min(PROBE_IMAGES, max_images)


def rpi_count(permutations: int | None) -> int:
    """The RPI permutations of a measurement: ``permutations``, or :data:`RPI_PERMUTATIONS` when None;
    ValueError below 1 (or not an integer)."""
    if permutations is None:
        return RPI_PERMUTATIONS
    import numbers

    if isinstance(permutations, bool) or not isinstance(permutations, numbers.Integral) or permutations < 1:
        raise SettingError(f"rpi_permutations must be an integer >= 1, got {permutations!r}")
    return int(permutations)


PE_COMPONENTS = ("ape", "sincos", "rope", "relative", "gpsa", "fourier", "conv", "unknown")
"""The components a model's positional encodings fall in (``PEEntry.component``, the keys of an alpha per
component): ``ape`` (absolute tables added to the tokens, gemma4's factorised x / y tables too), ``sincos`` (our
models' fixed table), ``rope`` (every rotary encoding), ``relative`` (relative position biases: tables,
decomposed tables, RelPosMlp, swinv2's continuous bias), ``gpsa`` (convit's positional attention), ``fourier``
(PositionalEncodingFourier), ``conv`` (convolutional encodings: no scale) and ``unknown`` (what only looks like
a PE)."""


def check_alpha(alpha: float | str) -> float:
    """Return ``alpha`` as a float; raise ValueError unless it is finite and >= 0."""
    import math

    try:
        value = float(alpha)
    except (TypeError, ValueError):
        raise SettingError(f"alpha must be a finite number >= 0, got {alpha!r}") from None
    if not math.isfinite(value) or value < 0:
        raise SettingError(f"alpha must be a finite number >= 0, got {alpha!r}")
    return value


def check_alpha_spec(alpha: Any) -> float | dict[str, float]:
    """One alpha (a finite number >= 0) or a mapping PE component -> alpha (:data:`PE_COMPONENTS`), checked:
    the float, or a dict of floats; ValueError for anything else (an empty mapping, an unknown component)."""
    if not isinstance(alpha, Mapping):
        return check_alpha(alpha)
    if not alpha:
        raise SettingError("an alpha per component needs at least one component, got an empty mapping")
    unknown = [str(name) for name in alpha if name not in PE_COMPONENTS]
    if unknown:
        raise SettingError(f"unknown PE component(s) {', '.join(unknown)}: expected among {', '.join(PE_COMPONENTS)}")
    return {str(name): check_alpha(value) for name, value in alpha.items()}


def parse_alpha_spec(text: str) -> float | dict[str, float]:
    """The command line's ``--alpha``: ``"0.5"`` (every PE) or ``"ape=0,rope=1"`` (one alpha per component;
    the components not named keep their scale), checked by :func:`check_alpha_spec`."""
    if "=" not in text:
        return check_alpha(text)
    spec: dict[str, str] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        name, sep, value = part.partition("=")
        if not sep or not name.strip() or name.strip() in spec:
            raise SettingError(f"--alpha needs a number or COMPONENT=ALPHA pairs (each component once), got {text!r}")
        spec[name.strip()] = value
    return check_alpha_spec(spec)
