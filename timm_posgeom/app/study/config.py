"""What a study does: :class:`StudyConfig`, the presets that fill it, and the settings a resume compares."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

from ...defaults import IMAGENET_C_JPEG_BLUR
from ...errors import PosgeomError, SettingError
from ...measuring.settings import MAX_IMG_SIZE, MeasureSettings
from ...protocol import DEFAULT_ALPHAS, PROTOCOL_FIELDS, RENAMED_SETTINGS, Protocol, current_names
from ..rundir import settings_changes

__all__ = [
    "CONDITIONS",
    "SWEPT",
    "PRESETS",
    "StudyConfig",
    "StudyError",
    "preset_config",
    "check_init",
    "config_changes",
    "LEGACY_SETTINGS",
    "RPI_SETTINGS",
    "PART_SETTINGS",
    "sweep_rpi",
    "attention_rpi",
    "CPU_ALPHAS",
]

CONDITIONS = ("nope", "ape", "sincos", "rope", "rpt")
SWEPT = ("ape", "sincos", "rope")
# The CPU presets' alpha sweep: 6 of the paper's 10 alphas (1, .8, .6, .5, .4, .2), for about 40% less sweep time
# on 2 cores, plus alpha 0 (the PE removed), which the paper does not measure and which shows where the sweep ends.
# Every committed study (experiments/scaling/) was measured with it: a resume keeps their sweeps.
CPU_ALPHAS = (1.0, 0.8, 0.6, 0.5, 0.4, 0.2, 0.0)


@dataclass
class StudyConfig:
    """What a study does. Presets fill it; the command line overrides parts of it. ``protocol()`` is how each
    run is measured (:func:`timm_posgeom.protocol.measure_model`): every field named like a
    :class:`~timm_posgeom.protocol.Protocol` setting is that setting."""

    preset: str
    recipe_prefix: str  # recipes/<prefix>_<condition>.yaml
    data: str | None  # None: the embedded synthetic set
    seeds: int = 1
    conditions: tuple[str, ...] = CONDITIONS
    train_overrides: list[str] = field(default_factory=list)  # --set key=value for every training run
    init: str | None = None  # model_kwargs.init of every run (timm | paper); None: what each recipe says
    max_images: int | None = None  # the evaluation's images (None: the whole validation split); was eval_images
    probe_images: int = 1000  # the paper's SSDC batch
    # RPI permutations per model (seeds 0 .. n-1, shared by every model and seed): SSDC under RPI is their
    # mean, and their spread enters the claims' intervals. The paper draws one per batch; one permutation
    # alone hides its own variance (the no-PE floor of one permutation is not zero). 10: at 8 x 8 on Imagenette
    # one permutation's floor is about +-0.04, so 3 (a t interval on 2 degrees of freedom, +-0.12) could not
    # tell |SSDC| < 0.1; 10 give about +-0.03, for one probe pass each (docs/method.md#rpi-and-rpt).
    rpi_permutations: int = 10
    sweep_images: int | None = None  # fragility images per alpha (None: max_images)
    alphas: tuple[float, ...] = DEFAULT_ALPHAS  # the protocol's, the paper's grid (the CPU presets: CPU_ALPHAS)
    shifts: tuple[str, ...] = ("jpeg:5", "blur:2.5:5")
    # fragility also with each shift applied at S x S px before the resize to the model's input (the paper's
    # 224 px; robustness.fragility's shift_size), beside the numbers with the shift at the model's input; None: not
    shift_size: int | None = None
    # every run monitors its training on this class-stratified fraction of the training split, held out
    # (recipe key heldout_fraction); None: what each recipe says (0: the validation split)
    heldout_fraction: float | None = None
    imagenet_c: bool = False  # add ImageNet-C severities 1-5 of both corruptions
    # the optional measures of every run (timm_posgeom.protocol.measure_names): attention per head, normal and
    # under RPI (eval.json's attention), and any measure registered since (eval.json's measures)
    extras: tuple[str, ...] = ("attention", "attention_rpi")
    # attention per head at this many blocks, spread evenly from the first to the last, on the first of the probe
    # images (at most this many): a few layers and a few hundred images keep it cheap and still show how the
    # heads' reach changes with depth
    attention_layers: int | None = 4
    attention_images: int | None = 256
    batch_size: int = 128
    num_workers: int = 0  # was workers
    device: str | None = None
    accelerate_config: str | None = None  # `accelerate launch --config_file`: a file or a shipped config name
    synthetic_size: int | None = None
    # images in the synthetic validation split the study measures on (None: synthetic_size // 5, the training
    # runs' own); larger than that only adds images (each is drawn from its own seed and index)
    synthetic_val_size: int | None = None

    def protocol(self, condition: str | None = None) -> Protocol:
        """How each run is measured: the :class:`~timm_posgeom.protocol.Protocol` of every field named like one
        of its settings, the shifts with ImageNet-C's JPEG and blur at severities 1-5 when ``imagenet_c``, SSDC
        reduced both ways (the records keep the per-image statistics), the permutations' seeds from 0, no
        progress bars; a ``condition`` outside ``SWEPT`` gets no alpha sweep."""
        values = {name: getattr(self, name) for name in PROTOCOL_FIELDS if hasattr(self, name)}
        values.update(shifts=self.all_shifts(), reduction="both", seed=0, progress=False)
        if condition is not None and condition not in SWEPT:
            values["alphas"] = ()
        return Protocol(**values)

    def all_shifts(self) -> tuple[str, ...]:
        """``shifts``, then ImageNet-C's JPEG and blur at severities 1-5 when ``imagenet_c``."""
        return (*self.shifts, *(IMAGENET_C_JPEG_BLUR if self.imagenet_c else ()))


