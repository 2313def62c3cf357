"""The module paths that moved into rooms by idea (issue 49; ``timm_posgeom/_compat.py``): each old path still
imports, warns once with a DeprecationWarning pointing at the importing line, and is the module at its new path;
and nothing of ours (package, tests, scripts, benchmarks, experiments) imports an old path."""

from __future__ import annotations

import ast
import contextlib
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import timm_posgeom
from timm_posgeom._compat import MOVED

REPO = Path(timm_posgeom.__file__).parent.parent
OURS = ("timm_posgeom", "tests", "scripts", "benchmarks", "experiments")


@pytest.mark.slow
def test_every_old_path_warns_and_is_the_new_module(tmp_path):
    """Run in a fresh interpreter: an old path imported here would stay bound on its parent package (the old
    ``timm_posgeom.imagenet_c`` module would hide the function of that name for the tests after this one)."""
    script = tmp_path / "old_paths.py"
    script.write_text(
        "import importlib, json, sys, warnings\n"
        "from timm_posgeom._compat import MOVED\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    from timm_posgeom.seeding import index_hash  # an import statement: line 5\n"
        "from timm_posgeom.measuring.seeding import index_hash as new_index_hash\n"
        "out = {'from-import': index_hash is new_index_hash}\n"
        "for old, new in MOVED.items():\n"
        "    with warnings.catch_warnings(record=True) as again:\n"
        "        warnings.simplefilter('always')\n"
        "        module = importlib.import_module(old)  # a call: line 11\n"
        "        same = module is importlib.import_module(old) is importlib.import_module(new) is sys.modules[old]\n"
        "    warned = caught if old == 'timm_posgeom.seeding' else again\n"
        "    out[old] = {'same': same, 'warnings': [(w.category.__name__, str(w.message), w.filename, w.lineno) for w in warned]}\n"
        "print(json.dumps(out))\n"
    )
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out.pop("from-import") is True
    assert set(out) == set(MOVED)
    for old, seen in out.items():
        assert seen["same"], old
        # once (a second import finds the module in sys.modules), naming the new path, at the importing line
        assert len(seen["warnings"]) == 1, (old, seen["warnings"])
        category, message, filename, lineno = seen["warnings"][0]
        assert category == "DeprecationWarning" and MOVED[old] in message and "next release" in message, message
        assert (Path(filename), lineno) == (script, 5 if old == "timm_posgeom.seeding" else 11), (old, filename, lineno)


def test_the_new_paths_exist_and_no_old_path_does():
    """A shim never hides a module: the old path has no file of its own, and its new path is a real module."""
    for old, new in MOVED.items():
        assert not (REPO / Path(*old.split("."))).with_suffix(".py").exists(), old
        assert (REPO / Path(*new.split("."))).with_suffix(".py").is_file() or (
            REPO / Path(*new.split(".")) / "__init__.py"
        ).is_file(), new


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(tree: ast.AST, package: list[str]) -> list[str]:
    """The modules (and ``module.name`` for ``from module import name``) a tree imports, relative imports
    resolved from ``package``."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
            out += [base] + [f"{base}.{a.name}" for a in node.names]
    return out


def _old_paths_used(path: Path, name: str | None = None) -> list[str]:
    """The old paths the file imports (``import``, ``from ... import``, relative ones resolved from its module
    ``name``; in a script it writes out too) or names in a string (a monkeypatch target, a ``module:function``
    entry)."""
    here = (name or _module_name(path)).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    tree = ast.parse(path.read_text())
    found = [t for t in _imported(tree, package) if t in MOVED]
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            targets = [node.value.split(":")[0]]
            if "import" in node.value and "\n" in node.value:  # a script written out: its imports too
                with contextlib.suppress(SyntaxError):
                    targets += _imported(ast.parse(textwrap.dedent(node.value)), [])
            found += [t for t in targets if t in MOVED]
    return found


def test_nothing_of_ours_imports_an_old_path():
    files = [p for room in OURS for p in sorted((REPO / room).rglob("*.py"))]
    files = [p for p in files if p.name not in (Path(__file__).name, "_compat.py")]
    used = [f"{p.relative_to(REPO)}: {old}" for p in files for old in _old_paths_used(p)]
    assert not used, "old module paths (for users only; import the new one): " + ", ".join(used)


def test_the_checker_sees_old_paths(tmp_path):
    fake = tmp_path / "fake.py"
    fake.write_text(
        "from .. import seeding\nfrom ..distributed import rank\nimport timm_posgeom.seeding\n"
        "x = 'timm_posgeom.distributed:rank'\nfrom ..measuring.seeding import index_hash\n"
        'SCRIPT = """\nimport os\nfrom timm_posgeom import distributed\n"""\n'
    )
    hits = _old_paths_used(fake, "timm_posgeom.data.fake")
    assert sorted(hits) == ["timm_posgeom.distributed"] * 3 + ["timm_posgeom.seeding"] * 2, hits


def test_old_paths_are_listed_in_the_changelog():
    changelog = (REPO / "CHANGELOG.md").read_text()
    unreleased = changelog.split("## [Unreleased]")[1].split("\n## [")[0]
    missing = [old for old in MOVED if f"`{old.removeprefix('timm_posgeom.')}`" not in unreleased]
    assert not missing, f"moved paths the CHANGELOG's Unreleased section does not name: {missing}"
