"""What a zoo measures and how (:class:`ZooConfig`), its model lists, and what every part shares."""

from __future__ import annotations

import os
import re
import warnings
from dataclasses import InitVar, asdict, dataclass
from pathlib import Path
from typing import Any

from ...data.shifts import PAPER_SHIFTS
from ...errors import PathNotFoundError, PosgeomError, SettingError, one_line
from ...measuring.distributed import is_main
from ...protocol import PROTOCOL_FIELDS, RPI_PERMUTATIONS, Protocol, check_alpha_spec, probe_count
from ...results.fingerprints import fingerprint
from ...results.jsonio import to_jsonable
from ..provenance import package_versions
from ..records import ZooModel
from ..rundir import NEUTRAL_KEYS

JPEG_SHIFT = "jpeg:5"  # the paper's JPEG shift: the x of the fragility figure is this shift's FS


SWEEP_SHIFTS = (JPEG_SHIFT,)  # the alpha sweep's shifts, as the study's


PRETRAINED_MODES = ("auto", "on", "off")


EXTRAS = ("attention", "position")  # the default measures beyond SSDC and fragility, each a group of columns


NO_MODELS = "no models to measure: give model names, --models-file FILE, --filter PATTERN or --model-set NAME"


class ZooError(PosgeomError, RuntimeError):
    """A zoo that cannot run as asked (no models, settings that differ from the recorded ones)."""


@dataclass
class ZooConfig:
    """What a zoo measures and how. ``settings()`` is what its records are compared on; ``protocol()`` is how
    each model is measured (:func:`timm_posgeom.protocol.measure_model`): every field named like a
    :class:`~timm_posgeom.protocol.Protocol` setting is that setting."""

    data: str
    split: str = "validation"
    data_config: str | None = None  # the data set's configuration (Hub and parquet sets)
    revision: str | None = None  # of a Hub data set
    streaming: bool = False  # stream the first images of the split (the same images: neutral)
    max_images: int | None = None  # at most the first N images for all the work (None: the whole split)
    probe_images: int | None = None  # SSDC's count (None: protocol.PROBE_IMAGES, or max_images if fewer)
    sweep_images: int | None = None  # the sweep's fragility images per alpha (None: max_images)
    site: str = "auto"
    reduction: str = "mean_map"  # SSDC's reduction (the records keep the mean map's; both: per image too)
    resize: str = "paper"
    img_size: int | None = None  # None: each model's own input size
    pretrained: str = "auto"  # auto: timm names with weights load them; on: required; off: random init
    # how the data's labels meet each model's classes (timm_posgeom.data.labels.match_labels); a model they cannot
    # meet gets no top-1 and FS (the reason noted), never an error
    labels: str = "by-name"
    bad_images: str = "error"  # an image that cannot be decoded: error (named) | skip (left out, listed)
    shifts: tuple[str, ...] = PAPER_SHIFTS
    alphas: tuple[float, ...] | None = None  # None: no alpha sweep
    # the alpha sweep scales these PE components alone (pe_scale(model, {component: alpha})), the others kept;
    # None: every encoding. A model without one of them gets no sweep, with the reason noted
    alpha_components: tuple[str, ...] | None = None
    seed: int = 0  # random init (torch.manual_seed before each model is built), RPI permutations, bootstrap
    rpi_permutations: int = RPI_PERMUTATIONS  # SSDC and attention under RPI: the mean over this many (seed + k)
    batch_size: int = 64
    num_workers: int | None = None
    device: str | None = None
    shared_decode: bool = True  # decode the images once and resize them once per input configuration
    # the optional measures (timm_posgeom.protocol.measure_names): attention (distance, entropy per head), position
    # (the linear probe), attention_rpi, and any measure registered since
    extras: tuple[str, ...] = EXTRAS
    attention_layers: int | None = None  # the attention measures at this many blocks spread over depth (None: all)
    attention_images: int | None = None  # ... on at most this many of the probe images (None: all of them)
    # what the data holds (timm_posgeom.data.content_fingerprint: classes, labels, every image's bytes), set by
    # run_zoo when it loads the data: a record is reused only for the same images, whatever their path
    data_fingerprint: str | None = None
    images: InitVar[int | None] = None  # the old name of max_images (SSDC and fragility on the first N): one release

    def __post_init__(self, images: int | None = None) -> None:
        if images is not None:
            warnings.warn(
                "ZooConfig(images=N) is deprecated and will be removed in the next release: use "
                "max_images=N (and probe_images=N for the same SSDC count)",
                DeprecationWarning,
                stacklevel=3,
            )
            if self.max_images is None:
                self.max_images = images
            if self.probe_images is None:
                self.probe_images = images
        if self.bad_images not in ("error", "skip"):
            raise SettingError(f"bad_images must be error or skip, got {self.bad_images!r}")
        if self.pretrained not in PRETRAINED_MODES:
            raise SettingError(f"pretrained must be one of {', '.join(PRETRAINED_MODES)}, got {self.pretrained!r}")
        self._check_sweep()
        self.protocol()  # every measuring setting checked where it enters (ProtocolError, one line)

    def protocol(self, progress: bool = False) -> Protocol:
        """How each model is measured: the :class:`~timm_posgeom.protocol.Protocol` of every field named like
        one of its settings (``alphas`` None: no sweep), the paper's JPEG q5 as the sweep's shift."""
        values = {name: getattr(self, name) for name in PROTOCOL_FIELDS if hasattr(self, name)}
        values.update(alphas=self.alphas or (), sweep_shifts=SWEEP_SHIFTS, progress=progress)
        return Protocol(**values)

    def _check_sweep(self) -> None:
        """ValueError for an empty list of alphas, or components named without a sweep (or unknown)."""
        if self.alphas is not None and not self.alphas:
            raise SettingError("alphas is empty")
        if self.alpha_components is not None:
            if self.alphas is None or not self.alpha_components:
                raise SettingError("alpha_components names the PE components of an alpha sweep: give alphas too")
            check_alpha_spec(dict.fromkeys(self.alpha_components, 1.0))  # known component names

    def probe_count(self) -> int:
        """The images of each SSDC probe: ``probe_images``, else 1,000 or ``max_images`` if fewer."""
        return probe_count(self.probe_images, self.max_images)

    def load_count(self) -> int | None:
        """The images to load: ``max_images``, or more when ``probe_images`` asks for more (None: all)."""
        if self.max_images is None:
            return None
        return max(self.max_images, self.probe_images or 0)

    def settings(self) -> dict[str, Any]:
        """The result-changing settings, JSON-ready (the data as an absolute path when it is local)."""
        from ...data import resolve_source

        kind, where = resolve_source(self.data)
        values = {k: v for k, v in asdict(self).items() if k not in NEUTRAL_KEYS["zoo"]}
        values["data"] = os.path.abspath(where) if kind == "local" and where else (where or "synthetic")
        values["sweep_shifts"] = list(SWEEP_SHIFTS) if self.alphas is not None else None
        if values.get("alpha_components") is None:  # absent, as in the records written before it existed
            values.pop("alpha_components", None)
        return to_jsonable(values)


