"""One protocol, one measuring function: :class:`Protocol` says how a model is measured, :func:`measure_model`
measures it, :class:`Measurement` holds every number with its interval. The study, the zoo and the command line
all measure through here (docs/method.md#the-protocol-one-measurement-of-a-model).

:func:`measure_model` composes the library's measuring functions, it does not redo them: SSDC clean and under
RPI (:func:`~timm_posgeom.probes.probe_ssdc`), top-1 and fragility per shift
(:func:`~timm_posgeom.robustness.fragility`), the alpha sweep (:func:`~timm_posgeom.robustness.alpha_sweep`),
and the optional measures of the registry (:func:`register_measure`): attention
(:func:`~timm_posgeom.probes.attention_measures`) and the linear position probe
(:func:`~timm_posgeom.probes.position_probe`) are built in; a new measure is one function plus one
:func:`register_measure` call, and every runner picks it up by its name in ``Protocol.extras``.

Importing this module imports no torch (``posgeom --help`` stays light): the measuring functions are imported
inside :func:`measure_model`. The plain default values live in :mod:`timm_posgeom.defaults` (re-exported here).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .defaults import (
    DEFAULT_ALPHAS,
    JACKKNIFE_GROUPS,
    LABEL_POLICIES,
    PAPER_SHIFTS,
    PE_COMPONENTS,
    PROBE_IMAGES,
    REDUCTIONS,
    RPI_PERMUTATIONS,
    SITES,
    SPEC_FORMS,
    check_alpha,
    check_alpha_spec,
    parse_alpha_spec,
    probe_count,
    rpi_count,
)
from .errors import PosgeomError, one_line
from .measuring.settings import RESIZE_MODES, MeasureSettings

if TYPE_CHECKING:
    import torch.nn as nn

    from .probes import PositionProbeResult, SSDCResult
    from .robustness import AlphaSweepResult, FragilityResult

__all__ = [
    "Protocol",
    "ProtocolError",
    "Measurement",
    "PositionMeasure",
    "MeasureSpec",
    "measure_model",
    "register_measure",
    "measure_names",
    "spread_layers",
    "PROTOCOL_FIELDS",
    "RENAMED_SETTINGS",
    "current_names",
    "PAPER_SHIFTS",
    "DEFAULT_ALPHAS",
    "PROBE_IMAGES",
    "RPI_PERMUTATIONS",
    "JACKKNIFE_GROUPS",
    "SPEC_FORMS",
    "probe_count",
    "rpi_count",
    "PE_COMPONENTS",
    "check_alpha",
    "check_alpha_spec",
    "parse_alpha_spec",
]

RENAMED_SETTINGS = {"eval_images": "max_images", "workers": "num_workers"}
"""Former names of protocol settings -> their one name (the study's configs and records said ``eval_images`` and
``workers`` where everything else says ``max_images`` and ``num_workers``); :func:`current_names` reads them."""


def current_names(settings: Mapping[str, Any]) -> dict[str, Any]:
    """``settings`` with every former name (:data:`RENAMED_SETTINGS`) replaced by its one name, in order."""
    return {RENAMED_SETTINGS.get(k, k): v for k, v in settings.items()}


class ProtocolError(PosgeomError, ValueError):
    """A protocol no measurement can follow (one line: which setting, what it must be, what it was)."""


def _count(value: Any, low: int = 1) -> bool:
    """Whether ``value`` is None or an integer >= ``low`` (numpy's integers too; not a bool)."""
    return value is None or (isinstance(value, numbers.Integral) and not isinstance(value, bool) and int(value) >= low)


def _floats(values: Iterable[Any]) -> tuple[float, ...]:
    """``values`` as floats; ProtocolError naming the one that is not a number."""
    out = []
    for v in values:
        try:
            out.append(float(v))
        except (TypeError, ValueError):
            raise ProtocolError(f"alphas must be numbers, got {v!r}") from None
    return tuple(out)


@dataclass(frozen=True)
class Protocol:
    """How one model is measured: which images, which interventions, which measures. The paper's by default.

    Every measuring runner holds one (``StudyConfig.protocol()``, ``ZooConfig.protocol()``, the command line's
    :func:`~timm_posgeom.cli._options.protocol_from_args`), under the same names as here.

    Attributes:
        max_images: the first N images for all the work (fragility; the sweep's unless ``sweep_images``);
            None: every image.
        probe_images: the SSDC probe's images (and the sweep's, and the optional measures'); None: 1,000 (the
            paper's), or ``max_images`` if fewer (:func:`~timm_posgeom.defaults.probe_count`).
        sweep_images: the fragility images of each alpha of the sweep; None: ``max_images``.
        rpi_permutations: K: every number under RPI is the mean over K shared permutations (seeds ``seed`` ..
            ``seed + K - 1``; the sweep draws K afresh per alpha), with a 95% interval over them.
        seed: seed of everything random (permutations, bootstrap, random corruptions).
        alphas: the alpha sweep's PE scales (the paper's grid); ``()``: no sweep.
        alpha_components: the sweep scales these PE components alone (``pe_inventory``'s names, e.g. ``("rope",)``
            on a model with an APE and RoPE), the others kept as they are; None: every PE.
        sweep_shifts: the shifts whose FS the sweep measures at each alpha (the paper's JPEG q5).
        shifts: the fragility shifts (spec strings, e.g. ``jpeg:5``); ``shift_size``: also each at S x S px
            before the resize to the model's input (``fragility_at_size``); None: not.
        labels: how the data's labels meet the model's classes (:func:`~timm_posgeom.data.labels.match_labels`):
            ``check``, ``by-name`` or ``as-is``; labels that cannot be matched leave top-1 and FS out (a note).
        img_size: input size S for models that take any size (None: the model's own); ``resize``: ``paper``
            (straight to the input size) or ``timm`` (resize + centre crop).
        site: SSDC's probe site (``auto``: attention input of each block of a flat ViT, each stage
            otherwise); ``reduction``: ``mean_map`` (the paper's), ``per_image`` or ``both``.
        extras: optional measures by their registry name (:func:`measure_names`); ``attention_layers``: the
            attention measures at this many blocks spread from the first to the last (None: every block);
            ``attention_images``: on at most this many of the probe images (None: all of them).
        batch_size, num_workers, device, progress: how it runs; no number depends on them (device None: cuda
            when available).
    """

    max_images: int | None = None
    probe_images: int | None = None
    sweep_images: int | None = None
    rpi_permutations: int = RPI_PERMUTATIONS
    seed: int = 0
    alphas: tuple[float, ...] = DEFAULT_ALPHAS
    alpha_components: tuple[str, ...] | None = None
    sweep_shifts: tuple[str, ...] = ("jpeg:5",)
    shifts: tuple[str, ...] = PAPER_SHIFTS
    shift_size: int | None = None
    labels: str = "check"
    img_size: int | None = None
    resize: str = "paper"
    site: str = "auto"
    reduction: str = "mean_map"
    extras: tuple[str, ...] = ()
    attention_layers: int | None = None
    attention_images: int | None = None
    batch_size: int = 64
    num_workers: int | None = None
    device: str | None = None
    progress: bool = False

    def __post_init__(self) -> None:
        for name in ("alphas", "alpha_components", "sweep_shifts", "shifts", "extras"):  # lists: tuples
            value = getattr(self, name)
            if isinstance(value, (list, tuple)):
                object.__setattr__(self, name, _floats(value) if name == "alphas" else tuple(value))
        for problem in self._problems():
            raise ProtocolError(problem)
        self.measure_settings()  # the bounds every measurement keeps (RPI permutations, input size, workers, ...)

    def _problems(self) -> Iterable[str]:
        """What is wrong with this protocol, one line each."""
        optional = ("max_images", "probe_images", "sweep_images", "shift_size", "img_size", "attention_layers")
        for name in (*optional, "attention_images", "rpi_permutations", "batch_size"):
            value = getattr(self, name)
            if not _count(value) or (value is None and name in ("rpi_permutations", "batch_size")):
                yield f"{name} must be an integer >= 1, got {value!r}"
        if not _count(self.num_workers, 0):
            yield f"num_workers must be an integer >= 0 (or None), got {self.num_workers!r}"
        if self.seed is None or not _count(self.seed, -(2**63)):
            yield f"seed must be an integer, got {self.seed!r}"
        if not all(math.isfinite(a) for a in self.alphas):
            yield f"alphas must be finite numbers, got {list(self.alphas)}"
        for name in ("shifts", "sweep_shifts", "extras"):
            values = getattr(self, name)
            if len(set(values)) != len(values) or (name == "shifts" and not values):
                yield f"{name} must be distinct{' and not empty' if name == 'shifts' else ''}, got {list(values)}"
        if self.alphas and not self.sweep_shifts:
            yield "sweep_shifts is empty: the alpha sweep needs a shift (or no alphas: no sweep)"
        if self.alpha_components is not None:
            unknown = [c for c in self.alpha_components if c not in PE_COMPONENTS]
            if not self.alpha_components or unknown or not self.alphas:
                yield (
                    f"alpha_components names PE components of an alpha sweep (among {', '.join(PE_COMPONENTS)}, with "
                    f"alphas), got {list(self.alpha_components)}"
                )
        yield from self._choice_problems()

    def _choice_problems(self) -> Iterable[str]:
        """What is wrong with the settings that take one of a few values."""
        choices = (("labels", LABEL_POLICIES), ("resize", RESIZE_MODES), ("site", SITES), ("reduction", REDUCTIONS))
        for name, allowed in choices:
            if getattr(self, name) not in allowed:
                yield f"{name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}"
        unknown = [e for e in self.extras if e not in _MEASURES]
        if unknown:
            yield f"unknown extras {unknown}: choose among {', '.join(_MEASURES)} (or none)"
        if not isinstance(self.progress, bool):
            yield f"progress must be True or False, got {self.progress!r}"

    def replace(self, **changes: Any) -> Protocol:
        """A copy with ``changes`` (field names), checked like a new one."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The fields as plain JSON values (tuples as lists, the device as its name)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out.update({k: list(v) for k, v in out.items() if isinstance(v, tuple)})
        out["device"] = None if self.device is None else str(self.device)
        return out

    def probe_count(self) -> int:
        """The SSDC probe's images: ``probe_images``, else 1,000 or ``max_images`` if fewer."""
        return probe_count(self.probe_images, self.max_images)

    def parts(self) -> tuple[str, ...]:
        """The parts :func:`measure_model` measures by default: SSDC, fragility, fragility at ``shift_size``
        (when set), the alpha sweep (when there are alphas), then ``extras`` in their order."""
        return (
            "ssdc",
            "fragility",
            *(("fragility_at_size",) if self.shift_size else ()),
            *(("alpha_sweep",) if self.alphas else ()),
            *self.extras,
        )

    def measure_settings(self, **changes: Any) -> MeasureSettings:
        """The :class:`~timm_posgeom.measuring.MeasureSettings` the library functions read from this protocol:
        seed, RPI permutations, resize, input size, batch, workers, device, progress (``changes`` on top)."""
        values: dict[str, Any] = dict(
            seed=self.seed,
            rpi_permutations=self.rpi_permutations,
            resize=self.resize,
            img_size=self.img_size,
            batch_size=self.batch_size,
            num_workers=self.num_workers,
            device=self.device,
            progress=self.progress,
        )
        return MeasureSettings(**{**values, **changes})


PROTOCOL_FIELDS = tuple(f.name for f in dataclasses.fields(Protocol))
"""Every setting of :class:`Protocol`, by its one name."""


@dataclass
class PositionMeasure:
    """The ``position`` measure: the linear position probe fitted on the first half of the probe images and
    scored on the second (docs/attention.md#position-probe), normal and under RPI (None, with a note, where the
    model cannot be permuted)."""

    normal: PositionProbeResult
    rpi: PositionProbeResult | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "normal": self.normal.to_dict(),
            "rpi": self.rpi.to_dict() if self.rpi is not None else None,
            "notes": list(self.notes),
        }


