"""The package's shape (docs/architecture.md). import-linter checks the layers and cycles (its contracts in
pyproject.toml, run by `lint-imports` in CI); here: the contracts name every library module (a new module
must be put in its room), the root exports only the library, and nothing imports the package root."""

from __future__ import annotations

import ast
import contextlib
import re
import textwrap
from pathlib import Path

import timm_posgeom

ROOT = Path(timm_posgeom.__file__).parent
PYPROJECT = ROOT.parent / "pyproject.toml"
# The library: what a user of timm imports (the package's top level). The application: what the `posgeom`
# command runs (app/). The command line (cli/). errors: the bottom, importable by all.
APPLICATION, COMMAND_LINE, BOTTOM = "app", "cli", "errors"
DATA = {"recipes", "hub_cards"}  # shipped files, not code


def _library() -> set[str]:
    """The library's modules as the layers contract lists them (pyproject.toml)."""
    import pytest

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    contracts = tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]["contracts"]
    layers = next(c["layers"] for c in contracts if c["type"] == "layers")
    assert layers[0] == f"timm_posgeom.{COMMAND_LINE}" and layers[1] == f"timm_posgeom.{APPLICATION}"
    assert layers[-1] == f"timm_posgeom.{BOTTOM}"
    return {m.strip().removeprefix("timm_posgeom.") for m in layers[2].split(":")}


def _modules() -> dict[str, Path]:
    """Dotted name (without the package) -> file, for every module of the package."""
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package modules ``name`` imports ("" is the package root), anywhere in the file."""
    is_package = path.name == "__init__.py"
    here = name.split(".") if name else []
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here if is_package else here[:-1]
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                module = ".".join(base + ([node.module] if node.module else []))
                absolute = "timm_posgeom" + ("." + module if module else "")
            else:
                absolute = node.module or ""
            # `from X import y` imports the module X.y when it is one, else X itself
            targets = [
                f"{absolute}.{a.name}" if f"{absolute}.{a.name}".removeprefix("timm_posgeom.") in modules else absolute
                for a in node.names
            ]
        else:
            continue
        for target in targets:
            if target == "timm_posgeom":
                found.add("")
            elif target.startswith("timm_posgeom."):
                found.add(target.removeprefix("timm_posgeom."))
    return found


def _room(module: str) -> str:
    return module.split(".")[0]


def test_every_module_is_in_a_layer_of_the_contract():
    """A module outside the layers contract would escape import-linter's checks."""
    if not PYPROJECT.is_file():  # an installed wheel: the contract travels with the repository
        import pytest

        pytest.skip("pyproject.toml is not beside the package (an installed wheel)")
    rooms = {_room(m) for m in _modules() if m}
    library = _library()
    assert not rooms - library - {APPLICATION, COMMAND_LINE, BOTTOM} - DATA, (
        f"modules in no layer of pyproject.toml's contract: {sorted(rooms - library - {APPLICATION, COMMAND_LINE, BOTTOM} - DATA)}"
    )


def test_every_package_ships_in_the_wheel():
    """setuptools' list of packages is explicit (pyproject.toml): a sub-package missing from it would be
    left out of the wheel, and every import of it would fail for a user (the sources here would hide it)."""
    import pytest

    if not PYPROJECT.is_file():
        pytest.skip("pyproject.toml is not beside the package (an installed wheel)")
    tomllib = pytest.importorskip("tomllib")
    listed = set(tomllib.loads(PYPROJECT.read_text())["tool"]["setuptools"]["packages"])
    packages = {".".join(("timm_posgeom", *p.parent.relative_to(ROOT).parts)) for p in ROOT.rglob("__init__.py")}
    assert not packages - listed, f"packages left out of the wheel: {sorted(packages - listed)}"


def test_the_layers_hold_and_nothing_is_circular():
    """What CI's `lint-imports` checks, run by the tests too (where the repository is)."""
    import shutil
    import subprocess
    import sys

    import pytest

    # the environment's own script first: the tests may run without the environment on PATH
    here = Path(sys.executable).parent / "lint-imports"
    lint = str(here) if here.is_file() else shutil.which("lint-imports")
    if not PYPROJECT.is_file() or lint is None:
        pytest.skip("import-linter or pyproject.toml not here (an installed wheel): CI runs lint-imports")
    out = subprocess.run(
        [lint, "--config", str(PYPROJECT), "--no-cache"], capture_output=True, text=True, cwd=PYPROJECT.parent
    )
    assert out.returncode == 0, out.stdout[-3000:]


