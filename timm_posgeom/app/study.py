"""The whole study in one command: train (or reuse) every condition, probe, stress, sweep, report.

For each condition (no PE, APE, sincos, RoPE, RPT) and seed, a run directory
``<out>/runs/<condition>_s<seed>/`` holds the training run (``posgeom train``, in a subprocess so
each model starts from fresh memory, resumable from its checkpoints) and ``eval.json``:

* clean accuracy and fragility (the paper's JPEG q5 and blur sigma 2.5 / kernel 5, optionally
  ImageNet-C severities), exact counts over the evaluation images;
* SSDC across depth at the attention input, normal and under RPI, both reductions (mean map and per
  image), and the mean similarity maps of layers 0 and 1; under RPI with ``rpi_permutations``
  permutations (seeds 0 .. P-1, the same for every model and seed), whose spread enters the claims'
  intervals (docs/method.md#rpi-and-rpt);
* for APE, sincos and RoPE, an alpha sweep (delta SSDC under RPI and JPEG fragility per alpha);
* the SSDC of the same architecture untrained (the paper's static prior).

Every stage's result is written as soon as it exists, so an interrupted study resumes where it
stopped (``--resume``). ``results.json`` collects every number with the exact configuration,
versions and seeds; :mod:`timm_posgeom.app.report` turns it into ``report.md`` and figures.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..errors import PosgeomError
from ..jsonio import to_jsonable, write_json
from .provenance import package_versions
from .records import HistoryPoint, RunEval, RunSummary, SSDCSummary, StudyResults, StudyRun, SweepSummary
from .rundir import describe_changes, set_aside, settings_changes

__all__ = ["CONDITIONS", "PRESETS", "StudyConfig", "run_study", "plan_study", "preset_config", "dry_run",
           "write_plan"]

CONDITIONS = ("nope", "ape", "sincos", "rope", "rpt")
SWEPT = ("ape", "sincos", "rope")


@dataclass
class StudyConfig:
    """What a study does. Presets fill it; the command line overrides parts of it."""

    preset: str
    recipe_prefix: str  # recipes/<prefix>_<condition>.yaml
    data: str | None  # None: the embedded synthetic set
    seeds: int = 1
    conditions: tuple[str, ...] = CONDITIONS
    train_overrides: list[str] = field(default_factory=list)  # --set key=value for every training run
    init: str | None = None  # model_kwargs.init of every run (timm | paper); None: what each recipe says
    eval_images: int | None = None  # None: the whole validation split
    probe_images: int = 1000  # the paper's SSDC batch
    # RPI permutations per model (seeds 0 .. n-1, shared by every model and seed): SSDC under RPI is their
    # mean, and their spread enters the claims' intervals. The paper draws one per batch; one permutation
    # alone hides its own variance (the no-PE floor of one permutation is not zero).
    rpi_permutations: int = 3
    sweep_images: int | None = None  # fragility images per alpha (None: eval_images)
    alphas: tuple[float, ...] = (1.0, 0.8, 0.6, 0.5, 0.4, 0.2, 0.0)
    shifts: tuple[str, ...] = ("jpeg:5", "blur:2.5:5")
    imagenet_c: bool = False  # add ImageNet-C severities 1-5 of both corruptions
    batch_size: int = 128
    workers: int = 0
    device: str | None = None
    accelerate_config: str | None = None  # `accelerate launch --config_file`: a file or a shipped config name
    synthetic_size: int | None = None
    # images in the synthetic validation split the study measures on (None: synthetic_size // 5, the training
    # runs' own); larger than that only adds images (each is drawn from its own seed and index)
    synthetic_val_size: int | None = None


PRESETS: dict[str, dict[str, Any]] = {
    # The embedded default: the synthetic set (classes that need layout as well as content), micro models
    # at width 64 (2 heads of 32) at 64 px, 300 steps each with the paper's initialisation: 8 min 21 s on 2
    # idle cores from a fresh install (set v3). With timm's initialisation the APE model had not learnt the layout after 1,000 steps
    # (top-1 0.38, no better than a model without PE could be on set v2), with the paper's it had after 100
    # (0.92). Fragility is measured on 3,200 validation images, SSDC and the sweep on the first 320. On set v2
    # JPEG q5 cost every model at most 3% of its accuracy and the fragility claim stayed within noise; set v3's
    # position grating, which JPEG q5 removes, is what a model without PE reads layout from (synthetic.py).
    "demo": dict(
        recipe_prefix="imagenette_cpu", data=None, eval_images=3200, probe_images=320, sweep_images=320,
        alphas=(1.0, 0.5, 0.0), batch_size=64, synthetic_size=1600, synthetic_val_size=3200, init="paper",
        train_overrides=["data=synthetic", "synthetic_size=1600", "epochs=12", "batch_size=64", "lr=2e-3",
                         "warmup_epochs=2", "model_kwargs.embed_dim=64", "model_kwargs.num_heads=2",
                         "cache=true", "disk_cache=false", "eval_every=4", "checkpoint_every=100",
                         "log_every=10", "rpi_ssdc_images=0"],
    ),
    # Real images at CPU scale: Imagenette at 64 px, the imagenette_cpu_* recipes.
    "imagenette-cpu": dict(recipe_prefix="imagenette_cpu", data="../shared/data/imagenette"),
    # The paper's 14 x 14 token grid at CPU scale: the imagenette_cpu recipes at 112 px (patch 8), crop
    # padding scaled with the image (4 -> 7 px), and the micro model at width 64 (2 heads of 64 / 2 = 32,
    # the micro model's head size; depth 4 kept, so per-layer numbers line up with the 8 x 8 study).
    # Why width 64: one training step at 112 px costs 3.4x one at 64 px at width 128 (58 against 256
    # img/s on 2 cores, benchmarks/bench_train.py); width 64 brings it back (213 img/s), about 30
    # minutes of training per model plus its evaluations, where width 128 would take about 110.
    "imagenette-cpu-14": dict(recipe_prefix="imagenette_cpu", data="../shared/data/imagenette",
                              train_overrides=["img_size=112", "crop_pad=7", "model_kwargs.embed_dim=64",
                                               "model_kwargs.num_heads=2"]),
    # The paper's protocol on ImageNet-100 through accelerate on GPUs.
    "in100": dict(recipe_prefix="in100_paper", data="clane9/imagenet-100", batch_size=256, workers=8,
                  alphas=(1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1, 0.0),
                  accelerate_config="1gpu"),
}


def preset_config(preset: str, **overrides: Any) -> StudyConfig:
    """The :class:`StudyConfig` of a preset, with ``overrides`` (None values ignored)."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; expected one of {', '.join(PRESETS)}")
    values = dict(PRESETS[preset], preset=preset)
    values.update({k: v for k, v in overrides.items() if v is not None})
    config = StudyConfig(**values)
    bad = [c for c in config.conditions if c not in CONDITIONS]
    if bad:
        raise ValueError(f"unknown condition(s) {bad}; expected some of {', '.join(CONDITIONS)}")
    twice = sorted({c for c in config.conditions if config.conditions.count(c) > 1})
    if twice:  # the same run twice would count as a second seed with no spread
        raise ValueError(f"condition(s) given twice: {', '.join(twice)}; use --seeds for more runs of one")
    if config.seeds < 1:
        raise ValueError(f"seeds must be >= 1, got {config.seeds}")
    if config.rpi_permutations < 1:
        raise ValueError(f"rpi_permutations must be >= 1, got {config.rpi_permutations}")
    _check_init(config.init)
    return config