@dataclass
class Measurement:
    """Everything :func:`measure_model` measured on one model under ``protocol``; a part not measured is None
    (or absent from ``extras``) and ``notes`` says why.

    Attributes:
        ssdc: SSDC per layer without RPI, with its 95% interval over images (``per_layer_ci``).
        ssdc_rpi: SSDC per layer under RPI: the mean over the RPI permutations, with its interval over them;
            its ``rise`` is delta SSDC (SSDC(layer 1) - SSDC(layer 0), docs/method.md#delta-ssdc).
        fragility: clean top-1 (Wilson interval), top-1 and FS per shift (paired bootstrap interval).
        fragility_at_size: the same with each shift applied at ``protocol.shift_size`` px.
        alpha_sweep: per alpha, delta SSDC under RPI and FS of ``protocol.sweep_shifts``, with intervals.
        sweep_ssdc: SSDC under RPI per alpha (the sweep's SSDC part; measured alone when the labels do not
            match, FS then left out).
        labels: how the data's labels met the model's classes (None: not matched, or no fragility measured).
        extras: registry name -> the optional measure's result (each has ``to_dict()``).
        notes: one line per part not measured, or measured with a caveat.
    """

    protocol: Protocol
    ssdc: SSDCResult | None = None
    ssdc_rpi: SSDCResult | None = None
    fragility: FragilityResult | None = None
    fragility_at_size: FragilityResult | None = None
    alpha_sweep: AlphaSweepResult | None = None
    sweep_ssdc: list[SSDCResult] | None = None
    labels: str | None = None
    extras: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def delta_ssdc(self) -> float:
        """Delta SSDC under RPI (NaN when RPI was not measured)."""
        return float(self.ssdc_rpi.rise) if self.ssdc_rpi is not None else math.nan

    @property
    def delta_ssdc_ci(self) -> tuple[float, float]:
        """The 95% interval of :attr:`delta_ssdc` over the RPI permutations."""
        return tuple(self.ssdc_rpi.delta_ci) if self.ssdc_rpi is not None else (math.nan, math.nan)  # type: ignore[return-value]

    @property
    def top1(self) -> float:
        """Clean top-1 (NaN when it was not measured)."""
        return float(self.fragility.clean_accuracy) if self.fragility is not None else math.nan

    @property
    def top1_ci(self) -> tuple[float, float]:
        """The Wilson 95% interval of :attr:`top1`."""
        return tuple(self.fragility.clean_interval) if self.fragility is not None else (math.nan, math.nan)  # type: ignore[return-value]

    def to_dict(self) -> dict[str, Any]:
        """Every part as JSON-ready values (NaN kept as float NaN), the protocol first."""

        def part(value: Any) -> Any:
            return value.to_dict() if value is not None else None

        return {
            "protocol": self.protocol.to_dict(),
            "ssdc": part(self.ssdc),
            "ssdc_rpi": part(self.ssdc_rpi),
            "delta_ssdc": self.delta_ssdc,
            "delta_ssdc_ci": list(self.delta_ssdc_ci),
            "top1": self.top1,
            "top1_ci": list(self.top1_ci),
            "fragility": part(self.fragility),
            "fragility_at_size": part(self.fragility_at_size),
            "alpha_sweep": part(self.alpha_sweep),
            "sweep_ssdc": [r.to_dict() for r in self.sweep_ssdc] if self.sweep_ssdc is not None else None,
            "labels": self.labels,
            "extras": {name: part(result) for name, result in self.extras.items()},
            "notes": list(self.notes),
        }


