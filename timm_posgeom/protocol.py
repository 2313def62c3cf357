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
    "MAX_RPI_PERMUTATIONS",
    "MEMORY_BUDGET_BYTES",
    "MAX_IMG_SIZE",
    "MAX_CLASSES",
    "MAX_SEEDS",
    "max_workers",
    "JACKKNIFE_GROUPS",
    "SPEC_FORMS",
    "rpi_count",
    "sums_budget_error",
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

MAX_RPI_PERMUTATIONS = 10_000
"""The most RPI permutations a measurement takes: each is a forward pass of every image and running sums of its
own; past a few hundred the interval over them no longer narrows what is read (its width shrinks as 1 / sqrt(K))."""

MEMORY_BUDGET_BYTES = 4 * 2**30
"""The memory the running sums of one measurement may take (every RPI permutation's mean maps or measures): a count
of permutations whose sums would pass it is refused before the first forward pass, with the count that fits."""

MAX_IMG_SIZE = 4096
"""The largest input (or shift) size in pixels a side: a ViT's token count grows with its square and its attention
with the fourth power (4096 px at patch 16 is 65,536 tokens)."""

MAX_CLASSES = 100_000
"""The most classes a model is built with (``num_classes``): its head holds that many times its width of weights
(ImageNet-22k has 21,841)."""

MAX_SEEDS = 100
"""The most seeds a study trains: each seed is one training run of every condition."""

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
    ValueError below 1 (or not an integer) or above :data:`MAX_RPI_PERMUTATIONS`."""
    if permutations is None:
        return RPI_PERMUTATIONS
    import numbers

    if isinstance(permutations, bool) or not isinstance(permutations, numbers.Integral) or permutations < 1:
        raise ValueError(f"rpi_permutations must be an integer >= 1, got {permutations!r}")
    if permutations > MAX_RPI_PERMUTATIONS:
        raise ValueError(
            f"rpi_permutations {permutations:,} is more than {MAX_RPI_PERMUTATIONS:,}, the most a measurement takes "
            "(each is a forward pass of every image; the interval over them narrows as 1 / sqrt(K))"
        )
    return int(permutations)


def max_workers() -> int:
    """The most DataLoader workers a measurement or a run starts: 4 per CPU this process may use, at least 8 (each
    worker is a process of its own, holding a copy of the dataset's state)."""
    import os

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(8, 4 * cpus)


def sums_budget_error(what: str, count: int, each_bytes: int) -> ValueError | None:
    """The error for ``count`` RPI permutations whose running sums take ``each_bytes`` each when together they
    pass :data:`MEMORY_BUDGET_BYTES` (None when they fit): it names the count that fits."""
    if count * each_bytes <= MEMORY_BUDGET_BYTES:
        return None
    fits = max(1, MEMORY_BUDGET_BYTES // max(each_bytes, 1))
    return ValueError(
        f"{what}: {count:,} RPI permutations would keep {count * each_bytes / 2**30:.1f} GiB of running sums "
        f"({each_bytes / 2**20:.1f} MiB each), more than the {MEMORY_BUDGET_BYTES / 2**30:.0f} GiB allowed: use at most "
        f"{fits:,} (rpi_permutations), or fewer layers or a smaller image"
    )
