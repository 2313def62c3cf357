"""The study, one way down: the plan made once, then for each run train -> measure -> record, then the
report from the results in memory (:func:`run_study`); and what a resume checks first."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from ..provenance import package_versions
from ..records import RunSummary, StudyResults, StudyRun
from ..rundir import NotWritableError, OutputExistsError, check_fields, describe_changes, read_json_file
from .config import CONDITIONS, StudyConfig, StudyError, config_changes
from .measure import Measuring, check_evals, eval_settings, measure_run, untrained_ssdc
from .plan import PlannedRun, StudyPlan, make_plan, write_plan
from .training import is_trained, train_run, training_history

__all__ = ["run_study"]


def run_study(
    config: StudyConfig,
    out: str | os.PathLike,
    *,
    resume: bool = False,
    progress: bool = True,
    allow_changes: bool = False,
) -> StudyResults:
    """Run (or resume) the study; write ``results.json``, ``report.md`` and figures into ``out``.

    A resume compares the settings with those the study was started with: a change that alters results
    is refused with the list of differences unless ``allow_changes``; then every run trained with
    another recipe is trained again and every measurement made with other settings made again (the
    former files are kept beside them), and the records say what ran with what (``eval.json``'s
    ``settings``)."""
    from tqdm.auto import tqdm

    from ..report.document import write_report

    out = _open_out(Path(out), resume, create=False)  # created once every check has passed: a refusal leaves none
    # the invocations this one resumes: their measured runs stay in the study, their time is added to its own
    previous = StudyResults.read(out / "results.json") if resume and (out / "results.json").is_file() else None
    if previous is not None:
        config = _keep_measured(config, previous.runs, out)
    plan = make_plan(config, out)  # every recipe built and validated once, before anything runs
    saved = _saved_plan(out) if resume and (out / "plan.json").is_file() else None
    _check_settings(saved, config, out, allow_changes)
    val, identity = _eval_split(plan, saved, out)
    m = Measuring(
        config=config,
        val=val,
        settings=eval_settings(config, val),
        versions=package_versions(),
        log=lambda s: None,
        allow_changes=allow_changes,
    )
    check_evals(list(plan.runs), m)  # a refused resume writes nothing: every run checked before the plan is
    _open_out(out, resume)
    planned = plan.to_json()
    write_plan(config, out, planned, data=identity)  # a plan written before the data was identified gains it here
    started, earlier = time.time(), previous.elapsed_s if previous is not None else 0.0
    order = {(r.condition, r.seed): i for i, r in enumerate(plan.runs)}
    bar = tqdm(_trained_first(plan.runs), desc="study", unit="run", disable=not progress)
    m.log = bar.write if progress else (lambda s: None)
    results = StudyResults(
        config=asdict(config),
        plan=planned,
        versions=m.versions,
        recipes=plan.recipes(),
        eval_data=dict(
            source=plan.first.data or "synthetic",
            split=plan.first.val_split,
            images=len(val),
            classes=val.num_classes,
            identity=identity,
        ),
    )
    for run in bar:
        bar.set_postfix_str(run.label)
        results.runs.append(_run_one(run, m, out))
        results.runs.sort(key=lambda r: order[(r.condition, r.seed)])  # the plan's order, whatever ran first
        results.elapsed_s = round(earlier + time.time() - started, 1)
        results.complete = len(results.runs) == len(plan.runs)
        results.write(out / "results.json")
    write_report(out, results)
    return results


def _trained_first(runs: Sequence[PlannedRun]) -> list[PlannedRun]:
    """The runs with a finished training first (each measured, or its record reused, in seconds to minutes),
    then the ones still to train, each group in the plan's order: ``results.json`` is rewritten after every
    run with the runs this invocation has done, so an interrupted resume keeps every trained run in it
    rather than only those the plan puts before the run it stopped in."""
    trained = [is_trained(r) for r in runs]
    return [r for r, t in zip(runs, trained) if t] + [r for r, t in zip(runs, trained) if not t]


def _run_one(run: PlannedRun, m: Measuring, out: Path) -> StudyRun:
    """One run, one way: trained (or reused), measured, its record made from what the steps returned."""
    train_run(run, m.config, m.log, m.allow_changes)
    evals = measure_run(run, m)
    return StudyRun(
        condition=run.condition,
        seed=run.seed,
        run_dir=os.path.relpath(run.run_dir, out),
        train=RunSummary.read(run.run_dir / "summary.json"),
        eval=evals,
        history=training_history(run.run_dir),
        untrained=untrained_ssdc(run, m, out),
    )


def _open_out(out: Path, resume: bool, create: bool = True) -> Path:
    """``out``, created (with ``create``); FileExistsError when it holds a study and this is not a resume."""
    if out.exists() and any(out.iterdir()) and not resume:
        raise OutputExistsError(f"{out} already holds a study; pass --resume to continue it or choose another --out")
    if not create:
        return out
    out.mkdir(parents=True, exist_ok=True)
    if not os.access(out, os.W_OK):
        raise NotWritableError(f"cannot write to {out}")
    return out


def _saved_plan(out: Path) -> dict[str, Any]:
    """``plan.json`` of the study being resumed; RunFileError (one line) when it is damaged."""
    path, hint = out / "plan.json", "restore it, or start the study again in another --out"
    saved = read_json_file(path, hint)
    check_fields(path, saved, {"config": dict, "plan": list, "data": dict}, hint)
    return saved


def _check_settings(saved: dict[str, Any] | None, config: StudyConfig, out: Path, allow_changes: bool) -> None:
    """A resume with settings that change results is refused unless ``allow_changes`` (then it says so)."""
    if saved is None:
        return
    changes = config_changes(saved.get("config", {}), asdict(config))
    if changes and not allow_changes:
        raise StudyError(
            f"{out} was started with other settings ({describe_changes(changes)}): its runs and numbers would "
            "not be what the report says; pass --allow-changes to recompute what they affect (former "
            "files are kept), or choose another --out"
        )
    if changes:
        print(f"resuming {out} with changed settings: {describe_changes(changes)}; what they affect is recomputed")


def _eval_split(plan: StudyPlan, saved: dict[str, Any] | None, out: Path) -> tuple[Any, dict[str, Any]]:
    """The validation split every run is measured on (the first recipe's) and its identity; StudyError when
    the study was measured on other data under the same name, even with allow_changes (runs trained on the
    former data would be reused under the same recipe)."""
    from ...data import check_images, data_identity, identity_change, load_split

    config, first = plan.config, plan.first
    # streamed (the recipes' streaming): the first max_val_images, the training runs' own validation images
    val = load_split(
        first.data,
        first.val_split,
        img_size=first.img_size,
        seed=first.seed,
        synthetic_size=config.synthetic_val_size or (config.synthetic_size // 5 if config.synthetic_size else None),
        subset=first.max_val_images if first.streaming else None,
        config=first.data_config,
        revision=first.revision,
        streaming=first.streaming,
    )
    if first.bad_images == "skip":  # as the training runs: left out, listed
        val = check_images(val, "skip", progress=False)
    identity = data_identity(val, content=True)  # every image's bytes: the same path with other images is refused
    what = identity_change(saved["data"], identity) if saved is not None and saved.get("data") else None
    if what:
        raise StudyError(
            f"{out} was measured on other data: {first.data or 'synthetic'} ({first.val_split}) now has other "
            f"{what} than when the study started; point --data at that data, or choose another --out"
        )
    return val, identity


def _keep_measured(config: StudyConfig, runs: list[StudyRun], out: Path) -> StudyConfig:
    """``config`` widened to every condition and seed of ``runs``, the measured runs of the study in ``out``.

    ``--conditions`` and ``--num-seeds`` choose which runs a study holds; a resume that names fewer than were
    measured would rewrite results.json and the report without them (a claim the study had decided would
    read "not measured"). The measured runs stay; a condition or seed planned but never measured may be
    dropped."""
    measured = {r.condition for r in runs}
    extra = [c for c in CONDITIONS if c in measured and c not in config.conditions]
    seeds = max([config.seeds] + [r.seed + 1 for r in runs])
    if not extra and seeds == config.seeds:
        return config
    kept = ", ".join(extra + ([f"{seeds} seeds"] if seeds > config.seeds else []))
    print(
        f"resuming {out}: it holds measured runs beyond the ones asked for ({kept}); they stay in the study "
        "and its report (choose another --out for a study of fewer)"
    )
    conditions = tuple(c for c in CONDITIONS if c in config.conditions or c in measured) if extra else config.conditions
    return replace(config, conditions=conditions, seeds=seeds)