# -- the registry of optional measures -----------------------------------------------------------------------------
@dataclass(frozen=True)
class MeasureSpec:
    """An optional measure: ``function(model, data, protocol)`` returns a typed result with ``to_dict()`` (JSON
    values, each number with its interval where it has one), given as the function or as ``"module:function"``
    (imported when it first measures: the registry stays light); ``flat_only``: it reads the blocks of a flat ViT
    (a per-stage model gets a note instead); ``description``: one line for ``--help`` and the docs."""

    name: str
    function: Callable[[Any, Any, Protocol], Any] | str
    description: str
    flat_only: bool = False

    def resolve(self) -> Callable[[Any, Any, Protocol], Any]:
        """The function itself (``"module:function"`` imported)."""
        if callable(self.function):
            return self.function
        import importlib

        module, _, name = self.function.partition(":")
        function: Callable[[Any, Any, Protocol], Any] = getattr(importlib.import_module(module), name)
        return function


_MEASURES: dict[str, MeasureSpec] = {}


def register_measure(
    name: str,
    function: Callable[[Any, Any, Protocol], Any] | str,
    description: str,
    *,
    flat_only: bool = False,
    replace: bool = False,
) -> MeasureSpec:
    """Add an optional measure under ``name``: from then on ``Protocol(extras=(name,))`` measures it, in
    :func:`measure_model` and so in the study, the zoo and the command line (their ``--extras``).

    ``function(model, data, protocol)`` reads everything it needs from ``protocol`` (images, seed, RPI
    permutations, batch size, device...) and returns a result with ``to_dict()``; ``"module:function"`` names it
    without importing it (a measure of the package is registered so, in the list at the end of this module, and
    its module is imported only when it measures). A :class:`PosgeomError` it raises becomes a note (``NAME not
    measured: ...``), any other error propagates. ValueError for a name taken (unless ``replace``) or not a plain
    identifier."""
    if not name.isidentifier() or name in ("ssdc", "fragility", "fragility_at_size", "alpha_sweep", "sweep_ssdc"):
        raise ValueError(f"a measure's name must be an identifier other than a core part's, got {name!r}")
    if isinstance(function, str) and function.count(":") != 1:
        raise ValueError(f"a measure given by name is 'module:function', got {function!r}")
    if name in _MEASURES and not replace:
        raise ValueError(f"a measure named {name!r} is registered already (replace=True replaces it)")
    spec = MeasureSpec(name=name, function=function, description=description, flat_only=flat_only)
    _MEASURES[name] = spec
    return spec


