"""The package as a user gets it: version, shipped resources, a light import, the model-name prefix."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import version

import pytest
import timm

import timm_posgeom
from timm_posgeom.cli import main

# Imported lazily by the commands that need them; never by `import timm_posgeom` or `posgeom --help`.
HEAVY = ("datasets", "accelerate", "matplotlib", "pandas", "pyarrow", "scipy")


def _modules_after(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", code + "\nimport sys, json; print(json.dumps(sorted(sys.modules)))"],
        capture_output=True,
        text=True,
        check=True,
    )
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_import_and_help_stay_light():
    for code in ("import timm_posgeom", "from timm_posgeom.cli.main import build_parser; build_parser().format_help()"):
        loaded = _modules_after(code)
        heavy = sorted(m for m in loaded if m.split(".")[0] in HEAVY)
        assert not heavy, f"{code!r} imported {heavy[:8]}"


def test_the_rooms_the_command_line_reads_before_run_stay_light():
    """The protocol, its defaults and the measure settings are what ``posgeom --help`` and the flags' checks read
    (cli/_options.py); their rooms import no torch, timm or numpy, so neither does the help. A moved module path
    (``timm_posgeom.seeding``: ``_compat``) is found without importing anything either until it is imported."""
    code = "import timm_posgeom.protocol, timm_posgeom.defaults, timm_posgeom.measuring, timm_posgeom.errors"
    code += "\nimport importlib.util; assert importlib.util.find_spec('timm_posgeom.seeding') is not None"
    loaded = {m.split(".")[0] for m in _modules_after(code)}
    assert not loaded & {"torch", "timm", "torchvision", "numpy", *HEAVY}, sorted(loaded & {"torch", "timm", "numpy"})


def test_version(capsys):
    assert timm_posgeom.__version__ == version("timm-posgeom")
    try:
        main(["--version"])
    except SystemExit as e:
        assert e.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"posgeom {timm_posgeom.__version__} (timm {timm.__version__}, torch ")


def test_recipes_command_lists_shipped_recipes_and_configs(capsys):
    assert main(["recipes"]) == 0
    out = capsys.readouterr().out
    assert "imagenette_cpu_ape" in out and "in100_paper_rpt" in out and "2node_8gpu" in out
    assert main(["recipes", "--show", "in100_paper_ape"]) == 0
    assert "posgeom_vit_small_patch16_224_ape" in capsys.readouterr().out


def test_model_names_have_their_own_prefix():
    ours = set(timm_posgeom.list_models())
    assert ours == set(timm.list_models("posgeom_*"))
    assert len(ours) == 20
    # timm's own names are not ours, and none of ours hides among timm's unprefixed names
    assert not ours & set(timm.list_models("vit_*"))


# --------------------------------------------------------------------------------------------
# the command line: one name and one meaning per idea; fast --help
# --------------------------------------------------------------------------------------------
# A flag several commands take has one default and one help text everywhere, except these, whose
# meaning depends on the command (the reason given).
PER_COMMAND = {
    "--out": "each command writes its own folder",
    "--data": "train and study: overrides the recipe's or preset's data; zoo: required unless --merge",
    "--pretrained": "zoo: by default weights where a name has them (auto), across many models",
    "--no-pretrained": "the other half of --pretrained",
    "--shift": "each command's own default shifts",
    "--alphas": "zoo: no sweep unless asked",
    "--allow-changes": "what changed: a recipe, a study's settings, a zoo's settings",
    "--resume": "a training run or a study",
    "--set": "one training run or every run of a study",
    "--dry-run": "study plans, push lists uploads",
    "--repo-id": "card: a placeholder by default; push: required",
    "--max-images": "train and study: of each split, the recipe's (or preset's) by default",
    "--probe-images": "train: SSDC at each evaluation; study: the preset's count by default",
    "--bad-images": "train and study: the recipe's by default",
    "--labels": "zoo: by-name by default (a model whose classes cannot be matched gets no top-1 and FS)",
    "--seed": "train: the recipe's by default",
}


def _options_by_command() -> dict[str, dict[str, tuple[object, str]]]:
    """flag -> {command: (default, help)} from the parser every ``posgeom COMMAND --help`` prints."""
    import argparse

    from timm_posgeom.cli.main import COMMANDS, build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert sorted(sub.choices) == sorted(COMMANDS)
    table: dict[str, dict[str, tuple[object, str]]] = {}
    for command, parser in sub.choices.items():
        for action in parser._actions:
            for flag in action.option_strings:
                if flag not in ("-h", "--help") and action.help is not argparse.SUPPRESS:
                    table.setdefault(flag, {})[command] = (action.default, action.help)
    return table


def test_a_shared_option_has_one_name_default_and_help_in_every_command(capsys):
    table = _options_by_command()
    differ = {
        flag: sorted(by)
        for flag, by in table.items()
        if len(by) > 1 and flag not in PER_COMMAND and len({repr(v) for v in by.values()}) > 1
    }
    assert not differ, f"one flag, several defaults or help texts: {differ}"
    # the image limit: one name in every measuring command, the whole split by default; SSDC's own count
    for command in ("probe", "fragility", "sweep", "extrapolate", "zoo"):
        assert table["--max-images"][command][0] is None
    assert (
        set(table["--probe-images"]) == {"sweep", "extrapolate", "intervene", "zoo", "train", "study"}
        and table["--probe-images"]["zoo"][0] is None
    )
    assert "--images" not in table  # zoo's old name: accepted (with a warning), not shown
    # --imagenet-c is fragility's (every ImageNet-C corruption); zoo and study's JPEG and blur have their own name
    assert set(table["--imagenet-c"]) == {"fragility"} and set(table["--imagenet-c-jpeg-blur"]) == {"zoo", "study"}
    for flag in PER_COMMAND:
        assert len(table.get(flag, {})) > 1, f"{flag} is no longer shared: drop it from PER_COMMAND"
    # what --help prints is what was compared
    with pytest.raises(SystemExit):
        main(["zoo", "--help"])
    assert "--max-images N" in capsys.readouterr().out


def test_zoo_old_images_flag_is_refused_beside_the_new_name(capsys):
    with pytest.raises(SystemExit) as e:
        main(["zoo", "m", "--data", "synthetic", "--images", "4", "--max-images", "4"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--images is the old name of --max-images" in err


def test_help_and_argument_errors_import_neither_torch_nor_timm():
    """`posgeom --help`, `posgeom COMMAND --help` and a bad flag answer before torch or timm is imported
    (the time they cost: benchmarks/bench_cli.py)."""
    for argv in (
        ["--help"],
        ["probe", "--help"],
        ["zoo", "--help"],
        ["fragility", "m"],
        ["sweep", "m", "--data", "synthetic", "--max-images", "0"],
    ):
        code = f"from timm_posgeom.cli import main\ntry:\n    main({argv!r})\nexcept SystemExit:\n    pass"
        loaded = {m.split(".")[0] for m in _modules_after(code)}
        assert not loaded & {"torch", "timm", "torchvision", "numpy", *HEAVY}, (
            argv,
            sorted(loaded & {"torch", "timm"}),
        )


@pytest.mark.slow
def test_models_register_whichever_of_timm_and_the_package_is_imported_first():
    for code in ("import timm_posgeom, timm", "import timm, timm_posgeom", "import timm_posgeom.models, timm"):
        out = subprocess.run(
            [sys.executable, "-c", code + "\nprint(len(timm.list_models('posgeom_*')))"],
            capture_output=True,
            text=True,
            check=True,
        )
        assert out.stdout.split()[-1] == "20", code


@pytest.mark.parametrize(
    "first",
    [
        "import timm_posgeom; timm_posgeom.check_support",
        "from timm_posgeom.interventions import pe_scale",
        "import timm_posgeom.probes.support",
    ],
)
@pytest.mark.slow
def test_a_first_import_of_timm_from_inside_the_package_registers_the_models(first):
    """The registration hook fired while pos.rope was half-imported (timm's first import came from it), and
    the first public name reached that way raised ImportError in a fresh interpreter."""
    out = subprocess.run(
        [sys.executable, "-c", f"{first}\nimport timm\nprint(len(timm.list_models('posgeom_*')))"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "20"


def test_a_command_module_that_fails_to_import_fails_loudly(monkeypatch):
    """A command missing from the parser would read as the user's typo ("invalid choice"): the import error shows."""
    import importlib

    cli_main_module = importlib.import_module("timm_posgeom.cli.main")
    monkeypatch.setattr(cli_main_module, "COMMANDS", (*cli_main_module.COMMANDS, "no_such_command_xyz"))
    with pytest.raises(ModuleNotFoundError, match="no_such_command_xyz"):
        cli_main_module.build_parser()


def test_the_type_checker_covers_the_whole_package():
    """mypy (CI) checks every module of the package, the application and the command line included, and the bodies
    of unannotated functions: its files are the package itself, not a list that a new module escapes."""
    from pathlib import Path

    pyproject = Path(timm_posgeom.__file__).parents[1] / "pyproject.toml"
    if not pyproject.is_file():
        pytest.skip("pyproject.toml is not beside the package (an installed wheel)")
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    mypy = tomllib.loads(pyproject.read_text())["tool"]["mypy"]
    assert mypy["files"] == ["timm_posgeom"] and mypy["check_untyped_defs"] is True
    left_out = [o for o in mypy.get("overrides", []) if any(m.startswith("timm_posgeom") for m in o["module"])]
    assert not left_out, left_out
