"""The study's measuring step: a trained run's fragility, SSDC across depth (normal and under RPI), alpha
sweep and attention per head, each part written to ``eval.json`` as soon as it exists; and the same
architecture's SSDC untrained (the paper's static prior)."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ...errors import PosgeomError
from ...jsonio import to_jsonable, write_errors
from ..records import AttentionSummary, RunEval, SSDCSummary, SweepSummary
from ..rundir import describe_changes, set_aside
from .config import PART_SETTINGS, SWEPT, StudyConfig, StudyError, attention_rpi, config_changes, sweep_rpi
from .fragility_at_size import fragility_at_size
from .plan import PlannedRun

__all__ = [
    "Measuring",
    "measure_run",
    "check_evals",
    "eval_changes",
    "untrained_ssdc",
    "eval_settings",
    "ATTENTION_LAYERS",
    "ATTENTION_IMAGES",
    "attention_layers",
    "attention_summary",
    "ssdc_summary",
]

# Attention per head is measured at this many blocks, spread evenly from the first to the last, on the first
# of the SSDC probe images (at most ATTENTION_IMAGES): a few layers and a few hundred images keep it cheap and
# still show how the heads' reach changes with depth.
ATTENTION_LAYERS = 4
ATTENTION_IMAGES = 256


@dataclass
class Measuring:
    """What measuring every run of a study shares, made once: the configuration, the evaluation split, the
    settings recorded with each measurement, the versions of this invocation, the log."""

    config: StudyConfig
    val: Any  # the evaluation split (data.load_split)
    settings: dict[str, Any]  # eval_settings(config, val)
    versions: dict[str, str]  # package_versions() of this invocation
    log: Callable[[str], None]
    allow_changes: bool = False
    # run folder -> its alpha sweep measured before under other RPI permutations alone: its FS is kept
    kept_fs: dict[Path, SweepSummary] = field(default_factory=dict)


def eval_settings(config: StudyConfig, val: Any) -> dict[str, Any]:
    """What a run's measurements depend on besides its weights: recorded in eval.json, compared on resume."""
    return to_jsonable(
        dict(
            data=config.data or "synthetic",
            val_images=len(val),
            eval_images=config.eval_images,
            probe_images=config.probe_images,
            sweep_images=config.sweep_images,
            alphas=config.alphas,
            shifts=config.shifts,
            imagenet_c=config.imagenet_c,
            shift_size=config.shift_size,
            rpi_permutations=config.rpi_permutations,
            sweep_rpi=sweep_rpi(config.rpi_permutations),
            attention_rpi=attention_rpi(config.rpi_permutations),
        )
    )


def measure_run(run: PlannedRun, m: Measuring) -> RunEval:
    """Fragility, SSDC, (for PE models) the alpha sweep, and attention per head of a trained run; each part
    is written to ``eval.json`` as soon as it exists, and a resumed study skips the parts already there."""
    from ...factory import create_model

    eval_path = run.run_dir / "eval.json"
    evals = _open_eval(eval_path, run, m)

    def measured() -> None:  # a part was measured now: with this invocation's versions
        # an eval.json from before versions were kept (None) stays "not recorded": its earlier parts were not
        if evals.versions is not None and m.versions not in evals.versions:
            evals.versions.append(m.versions)
        evals.write(eval_path)

    model = create_model(f"local-dir:{run.run_dir / 'export'}").eval()
    if evals.fs is None:
        m.log(f"[{run.run_dir.name}] fragility")
        _fragility(evals, model, m)
        measured()
    if m.config.shift_size and evals.fragility_at_size is None:
        m.log(f"[{run.run_dir.name}] fragility, the shifts at {m.config.shift_size} px")
        evals.fragility_at_size = fragility_at_size(model, m.val, m.config)
        measured()
    if evals.ssdc is None:
        m.log(f"[{run.run_dir.name}] SSDC across depth, normal and under RPI")
        evals.ssdc = ssdc_summary(model, m.val, m.config, run.run_dir / "maps.pt")
        measured()
    if run.condition in SWEPT and evals.alpha_sweep is None:
        kept = m.kept_fs.pop(run.run_dir, None)
        m.log(
            f"[{run.run_dir.name}] alpha sweep {list(m.config.alphas)}"
            + (" (delta SSDC under RPI; FS kept: it does not depend on the permutations)" if kept else "")
        )
        evals.alpha_sweep = _sweep(model, m, kept)
        measured()
    if evals.attention is None:
        m.log(f"[{run.run_dir.name}] attention per head")
        evals.attention = attention_summary(model, m.val, m.config, m.log)
        if evals.attention is not None:
            measured()
    return evals


