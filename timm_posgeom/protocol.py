"""The paper's protocol as plain values: the shifts, the alphas, the probe's image count, the shift spec forms.

Nothing here imports torch (or anything else of weight), so the command line can show them in ``--help``
without loading the library: :mod:`timm_posgeom.shifts` and :mod:`timm_posgeom.robustness` re-export them.
Definitions: docs/method.md.
"""

from __future__ import annotations

__all__ = [
    "PAPER_SHIFTS",
    "DEFAULT_ALPHAS",
    "PROBE_IMAGES",
    "RPI_PERMUTATIONS",
    "JACKKNIFE_GROUPS",
    "SPEC_FORMS",
    "rpi_count",
]

PAPER_SHIFTS = ("jpeg:5", "blur:2.5:5")
"""The paper's two shifts: JPEG quality 5 and Gaussian blur sigma 2.5 with a 5x5 kernel."""

DEFAULT_ALPHAS = (1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1)
"""The PE scales of an alpha sweep."""

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


def probe_count(probe_images: int | None, max_images: int | None) -> int:
    """How many images an SSDC probe inside a bigger measurement uses: ``probe_images`` when given (the
    more specific option wins), else :data:`PROBE_IMAGES` bounded by ``max_images`` (the limit on all the
    work). ValueError for a count below 1."""
    for name, value in (("probe_images", probe_images), ("max_images", max_images)):
        if value is not None and value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
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
        raise ValueError(f"rpi_permutations must be an integer >= 1, got {permutations!r}")
    return int(permutations)
