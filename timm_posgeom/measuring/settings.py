"""``MeasureSettings``: the settings every measuring function shares, as one frozen object.

:func:`~timm_posgeom.probes.probe_ssdc`, :func:`~timm_posgeom.probes.run_measures` (and the measures built
on it), :func:`~timm_posgeom.robustness.fragility`, :func:`~timm_posgeom.robustness.alpha_sweep`,
:func:`~timm_posgeom.robustness.imagenet_c.imagenet_c_fragility` and :func:`~timm_posgeom.robustness.imagenet_c.imagenet_c_released`
read their images, batches, device, workers, seed, distributed mode and progress bar from one
:class:`MeasureSettings`, passed as ``settings=``. The plain keywords keep working: a keyword named like a
field (``batch_size=8``) overrides that field of ``settings`` (or of the defaults), and any other unknown
keyword is a TypeError, as before. The settings are checked here, once, whichever function reads them.

Nothing here imports torch: the object is a plain value (docs/architecture.md, rule 6).
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import PosgeomError, SettingError

__all__ = [
    "MeasureSettings",
    "MeasureSettingsError",
    "DISTRIBUTED_MODES",
    "RESIZE_MODES",
    "MAX_RPI_PERMUTATIONS",
    "MEMORY_BUDGET_BYTES",
    "MAX_IMG_SIZE",
    "MAX_CLASSES",
    "max_workers",
    "sums_budget_error",
]

DISTRIBUTED_MODES = ("auto", "presharded", "off")
RESIZE_MODES = ("paper", "timm")
"""How an image is brought to the model's input size (:func:`~timm_posgeom.data.transforms.resize_transform`)."""


# What a request may cost (issue 54): each count is checked against it where it enters, here for every measuring
# function, and by the command line before anything is loaded.
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


def max_workers() -> int:
    """The most DataLoader workers a measurement or a run starts: 4 per CPU this process may use, at least 8 (each
    worker is a process of its own, holding a copy of the dataset's state)."""
    import os

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(8, 4 * cpus)


def sums_budget_error(what: str, count: int, each_bytes: int) -> SettingError | None:
    """The error for ``count`` RPI permutations whose running sums take ``each_bytes`` each when together they
    pass :data:`MEMORY_BUDGET_BYTES` (None when they fit): it names the count that fits."""
    if count * each_bytes <= MEMORY_BUDGET_BYTES:
        return None
    fits = max(1, MEMORY_BUDGET_BYTES // max(each_bytes, 1))
    return SettingError(
        f"{what}: {count:,} RPI permutations would keep {count * each_bytes / 2**30:.1f} GiB of running sums "
        f"({each_bytes / 2**20:.1f} MiB each), more than the {MEMORY_BUDGET_BYTES / 2**30:.0f} GiB allowed: use at "
        f"most {fits:,} (rpi_permutations), or fewer layers or a smaller image"
    )


class MeasureSettingsError(PosgeomError, ValueError):
    """A setting no measurement can use (one line: which setting, what it must be, what it was)."""


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)  # numpy's integers too


