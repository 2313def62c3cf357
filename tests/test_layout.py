"""The package's shape: the library never imports the application, nothing imports the package root,
and every module is classified as one or the other (a new module must be put in its room)."""
from __future__ import annotations

import ast
from pathlib import Path

import timm_posgeom

ROOT = Path(timm_posgeom.__file__).parent
# The library: what a user of timm imports. The application: what the `posgeom` command runs.
LIBRARY = {"models", "pos", "interventions", "probes", "shifts", "transforms", "data", "eval_data", "robustness",
           "imagenet_c", "support", "synthetic", "factory", "jsonio", "version", "distributed"}
APPLICATION = {"recipe", "records", "provenance", "claims", "train", "study", "zoo", "report", "hub", "cli", "commands", "recipes",
               "hub_cards"}


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
                base = base[:len(base) - (node.level - 1)] if node.level > 1 else base
                module = ".".join(base + ([node.module] if node.module else []))
                absolute = "timm_posgeom" + ("." + module if module else "")
            else:
                absolute = node.module or ""
            # `from X import y` imports the module X.y when it is one, else X itself
            targets = [f"{absolute}.{a.name}" if f"{absolute}.{a.name}".removeprefix("timm_posgeom.") in modules
                       else absolute for a in node.names]
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


def test_every_module_is_library_or_application():
    rooms = {_room(m) for m in _modules() if m}
    assert not rooms - LIBRARY - APPLICATION, f"unclassified modules: {sorted(rooms - LIBRARY - APPLICATION)}"
    assert not LIBRARY & APPLICATION


def test_the_library_never_imports_the_application():
    modules = _modules()
    bad = {}
    for name, path in modules.items():
        if name == "" or _room(name) not in LIBRARY:
            continue
        wrong = sorted(m for m in _imports(name, path, modules) if m and _room(m) in APPLICATION)
        if wrong:
            bad[name] = wrong
    assert not bad, f"library modules importing the application: {bad}"


def test_the_root_exports_only_the_library():
    modules = _modules()
    assert {_room(m) for m in _imports("", modules[""], modules)} <= LIBRARY
    assert set(timm_posgeom.__all__) == {n for n in dir(timm_posgeom) if n in timm_posgeom.__all__}


def test_nothing_imports_the_package_root():
    modules = _modules()
    bad = sorted(name for name, path in modules.items() if name and "" in _imports(name, path, modules))
    assert not bad, f"modules importing the package root: {bad}"


def test_the_checker_sees_what_it_should(tmp_path):
    """The rules above would catch a violation: the import reader on a made-up ``probes/fake.py``."""
    fake = tmp_path / "fake.py"
    fake.write_text("from .. import __version__\nfrom ..hub import render_card\nimport timm_posgeom.report\n"
                    "from . import spearman\n\ndef f():\n    from ..train import train\n")
    assert _imports("probes.fake", fake, _modules()) == {"", "hub", "report", "probes.spearman", "train"}
