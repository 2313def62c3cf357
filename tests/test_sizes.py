"""Functions that read on one screen (docs/architecture.md, "Rooms by idea"): no function of the package over 60
lines. A module holds one idea, whatever its length (timm keeps a whole model family in one file); ruff checks
arguments, statements and complexity (pyproject.toml) and has no rule for length, so this test counts. A
function's docstring is not counted: it is the documentation the standards ask for."""

from __future__ import annotations

import ast
from pathlib import Path

import timm_posgeom

ROOT = Path(timm_posgeom.__file__).parent
MAX_FUNCTION_LINES = 60


def function_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines from ``def`` to the function's last line, less its docstring (decorators not counted)."""
    lines = node.end_lineno - node.lineno + 1
    first = node.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        lines -= first.end_lineno - first.lineno + 1
    return lines


def over_limit(root: Path = ROOT) -> set[str]:
    """``module:function`` for a function over MAX_FUNCTION_LINES (nested functions and methods included), paths
    relative to ``root``."""
    found = set()
    for path in sorted(root.rglob("*.py")):
        name = path.relative_to(root).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and function_lines(node) > MAX_FUNCTION_LINES:
                found.add(f"{name}:{node.name}")
    return found


def test_no_function_over_the_limit():
    over = over_limit()
    assert not over, f"over {MAX_FUNCTION_LINES} lines a function: {sorted(over)}"


def test_the_count_sees_a_long_function(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    (tmp_path / "long.py").write_text(f'def f():\n    """Doc\n    string."""\n{body}\n')
    (tmp_path / "short.py").write_text(f'def g():\n    """Doc\n    string."""\n{body[: body.rindex(chr(10))]}\n')
    (tmp_path / "big.py").write_text("x = 1\n" * 2000)  # a long module of short statements is fine
    assert over_limit(tmp_path) == {"long.py:f"}