def _check_init(init: str | None) -> None:
    from ..models.vision_transformer_pe import INIT_TYPES

    if init is not None and init not in INIT_TYPES:
        raise ValueError(f"unknown init {init!r}; expected one of {', '.join(INIT_TYPES)}")


# --------------------------------------------------------------------------------------------
# plan
# --------------------------------------------------------------------------------------------
def _run_overrides(config: StudyConfig, seed: int) -> list[str]:
    """The recipe overrides of one run: ``--set`` values, then ``--init`` (it wins), seed and data."""
    _check_init(config.init)
    overrides = list(config.train_overrides)
    if any(o.split("=", 1)[0].strip() == "seed" for o in overrides):  # the study's seeds would replace it
        raise ValueError("a study sets each run's seed itself (0 .. seeds-1): use --seeds, not --set seed=...")
    if config.init is not None:
        overrides.append(f"model_kwargs.init={config.init}")
    overrides.append(f"seed={seed}")
    if config.data is not None:
        overrides.append(f"data={config.data}")
    return overrides


def _recipe_for(config: StudyConfig, condition: str, seed: int):
    from .recipe import load_recipe

    return load_recipe(f"{config.recipe_prefix}_{condition}", _run_overrides(config, seed))


def plan_study(config: StudyConfig, out: str | os.PathLike) -> list[dict[str, Any]]:
    """Validate every recipe and list the runs: what would be trained and evaluated, and how.

    Raises RecipeError / ValueError for a recipe that no run could use.
    """
    out = Path(out)
    plan = []
    for condition in config.conditions:
        for seed in range(config.seeds):
            recipe = _recipe_for(config, condition, seed)
            _check_init(recipe.model_kwargs.get("init"))
            run_dir = out / "runs" / f"{condition}_s{seed}"
            plan.append(dict(condition=condition, seed=seed, run_dir=str(run_dir), model=recipe.model,
                             recipe=f"{config.recipe_prefix}_{condition}", data=recipe.data or "synthetic",
                             epochs=recipe.epochs, batch_size=recipe.batch_size, img_size=recipe.img_size,
                             init=recipe.model_kwargs.get("init", "timm"),
                             command=" ".join(_train_command(config, condition, seed, run_dir)).replace(sys.executable, "python")))
    return plan