def eval_changes(run: PlannedRun, m: Measuring) -> tuple[RunEval, str, dict[str, tuple[Any, Any]]]:
    """(the run's ``eval.json``, or a new record; the SHA-1 of its exported weights; what differs between the
    record and what is measured now: settings, or weights exported again since). Reads only."""
    from ..hub import weights_sha1

    eval_path, settings = run.run_dir / "eval.json", m.settings
    sha1 = weights_sha1(run.run_dir / "export" / "model.safetensors")
    evals = (
        RunEval.read(eval_path)
        if eval_path.is_file()
        else RunEval(settings=settings, weights_sha1=sha1, versions=[m.versions])
    )
    changed = config_changes(evals.settings or {}, settings) if evals.settings != settings else {}
    if evals.weights_sha1 is not None and evals.weights_sha1 != sha1:  # the run was exported again since
        changed["weights (export/model.safetensors)"] = (evals.weights_sha1[:12], sha1[:12])
    return evals, sha1, changed


def check_evals(runs: list[PlannedRun], m: Measuring) -> None:
    """Before anything of a resumed study is written: StudyError (one line) when a measured run's ``eval.json``
    was made with other settings or other weights and changes are not allowed (found mid-way, the study
    would have rewritten its results first)."""
    from .training import recipe_changes

    if m.allow_changes:
        return
    for run in runs:
        changed = recipe_changes(run)
        if changed:
            raise StudyError(
                f"{run.run_dir} was trained with another recipe ({describe_changes(changed)}); pass "
                "--allow-changes to train it again with the new one (the former run is kept), or choose "
                "another --out"
            )
        if (run.run_dir / "eval.json").is_file() and (run.run_dir / "export" / "model.safetensors").is_file():
            _, _, changed = eval_changes(run, m)
            if changed:
                raise StudyError(
                    f"{run.run_dir / 'eval.json'} was measured with other settings "
                    f"({describe_changes(changed)}); pass --allow-changes to measure again (the former "
                    "file is kept)"
                )


def _open_eval(eval_path: Path, run: PlannedRun, m: Measuring) -> RunEval:
    """The run's ``eval.json`` (a new record when there is none), checked against the settings and the
    weights measured now: a change is refused unless ``allow_changes``; then a change of settings that each
    touch one part (``PART_SETTINGS``: the RPI permutations of SSDC, of the sweep, of attention) clears
    those parts alone, any other sets the file aside and starts again."""
    settings, current = m.settings, m.versions
    evals, sha1, changed = eval_changes(run, m)
    if changed and not m.allow_changes:
        raise StudyError(
            f"{eval_path} was measured with other settings ({describe_changes(changed)}); pass "
            "--allow-changes to measure again (the former file is kept)"
        )
    if changed and set(changed) <= set(PART_SETTINGS):  # only these parts depend on them: measure them again
        set_aside(eval_path, m.log)
        parts = sorted({PART_SETTINGS[key] for key in changed})
        m.log(f"[{run.run_dir.name}] {describe_changes(changed)}: {', '.join(parts)} measured again, the rest kept")
        if evals.alpha_sweep is not None and "alpha_sweep" in parts and evals.alpha_sweep.fs_interval is not None:
            m.kept_fs[run.run_dir] = evals.alpha_sweep  # the same alphas, shifts and images: only the RPI part moves
        for part in parts:
            setattr(evals, part, None)
        evals.settings = settings
        evals.write(eval_path)
    elif changed:
        set_aside(eval_path, m.log)
        evals = RunEval(settings=settings, weights_sha1=sha1, versions=[current])
    elif evals.settings != settings:  # the same settings, recorded before some existed (LEGACY_SETTINGS)
        evals.settings = settings
        evals.write(eval_path)
    if evals.weights_sha1 is None:  # recorded before the weights were: they are the run's export, unchanged since
        evals.weights_sha1 = sha1
        evals.write(eval_path)
    return evals


def _fragility(evals: RunEval, model: torch.nn.Module, m: Measuring) -> None:
    """Clean accuracy, accuracy and FS per shift (with their intervals) into ``evals``."""
    from ... import robustness
    from ...shifts import IMAGENET_C

    config = m.config
    shifts = list(config.shifts)
    if config.imagenet_c:
        shifts += [f"imagenet-c:{name}:{s}" for name in IMAGENET_C for s in range(1, 6)]
    res = robustness.fragility(
        model,
        m.val,
        shifts,
        batch_size=config.batch_size,
        max_images=config.eval_images,
        num_workers=config.workers,
        device=config.device,
        progress=False,
    )
    evals.clean_accuracy, evals.accuracy, evals.fs = res.clean_accuracy, dict(res.accuracy), dict(res.fs)
    evals.fs_interval = {k: list(v) for k, v in res.fs_interval.items()}
    evals.num_images = res.num_images