@dataclass(frozen=True)
class MeasureSettings:
    """How a measurement reads its images and where it runs; the same meaning in every measuring function.

    Attributes:
        max_images: use at most the first N images (with several processes: N in all); None: all of
            them. ``imagenet_c_released`` refuses it (the released images are corrupted copies of the
            whole clean split).
        batch_size: images per batch (per step of ``fragility``; per model forward of the ImageNet-C
            functions); None only where the data is one tensor (``probe_ssdc``, ``run_measures``: the
            whole tensor at once).
        resize: ``"paper"`` (straight to the input size) or ``"timm"`` (timm's resize + centre crop),
            for the functions that build their own loader from a split (``fragility``, ``alpha_sweep``,
            the ImageNet-C functions); ``probe_ssdc`` and ``run_measures`` read batches already
            transformed (:func:`~timm_posgeom.data.eval_data.eval_loader`).
        img_size: the input size S or (H, W) for models that take any size, at most
            :data:`MAX_IMG_SIZE` a side; None: the model's own
            (where a loader is built, as ``resize``).
        device: where to run (``"cpu"``, ``"cuda"``, a ``torch.device``); None: the model's device.
        num_workers: DataLoader workers (where a loader is built), at most 4 per CPU
            (:func:`max_workers`); None: ``min(4, cpu_count - 1)``.
        seed: seed of everything random: the RPI permutations, the bootstrap, random corruptions
            (None: one drawn from torch's global RNG, shared by the processes).
        rpi_permutations: under RPI, the K shared permutations every SSDC and attention measure is averaged
            over (permutation k from the seed ``seed + k``; an interval over them); None: 10
            (:data:`~timm_posgeom.protocol.RPI_PERMUTATIONS`). Accuracy under RPI draws one permutation per
            image instead (``fragility``).
        distributed: ``"auto"`` (alone nothing changes; launched as several processes, each measures
            its share of the batches and every process returns the one-process result),
            ``"presharded"`` (``probe_ssdc`` and ``run_measures`` only: the data is this process's own
            shard) or ``"off"`` (this process measures all the data alone).
        progress: show a tqdm bar (on the main process only when several share the work).
    """

    max_images: int | None = None
    batch_size: int | None = 64
    resize: str = "paper"
    img_size: int | tuple[int, int] | None = None
    device: Any = None
    num_workers: int | None = None
    seed: int | None = 0
    rpi_permutations: int | None = None
    distributed: str = "auto"
    progress: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.img_size, list):  # a list from JSON or YAML: a tuple, so that the settings hash
            object.__setattr__(self, "img_size", tuple(self.img_size))
        for problem in self._problems():
            raise MeasureSettingsError(problem)

    def _problems(self) -> list[str]:
        """What is wrong with these settings, one line each (empty when nothing is)."""
        problems = []
        if self.max_images is not None and (not _is_int(self.max_images) or self.max_images < 1):
            problems.append(f"max_images must be >= 1, got {self.max_images!r}")
        if self.batch_size is not None and (not _is_int(self.batch_size) or self.batch_size < 1):
            problems.append(
                f"batch_size must be an integer >= 1 (or None: the whole tensor at once), got {self.batch_size!r}"
            )
        if self.resize not in RESIZE_MODES:
            problems.append(f"resize must be one of {', '.join(RESIZE_MODES)}, got {self.resize!r}")
        sizes = self.img_size if isinstance(self.img_size, tuple) else (self.img_size,) if self.img_size else ()
        if self.img_size is not None and (
            len(sizes) not in (1, 2) or not all(_is_int(s) and 1 <= s <= MAX_IMG_SIZE for s in sizes)
        ):
            problems.append(f"img_size must be from 1 to {MAX_IMG_SIZE} px (S or (H, W)), got {self.img_size!r}")
        workers = max_workers()
        if self.num_workers is not None and (not _is_int(self.num_workers) or not 0 <= self.num_workers <= workers):
            problems.append(
                f"num_workers must be from 0 to {workers} (4 per CPU here, each a process of its own), got "
                f"{self.num_workers!r}"
            )
        if self.seed is not None and (not _is_int(self.seed) or not -(2**63) <= self.seed < 2**63):
            problems.append(f"seed must be an integer of 64 bits or None, got {self.seed!r}")
        if self.rpi_permutations is not None and (
            not _is_int(self.rpi_permutations) or not 1 <= self.rpi_permutations <= MAX_RPI_PERMUTATIONS
        ):
            problems.append(
                f"rpi_permutations must be an integer from 1 to {MAX_RPI_PERMUTATIONS:,} (or None: 10), got "
                f"{self.rpi_permutations!r}"
            )
        if self.distributed not in DISTRIBUTED_MODES:
            problems.append(
                f"unknown distributed mode {self.distributed!r}; expected one of {', '.join(DISTRIBUTED_MODES)}"
            )
        if not isinstance(self.progress, bool):
            problems.append(f"progress must be True or False, got {self.progress!r}")
        return problems

    def replace(self, **changes: Any) -> MeasureSettings:
        """A copy with ``changes`` (field names), checked like a new one."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The fields as plain values (the device as its name), e.g. to record with a result."""
        out = dataclasses.asdict(self)
        out["device"] = None if self.device is None else str(self.device)
        out["img_size"] = (
            None
            if self.img_size is None
            else (list(self.img_size) if isinstance(self.img_size, tuple) else self.img_size)
        )
        return out

    @classmethod
    def resolve(
        cls,
        where: str,
        settings: MeasureSettings | None,
        options: Mapping[str, Any],
        own: Mapping[str, Any] | None = None,
    ) -> tuple[MeasureSettings, dict[str, Any]]:
        """The settings a call of ``where`` measures with, and its own options.

        ``settings`` (default: the defaults) with every keyword of ``options`` that names a field put
        in its place (an explicit keyword wins); the other keywords must be among ``own`` (the
        function's own options, name -> default), else TypeError as Python says it. Returns (the
        checked settings, ``own`` with the values given)."""
        if settings is None:
            settings = cls()
        elif not isinstance(settings, cls):
            raise TypeError(f"{where}() settings must be a MeasureSettings, got {type(settings).__name__}")
        own = dict(own or {})
        for name in options:
            if name not in _FIELDS and name not in own:
                raise TypeError(f"{where}() got an unexpected keyword argument {name!r}")
        changes = {k: v for k, v in options.items() if k in _FIELDS}
        return (settings.replace(**changes) if changes else settings), {k: options.get(k, v) for k, v in own.items()}


_FIELDS = frozenset(f.name for f in dataclasses.fields(MeasureSettings))
