"""The package as a user gets it: version, shipped resources, a light import, the model-name prefix."""
from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import version

import timm

import timm_posgeom
from timm_posgeom.cli import main

# Imported lazily by the commands that need them; never by `import timm_posgeom` or `posgeom --help`.
HEAVY = ("datasets", "accelerate", "matplotlib", "pandas", "pyarrow", "scipy")


def _modules_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys, json; print(json.dumps(sorted(sys.modules)))"],
                         capture_output=True, text=True, check=True)
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_import_and_help_stay_light():
    for code in ("import timm_posgeom",
                 "from timm_posgeom.cli.main import build_parser; build_parser().format_help()"):
        loaded = _modules_after(code)
        heavy = sorted(m for m in loaded if m.split(".")[0] in HEAVY)
        assert not heavy, f"{code!r} imported {heavy[:8]}"


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