def _train_command(config: StudyConfig, condition: str, seed: int, run_dir: Path, resume: bool = False) -> list[str]:
    args = ["-m", "timm_posgeom.cli", "train", "--recipe", f"{config.recipe_prefix}_{condition}", "--out", str(run_dir)]
    for s in _run_overrides(config, seed):
        args += ["--set", s]
    if resume:
        args.append("--resume")
    if config.accelerate_config:
        return ["accelerate", "launch", "--config_file", _accelerate_config(config), *args]
    return [sys.executable, *args]


# --------------------------------------------------------------------------------------------
# stages
# --------------------------------------------------------------------------------------------
class StudyError(PosgeomError, RuntimeError):
    """A study that cannot go on as asked (a failed training, settings that differ from what exists)."""


# Settings added since the first studies, with the value a study that did not record them had: a study (or
# an eval.json) started before rpi_permutations existed drew one RPI permutation, seed 0.
LEGACY_SETTINGS: dict[str, Any] = {"rpi_permutations": 1}
# Settings that change only the RPI part of a run's measurements (SSDC under RPI): a change re-measures it,
# keeping the run's fragility and alpha sweep.
RPI_SETTINGS = frozenset({"rpi_permutations"})


def _with_legacy(saved: dict[str, Any]) -> dict[str, Any]:
    """``saved`` with the settings it predates set to what it ran with (``LEGACY_SETTINGS``); {} stays {}."""
    return {**LEGACY_SETTINGS, **saved} if saved else saved