def test_the_root_exports_only_the_library():
    modules = _modules()
    if PYPROJECT.is_file():  # the contract travels with the repository, not with an installed wheel
        assert {_room(m) for m in _imports("", modules[""], modules)} <= _library() | {BOTTOM}
    else:
        assert not {_room(m) for m in _imports("", modules[""], modules)} & {APPLICATION, COMMAND_LINE}
    assert set(timm_posgeom.__all__) == {n for n in dir(timm_posgeom) if n in timm_posgeom.__all__}


def test_nothing_imports_the_package_root():
    modules = _modules()
    bad = sorted(name for name, path in modules.items() if name and "" in _imports(name, path, modules))
    assert not bad, f"modules importing the package root: {bad}"


def test_the_checker_sees_what_it_should(tmp_path):
    """The rules above would catch a violation: the import reader on a made-up ``probes/fake.py``."""
    fake = tmp_path / "fake.py"
    fake.write_text(
        "from .. import __version__\nfrom ..hub import render_card\nimport timm_posgeom.app.report\n"
        "from . import streaming\n\ndef f():\n    from ..train import train\n"
    )
    assert _imports("probes.fake", fake, _modules()) == {"", "hub", "app.report", "probes.streaming", "train"}


def test_no_public_name_is_hidden_by_a_module():
    """A module at the root named like a public function (0.1.0's ``imagenet_c.py`` beside the shift builder
    ``imagenet_c``) replaced the function with itself once anything imported it (``timm_posgeom.imagenet_c``
    read as the module after ``imagenet_c_fragility`` was used)."""
    import types

    for name in timm_posgeom.__all__:  # loads every public name, and the modules that define them
        getattr(timm_posgeom, name)
    hidden = [n for n in timm_posgeom.__all__ if isinstance(getattr(timm_posgeom, n), types.ModuleType)]
    assert not hidden, f"public names bound to a module: {hidden}"


# -- privacy: a helper two modules share is public in its one home (or a `_module.py` of its package's own) ----
REPO = ROOT.parent
OURS = ("timm_posgeom", "tests", "scripts", "benchmarks", "experiments")