def read_models_file(path: str | os.PathLike) -> list[str]:
    """Model names from a text file: one per line; ``#`` starts a comment; blank lines ignored."""
    path = Path(path)
    if not path.is_file():
        raise PathNotFoundError(f"models file not found: {path}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ZooError(f"{path} is not a text file: a models file lists one model name per line") from None
    names = []
    for line in text.splitlines():
        name = line.split("#", 1)[0].strip()
        if name:
            names.append(name)
    return names


def filter_models(pattern: str, pretrained: str = "auto") -> list[str]:
    """``timm.list_models(pattern, pretrained=...)``: with weights (timm's ``name.tag`` names) unless
    ``pretrained`` is ``off``. Raises ZooError when nothing matches."""
    import timm

    names = timm.list_models(pattern, pretrained=pretrained != "off")
    if not names:
        raise ZooError(
            f"--filter {pattern!r} matches no timm model{' with pretrained weights' if pretrained != 'off' else ''}"
        )
    return list(names)


def safe_name(name: str) -> str:
    """A file name for a model: the name itself when it is made of ``[A-Za-z0-9._-]`` (timm's names),
    else those characters with the rest as ``_`` plus the name's
    :func:`~timm_posgeom.results.fingerprints.fingerprint` (no two names share a file)."""
    clean = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "model"
    return name if clean == name else f"{clean[:80]}-{fingerprint(name)}"


def _former_safe_name(name: str) -> str:
    """The file name timm-posgeom 0.1.0 gave a model: the name's SHA-1 cut to 8 hex digits."""
    clean = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "model"
    return name if clean == name else f"{clean[:80]}-{fingerprint(name)[:8]}"


def record_path(out: Path, name: str) -> Path:
    """Where the zoo in ``out`` keeps the record of model ``name``: ``models/<safe_name(name)>.json``; when that
    file is not there but one under the name timm-posgeom 0.1.0 gave it is (:func:`safe_name` with 8 hex
    digits), that one, so that a resumed zoo keeps what it measured then. A record is written under the new
    name (:func:`write_record`)."""
    path = out / "models" / f"{safe_name(name)}.json"
    former = out / "models" / f"{_former_safe_name(name)}.json"
    return former if not path.is_file() and former.is_file() else path


def write_record(out: Path, name: str, record: ZooModel) -> Path:
    """Write the record of model ``name`` to ``models/<safe_name(name)>.json`` (atomically); a record of the model
    under its former name (:func:`record_path`) is removed then: the new one replaces it."""
    path = record.write(out / "models" / f"{safe_name(name)}.json")
    former = out / "models" / f"{_former_safe_name(name)}.json"
    if former != path:
        former.unlink(missing_ok=True)
    return path


def is_main_process() -> bool:
    """Whether this process writes files: the only process, or rank 0 of a launch (accelerate, torchrun)."""
    return bool(is_main())


def versions() -> dict[str, str]:
    """Python, torch, timm and timm-posgeom versions."""
    return package_versions(training=False)


def config_from_settings(settings: dict[str, Any]) -> ZooConfig:
    """The :class:`ZooConfig` a zoo's recorded settings describe (its neutral fields at their defaults)."""
    known = {f for f in ZooConfig.__dataclass_fields__}
    values = {k: v for k, v in settings.items() if k in known}
    for key in ("shifts", "alphas", "alpha_components"):
        if values.get(key) is not None:
            if not isinstance(values[key], list):  # a zoo.json edited by hand
                raise ZooError(f"the zoo's recorded {key} are {values[key]!r}, not a list: restore its zoo.json")
            values[key] = tuple(values[key])
    return ZooConfig(**values)


def failure_text(error: BaseException) -> str:
    """``"ErrorClass: message"`` on one line: a zoo record names what failed."""
    return f"{type(error).__name__}: {one_line(error)}"