PRESETS: dict[str, dict[str, Any]] = {
    # The embedded default: the synthetic set (classes that need layout as well as content), micro models
    # at width 64 (2 heads of 32) at 64 px, 300 steps each with the paper's initialisation: 4 min 26 s on 2
    # idle cores (set v3, 10 RPI permutations). With timm's initialisation the APE model had not learnt the layout after 1,000 steps
    # (top-1 0.38, no better than a model without PE could be on set v2), with the paper's it had after 100
    # (0.92). Fragility is measured on 3,200 validation images, SSDC and the sweep on the first 320. On set v2
    # JPEG q5 cost every model at most 3% of its accuracy and the fragility claim stayed within noise; set v3's
    # position grating, which JPEG q5 removes, is what a model without PE reads layout from (synthetic.py).
    "demo": dict(
        recipe_prefix="imagenette_cpu",
        data=None,
        heldout_fraction=0.1,
        max_images=3200,
        probe_images=320,
        sweep_images=320,
        alphas=(1.0, 0.5, 0.0),
        batch_size=64,
        synthetic_size=1600,
        synthetic_val_size=3200,
        init="paper",
        train_overrides=[
            "data=synthetic",
            "max_train_images=1600",
            "max_val_images=320",
            "epochs=12",
            "batch_size=64",
            "lr=2e-3",
            "warmup_epochs=2",
            "model_kwargs.embed_dim=64",
            "model_kwargs.num_heads=2",
            "cache=true",
            "disk_cache=false",
            "eval_every=4",
            "checkpoint_every=100",
            "log_every=10",
            "probe_images=0",
        ],
    ),
    # Real images at CPU scale: Imagenette at 64 px, the imagenette_cpu_* recipes.
    # Fragility also with the shift at the images' own 224 px, the paper's resolution, before the resize to 64.
    "imagenette-cpu": dict(
        recipe_prefix="imagenette_cpu", data="imagenette2-320", heldout_fraction=0.1, shift_size=224, alphas=CPU_ALPHAS
    ),
    # The paper's 14 x 14 token grid at CPU scale: the imagenette_cpu recipes at 112 px (patch 8), crop
    # padding scaled with the image (4 -> 7 px), and the micro model at width 64 (2 heads of 64 / 2 = 32,
    # the micro model's head size; depth 4 kept, so per-layer numbers line up with the 8 x 8 study).
    # Why width 64: one training step at 112 px costs 3.4x one at 64 px at width 128 (58 against 256
    # img/s on 2 cores, benchmarks/bench_train.py); width 64 brings it back (213 img/s), about 30
    # minutes of training per model plus its evaluations, where width 128 would take about 110.
    "imagenette-cpu-14": dict(
        recipe_prefix="imagenette_cpu",
        data="imagenette2-320",
        heldout_fraction=0.1,
        shift_size=224,
        alphas=CPU_ALPHAS,
        train_overrides=["img_size=112", "crop_pad=7", "model_kwargs.embed_dim=64", "model_kwargs.num_heads=2"],
    ),
    # The paper's protocol on ImageNet-100 through accelerate on GPUs. The models read 224 px: the shift is at
    # 224 px already (no shift_size). 5% of the training split (65 images a class) monitors training. The alpha
    # sweep is the protocol's, the paper's grid.
    "in100": dict(
        recipe_prefix="in100_paper",
        data="clane9/imagenet-100",
        batch_size=256,
        num_workers=8,
        heldout_fraction=0.05,
        accelerate_config="1gpu",
    ),
}


MAX_SEEDS = 100
"""The most seeds a study trains: each seed is one training run of every condition."""