def measure_names() -> dict[str, str]:
    """The registered optional measures: name -> its one-line description, in the order registered."""
    return {name: spec.description for name, spec in _MEASURES.items()}


def spread_layers(depth: int, count: int) -> list[int]:
    """``count`` block indices spread evenly over ``depth`` blocks, the first and the last included (every block
    when there are no more than ``count``)."""
    if depth <= count:
        return list(range(depth))
    if count == 1:
        return [depth - 1]
    return sorted({round(k * (depth - 1) / (count - 1)) for k in range(count)})


# -- measuring -----------------------------------------------------------------------------------------------------
def measure_model(
    model: nn.Module,
    data: Any,
    protocol: Protocol | None = None,
    *,
    parts: Sequence[str] | None = None,
) -> Measurement:
    """Measure ``model`` on ``data`` under ``protocol`` (default: the paper's, :class:`Protocol`).

    Args:
        model: a timm classifier (a flat ViT, or any model SSDC probes per stage); put in eval mode, moved to
            ``protocol.device`` for the call and moved back.
        data: a split: an indexable of (PIL image, label) or {"image", "label"}, e.g.
            :func:`~timm_posgeom.data.load_split`'s (each part reads its first images, as its function does).
        protocol: the settings; the library functions receive them (``protocol.measure_settings()``).
        parts: which parts to measure (default ``protocol.parts()``): ``ssdc`` (clean and under RPI),
            ``fragility``, ``fragility_at_size``, ``alpha_sweep``, ``sweep_ssdc`` (the sweep's SSDC alone) and the
            registry's names. A runner that resumes asks for the parts it lacks.

    Returns:
        A :class:`Measurement`. A part that does not apply to the model (RPI of a model without a patch
        embedding, FS where the labels cannot be matched, an attention module the capture does not know) is
        left None with a note; any other error propagates.
    """
    protocol = protocol or Protocol()
    todo = _check_parts(protocol.parts() if parts is None else parts)
    device = _device(protocol.device)
    protocol = protocol.replace(device=str(device))
    was = next((p.device for p in model.parameters()), None)
    training = model.training
    model.to(device).eval()
    result = Measurement(protocol=protocol)
    try:
        for part in todo:
            (_CORE.get(part) or _extra)(model, data, protocol, result, part)
    finally:
        model.train(training)
        if was is not None:
            model.to(was)
    return result


