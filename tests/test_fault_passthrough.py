"""Bad-input suite, class "settings passed through" (issue 54, class 2): what a recipe hands to timm's constructors
(``model_kwargs`` to the model, ``opt`` to timm's optimizers, ``sched`` to its schedulers) is checked where it
enters, before any work: the model built on the meta device with the recipe's ``model_kwargs`` and one forward
pass of its shapes, the optimizer and the scheduler made over it (``app.train.build.check_model``).

``posgeom train`` and the study (its dry run too: it refuses exactly what the real run refuses) say each in one
line, exit 2, and leave no folder. Before: ``posgeom train --set model_kwargs.bogus_kw=1`` gave ``TypeError:
Eva.__init__() got an unexpected keyword argument`` and an empty folder; an unknown optimizer or scheduler was
refused only after the data was loaded (a data.json left behind); a width its heads do not divide failed at the
first training step; the study's dry run passed all of them."""

from __future__ import annotations

import pytest
from faultsuite import cli, judge, refused

SMALL = ["--set", "max_train_images=32", "--set", "max_val_images=8", "--set", "batch_size=16", "--no-progress"]
BAD = [
    ("a keyword the model does not take", "model_kwargs.bogus_kw=1", "unexpected keyword argument 'bogus_kw'"),
    ("a width its heads do not divide", "model_kwargs.embed_dim=33", "fix model_kwargs"),
    ("a depth below one", "model_kwargs.depth=-1", "fix model_kwargs"),
    ("an optimizer timm does not know", "opt=adamm", "opt 'adamm' cannot be made"),
    ("a scheduler timm does not know", "sched=cosin", "sched 'cosin' cannot be made"),
    ("a tracker accelerate does not know", "log_with=[bogus]", "unknown tracker 'bogus'"),
]
IDS = [b[0] for b in BAD]


@pytest.mark.parametrize("setting,phrase", [b[1:] for b in BAD], ids=IDS)
def test_train_refuses_a_setting_its_constructors_refuse_before_any_work(tmp_path, setting, phrase):
    """The issue's example (model_kwargs.bogus_kw) and its class."""
    run = cli(["train", "--out", tmp_path / "run", "--set", setting, *SMALL])
    outcome = refused(run, phrase)
    judge("passthrough", outcome if not (tmp_path / "run").exists() else "other", "refused", run.err + run.trace)


@pytest.mark.parametrize("dry", [True, False], ids=["dry run", "real run"])
@pytest.mark.parametrize("setting,phrase", [b[1:] for b in BAD], ids=IDS)
def test_the_study_and_its_dry_run_refuse_the_same(tmp_path, setting, phrase, dry):
    """The dry run listed every run as valid; the real study failed in its first training subprocess."""
    out = tmp_path / "study"
    argv = ["study", "--preset", "demo", "--conditions", "nope", "--out", out, "--set", setting]
    run = cli([*argv, "--dry-run"] if dry else argv)
    outcome = refused(run, phrase)
    judge("passthrough", outcome if not out.exists() else "other", "refused", run.err + run.trace)


@pytest.mark.slow
def test_the_checks_pass_what_the_runs_take(tmp_path):
    """Every shipped recipe, as it is, passes check_model: the checks refuse only what a run would."""
    from timm_posgeom.app.recipe import load_recipe, shipped_recipes
    from timm_posgeom.app.train.build import check_model

    failed = []
    for name in shipped_recipes():
        try:
            check_model(load_recipe(name))
        except Exception as e:  # noqa: BLE001
            failed.append(f"{name}: {e}")
    judge("passthrough", "right" if not failed else "other", "right", failed)


OPTIONS = [
    (
        "probe --alpha on a model without a PE",
        ["probe", "posgeom_vit_micro_patch8_64_nope", "--alpha", "0.5"],
        "nothing to scale",
    ),
    ("attention of a CNN", ["attention", "resnet18"], "no `blocks`"),
    ("probe --rpi of a CNN", ["probe", "resnet18", "--rpi"], "patch"),
]


@pytest.mark.parametrize("argv,phrase", [o[1:] for o in OPTIONS], ids=[o[0] for o in OPTIONS])
def test_an_option_that_cannot_apply_to_the_model_is_one_line_before_any_work(tmp_path, argv, phrase):
    run = cli([*argv, "--data", "synthetic", "--max-images", "2", "--num-workers", "0", "--out", tmp_path / "o"])
    outcome = refused(run, phrase)
    judge("passthrough", outcome if not (tmp_path / "o").exists() else "other", "refused", run.err + run.trace)