def _sweep(model: torch.nn.Module, m: Measuring, kept: SweepSummary | None = None) -> SweepSummary:
    """The alpha sweep: delta SSDC under RPI and JPEG q5 FS per alpha. With ``kept`` (the run's former sweep,
    measured with the same alphas, shifts and images under other RPI permutations), only the SSDC part is
    measured (:func:`~timm_posgeom.robustness.sweep_ssdc`, the sweep's own code) and its FS kept."""
    from ... import robustness

    config = m.config
    if kept is not None and list(kept.alphas) == [float(a) for a in config.alphas]:
        from ...measuring import MeasureSettings

        loader = _probe_loader(model, m.val, config)
        ssdcs = robustness.sweep_ssdc(
            model,
            loader,
            config.alphas,
            settings=MeasureSettings(
                seed=0,
                rpi_permutations=config.rpi_permutations,
                device=config.device,
                progress=False,
                max_images=config.probe_images,
            ),
        )
        return SweepSummary(
            alphas=list(kept.alphas),
            delta_ssdc=[r.rise for r in ssdcs],
            fs=kept.fs,
            clean_accuracy=kept.clean_accuracy,
            rpi_per_layer=[list(r.per_layer) for r in ssdcs],
            fs_interval=kept.fs_interval,
            rpi_permutations=config.rpi_permutations,
            delta_ssdc_ci=[list(r.delta_ci) for r in ssdcs],
        )
    sweep = robustness.alpha_sweep(
        model,
        m.val,
        config.alphas,
        shifts=("jpeg:5",),
        probe_images=config.probe_images,
        batch_size=config.batch_size,
        max_images=config.sweep_images or config.eval_images,
        num_workers=config.workers,
        device=config.device,
        progress=False,
        seed=0,
        rpi_permutations=config.rpi_permutations,
    )
    return SweepSummary(
        alphas=list(sweep.alphas),
        delta_ssdc=list(sweep.delta_ssdc),
        fs=sweep.fs,
        clean_accuracy=[r.clean_accuracy for r in sweep.rows],
        rpi_per_layer=[list(r.ssdc_per_layer) for r in sweep.rows],
        fs_interval={s: [list(r.fragility.fs_interval[s]) for r in sweep.rows] for s in sweep.shifts},
        rpi_permutations=config.rpi_permutations,
        delta_ssdc_ci=[list(r.delta_ssdc_ci) for r in sweep.rows],
    )


def _probe_loader(model: torch.nn.Module, split: Any, config: StudyConfig, max_images: int | None = None) -> Any:
    """The first ``probe_images`` (or ``max_images``) of ``split`` as the model reads them (the paper's resize)."""
    from ...eval_data import eval_loader

    return eval_loader(
        model,
        split,
        max_images=max_images or config.probe_images,
        batch_size=config.batch_size,
        resize="paper",
        num_workers=config.workers,
    )


def ssdc_summary(model: torch.nn.Module, split: Any, config: StudyConfig, maps_path: Path | None) -> SSDCSummary:
    """SSDC across depth, normal and under RPI (both reductions) on the first ``probe_images``, each with its
    95% interval: over images without RPI, over the ``config.rpi_permutations`` permutations under RPI (seeds
    0 .. P-1, the protocol of :func:`~timm_posgeom.probes.probe_ssdc`; docs/method.md#rpi-and-rpt). The mean
    maps of layers 0 and 1 (under RPI: of the first permutation) go to ``maps_path``."""
    from ...probes import probe_ssdc

    results, maps = {}, {}
    for rpi in (False, True):
        res = probe_ssdc(
            model,
            _probe_loader(model, split, config),
            rpi=rpi,
            seed=0,
            reduction="both",
            rpi_permutations=config.rpi_permutations,
            device=config.device,
            progress=False,
        )
        results[rpi] = res
        if res.mean_maps is not None:
            maps["rpi" if rpi else "normal"] = res.mean_maps[:2].clone()
            if rpi and res.permutation is not None:
                maps["permutation"] = res.permutation.clone()
    if maps_path is not None and maps:
        with write_errors(maps_path):  # a full disk: one line
            torch.save(maps, maps_path)
    normal, rpi = results[False], results[True]

    def means(res):
        return [s.mean for s in res.per_image] if res.per_image else None

    def stds(res):
        return [s.std for s in res.per_image] if res.per_image else None

    def pairs(ci):
        return [list(c) for c in ci] if ci is not None else None

    return SSDCSummary(
        n_images=int(rpi.settings["n_images"]),
        per_layer=list(normal.per_layer),
        rise=normal.rise,
        rpi_per_layer=list(rpi.per_layer),
        rpi_delta=rpi.rise if len(rpi.per_layer) >= 2 else None,
        rpi_content_per_layer=list(rpi.content_per_layer),
        per_image_mean=means(normal),
        per_image_std=stds(normal),
        rpi_per_image_mean=means(rpi),
        rpi_per_image_std=stds(rpi),
        rpi_permutations=list(rpi.settings["permutation_seeds"]),
        rpi_by_permutation=rpi.by_permutation,
        per_layer_ci=pairs(normal.per_layer_ci),
        rise_ci=list(normal.rise_ci) if normal.rise_ci else None,
        rpi_per_layer_ci=pairs(rpi.per_layer_ci),
        rpi_delta_ci=list(rpi.rise_ci) if rpi.rise_ci else None,
    )