def _check_parts(parts: Sequence[str]) -> list[str]:
    unknown = [p for p in parts if p not in _CORE and p not in _MEASURES]
    if unknown:
        raise ProtocolError(f"unknown parts {unknown}: choose among {', '.join([*_CORE, *_MEASURES])}")
    return list(dict.fromkeys(parts))


def _device(device: str | None) -> Any:
    """``device``, or cuda (this process's, when launched as several) when available, else cpu."""
    import torch

    if device is not None:
        return torch.device(device)
    if torch.cuda.is_available():
        local = os.environ.get("LOCAL_RANK")
        return torch.device(f"cuda:{local}" if local else "cuda")
    return torch.device("cpu")


def _failure(error: BaseException) -> str:
    """``"ErrorClass: message"`` on one line: a note names what failed."""
    return f"{type(error).__name__}: {one_line(error)}"


def _loader(model: Any, data: Any, protocol: Protocol, images: int) -> Any:
    """The first ``images`` of ``data`` as the model reads them (the protocol's resize, size, batch, workers)."""
    from .data.eval_data import eval_loader

    return eval_loader(
        model,
        data,
        max_images=images,
        batch_size=protocol.batch_size,
        resize=protocol.resize,
        num_workers=protocol.num_workers,
        img_size=protocol.img_size,
    )


