"""The study's measuring step: each part of a trained run's measurement (:func:`timm_posgeom.protocol.measure_model`
under the study's protocol, ``StudyConfig.protocol``) written to ``eval.json`` as soon as it exists, a resume
measuring only the parts missing; and the same architecture's SSDC untrained (the paper's static prior). This
module plans, resumes, fingerprints and writes: the numbers are the library's."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ...models.pretrained import WEIGHTS_FILE, weights_sha1
from ...protocol import RENAMED_SETTINGS, Measurement, Protocol, measure_model, spread_layers
from ...results.fingerprints import fingerprint
from ...results.jsonio import to_jsonable, write_errors
from ..records import AttentionSummary, Num, RunEval, RunSummary, SSDCSummary, SweepSummary
from ..rundir import describe_changes, set_aside
from .config import PART_SETTINGS, StudyConfig, StudyError, attention_rpi, config_changes, sweep_rpi
from .fragility_at_size import at_size_record
from .plan import PlannedRun

__all__ = [
    "Measuring",
    "measure_run",
    "check_evals",
    "eval_changes",
    "untrained_ssdc",
    "untrained_path",
    "eval_settings",
    "ATTENTION_LAYERS",
    "ATTENTION_IMAGES",
    "attention_layers",
    "attention_summary",
    "ssdc_summary",
]

# The study's attention per head (StudyConfig's defaults): at this many blocks spread evenly from the first to
# the last, on the first of the SSDC probe images (at most ATTENTION_IMAGES).
ATTENTION_LAYERS = StudyConfig.attention_layers
ATTENTION_IMAGES = StudyConfig.attention_images
ATTENTION = ("attention", "attention_rpi")  # the optional measures eval.json keeps as its ``attention``


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
            max_images=config.max_images,
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
    """Fragility, SSDC, (for PE models) the alpha sweep, attention per head and the other optional measures of a
    trained run; each part is written to ``eval.json`` as soon as it exists, and a resumed study measures only the
    parts not there yet."""
    from ...models.factory import create_model

    eval_path = run.run_dir / "eval.json"
    evals = _open_eval(eval_path, run, m)
    protocol = m.config.protocol(run.condition)
    kept = m.kept_fs.pop(run.run_dir, None)
    if kept is not None and list(kept.alphas) != list(protocol.alphas):  # other alphas: the FS kept does not apply
        kept = None
    missing = list(_missing(evals, protocol, kept is not None))
    if not missing:  # measured whole: its weights are not needed (they may live outside git)
        return evals
    model = create_model(f"local-dir:{_weights_here(run).parent}").eval()
    for part, parts in missing:
        m.log(f"[{run.run_dir.name}] {_WHAT.get(part, part)}")
        measured = measure_model(model, m.val, protocol, parts=parts)
        for note in measured.notes:
            m.log(f"[{run.run_dir.name}] {note}")
        if _record(evals, part, measured, run, kept):
            # an eval.json from before versions were kept (None) stays "not recorded": its earlier parts were not
            if evals.versions is not None and m.versions not in evals.versions:
                evals.versions.append(m.versions)
            evals.write(eval_path)
    return evals


_WHAT = {
    "fragility": "fragility",
    "fragility_at_size": "fragility, the shifts at the study's shift_size",
    "ssdc": "SSDC across depth, normal and under RPI",
    "alpha_sweep": "alpha sweep",
    "attention": "attention per head",
}


def _missing(evals: RunEval, protocol: Protocol, kept_fs: bool) -> Iterator[tuple[str, tuple[str, ...]]]:
    """(the eval.json part, the measure_model parts that make it) of every part the record lacks, in order."""
    if evals.fs is None:
        yield "fragility", ("fragility",)
    if protocol.shift_size and evals.fragility_at_size is None:
        yield "fragility_at_size", ("fragility_at_size",)
    if evals.ssdc is None:
        yield "ssdc", ("ssdc",)
    if protocol.alphas and evals.alpha_sweep is None:  # FS kept: the sweep's SSDC under RPI alone
        yield "alpha_sweep", ("sweep_ssdc",) if kept_fs else ("alpha_sweep",)
    attention = tuple(e for e in protocol.extras if e in ATTENTION)
    if attention and evals.attention is None:
        yield "attention", attention
    for name in protocol.extras:
        if name not in ATTENTION and (evals.measures or {}).get(name) is None:
            yield name, (name,)


def _record(evals: RunEval, part: str, measured: Measurement, run: PlannedRun, kept: SweepSummary | None) -> bool:
    """Put ``part`` of ``measured`` into ``evals``; False when it was not measured (the notes say why)."""
    if part == "fragility":
        if measured.fragility is None:  # a trained run's labels are its data's: a mismatch is the data's fault
            raise StudyError(f"{run.run_dir}: {'; '.join(measured.notes)}")
        res = measured.fragility
        evals.clean_accuracy, evals.accuracy, evals.fs = res.clean_accuracy, dict(res.accuracy), dict(res.fs)
        evals.fs_interval = {k: list(v) for k, v in res.fs_interval.items()}
        evals.num_images = res.num_images
        return True
    if part == "fragility_at_size":
        at_size = measured.fragility_at_size
        evals.fragility_at_size = None if at_size is None else at_size_record(at_size, measured.protocol)
    elif part == "ssdc":
        evals.ssdc = _ssdc_record(measured, run.run_dir / "maps.pt")
    elif part == "alpha_sweep":
        evals.alpha_sweep = _sweep_record(measured, kept)
    elif part == "attention":
        evals.attention = _attention_record(measured)
    else:  # another optional measure of the registry: its result whole
        if part not in measured.extras:
            return False
        evals.measures = {**(evals.measures or {}), part: to_jsonable(measured.extras[part].to_dict())}
        return True
    return getattr(evals, part) is not None


def _weights_here(run: PlannedRun) -> Path:
    """The run's exported weights file; StudyError in one line when they are not here (a committed run's weights
    live outside git, and a measurement needs them)."""
    path = run.run_dir / "export" / WEIGHTS_FILE
    if not path.is_file():
        raise StudyError(
            f"{path} is not here and {run.run_dir.name} has parts left to measure: `posgeom weights restore "
            f"{run.run_dir}` brings back the weights of a committed run (docs/guide.md, 'Trained weights outside git')"
        )
    return path


def _export_sha1(run: PlannedRun, recorded: str | None) -> str:
    """The SHA-1 of the run's exported weights: of the file, or, when the weights are not here (outside git), the
    one its records hold (``eval.json``, else ``summary.json``): they cannot have changed unseen."""
    path = run.run_dir / "export" / WEIGHTS_FILE
    if path.is_file():
        return weights_sha1(path)
    if recorded is None and (run.run_dir / "summary.json").is_file():
        recorded = RunSummary.read(run.run_dir / "summary.json").export_sha1
    if recorded is None:
        _weights_here(run)  # no record of them either: say how to get them
    return str(recorded)


def eval_changes(run: PlannedRun, m: Measuring) -> tuple[RunEval, str, dict[str, tuple[Any, Any]]]:
    """(the run's ``eval.json``, or a new record; the SHA-1 of its exported weights; what differs between the
    record and what is measured now: settings, or weights exported again since). Reads only."""
    eval_path, settings = run.run_dir / "eval.json", m.settings
    evals = RunEval.read(eval_path) if eval_path.is_file() else None
    sha1 = _export_sha1(run, evals.weights_sha1 if evals is not None else None)
    if evals is None:
        evals = RunEval(settings=settings, weights_sha1=sha1, versions=[m.versions])
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
        if (run.run_dir / "eval.json").is_file() and (run.run_dir / "export" / "config.json").is_file():
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
        same_fs = not {"alphas", "sweep_images"} & set(changed)  # the same alphas and images: only the RPI part moves
        if evals.alpha_sweep is not None and same_fs and "alpha_sweep" in parts and evals.alpha_sweep.fs_interval:
            m.kept_fs[run.run_dir] = evals.alpha_sweep
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


def _ssdc_record(measured: Measurement, maps_path: Path | None) -> SSDCSummary:
    """SSDC across depth, normal and under RPI (both reductions), each with its 95% interval: over images without
    RPI, over the RPI permutations under RPI (docs/method.md#rpi-and-rpt). The mean maps of layers 0 and 1 (under
    RPI: of the first permutation) go to ``maps_path``."""
    normal, rpi = measured.ssdc, measured.ssdc_rpi
    if normal is None or rpi is None:  # a trained ViT of the study can always be permuted
        raise StudyError(f"SSDC not measured: {'; '.join(measured.notes)}")
    maps = {}
    for key, res in (("normal", normal), ("rpi", rpi)):
        if isinstance(res.mean_maps, torch.Tensor):  # a flat ViT's (L, N, N); a staged model's list is not kept
            maps[key] = res.mean_maps[:2].clone()
    if rpi.permutation is not None and "rpi" in maps:
        maps["permutation"] = rpi.permutation.clone()
    if maps_path is not None and maps:
        with write_errors(maps_path):  # a full disk: one line
            torch.save(maps, maps_path)

    def means(res: Any) -> list[Num] | None:
        return [s.mean for s in res.per_image] if res.per_image else None

    def stds(res: Any) -> list[Num] | None:
        return [s.std for s in res.per_image] if res.per_image else None

    def pairs(rows: Any) -> list[list[Num]] | None:  # per layer (an interval) or per permutation (the layers)
        return [list(row) for row in rows] if rows is not None else None

    return SSDCSummary(
        n_images=int(rpi.settings["n_images"]),
        per_layer=list(normal.per_layer),
        rise=normal.rise,
        rpi_per_layer=list(rpi.per_layer),
        rpi_delta=rpi.rise if len(rpi.per_layer) >= 2 else None,
        rpi_content_per_layer=list(rpi.content_per_layer or []),
        per_image_mean=means(normal),
        per_image_std=stds(normal),
        rpi_per_image_mean=means(rpi),
        rpi_per_image_std=stds(rpi),
        rpi_permutations=list(rpi.settings["permutation_seeds"]),
        rpi_by_permutation=pairs(rpi.by_permutation),
        per_layer_ci=pairs(normal.per_layer_ci),
        rise_ci=list(normal.rise_ci) if normal.rise_ci else None,
        rpi_per_layer_ci=pairs(rpi.per_layer_ci),
        rpi_delta_ci=list(rpi.rise_ci) if rpi.rise_ci else None,
    )


def _sweep_record(measured: Measurement, kept: SweepSummary | None) -> SweepSummary | None:
    """The alpha sweep: delta SSDC under RPI and JPEG q5 FS per alpha. With ``kept`` (the run's former sweep,
    measured with the same alphas, shifts and images under other RPI permutations) only the sweep's SSDC was
    measured now, and its FS is kept."""
    ssdcs, sweep, k = measured.sweep_ssdc, measured.alpha_sweep, measured.protocol.rpi_permutations
    if ssdcs is None:
        return None
    fs: dict[str, list[Num]]
    clean: list[Num]
    fs_interval: dict[str, list[list[Num]]] | None
    if sweep is not None:
        fs, clean = {s: list(v) for s, v in sweep.fs.items()}, [r.clean_accuracy for r in sweep.rows]
        fs_interval = {s: [list(r.fragility.fs_interval[s]) for r in sweep.rows] for s in sweep.shifts}
    elif kept is not None:
        fs, clean, fs_interval = kept.fs, kept.clean_accuracy, kept.fs_interval
    else:
        return None
    return SweepSummary(
        alphas=[float(a) for a in measured.protocol.alphas],
        delta_ssdc=[r.rise for r in ssdcs],
        fs=fs,
        clean_accuracy=clean,
        rpi_per_layer=[list(r.per_layer) for r in ssdcs],
        fs_interval=fs_interval,
        rpi_permutations=k,
        delta_ssdc_ci=[list(r.delta_ci) for r in ssdcs],
    )


def _attention_record(measured: Measurement) -> AttentionSummary | None:
    """Mean attention distance, attention entropy and attention SSDC per head (docs/attention.md#the-measures),
    normal and under RPI (the mean over the RPI permutations); None for a model whose attention cannot be
    captured (a note says why). Numbers in their JSON form (lists, NaN as None)."""
    normal, shuffled = measured.extras.get("attention"), measured.extras.get("attention_rpi")
    if normal is None:
        return None
    summary = AttentionSummary(
        n_images=int(normal.settings["n_images"]),
        layers=[int(k) for k in normal.layers],
        grid=[int(g) for g in normal.settings["grid_size"]],
        mean_distance=to_jsonable(normal.mean_distance),
        entropy=to_jsonable(normal.entropy),
        ssdc=to_jsonable(normal.ssdc),
    )
    if shuffled is not None:
        summary.rpi_mean_distance = to_jsonable(shuffled.mean_distance)
        summary.rpi_entropy, summary.rpi_ssdc = to_jsonable(shuffled.entropy), to_jsonable(shuffled.ssdc)
        summary.rpi_permutations = measured.protocol.rpi_permutations
    return summary


def ssdc_summary(model: torch.nn.Module, split: Any, config: StudyConfig, maps_path: Path | None) -> SSDCSummary:
    """SSDC across depth of ``model`` on ``split`` under the study's protocol (:func:`_ssdc_record`)."""
    return _ssdc_record(measure_model(model, split, config.protocol(), parts=("ssdc",)), maps_path)


def attention_layers(depth: int, count: int = ATTENTION_LAYERS or 4) -> list[int]:
    """``count`` block indices spread evenly over ``depth`` blocks, the first and the last included (every
    block when there are no more than ``count``): :func:`timm_posgeom.protocol.spread_layers`."""
    return spread_layers(depth, count)


def attention_summary(
    model: torch.nn.Module, split: Any, config: StudyConfig, log: Callable[[str], None] = lambda s: None
) -> AttentionSummary | None:
    """Attention per head of ``model`` on ``split`` under the study's protocol (:func:`_attention_record`); None
    (said through ``log``) for a model whose attention cannot be captured."""
    measured = measure_model(model, split, config.protocol(), parts=ATTENTION)
    for note in measured.notes:
        log(note)
    return _attention_record(measured)


def untrained_path(run: PlannedRun, m: Measuring, out: Path) -> Path:
    """Where the untrained SSDC of ``run`` is kept: ``<out>/untrained/<condition>_s<seed>-<key>.json``, the key the
    :func:`~timm_posgeom.results.fingerprints.fingerprint` of the settings and the recipe (other settings: another
    file). The settings go in under the names the first studies recorded them with, so the files of a study
    begun then are found; and a file of timm-posgeom 0.1.0, whose key was cut to 10 hex digits, is found when
    none has the full key (a resumed study does not measure its untrained models again)."""
    former = {new: old for old, new in RENAMED_SETTINGS.items()}
    settings = {former.get(k, k): v for k, v in m.settings.items()}
    key = fingerprint(json.dumps(dict(settings, recipe=run.recipe.to_dict()), sort_keys=True))
    path, kept = (out / "untrained" / f"{run.condition}_s{run.seed}-{k}.json" for k in (key, key[:10]))
    return kept if not path.is_file() and kept.is_file() else path


def untrained_ssdc(run: PlannedRun, m: Measuring, out: Path) -> SSDCSummary:
    """SSDC of the architecture untrained (same recipe, same seed): the static prior; kept in
    ``<out>/untrained/`` (:func:`untrained_path`), measured only when not kept there."""
    import timm

    recipe = run.recipe
    path = untrained_path(run, m, out)
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
