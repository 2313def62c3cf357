"""The study's plan, made once: every run (condition x seed) with its run folder and its recipe, built and
validated before anything runs; ``plan.json``; the dry run."""

from __future__ import annotations

import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import PathNotFoundError, SettingError
from ...results.jsonio import write_json
from .config import StudyConfig, check_init

if TYPE_CHECKING:
    from ..recipe import Recipe

__all__ = ["PlannedRun", "StudyPlan", "make_plan", "plan_study", "write_plan", "dry_run"]


@dataclass(frozen=True)
class PlannedRun:
    """One run of the study: a condition and a seed, trained into ``run_dir`` with ``recipe``.

    ``overrides`` are the ``--set`` values of its training subprocess (``posgeom train --recipe
    recipe_name``), which build the same recipe there; ``recipe`` is that recipe, built once here."""

    condition: str
    seed: int
    run_dir: Path
    recipe_name: str  # recipes/<prefix>_<condition>.yaml
    overrides: tuple[str, ...]
    recipe: Recipe

    @property
    def label(self) -> str:
        """``<condition> s<seed>``, as the log and the report name a run."""
        return f"{self.condition} s{self.seed}"

    def train_command(self, config: StudyConfig, resume: bool = False) -> list[str]:
        """The command that trains the run (``accelerate launch`` with the study's launcher config)."""
        args = ["-m", "timm_posgeom.cli", "train", "--recipe", self.recipe_name, "--out", str(self.run_dir)]
        for s in self.overrides:
            args += ["--set", s]
        if resume:
            args.append("--resume")
        if config.device is not None:
            args += ["--device", config.device]
        if config.accelerate_config:
            return ["accelerate", "launch", "--config_file", accelerate_config(config.accelerate_config), *args]
        return [sys.executable, *args]

    def to_dict(self, config: StudyConfig) -> dict[str, Any]:
        """The run's entry in ``plan.json`` and ``results.json``."""
        recipe = self.recipe
        return dict(
            condition=self.condition,
            seed=self.seed,
            run_dir=str(self.run_dir),
            model=recipe.model,
            recipe=self.recipe_name,
            data=recipe.data or "synthetic",
            epochs=recipe.epochs,
            batch_size=recipe.batch_size,
            img_size=recipe.img_size,
            init=recipe.model_kwargs.get("init", "timm"),
            command=" ".join(self.train_command(config)).replace(sys.executable, "python"),
        )


@dataclass(frozen=True)
class StudyPlan:
    """Every run of a study, in order (condition, then seed), and what they share."""

    config: StudyConfig
    out: Path
    runs: tuple[PlannedRun, ...]

    @property
    def first(self) -> Recipe:
        """The recipe of the first condition's seed 0: the study's evaluation data is its validation split."""
        return self.runs[0].recipe

    def recipes(self) -> dict[str, dict[str, Any]]:
        """Each condition's recipe (seed 0) as a dict, for ``results.json``."""
        return {r.condition: r.recipe.to_dict() for r in self.runs if r.seed == 0}

    def to_json(self) -> list[dict[str, Any]]:
        """The plan as ``plan.json`` and ``results.json`` hold it: one dict per run."""
        return [r.to_dict(self.config) for r in self.runs]


def _run_overrides(config: StudyConfig, seed: int) -> tuple[str, ...]:
    """The recipe overrides of one run: ``--set`` values, then ``--init`` and ``--heldout`` (they win), seed and
    data."""
    check_init(config.init)
    overrides = list(config.train_overrides)
    if any(o.split("=", 1)[0].strip() == "seed" for o in overrides):  # the study's seeds would replace it
        raise SettingError("a study sets each run's seed itself (0 .. seeds-1): use --num-seeds, not --set seed=...")
    if config.init is not None:
        overrides.append(f"model_kwargs.init={config.init}")
    if config.heldout_fraction is not None:
        overrides.append(f"heldout_fraction={config.heldout_fraction:g}")
    overrides.append(f"seed={seed}")
    if config.data is not None:
        overrides.append(f"data={config.data}")
    return tuple(overrides)


def make_plan(config: StudyConfig, out: str | os.PathLike) -> StudyPlan:
    """The study's runs, each recipe built once and validated: RecipeError / ValueError for a recipe that no
    run could use, before anything runs; each condition's model, optimizer and scheduler checked as ``posgeom
    train`` checks them (:func:`~timm_posgeom.app.train.build.check_model`), so a dry run refuses what the runs
    would."""
    from ..recipe import load_recipe
    from ..train.build import check_model

    out = Path(out)
    runs = []
    for condition in config.conditions:
        for seed in range(config.seeds):
            name, overrides = f"{config.recipe_prefix}_{condition}", _run_overrides(config, seed)
            recipe = load_recipe(name, list(overrides))
            check_init(recipe.model_kwargs.get("init"))
            if seed == 0:  # the seed changes no constructor's argument
                check_model(recipe)
            runs.append(
                PlannedRun(
                    condition=condition,
                    seed=seed,
                    run_dir=out / "runs" / f"{condition}_s{seed}",
                    recipe_name=name,
                    overrides=overrides,
                    recipe=recipe,
                )
            )
    return StudyPlan(config=config, out=out, runs=tuple(runs))


def plan_study(config: StudyConfig, out: str | os.PathLike) -> list[dict[str, Any]]:
    """Validate every recipe and list the runs: what would be trained and evaluated, and how.

    Raises RecipeError / ValueError for a recipe that no run could use.
    """
    return make_plan(config, out).to_json()


def write_plan(
    config: StudyConfig,
    out: str | os.PathLike,
    plan: list[dict[str, Any]] | None = None,
    data: dict[str, Any] | None = None,
) -> Path:
    """Record the study's configuration, plan and validation data (:func:`data_identity`) in
    ``<out>/plan.json``: what ``--resume`` compares with."""
    path = Path(out) / "plan.json"
    body = dict(config=asdict(config), plan=plan_study(config, out) if plan is None else plan)
    if data is not None:
        body["data"] = data
    write_json(path, body)
    return path


def dry_run(config: StudyConfig, out: str | os.PathLike) -> list[dict[str, Any]]:
    """Validate the preset's recipes, data sources and launcher config; return the plan (nothing runs).

    A local data path that does not exist is an error here (a Hub id is checked when it is loaded)."""
    from ...data import resolve_source

    plan = plan_study(config, out)
    for item in plan:
        if item["data"] != "synthetic":
            try:
                resolve_source(item["data"])
            except FileNotFoundError as e:
                raise PathNotFoundError(f"{e}; pass --data PATH_OR_HUB_ID") from None
    if config.accelerate_config:
        accelerate_config(config.accelerate_config)
    return plan


def accelerate_config(name: str) -> str:
    """The accelerate config file a study's ``accelerate_config`` names: a path, or the name of one shipped with
    the package (``1gpu``)."""
    from ..recipe import find_accelerate_config

    return str(find_accelerate_config(name))