def _ssdc(model: Any, data: Any, protocol: Protocol, result: Measurement, part: str) -> None:
    """SSDC per layer clean and under RPI on the first ``probe_count()`` images (a note when RPI cannot apply)."""
    from .interventions import TokenPermutationError
    from .probes import probe_ssdc

    def probe(rpi: bool) -> SSDCResult:
        loader = _loader(model, data, protocol, protocol.probe_count())
        return probe_ssdc(
            model,
            loader,
            site=protocol.site,
            rpi=rpi,
            reduction=protocol.reduction,
            settings=protocol.measure_settings(),
        )

    result.ssdc = probe(False)
    try:
        result.ssdc_rpi = probe(True)
    except (TypeError, TokenPermutationError) as e:  # no patch embedding to permute after (CNNs), ...
        result.notes.append(f"RPI not measured: {_failure(e)}")
        return
    if result.ssdc_rpi.settings.get("granularity") == "stage":
        result.notes.append("delta SSDC undefined: probed per stage (layers 0 and 1 lie on different grids)")


def _fragility(model: Any, data: Any, protocol: Protocol, result: Measurement, part: str) -> None:
    """Clean top-1, top-1 and FS per shift (``fragility``) or with the shifts at ``shift_size`` px
    (``fragility_at_size``), on the first ``max_images``; labels that cannot be matched leave it out, noted."""
    from .data.labels import LabelMismatchError, map_by_name
    from .robustness import fragility

    at_size: dict[str, Any] = {"shift_size": protocol.shift_size} if part == "fragility_at_size" else {}
    settings = protocol.measure_settings(max_images=protocol.max_images)
    try:
        res = fragility(model, data, list(protocol.shifts), labels=protocol.labels, settings=settings, **at_size)
    except LabelMismatchError as e:
        result.notes.append(
            f"top-1 and FS left empty: the data's labels cannot be matched to the model's outputs ({e})"
        )
        return
    setattr(result, part, res)
    if part == "fragility":
        result.labels = map_by_name(model, data)[1] if protocol.labels == "by-name" else protocol.labels
        if res.clean_accuracy == 0:
            result.notes.append("FS undefined: clean top-1 is 0")