def config_changes(saved: dict[str, Any], asked: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """``{key: (saved, asked)}`` for the result-changing StudyConfig fields that differ (JSON-compared); a
    setting ``saved`` predates counts as its legacy value (``LEGACY_SETTINGS``)."""
    return settings_changes("study", _with_legacy(saved), asked)


def _train(config: StudyConfig, condition: str, seed: int, run_dir: Path, log, allow_changes: bool = False) -> None:
    from .train import latest_checkpoint

    if (run_dir / "recipe.yaml").is_file():  # what exists was trained (or started) with this recipe?
        import yaml

        wanted = _recipe_for(config, condition, seed).to_dict()
        changes = settings_changes("recipe", yaml.safe_load((run_dir / "recipe.yaml").read_text()) or {}, wanted)
        if changes:
            if not allow_changes:
                raise StudyError(f"{run_dir} was trained with another recipe ({describe_changes(changes)}); pass --allow-changes to "
                                 "train it again with the new one (the former run is kept), or choose another --out")
            set_aside(run_dir, log)
    if (run_dir / "summary.json").is_file() and (run_dir / "export" / "model.safetensors").is_file():
        log(f"[{condition} s{seed}] trained run found, reused")
        return
    resume = latest_checkpoint(run_dir) is not None
    log(f"[{condition} s{seed}] {'resuming' if resume else 'training'}: {run_dir}")
    cmd = _train_command(config, condition, seed, run_dir, resume=resume)
    proc = subprocess.Popen(cmd, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        returncode = proc.wait()
    except BaseException:  # interrupted (Ctrl-C, or SIGTERM turned into an exception by the command): the
        _stop(proc)        # training run must not go on writing into run_dir after the study has stopped
        raise
    if returncode != 0:
        raise StudyError(f"training {condition} seed {seed} failed (exit {returncode}; its error is above): "
                         f"{' '.join(cmd)}")


def _stop(proc: subprocess.Popen, grace_s: float = 30.0) -> None:
    """Terminate a training subprocess and wait for it (killed after ``grace_s``); its last checkpoint stays."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _training_history(run_dir: Path) -> list[HistoryPoint]:
    """The evaluation records of a run's training log (``metrics.jsonl``), one per evaluation, in order.

    Each: step, epoch, val_top1, rpi_ssdc (SSDC per layer under RPI on the recipe's
    ``rpi_ssdc_images`` validation images, or None) and pe_ssdc (the learned table's own SSDC, or None).
    A resumed run has already dropped the records logged after its checkpoint (``MetricsLog``).
    """
    from .train import read_metrics

    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    return [HistoryPoint(step=int(r["step"]), epoch=round(float(r["epoch"]), 3), val_top1=r.get("val_top1"),
                         rpi_ssdc=r.get("rpi_ssdc"), pe_ssdc=r.get("pe_ssdc"))
            for r in read_metrics(path) if r.get("kind") == "eval"]


def _ssdc_summary(model, split, config: StudyConfig, maps_path: Path | None) -> SSDCSummary:
    """SSDC across depth, normal and under RPI (both reductions) on the first ``probe_images``; under RPI
    with ``config.rpi_permutations`` permutations (seeds 0 .. P-1): SSDC per layer under each, their mean,
    and the per-image reduction, content SSDC and maps of the first."""
    from ..eval_data import eval_loader
    from ..probes import probe_ssdc

    def loader():
        return eval_loader(model, split, max_images=config.probe_images, batch_size=config.batch_size,
                           resize="paper", num_workers=config.workers)

    results, maps = {}, {}
    for rpi in (False, True):
        res = probe_ssdc(model, loader(), rpi=rpi, seed=0, reduction="both", device=config.device, progress=False)
        results[rpi] = res
        if res.mean_maps is not None:
            maps["rpi" if rpi else "normal"] = res.mean_maps[:2].clone()
            if rpi and res.permutation is not None:
                maps["permutation"] = res.permutation.clone()
    if maps_path is not None and maps:
        torch.save(maps, maps_path)
    normal, rpi = results[False], results[True]
    by_permutation = [list(rpi.per_layer)]
    for seed in range(1, config.rpi_permutations):
        res = probe_ssdc(model, loader(), rpi=True, seed=seed, reduction="mean_map", device=config.device,
                         progress=False)
        by_permutation.append(list(res.per_layer))
    rpi_mean = _nanmean_rows(by_permutation)

    def means(res):
        return [s.mean for s in res.per_image] if res.per_image else None

    def stds(res):
        return [s.std for s in res.per_image] if res.per_image else None

    return SSDCSummary(
        n_images=int(rpi.metadata["n_images"]), per_layer=list(normal.per_layer), delta=normal.delta,
        rpi_per_layer=rpi_mean, rpi_delta=rpi_mean[1] - rpi_mean[0] if len(rpi_mean) >= 2 else None,
        rpi_content_per_layer=list(rpi.content_per_layer), per_image_mean=means(normal), per_image_std=stds(normal),
        rpi_per_image_mean=means(rpi), rpi_per_image_std=stds(rpi),
        rpi_permutations=list(range(config.rpi_permutations)), rpi_by_permutation=by_permutation)


def _nanmean_rows(rows: list[list[float | None]]) -> list[float]:
    """The mean over rows of each column, NaN (and None) left out; NaN where a column has no value."""
    import math

    out = []
    for column in zip(*rows):
        vals = [float(v) for v in column if v is not None and math.isfinite(float(v))]
        out.append(sum(vals) / len(vals) if vals else math.nan)
    return out


def _eval_settings(config: StudyConfig, val) -> dict[str, Any]:
    """What a run's measurements depend on besides its weights: recorded in eval.json, compared on resume."""
    return to_jsonable(dict(data=config.data or "synthetic", val_images=len(val), eval_images=config.eval_images,
                            probe_images=config.probe_images, sweep_images=config.sweep_images, alphas=config.alphas,
                            shifts=config.shifts, imagenet_c=config.imagenet_c,
                            rpi_permutations=config.rpi_permutations))


def _measure_run(config: StudyConfig, condition: str, run_dir: Path, val, log, allow_changes: bool = False) -> RunEval:
    """Fragility, SSDC and (for PE models) the alpha sweep of a trained run; each part is written to
    ``eval.json`` as soon as it exists, and a resumed study skips the parts already there."""
    from ..factory import create_model
    from ..robustness import alpha_sweep, fragility
    from ..shifts import IMAGENET_C
    from .hub import weights_sha1

    eval_path = run_dir / "eval.json"
    settings = _eval_settings(config, val)
    sha1 = weights_sha1(run_dir / "export" / "model.safetensors")
    current = package_versions()
    evals = RunEval.read(eval_path) if eval_path.is_file() else RunEval(settings=settings, weights_sha1=sha1,
                                                                         versions=[current])
    changed = config_changes(evals.settings or {}, settings) if evals.settings != settings else {}
    if evals.weights_sha1 is not None and evals.weights_sha1 != sha1:  # the run was exported again since
        changed["weights (export/model.safetensors)"] = (evals.weights_sha1[:12], sha1[:12])
    if changed and not allow_changes:
        raise StudyError(f"{eval_path} was measured with other settings ({describe_changes(changed)}); pass "
                         "--allow-changes to measure again (the former file is kept)")
    if changed and set(changed) <= RPI_SETTINGS:  # only the RPI part depends on them: measure it again
        set_aside(eval_path, log)
        log(f"[{run_dir.name}] {describe_changes(changed)}: SSDC under RPI measured again, the rest kept")
        evals.settings, evals.ssdc = settings, None
        evals.write(eval_path)
    elif changed:
        set_aside(eval_path, log)
        evals = RunEval(settings=settings, weights_sha1=sha1, versions=[current])
    elif evals.settings != settings:  # the same settings, recorded before some existed (LEGACY_SETTINGS)
        evals.settings = settings
        evals.write(eval_path)
    if evals.weights_sha1 is None:  # recorded before the weights were: they are the run's export, unchanged since
        evals.weights_sha1 = sha1
        evals.write(eval_path)

    def measured() -> None:  # a part was measured now: with this invocation's versions
        # an eval.json from before versions were kept (None) stays "not recorded": its earlier parts were not
        if evals.versions is not None and current not in evals.versions:
            evals.versions.append(current)
        evals.write(eval_path)

    model = create_model(f"local-dir:{run_dir / 'export'}").eval()
    if evals.fs is None:
        log(f"[{run_dir.name}] fragility")
        shifts = list(config.shifts)
        if config.imagenet_c:
            shifts += [f"imagenet-c:{name}:{s}" for name in IMAGENET_C for s in range(1, 6)]
        res = fragility(model, val, shifts, batch_size=config.batch_size, max_images=config.eval_images,
                        num_workers=config.workers, device=config.device, progress=False)
        evals.clean_accuracy, evals.accuracy, evals.fs = res.clean_accuracy, dict(res.accuracy), dict(res.fs)
        evals.fs_interval = {k: list(v) for k, v in res.fs_interval.items()}
        evals.num_images = res.num_images
        measured()
    if evals.ssdc is None:
        log(f"[{run_dir.name}] SSDC across depth, normal and under RPI")
        evals.ssdc = _ssdc_summary(model, val, config, run_dir / "maps.pt")
        measured()
    if condition in SWEPT and evals.alpha_sweep is None:
        log(f"[{run_dir.name}] alpha sweep {list(config.alphas)}")
        sweep = alpha_sweep(model, val, config.alphas, shifts=("jpeg:5",), probe_images=config.probe_images,
                            batch_size=config.batch_size, max_images=config.sweep_images or config.eval_images,
                            num_workers=config.workers, device=config.device, progress=False)
        evals.alpha_sweep = SweepSummary(
            alphas=list(sweep.alphas), delta_ssdc=list(sweep.delta_ssdc), fs=sweep.fs,
            clean_accuracy=[r.clean_accuracy for r in sweep.rows], rpi_per_layer=[list(r.ssdc_per_layer) for r in sweep.rows],
            fs_interval={s: [list(r.fragility.fs_interval[s]) for r in sweep.rows] for s in sweep.shifts})
        measured()
    return evals


def _untrained(config: StudyConfig, condition: str, seed: int, val, out: Path) -> SSDCSummary:
    """SSDC of the architecture untrained (same recipe, same seed): the static prior."""
    import timm

    key = hashlib.sha1(json.dumps(dict(_eval_settings(config, val), recipe=_recipe_for(config, condition, seed).to_dict()),
                                  sort_keys=True).encode()).hexdigest()[:10]
    path = out / "untrained" / f"{condition}_s{seed}-{key}.json"  # other settings: another file
    if path.is_file():
        return SSDCSummary.read(path)
    recipe = _recipe_for(config, condition, seed)
    torch.manual_seed(seed)
    model = timm.create_model(recipe.model, num_classes=len(val.classes), img_size=recipe.img_size,
                              **recipe.model_kwargs).eval()
    result = _ssdc_summary(model, val, config, None)
    path.parent.mkdir(parents=True, exist_ok=True)
    result.write(path)
    return result


def write_plan(config: StudyConfig, out: str | os.PathLike, plan: list[dict[str, Any]] | None = None,
               data: dict[str, Any] | None = None) -> Path:
    """Record the study's configuration, plan and validation data (:func:`data_identity`) in
    ``<out>/plan.json``: what ``--resume`` compares with."""
    path = Path(out) / "plan.json"
    body = dict(config=asdict(config), plan=plan_study(config, out) if plan is None else plan)
    if data is not None:
        body["data"] = data
    write_json(path, body)
    return path


def _keep_measured(config: StudyConfig, runs: list[StudyRun], out: Path) -> StudyConfig:
    """``config`` widened to every condition and seed of ``runs``, the measured runs of the study in ``out``.

    ``--conditions`` and ``--seeds`` choose which runs a study holds; a resume that names fewer than were
    measured would rewrite results.json and the report without them (a claim the study had decided would
    read "not measured"). The measured runs stay; a condition or seed planned but never measured may be
    dropped."""
    from dataclasses import replace

    measured = {r.condition for r in runs}
    extra = [c for c in CONDITIONS if c in measured and c not in config.conditions]
    seeds = max([config.seeds] + [r.seed + 1 for r in runs])
    if not extra and seeds == config.seeds:
        return config
    kept = ", ".join(extra + ([f"{seeds} seeds"] if seeds > config.seeds else []))
    print(f"resuming {out}: it holds measured runs beyond the ones asked for ({kept}); they stay in the study "
          "and its report (choose another --out for a study of fewer)")
    conditions = tuple(c for c in CONDITIONS if c in config.conditions or c in measured) if extra else config.conditions
    return replace(config, conditions=conditions, seeds=seeds)


def run_study(config: StudyConfig, out: str | os.PathLike, *, resume: bool = False, progress: bool = True,
              allow_changes: bool = False) -> StudyResults:
    """Run (or resume) the study; write ``results.json``, ``report.md`` and figures into ``out``.

    A resume compares the settings with those the study was started with: a change that alters results
    is refused with the list of differences unless ``allow_changes``; then every run trained with
    another recipe is trained again and every measurement made with other settings made again (the
    former files are kept beside them), and the records say what ran with what (``eval.json``'s
    ``settings``)."""
    from tqdm.auto import tqdm

    from ..data import data_identity, identity_change, load_split
    from .report import write_report

    out = Path(out)
    if out.exists() and any(out.iterdir()) and not resume:
        raise FileExistsError(f"{out} already holds a study; pass --resume to continue it or choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    if not os.access(out, os.W_OK):
        raise PermissionError(f"cannot write to {out}")
    # the invocations this one resumes: their measured runs stay in the study, their time is added to its own
    previous = StudyResults.read(out / "results.json") if resume and (out / "results.json").is_file() else None
    if previous is not None:
        config = _keep_measured(config, previous.runs, out)
    plan = plan_study(config, out)  # validates every recipe before anything runs
    saved = json.loads((out / "plan.json").read_text()) if resume and (out / "plan.json").is_file() else None
    if saved is not None:
        changes = config_changes(saved.get("config", {}), asdict(config))
        if changes and not allow_changes:
            raise StudyError(f"{out} was started with other settings ({describe_changes(changes)}): its runs and numbers would "
                             "not be what the report says; pass --allow-changes to recompute what they affect (former "
                             "files are kept), or choose another --out")
        if changes:
            print(f"resuming {out} with changed settings: {describe_changes(changes)}; what they affect is recomputed")
    first = _recipe_for(config, config.conditions[0], 0)
    val = load_split(first.data, first.val_split, img_size=first.img_size, seed=first.seed,
                     synthetic_size=config.synthetic_val_size or (config.synthetic_size // 5 if config.synthetic_size else None))
    identity = data_identity(val)
    what = identity_change(saved["data"], identity) if saved is not None and saved.get("data") else None
    if what:  # not even with allow_changes: runs trained on the former data would be reused under the same recipe
        raise StudyError(f"{out} was measured on other data: {first.data or 'synthetic'} ({first.val_split}) now has other "
                         f"{what} than when the study started; point --data at that data, or choose another --out")
    write_plan(config, out, plan, data=identity)  # a plan written before the data was identified gains it here
    started = time.time()
    earlier = previous.elapsed_s if previous is not None else 0.0
    bar = tqdm(plan, desc="study", unit="run", disable=not progress)
    log = bar.write if progress else (lambda s: None)
    results = StudyResults(config=asdict(config), plan=plan, versions=package_versions(),
                           recipes={c: _recipe_for(config, c, 0).to_dict() for c in config.conditions},
                           eval_data=dict(source=first.data or "synthetic", split=first.val_split, images=len(val),
                                          classes=val.num_classes, identity=identity))
    for item in bar:
        bar.set_postfix_str(f"{item['condition']} s{item['seed']}")
        run_dir = Path(item["run_dir"])
        _train(config, item["condition"], item["seed"], run_dir, log, allow_changes)
        evals = _measure_run(config, item["condition"], run_dir, val, log, allow_changes)
        results.runs.append(StudyRun(
            condition=item["condition"], seed=item["seed"], run_dir=os.path.relpath(run_dir, out),
            train=RunSummary.read(run_dir / "summary.json"), eval=evals, history=_training_history(run_dir),
            untrained=_untrained(config, item["condition"], item["seed"], val, out)))
        results.elapsed_s = round(earlier + time.time() - started, 1)
        results.complete = len(results.runs) == len(plan)
        results.write(out / "results.json")
    write_report(out)
    return results


def dry_run(config: StudyConfig, out: str | os.PathLike) -> list[dict[str, Any]]:
    """Validate the preset's recipes, data sources and launcher config; return the plan (nothing runs).

    A local data path that does not exist is an error here (a Hub id is checked when it is loaded)."""
    from ..data import resolve_source

    plan = plan_study(config, out)
    for item in plan:
        if item["data"] != "synthetic":
            try:
                resolve_source(item["data"])
            except FileNotFoundError as e:
                raise FileNotFoundError(f"{e}; pass --data PATH_OR_HUB_ID") from None
    if config.accelerate_config:
        _accelerate_config(config)
    return plan


def _accelerate_config(config: StudyConfig) -> str:
    """The accelerate config file: a path, or the name of one shipped with the package (``1gpu``)."""
    from .recipe import find_accelerate_config

    return str(find_accelerate_config(config.accelerate_config))
