"""Training recipes: one dataclass, loaded from YAML, overridden with ``key=value`` strings.

    recipe = load_recipe("imagenette_cpu_ape", overrides=["epochs=2", "model_kwargs.drop_path_rate=0"])

A bare recipe name is one of the recipes shipped in the package (``posgeom recipes`` lists them). An unknown
key (in the file or an override) is an error that lists the valid keys; override values are
parsed as YAML and coerced to the field's type (``none``/``null`` for optional fields).
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import types
import typing
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from ..errors import PathNotFoundError, PosgeomError
from ..measuring.settings import MAX_IMG_SIZE, max_workers

if TYPE_CHECKING:
    if sys.version_info >= (3, 11):
        from importlib.resources.abc import Traversable
    else:  # its home before Python 3.11
        from importlib.abc import Traversable

__all__ = [
    "Recipe",
    "RecipeError",
    "load_recipe",
    "upgrade_keys",
    "upgrade_overrides",
    "RENAMED_KEYS",
    "find_recipe",
    "apply_overrides",
    "shipped_recipes",
    "accelerate_configs",
    "find_accelerate_config",
]


# the resampling filters both PIL (the uint8 cache) and timm's transforms know
INTERPOLATIONS = ("bicubic", "bilinear", "nearest", "lanczos", "box")


class RecipeError(PosgeomError, ValueError):
    """A recipe that cannot be used: unknown key, wrong type, or inconsistent values."""


@dataclass
class Recipe:
    """Everything a training run needs to know. Defaults give a small CPU run on synthetic data."""

    # model
    model: str = "posgeom_vit_micro_patch8_64_ape"  # any timm model name (ours after `import timm_posgeom`)
    model_kwargs: dict[str, Any] = field(default_factory=dict)  # passed to timm.create_model
    # data
    data: str | None = None  # Hub id, local folder, or None / "synthetic"
    train_split: str = "train"  # --train-split
    val_split: str = "validation"  # --val-split
    data_config: str | None = None  # the data set's configuration (Hub and parquet sets with several)
    revision: str | None = None  # a branch, tag or commit of a Hub data set
    streaming: bool = False  # read the first max_train_images / max_val_images of each split as a stream
    # --max-images sets both: the first N images of each split (synthetic data: N images generated; default
    # 5000 and 1000)
    max_train_images: int | None = None
    max_val_images: int | None = None
    img_size: int = 64
    cache: bool = False  # pre-resize to img_size once, keep as uint8 in memory (augment none|crop_flip)
    disk_cache: bool = True  # with cache: also keep the uint8 tensor under ~/.cache/timm_posgeom
    augment: str = "crop_flip"  # none (resize straight, the paper) | crop_flip (the CPU pilot) | timm
    crop_pad: int = 4  # crop_flip: reflect padding
    hflip: float = 0.5
    auto_augment: str | None = None  # timm augment: e.g. rand-m9-mstd0.5-inc1
    color_jitter: float | None = None  # timm augment
    reprob: float = 0.0  # timm augment: random erasing probability
    scale: list[float] = field(default_factory=lambda: [0.08, 1.0])  # timm augment: RandomResizedCrop
    interpolation: str = "bicubic"
    eval_resize: str = "paper"  # paper (resize straight) | timm (resize + centre crop at crop_pct)
    crop_pct: float = 0.875
    workers: int = 2  # DataLoader workers per process
    bad_images: str = "error"  # an image that cannot be decoded: error (named) | skip (left out, listed)
    # monitor training (per-epoch top-1, loss, SSDC under RPI) on this class-stratified fraction of the training
    # split, held out (never trained on) by heldout_seed; 0: monitor on val_split (data.heldout, docs/method.md)
    heldout_fraction: float = 0.0
    heldout_seed: int = 0
    # optimisation
    batch_size: int = 128  # global: per-process batch x processes x grad_accum
    eval_batch_size: int | None = None  # per process; default: the per-process training batch
    grad_accum: int = 1
    epochs: int = 10
    max_steps: int | None = None  # cap on optimizer steps (the schedule then spans the capped run)
    opt: str = "adamw"  # timm create_optimizer_v2 name
    lr: float = 1e-3
    weight_decay: float = 0.05
    wd_exclude_1d: bool = True  # no weight decay on biases and norms, 1-d parameters (timm default)
    # no weight decay on what the model lists in no_weight_decay() (timm's models: class token, position table);
    # false with wd_exclude_1d false: every parameter decays (the paper: Adam's coupled L2 on all of them)
    wd_exclude_model: bool = True
    momentum: float = 0.9
    opt_betas: list[float] | None = None
    opt_eps: float | None = None
    sched: str = "cosine"  # timm create_scheduler_v2 name, or none (constant lr), stepped per update
    warmup_epochs: float = 0.0
    warmup_lr: float = 1e-6
    min_lr: float = 1e-6
    label_smoothing: float = 0.1
    mixup: float = 0.0  # timm Mixup alpha (0 = off)
    cutmix: float = 0.0  # timm CutMix alpha (0 = off)
    mixup_prob: float = 1.0
    mixup_switch_prob: float = 0.5
    clip_grad: float | None = None  # max gradient norm
    ema: bool = False  # timm ModelEmaV3 of the weights, evaluated and exported too
    ema_decay: float = 0.9998
    mixed_precision: str | None = None  # no | fp16 | bf16; none: as `accelerate launch` / its config says
    seed: int = 0
    # bookkeeping
    checkpoint_every: int = 500  # optimizer steps; checkpoints are also written at every epoch end
    keep_checkpoints: int = 2
    eval_every: int = 1  # epochs
    log_every: int = 20  # optimizer steps
    probe_images: int = 0  # at each evaluation: SSDC per layer under RPI on this many val images (0 = off)
    log_with: list[str] = field(default_factory=list)  # accelerate trackers (tensorboard, wandb, trackio, mlflow...)
    tracker_project: str | None = None  # the trackers' project / run name; default: the run folder's name
    notes: str = ""  # free text: what the recipe is for

    @classmethod
    def keys(cls) -> list[str]:
        """The valid recipe keys."""
        return [f.name for f in dataclasses.fields(cls)]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def validate(self) -> Recipe:
        """Raise RecipeError for values no run could use; return self."""
        _check_choices_and_counts(self)
        _check_numbers(self)
        _check_combinations(self)
        return self


def _need(ok: bool, message: str) -> None:
    if not ok:
        raise RecipeError(message)


def _check_choices_and_counts(r: Recipe) -> None:
    """The keys with a list of choices, and the counts."""
    choices = {
        "augment": ("none", "crop_flip", "timm"),
        "eval_resize": ("paper", "timm"),
        "mixed_precision": (None, "no", "fp16", "bf16"),
        "interpolation": INTERPOLATIONS,
        "bad_images": ("error", "skip"),
    }
    for key, allowed in choices.items():
        _need(
            getattr(r, key) in allowed, f"{key} must be one of {', '.join(map(str, allowed))}, got {getattr(r, key)!r}"
        )
    for key in (
        "img_size",
        "batch_size",
        "grad_accum",
        "epochs",
        "checkpoint_every",
        "keep_checkpoints",
        "eval_every",
        "log_every",
    ):
        _need(getattr(r, key) >= 1, f"{key} must be >= 1, got {getattr(r, key)}")
    for key in ("max_steps", "max_train_images", "max_val_images", "eval_batch_size"):
        value = getattr(r, key)
        _need(value is None or value >= 1, f"{key} must be >= 1 or none, got {value}")
    _need(
        0 <= r.workers <= max_workers(),
        f"workers must be from 0 to {max_workers()} (4 per CPU here, each a process), got {r.workers:,}",
    )
    _need(r.img_size <= MAX_IMG_SIZE, f"img_size must be at most {MAX_IMG_SIZE} px, got {r.img_size:,}")
    _need(0 <= r.heldout_fraction < 1, f"heldout_fraction must be in [0, 1), got {r.heldout_fraction}")
    _need(r.probe_images >= 0, f"probe_images must be >= 0, got {r.probe_images}")


def _check_numbers(r: Recipe) -> None:
    """The real numbers: finite, and in their ranges."""
    for f in dataclasses.fields(r):  # inf / nan pass every comparison below: refuse them first
        values = getattr(r, f.name)
        for v in values if isinstance(values, list) else [values]:
            _need(not isinstance(v, float) or math.isfinite(v), f"{f.name} must be a finite number, got {values}")
    _need(r.lr > 0, f"lr must be > 0, got {r.lr}")
    _need(0 <= r.label_smoothing < 1, f"label_smoothing must be in [0, 1), got {r.label_smoothing}")
    _need(len(r.scale) == 2, f"scale must be [min, max], got {r.scale}")
    # values that would train something else than asked, without an error of their own (a negative
    # max gradient norm flips the gradient's sign; an EMA decay outside [0, 1) diverges)
    _need(0 < r.scale[0] <= r.scale[1] <= 1, f"scale must be [min, max] with 0 < min <= max <= 1, got {r.scale}")
    _need(r.clip_grad is None or r.clip_grad > 0, f"clip_grad must be > 0 or none, got {r.clip_grad}")
    _need(0 <= r.ema_decay < 1, f"ema_decay must be in [0, 1), got {r.ema_decay}")
    for key in ("hflip", "reprob", "mixup_prob", "mixup_switch_prob"):
        _need(0 <= getattr(r, key) <= 1, f"{key} must be in [0, 1], got {getattr(r, key)}")
    for key in ("weight_decay", "warmup_epochs", "warmup_lr", "min_lr", "momentum", "mixup", "cutmix", "crop_pad"):
        _need(getattr(r, key) >= 0, f"{key} must be >= 0, got {getattr(r, key)}")
    _need(r.color_jitter is None or r.color_jitter >= 0, f"color_jitter must be >= 0, got {r.color_jitter}")
    _need(0 < r.crop_pct <= 1, f"crop_pct must be in (0, 1], got {r.crop_pct}")
    _need(r.opt_eps is None or r.opt_eps > 0, f"opt_eps must be > 0, got {r.opt_eps}")
    _need(
        r.opt_betas is None or (len(r.opt_betas) == 2 and all(0 <= b < 1 for b in r.opt_betas)),
        f"opt_betas must be two values in [0, 1), got {r.opt_betas}",
    )


def _check_combinations(r: Recipe) -> None:
    """Values that exclude each other, or that the run sets itself."""
    _need(
        not (r.cache and r.augment == "timm"),
        "cache: true keeps pre-resized uint8 images and supports augment none or crop_flip, not timm",
    )
    _need(
        not r.streaming or (r.max_train_images is not None and r.max_val_images is not None),
        "streaming reads the first N images of each split: give their number (max_train_images and "
        "max_val_images, or --max-images)",
    )
    for key in ("img_size", "num_classes", "pretrained"):
        _need(
            key not in r.model_kwargs,
            f"model_kwargs.{key} is set by the run (img_size from the recipe, num_classes from the data)",
        )


# Recipe keys renamed to the flags' names: accepted for one release, with a one-line notice
RENAMED_KEYS = {"train_subset": "max_train_images", "val_subset": "max_val_images", "rpi_ssdc_images": "probe_images"}
# synthetic_size: N synthetic training images and a fifth of N for validation, now max_train_images and
# max_val_images (on synthetic data, the number of images generated)
OLD_SYNTHETIC_SIZE = "synthetic_size"


def _renamed_notice(old: str, new: str) -> None:
    warnings.warn(
        f"recipe key {old} is deprecated and will be removed in the next release: use {new} (the same)",
        FutureWarning,
        stacklevel=4,
    )


def upgrade_keys(values: dict[str, Any], warn: bool = True) -> dict[str, Any]:
    """``values`` (a recipe's mapping) with the old key names given their new names (:data:`RENAMED_KEYS`;
    ``synthetic_size: N`` -> ``max_train_images: N``, ``max_val_images: N // 5``): a notice each when ``warn``
    (a recipe being loaded; not a run's saved recipe being compared)."""
    out = dict(values)
    for old, new in RENAMED_KEYS.items():
        if old in out:
            if new in out:
                raise RecipeError(f"{old} is the old name of {new}: give only {new}")
            if warn:
                _renamed_notice(old, new)
            out[new] = out.pop(old)
    if OLD_SYNTHETIC_SIZE in out:
        size = out.pop(OLD_SYNTHETIC_SIZE)
        if warn:
            _renamed_notice(OLD_SYNTHETIC_SIZE, "max_train_images (and max_val_images, a fifth of it before)")
        if size is not None and str(size).lower() not in ("none", "null", ""):
            n = _to_int(size)
            train = out.get("max_train_images")
            out["max_train_images"] = n if train in (None, "none", "null") else min(n, _to_int(train))
            if out.get("max_val_images") in (None, "none", "null"):
                out["max_val_images"] = max(1, n // 5)
    return out


def upgrade_overrides(overrides: list[str] | tuple[str, ...], warn: bool = True) -> list[str]:
    """``key=value`` overrides with the old key names renamed (:func:`upgrade_keys`), in place."""
    out: list[str] = []
    for item in overrides:
        key, _, text = item.partition("=")
        if key.strip() == OLD_SYNTHETIC_SIZE:
            new = upgrade_keys({OLD_SYNTHETIC_SIZE: _parse_value(text)}, warn)
            out += [f"{k}={v}" for k, v in new.items()]
        elif key.strip() in RENAMED_KEYS:
            if warn:
                _renamed_notice(key.strip(), RENAMED_KEYS[key.strip()])
            out.append(f"{RENAMED_KEYS[key.strip()]}={text}")
        else:
            out.append(item)
    return out


_FIELD_TYPES = typing.get_type_hints(Recipe)


def _unwrap_optional(tp: Any) -> tuple[Any, bool]:
    args = typing.get_args(tp)
    if (typing.get_origin(tp) in (typing.Union, types.UnionType)) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return rest[0], True
    return tp, False


def _to_bool(value: Any) -> bool:
    """A bool, a yes/no word (true/yes/on/1, false/no/off/0) or the integer 0 or 1; ValueError otherwise."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "yes", "on", "1", "false", "no", "off", "0"):
        return value.lower() in ("true", "yes", "on", "1")
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise ValueError


def _to_int(value: Any) -> int:
    """A whole number (``"1e3"`` included); ValueError for a bool or a fraction."""
    if isinstance(value, bool):
        raise ValueError
    number = float(value) if isinstance(value, str) else value
    if float(number) != int(number):
        raise ValueError
    return int(number)


def _to_float(value: Any) -> float:
    if isinstance(value, bool):
        raise ValueError
    return float(value)


def _to_dict(value: Any) -> dict:
    if not isinstance(value, dict):
        raise ValueError
    return dict(value)


# how a YAML-parsed value becomes each plain annotation of a recipe field (lists: _coerce, item by item)
_COERCERS: dict[type, Callable[[Any], Any]] = {bool: _to_bool, int: _to_int, float: _to_float, str: str, dict: _to_dict}


def _coerce(key: str, value: Any, tp: Any) -> Any:
    """Coerce a YAML-parsed ``value`` to the annotation ``tp`` of recipe field ``key``."""
    base, optional = _unwrap_optional(tp)
    if value is None or (optional and isinstance(value, str) and value.lower() in ("none", "null", "")):
        if optional:
            return None
        raise RecipeError(f"{key} may not be none")
    origin = typing.get_origin(base) or base
    try:
        if origin in (list, dict) and isinstance(value, str):  # a list or a mapping written in YAML
            value = yaml.safe_load(value) if origin is list else yaml.safe_load(value) or {}
        if origin is list:
            (item,) = typing.get_args(base) or (Any,)
            if not isinstance(value, (list, tuple)):
                raise ValueError
            return [_coerce(key, v, item) if item is not Any else v for v in value]
        coerce = _COERCERS.get(origin)
        return value if coerce is None else coerce(value)
    except (TypeError, ValueError, yaml.YAMLError):  # a YAML list or mapping that does not parse, too
        raise RecipeError(f"{key}: cannot use {value!r} as {getattr(base, '__name__', base)}") from None


def _unknown(key: str) -> RecipeError:
    return RecipeError(f"unknown recipe key {key!r}; valid keys: {', '.join(Recipe.keys())}")


def _parse_value(text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def apply_overrides(recipe: Recipe, overrides: list[str] | None) -> Recipe:
    """Return a copy of ``recipe`` with ``key=value`` overrides applied (``model_kwargs.name=value``
    sets one model kwarg; ``model_kwargs={...}`` replaces them all)."""
    values = recipe.to_dict()
    for item in upgrade_overrides(overrides or []):
        if "=" not in item:
            raise RecipeError(f"override {item!r} is not key=value")
        key, text = item.split("=", 1)
        key = key.strip()
        if key.startswith("model_kwargs."):
            name = key.split(".", 1)[1]
            if not name:
                raise RecipeError(f"override {item!r}: empty model_kwargs name")
            values["model_kwargs"] = dict(values["model_kwargs"], **{name: _parse_value(text)})
            continue
        if key not in _FIELD_TYPES:
            raise _unknown(key)
        base, _ = _unwrap_optional(_FIELD_TYPES[key])
        raw = text if base is str else _parse_value(text)
        values[key] = _coerce(key, raw, _FIELD_TYPES[key])
    return Recipe(**values).validate()


def recipe_from_dict(values: dict[str, Any]) -> Recipe:
    """Build and validate a Recipe from a mapping (unknown keys are an error)."""
    out = {}
    for key, value in upgrade_keys(values).items():
        if key not in _FIELD_TYPES:
            raise _unknown(key)
        out[key] = _coerce(key, value, _FIELD_TYPES[key])
    return Recipe(**out).validate()


def shipped_recipes() -> dict[str, Traversable]:
    """The recipes shipped inside the package (``timm_posgeom.recipes``): name -> file, sorted by name."""
    root = files("timm_posgeom.recipes")
    return {
        entry.name[: -len(".yaml")]: entry
        for entry in sorted(root.iterdir(), key=lambda e: e.name)
        if entry.is_file() and entry.name.endswith(".yaml")
    }


def accelerate_configs() -> dict[str, Traversable]:
    """The accelerate launcher configs shipped inside the package: name (e.g. ``1gpu``) -> file."""
    root = files("timm_posgeom.recipes") / "accelerate"
    return {
        entry.name[: -len(".yaml")]: entry
        for entry in sorted(root.iterdir(), key=lambda e: e.name)
        if entry.is_file() and entry.name.endswith(".yaml")
    }


def find_accelerate_config(name_or_path: str | os.PathLike) -> Path:
    """An accelerate config: an existing file, or the name of a shipped one (``1gpu``, ``8gpu``, ...)."""
    path = Path(name_or_path).expanduser()
    if path.is_file():
        return path
    shipped = accelerate_configs()
    name = Path(name_or_path).name.removesuffix(".yaml")
    if name in shipped:
        return packaged_path(shipped[name])
    raise PathNotFoundError(
        f"accelerate config {str(name_or_path)!r} not found (not a file, and not one of the "
        f"shipped configs: {', '.join(shipped) or 'none'})"
    )


def packaged_path(entry: Traversable) -> Path:
    """A shipped resource as a filesystem path (wheels and editable installs keep them as files)."""
    path = Path(str(entry))
    if not path.is_file():
        raise FileNotFoundError(f"packaged resource {entry} is not a file on disk (a zipped install?)")
    return path


def find_recipe(name_or_path: str | os.PathLike) -> Path:
    """A recipe file: an existing path, or the name of a shipped recipe (``posgeom recipes`` lists them)."""
    path = Path(name_or_path).expanduser()
    if path.is_file():
        return path
    shipped = shipped_recipes()
    name = str(name_or_path).removesuffix(".yaml")
    if name in shipped:
        return packaged_path(shipped[name])
    raise PathNotFoundError(
        f"recipe {str(name_or_path)!r} not found (not a file, and not one of the shipped "
        f"recipes: {', '.join(shipped) or 'none'})"
    )


def _data_relative_to_repo(data: str | None, recipe_path: Path) -> str | None:
    """A relative data path in a recipe under ``<repo>/recipes/`` that does not exist from the
    working directory is taken relative to the repository root (the recipes' convention)."""
    if not data or not data.startswith(("./", "../")) or Path(data).exists():
        return data
    candidate = recipe_path.resolve().parent.parent / data
    return str(candidate) if candidate.exists() else data


def load_recipe(name_or_path: str | Path | None = None, overrides: list[str] | None = None) -> Recipe:
    """Load a recipe (YAML file or bare name; None = the defaults) and apply ``key=value`` overrides."""
    recipe = Recipe()
    if name_or_path is not None:
        path = find_recipe(name_or_path)
        try:
            values = yaml.safe_load(path.read_text()) or {}
        except (yaml.YAMLError, UnicodeDecodeError) as e:  # not YAML, or not text at all
            raise RecipeError(f"{path}: not valid YAML: {e}") from None
        if not isinstance(values, dict):
            raise RecipeError(f"{path}: a recipe is a mapping of keys to values")
        try:
            recipe = recipe_from_dict(values)
        except RecipeError as e:
            raise RecipeError(f"{path}: {e}") from None
        recipe.data = _data_relative_to_repo(recipe.data, path)
    return apply_overrides(recipe, overrides)