def _alpha_sweep(model: Any, data: Any, protocol: Protocol, result: Measurement, part: str) -> None:
    """The alpha sweep (``alpha_sweep``: delta SSDC and FS per alpha; ``sweep_ssdc``: its SSDC part alone, as when
    the labels do not match); a model whose PE cannot be scaled or permuted gets a note."""
    from .data.labels import LabelMismatchError
    from .interventions import AlphaOverflowError, PEScaleError, TokenPermutationError
    from .robustness import alpha_sweep, sweep_ssdc

    try:
        if part == "alpha_sweep":
            try:
                result.alpha_sweep = alpha_sweep(
                    model,
                    data,
                    protocol.alphas,
                    protocol.sweep_shifts,
                    site=protocol.site,
                    labels=protocol.labels,
                    probe_images=protocol.probe_count(),
                    settings=protocol.measure_settings(max_images=protocol.sweep_images or protocol.max_images),
                    components=protocol.alpha_components,
                )
                result.sweep_ssdc = [row.ssdc for row in result.alpha_sweep.rows]
                return
            except LabelMismatchError:
                result.notes.append("alpha sweep: delta SSDC only (FS needs matched labels)")
        loader = _loader(model, data, protocol, protocol.probe_count())
        settings = protocol.measure_settings(progress=False)
        result.sweep_ssdc = sweep_ssdc(
            model, loader, protocol.alphas, site=protocol.site, settings=settings, components=protocol.alpha_components
        )
    except (PEScaleError, AlphaOverflowError, TokenPermutationError, TypeError) as e:
        result.notes.append(f"alpha sweep not measured: {_failure(e)}")


def _extra(model: Any, data: Any, protocol: Protocol, result: Measurement, part: str) -> None:
    """One optional measure of the registry; a per-stage model (for a flat-only measure) or a PosgeomError it
    raises gets a note instead."""
    from .probes.sites import resolve_site

    spec = _MEASURES[part]
    if spec.flat_only and resolve_site(model, "auto") == "stage_output":
        result.notes.append(f"{part} not measured: per-stage model (flat ViTs only)")
        return
    try:
        result.extras[part] = spec.resolve()(model, data, protocol)
    except PosgeomError as e:  # an attention module the capture does not know, too few images, ...
        result.notes.append(f"{part} not measured: {_failure(e)}")


_CORE: dict[str, Callable[[Any, Any, Protocol, Measurement, str], None]] = {
    "ssdc": _ssdc,
    "fragility": _fragility,
    "fragility_at_size": _fragility,
    "alpha_sweep": _alpha_sweep,
    "sweep_ssdc": _alpha_sweep,
}


# -- the built-in optional measures --------------------------------------------------------------------------------
def _attention(model: Any, data: Any, protocol: Protocol, rpi: bool = False) -> Any:
    """Mean attention distance, entropy and attention SSDC per block and head
    (:func:`~timm_posgeom.probes.attention_measures`; docs/attention.md#the-measures) at ``attention_layers``
    blocks, on the first ``attention_images`` of the probe images; under RPI the mean over the permutations."""
    from .probes import attention_measures

    images = protocol.probe_count()
    if protocol.attention_images is not None:
        images = min(images, protocol.attention_images)
    depth = len(getattr(model, "blocks", []))
    layers = None if protocol.attention_layers is None else spread_layers(depth, protocol.attention_layers)
    return attention_measures(
        model,
        _loader(model, data, protocol, images),
        rpi=rpi,
        layers=layers,
        settings=protocol.measure_settings(distributed="off"),
    )


def _attention_rpi(model: Any, data: Any, protocol: Protocol) -> Any:
    """:func:`_attention` under RPI."""
    return _attention(model, data, protocol, rpi=True)


def _position(model: Any, data: Any, protocol: Protocol) -> PositionMeasure:
    """The linear (row, col) position probe per block, fitted on the first half of the probe images and scored
    on the second (:func:`~timm_posgeom.probes.position_probe`), normal and under RPI (one permutation per image:
    no permutation count)."""
    from torch.utils.data import Subset

    from .probes import position_probe

    n = min(protocol.probe_count(), len(data))
    if n < 2:
        raise ProtocolError("it needs 2 probe images or more")
    half = n // 2
    site = protocol.site if protocol.site in ("attn_input", "block_output") else "attn_input"
    options: dict[str, Any] = dict(
        site=site,
        seed=protocol.seed,
        batch_size=protocol.batch_size,
        device=protocol.device,
        progress=protocol.progress,
        distributed="off",
    )

    def part(indices: range) -> Any:  # the probe images' first or second half, as the model reads them
        return _loader(model, Subset(data, indices), protocol, len(indices))

    fit, score = range(0, half), range(half, n)
    measured = PositionMeasure(normal=position_probe(model, part(fit), part(score), **options))
    try:
        measured.rpi = position_probe(model, part(fit), part(score), rpi=True, **options)
    except PosgeomError as e:
        measured.notes.append(f"position probe under RPI not measured: {_failure(e)}")
    return measured