def attention_layers(depth: int, count: int = ATTENTION_LAYERS) -> list[int]:
    """``count`` block indices spread evenly over ``depth`` blocks, the first and the last included (every
    block when there are no more than ``count``)."""
    if depth <= count:
        return list(range(depth))
    return sorted({round(k * (depth - 1) / (count - 1)) for k in range(count)})


def attention_summary(
    model: torch.nn.Module, split: Any, config: StudyConfig, log: Callable[[str], None] = lambda s: None
) -> AttentionSummary | None:
    """Mean attention distance, attention entropy and attention SSDC per head (docs/attention.md#the-measures)
    at :func:`attention_layers` of the model, on the first ``probe_images`` (at most ``ATTENTION_IMAGES``),
    normal and under RPI (the mean over ``config.rpi_permutations`` shared permutations, seeds 0 .. P-1), with
    the function ``posgeom attention`` and the zoo use. None (said
    through ``log``) for a model whose attention cannot be captured."""
    from ...probes import attention_measures

    def measure(rpi: bool) -> Any:
        loader = _probe_loader(model, split, config, min(config.probe_images, ATTENTION_IMAGES))
        return attention_measures(
            model,
            loader,
            rpi=rpi,
            seed=0,
            layers=layers,
            device=config.device,
            progress=False,
            rpi_permutations=config.rpi_permutations,
        )

    def rows(values: Any) -> list[list[float | None]]:
        return [[None if not math.isfinite(float(v)) else float(v) for v in row] for row in values]

    layers = attention_layers(len(getattr(model, "blocks", [])))
    try:
        normal = measure(False)
    except PosgeomError as e:  # an attention module the capture does not know
        log(f"attention not measured: {e}")
        return None
    summary = AttentionSummary(
        n_images=int(normal.settings["n_images"]),
        layers=[int(k) for k in normal.layers],
        grid=[int(g) for g in normal.settings["grid_size"]],
        mean_distance=rows(normal.mean_distance),
        entropy=rows(normal.entropy),
        ssdc=rows(normal.ssdc),
    )
    try:
        shuffled = measure(True)
    except PosgeomError as e:
        log(f"attention under RPI not measured: {e}")
    else:
        summary.rpi_mean_distance = rows(shuffled.mean_distance)
        summary.rpi_entropy, summary.rpi_ssdc = rows(shuffled.entropy), rows(shuffled.ssdc)
        summary.rpi_permutations = config.rpi_permutations
    return summary


def untrained_ssdc(run: PlannedRun, m: Measuring, out: Path) -> SSDCSummary:
    """SSDC of the architecture untrained (same recipe, same seed): the static prior; kept in
    ``<out>/untrained/`` under a key of the settings and the recipe."""
    import timm

    recipe = run.recipe
    key = hashlib.sha1(json.dumps(dict(m.settings, recipe=recipe.to_dict()), sort_keys=True).encode()).hexdigest()[:10]
    path = out / "untrained" / f"{run.condition}_s{run.seed}-{key}.json"  # other settings: another file
    if path.is_file():
        return SSDCSummary.read(path)
    torch.manual_seed(run.seed)
    model = timm.create_model(
        recipe.model, num_classes=len(m.val.classes), img_size=recipe.img_size, **recipe.model_kwargs
    ).eval()
    result = ssdc_summary(model, m.val, m.config, None)
    path.parent.mkdir(parents=True, exist_ok=True)
    result.write(path)
    return result