def preset_config(preset: str, **overrides: Any) -> StudyConfig:
    """The :class:`StudyConfig` of a preset, with ``overrides`` (None values ignored; a setting's former name,
    ``eval_images`` or ``workers``, is read as its one name with a DeprecationWarning, for one release)."""
    if preset not in PRESETS:
        raise SettingError(f"unknown preset {preset!r}; expected one of {', '.join(PRESETS)}")
    old = sorted(set(overrides) & set(RENAMED_SETTINGS))
    if old:
        warnings.warn(
            f"preset_config({', '.join(old)}=...) is deprecated and will be removed in the next release: use "
            f"{', '.join(RENAMED_SETTINGS[k] for k in old)} (the same)",
            DeprecationWarning,
            stacklevel=2,
        )
    values = dict(PRESETS[preset], preset=preset)
    values.update({k: v for k, v in current_names(overrides).items() if v is not None})
    config = StudyConfig(**values)
    bad = [c for c in config.conditions if c not in CONDITIONS]
    if bad:
        raise SettingError(f"unknown condition(s) {bad}; expected some of {', '.join(CONDITIONS)}")
    twice = sorted({c for c in config.conditions if config.conditions.count(c) > 1})
    if twice:  # the same run twice would count as a second seed with no spread
        raise SettingError(f"condition(s) given twice: {', '.join(twice)}; use --num-seeds for more runs of one")
    if not 1 <= config.seeds <= MAX_SEEDS:
        raise SettingError(
            f"seeds must be from 1 to {MAX_SEEDS} (each trains every condition once: {len(config.conditions)} runs "
            f"a seed), got {config.seeds:,}"
        )
    MeasureSettings(rpi_permutations=config.rpi_permutations)  # 1 .. MAX_RPI_PERMUTATIONS, as every measurement
    if config.shift_size is not None and not 1 <= config.shift_size <= MAX_IMG_SIZE:
        raise SettingError(f"shift_size must be from 1 to {MAX_IMG_SIZE} px or none, got {config.shift_size:,}")
    config.protocol()  # every measuring setting checked where it enters (ProtocolError, one line)
    check_init(config.init)
    return config


def check_init(init: str | None) -> None:
    """ValueError for a model initialisation the models do not know (None: each recipe's own)."""
    from ...models.vision_transformer_pe import INIT_TYPES

    if init is not None and init not in INIT_TYPES:
        raise SettingError(f"unknown init {init!r}; expected one of {', '.join(INIT_TYPES)}")


class StudyError(PosgeomError, RuntimeError):
    """A study that cannot go on as asked (a failed training, settings that differ from what exists)."""


def sweep_rpi(permutations: int) -> str:
    """How the alpha sweep permutes under RPI, as recorded in a run's measuring settings."""
    return f"{permutations} permutation{'s' if permutations != 1 else ''} per alpha, drawn afresh for each alpha"


def attention_rpi(permutations: int) -> str:
    """How the attention measures permute under RPI, as recorded in a run's measuring settings (one
    permutation is seed 0, as before the protocol)."""
    return "1 permutation, seed 0" if permutations == 1 else f"{permutations} shared permutations (seeds 0, 1, ...)"


# Settings added since the first studies, with the value a study that did not record them had: a study (or
# an eval.json) started before rpi_permutations existed drew one RPI permutation, seed 0; before the sweep and
# the attention measures took the permutation protocol, each drew one, seed 0 (at every alpha).
LEGACY_SETTINGS: dict[str, Any] = {
    "rpi_permutations": 1,
    "sweep_rpi": "1 permutation, seed 0 at every alpha",
    "attention_rpi": "1 permutation, seed 0",
    "shift_size": None,
    "heldout_fraction": None,
    # before the study's settings were the protocol's: attention per head at 4 blocks, on 256 images, normal and
    # under RPI, and no other optional measure
    "extras": ["attention", "attention_rpi"],
    "attention_layers": 4,
    "attention_images": 256,
}
# Settings that change one part of a run's measurements alone: a change re-measures that part (the eval.json
# field named here), keeping the others.
PART_SETTINGS: dict[str, str] = {
    "rpi_permutations": "ssdc",
    "sweep_rpi": "alpha_sweep",
    "attention_rpi": "attention",
    "shift_size": "fragility_at_size",
    "alphas": "alpha_sweep",
    "sweep_images": "alpha_sweep",
}
RPI_SETTINGS = frozenset({"rpi_permutations"})  # kept for readers of the old name: the SSDC part


def _with_legacy(saved: dict[str, Any], asked: dict[str, Any]) -> dict[str, Any]:
    """``saved`` with the settings it predates (of those ``asked`` has) set to what it ran with
    (``LEGACY_SETTINGS``); {} stays {}."""
    legacy = {k: v for k, v in LEGACY_SETTINGS.items() if k in asked}
    return {**legacy, **saved} if saved else saved


def config_changes(saved: dict[str, Any], asked: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """``{key: (saved, asked)}`` for the result-changing StudyConfig fields that differ (JSON-compared); a
    setting ``saved`` predates counts as its legacy value (``LEGACY_SETTINGS``), a setting under its former name
    (``eval_images``, ``workers``: :data:`~timm_posgeom.protocol.RENAMED_SETTINGS`) as its one name."""
    saved = current_names(saved)
    if saved.get("train_overrides"):  # a study started before the recipe keys took the flags' names
        from ..recipe import upgrade_overrides

        saved = {**saved, "train_overrides": upgrade_overrides(saved["train_overrides"], warn=False)}
    return settings_changes("study", _with_legacy(saved, asked), asked)