register_measure(
    "attention",
    _attention,
    "mean attention distance, entropy and attention SSDC per block and head",
    flat_only=True,
)
register_measure(
    "attention_rpi",
    _attention_rpi,
    "the attention measures under RPI (the mean over the RPI permutations, with intervals)",
    flat_only=True,
)
register_measure(
    "position",
    _position,
    "the linear row/col position probe per block, normal and under RPI",
    flat_only=True,
)


# -- the measures of the position interventions, extrapolation and localisation -------------------------------------
# Each is a library function of its own package; these read the protocol's settings into its arguments.
def _settings(protocol: Protocol, **changes: Any) -> MeasureSettings:
    """The protocol's measure settings for a measure that runs in one process, on the probe images."""
    return protocol.measure_settings(**{"max_images": protocol.probe_count(), "distributed": "off", **changes})


def _extrapolation(model: Any, data: Any, protocol: Protocol) -> Any:
    """:func:`~timm_posgeom.resolution.extrapolate` at its default sizes (0.5 to 4 times the training size) in every
    mode the model takes: top-1 on ``max_images``, SSDC and attention on the probe images."""
    from .resolution import extrapolate

    settings = _settings(protocol, max_images=protocol.max_images)
    return extrapolate(model, data, probe_images=protocol.probe_count(), labels=protocol.labels, settings=settings)


def _position_intervention(function: str) -> Callable[[Any, Any, Protocol], Any]:
    """``measure_pe_shuffle``, ``measure_pe_shift`` or ``measure_tile_shuffle`` under the protocol: top-1 on
    ``max_images``, SSDC on the probe images at the protocol's site, K permutations."""

    def measure(model: Any, data: Any, protocol: Protocol) -> Any:
        from . import robustness

        return getattr(robustness, function)(
            model,
            data,
            labels=protocol.labels,
            probe_images=protocol.probe_count(),
            site=protocol.site,
            settings=_settings(protocol, max_images=protocol.max_images),
        )

    return measure


def _localisation(function: str) -> Callable[[Any, Any, Protocol], Any]:
    """A measure of :mod:`timm_posgeom.localisation` on the probe images (the PE imprint reads none)."""

    def measure(model: Any, data: Any, protocol: Protocol) -> Any:
        from . import localisation

        batches = None if function == "pe_imprint" else _loader(model, data, protocol, protocol.probe_count())
        return getattr(localisation, function)(model, batches, _settings(protocol, progress=False))

    return measure


for _name, _function, _description in (
    ("pe_shuffle", _position_intervention("measure_pe_shuffle"), "top-1 and SSDC with the PE permuted, against RPI"),
    (
        "pe_shift",
        _position_intervention("measure_pe_shift"),
        "top-1 and SSDC with the PE shifted by whole and part patches",
    ),
    ("tile_shuffle", _position_intervention("measure_tile_shuffle"), "top-1 and SSDC with the image's tiles shuffled"),
    ("extrapolation", _extrapolation, "top-1, SSDC and delta SSDC under RPI at input sizes the model never saw"),
    ("activation_patching", _localisation("activation_patching"), "the clean stream patched into RPI, per block"),
    ("pe_imprint", _localisation("pe_imprint"), "SSDC of constant images per block: what the PE alone writes"),
    ("position_ablation", _localisation("position_ablation"), "the position probe's directions ablated per block"),
    ("encoding_cka", _localisation("encoding_cka"), "CKA of each block at alpha 1 against alpha 0"),
):
    register_measure(_name, _function, _description, flat_only=True)