def _private_imports(source: str, name: str, where: str) -> list[str]:
    """``where:line module [names]`` for each ``from module import _name`` of the source (of module ``name``)
    whose module is another one; in the scripts it writes out too (a string of Python with imports)."""
    here = name.split(".")
    package = here if where.endswith("__init__.py") else here[:-1]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            private = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
            target = node.module or ""
            if node.level:
                target = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
            if private and target != name:
                found.append(f"{where}:{node.lineno} {target} {private}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "import" in node.value:
            with contextlib.suppress(SyntaxError):
                found += _private_imports(textwrap.dedent(node.value), "__main__", f"{where}:{node.lineno} (a script)")
    return found


def _our_files() -> dict[Path, str]:
    """Every Python file of ours -> its module name (the package's dotted; elsewhere the file's stem)."""
    files = {}
    for room in OURS:
        for path in sorted((REPO / room).rglob("*.py")):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if room == "timm_posgeom":
                files[path] = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            else:
                files[path] = parts[-1]
    return files


def test_no_module_imports_another_modules_private_name():
    """timm's rule: a name with a leading underscore is its module's own. What two modules share is public in
    one home; the tests test through public names too (a private helper's test goes through its module)."""
    found = [
        hit
        for path, name in _our_files().items()
        if path != Path(__file__).resolve()  # its checker's test below holds made-up private imports
        for hit in _private_imports(path.read_text(), name, str(path.relative_to(REPO)))
    ]
    assert not found, "private names imported across modules:\n" + "\n".join(found)


def test_the_privacy_checker_sees_private_imports():
    source = (
        "from .streaming import _helper, public\nfrom . import _sibling\nfrom .fake import _mine\n"
        'from timm_posgeom.data import __all__\nSCRIPT = """\nfrom timm_posgeom.data.folder import _key\n"""\n'
    )
    assert _private_imports(source, "timm_posgeom.probes.fake", "fake.py") == [
        "fake.py:1 timm_posgeom.probes.streaming ['_helper']",
        "fake.py:2 timm_posgeom.probes ['_sibling']",
        "fake.py:5 (a script):2 timm_posgeom.data.folder ['_key']",
    ]


# -- docs/architecture.md is the truth: its tree names every package and module, and no other ----------------------
ARCHITECTURE = REPO / "docs" / "architecture.md"


def _architecture_tree() -> dict[str, str]:
    """The first fenced block of docs/architecture.md: each entry's path (relative to ``timm_posgeom/``: a package
    ``probes/``, a module ``errors.py``) -> its text. An entry starts at two spaces' indent, its text runs on."""
    block = ARCHITECTURE.read_text().split("```\n")[1]
    entries: dict[str, str] = {}
    current = None
    for line in block.splitlines()[1:]:
        if line.startswith("  --"):  # a heading of the tree
            current = None
        elif re.match(r"^  \S", line):
            current, _, text = line.strip().partition(" ")
            entries[current] = text
        elif current is not None:
            entries[current] += " " + line.strip()
    return entries


def _named_modules(text: str) -> set[str]:
    """The modules an entry names: ``name.py`` (of the entry's package) and ``room/name.py`` (a path)."""
    return set(re.findall(r"(?<![\w/.<])((?:\w+/)*\w+)\.py\b", text))


def test_the_architecture_document_names_every_package_and_module():
    from timm_posgeom.cli.main import COMMANDS

    entries = _architecture_tree()
    packages = {str(p.parent.relative_to(ROOT)) + "/" for p in ROOT.rglob("__init__.py") if p.parent != ROOT}
    packages -= {f"{d}/" for d in DATA}
    named: set[str] = set()
    for path, text in entries.items():
        package = path if path.endswith("/") else ""
        assert (ROOT / path).is_file() if not package else path in packages, f"the tree names {path}: none such"
        named |= {path} if not package else set()
        for module in _named_modules(text):
            full = f"{module}.py" if "/" in module else f"{package}{module}.py"
            assert (ROOT / full).is_file(), f"the tree's {path} names {module}.py: no {full}"
            named.add(full)
    assert not packages - set(entries), f"packages the tree leaves out: {sorted(packages - set(entries))}"
    modules = {
        str(p.relative_to(ROOT))
        for p in ROOT.rglob("*.py")
        if not p.name.startswith("__") and p.parent.name not in DATA
    }
    commands = {f"cli/{c}.py" for c in COMMANDS}  # one module per command: `cli/<command>.py`
    left_out = sorted(modules - named - commands)
    assert not left_out, f"modules the tree of docs/architecture.md leaves out: {left_out}"


def test_the_tree_reader_sees_what_it_should():
    assert _named_modules("main.py (x), <command>.py; app/report/runs.py, timm_posgeom.data and recipes/") == {
        "main",
        "app/report/runs",
    }
    entries = _architecture_tree()
    assert {"errors.py", "probes/", "probes/ssdc_probe/", "app/report/", "cli/"} <= set(entries)
    assert "spearman.py" in entries["probes/ssdc_probe/"] and "protocol.py" not in entries["errors.py"]


def test_every_room_of_the_library_is_layered_inside_it():
    """The second layers contract orders the library's rooms; a new room must take its place there."""
    import pytest

    if not PYPROJECT.is_file():
        pytest.skip("pyproject.toml is not beside the package (an installed wheel)")
    tomllib = pytest.importorskip("tomllib")
    contracts = [
        c for c in tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]["contracts"] if c["type"] == "layers"
    ]
    inside = {m.strip().removeprefix("timm_posgeom.") for layer in contracts[1]["layers"] for m in layer.split("|")}
    assert _library() - inside == {"_compat"}, sorted(_library() - inside)  # _compat imports nothing of ours
    assert len([m for m in ROOT.glob("*.py") if m.name != "__init__.py"]) <= 5, "the root keeps the face"
