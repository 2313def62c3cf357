"""The core library and the [app] extra: what needs the extra says so in one line, in the library (naming what
needs it) and on the command line (exit 2, before any work). CI installs the core wheel alone in a fresh venv
and checks that a probe runs without datasets, accelerate or matplotlib (.ci/check_install.sh)."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from timm_posgeom.errors import APP_MODULES, USER_ERRORS, MissingDependencyError, require

ROOT = Path(__file__).resolve().parents[1]
EXTRA_LINE = "it comes with the [app] extra (pip install 'timm-posgeom[app]')"


def test_require_imports_or_names_the_extra(tmp_path, monkeypatch):
    assert require("json", "x") is sys.modules["json"]
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # as if matplotlib were not installed
    with pytest.raises(MissingDependencyError) as err:
        require("matplotlib.figure", "plotting")
    assert str(err.value) == f"plotting needs matplotlib, which is not installed: {EXTRA_LINE}"
    assert isinstance(err.value, USER_ERRORS) and isinstance(err.value, ImportError)
    with pytest.raises(MissingDependencyError, match=r"\[imagenet-c\] extra"):
        require("posgeom_no_such_package", "ImageNet-C", extra="imagenet-c")
    # installed but broken (one of its own dependencies missing): its own error, not "install the extra"
    (tmp_path / "posgeom_broken.py").write_text("import posgeom_missing_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError) as err:
        require("posgeom_broken", "x")
    assert not isinstance(err.value, MissingDependencyError) and err.value.name == "posgeom_missing_dependency"


def test_the_app_modules_are_the_app_extra():
    """errors.APP_MODULES (what the command line checks) is what pyproject's [app] extra installs."""
    if not (ROOT / "pyproject.toml").is_file():
        pytest.skip("pyproject.toml is not in this tree")
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    app = {
        d.split(">")[0].split("<")[0].split("=")[0].split("[")[0].strip()
        for d in project["optional-dependencies"]["app"]
    }
    assert {"pyyaml" if m == "yaml" else m for m in APP_MODULES} == app
    core = {d.split(">")[0].split("<")[0].split("=")[0].strip() for d in project["dependencies"]}
    assert not core & app and "pyarrow" not in core | app  # pyarrow comes with datasets, never imported by us
    assert "timm-posgeom[app]" in project["optional-dependencies"]["dev"]


def test_plotting_without_matplotlib_is_one_line(monkeypatch, tmp_path):
    from timm_posgeom.probes.ssdc_probe.result import SSDCResult

    result = SSDCResult(per_layer=[0.5, 0.4], layers=[0, 1], metadata={"model": "m", "site": "attn_input"})
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    monkeypatch.setitem(sys.modules, "matplotlib.backends.backend_agg", None)
    with pytest.raises(
        MissingDependencyError,
        match=r"^plotting needs matplotlib, which is not installed: it comes "
        r"with the \[app\] extra",
    ):
        result.plot(tmp_path / "ssdc.png")
    assert not (tmp_path / "ssdc.png").exists()
    result.to_json(tmp_path / "ssdc.json")  # the result itself needs no extra
    assert (tmp_path / "ssdc.json").is_file()


def test_a_parquet_set_without_datasets_is_one_line(monkeypatch, imagenette_path):
    from timm_posgeom import load_split

    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(MissingDependencyError) as err:
        load_split(imagenette_path, "validation", subset=4)
    assert str(err.value) == f"reading a Hub or parquet data set needs datasets, which is not installed: {EXTRA_LINE}"


def test_the_core_needs_no_extra_for_a_probe(monkeypatch, tmp_path):
    """An ImageFolder tree, the synthetic set and a tensor batch are probed with every [app] module blocked."""
    from PIL import Image

    for name in ("datasets", "accelerate", "matplotlib", "jinja2", "markdown"):
        monkeypatch.setitem(sys.modules, name, None)
    import timm

    import timm_posgeom

    for i in range(4):
        folder = tmp_path / "val" / f"class{i % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (32, 32), (60 * i, 20, 200 - 40 * i)).save(folder / f"{i}.png")
    model = timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=2, num_classes=2).eval()
    split = timm_posgeom.load_split(tmp_path, "validation")
    assert len(split) == 4 and split.classes == ["class0", "class1"]
    result = timm_posgeom.probe_ssdc(model, timm_posgeom.eval_loader(model, split, batch_size=2), progress=False)
    assert len(result.per_layer) == 2
    batch = torch.randn(3, 3, 32, 32)
    assert (
        len(timm_posgeom.probe_ssdc(model, [(batch, torch.zeros(3, dtype=torch.long))], progress=False).per_layer) == 2
    )


def _blocked_find_spec(missing: set[str]):
    real = importlib.util.find_spec

    def find_spec(name: str, *args):
        return None if name.split(".")[0] in missing else real(name, *args)

    return find_spec


@pytest.mark.parametrize(
    ("argv", "needs"),
    [
        (["probe", "m", "--data", "synthetic"], "matplotlib"),
        (["study", "--dry-run"], "accelerate, datasets, matplotlib"),
        (["train", "--recipe", "synthetic_micro_ape", "--out", "x"], "accelerate, datasets, matplotlib"),
    ],
)
def test_a_command_that_needs_the_extra_says_so_in_one_line(argv, needs, monkeypatch, capsys):
    cli = importlib.import_module("timm_posgeom.cli.main")

    monkeypatch.setattr(importlib.util, "find_spec", _blocked_find_spec({"accelerate", "datasets", "matplotlib"}))
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err == (
        f"posgeom {argv[0]}: error: needs the [app] extra ({needs} not installed): pip install 'timm-posgeom[app]'\n"
    )


def test_posgeom_models_needs_no_extra(monkeypatch, capsys):
    cli = importlib.import_module("timm_posgeom.cli.main")

    monkeypatch.setattr(importlib.util, "find_spec", _blocked_find_spec(set(APP_MODULES)))
    assert cli.main(["models", "*micro*ape"]) == 0
    assert "posgeom_vit_micro_patch8_64_ape" in capsys.readouterr().out


def test_an_unforeseen_missing_app_module_is_one_line_too(monkeypatch, capsys):
    """A command whose run() meets a module of the extra that the table did not list: the same line, exit 2; a
    missing module of no extra keeps its traceback."""
    cli = importlib.import_module("timm_posgeom.cli.main")
    from timm_posgeom.cli import models

    def run(args):
        raise ModuleNotFoundError("No module named 'jinja2'", name="jinja2")

    monkeypatch.setattr(models, "run", run)
    with pytest.raises(SystemExit) as exit_:
        cli.main(["models"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err == (
        "posgeom models: error: needs the [app] extra (jinja2 not installed): pip install 'timm-posgeom[app]'\n"
    )

    def broken(args):
        raise ModuleNotFoundError("No module named 'foo'", name="foo")

    monkeypatch.setattr(models, "run", broken)
    with pytest.raises(ModuleNotFoundError):
        cli.main(["models"])
