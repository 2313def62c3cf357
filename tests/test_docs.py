"""Every ``docs/...#anchor`` the code and the docs cite names a heading that exists.

Anchors follow GitHub's rule for a heading: lower case; every character that is not a letter, a digit,
a space, a hyphen or an underscore removed; spaces turned into hyphens; a repeated anchor gains ``-1``,
``-2``, ... in the order the headings appear. (docs/method.md once lost its SSDC, RPI and delta SSDC
sections while ten modules still linked to them.)
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
CODE_DIRS = ("timm_posgeom", "scripts", "benchmarks")
CITED = re.compile(r"docs/([A-Za-z0-9_./-]+\.md)#([A-Za-z0-9_-]+)")  # docs/method.md#ssdc, anywhere
LINK = re.compile(r"\]\(([A-Za-z0-9_./-]*\.md)?#([A-Za-z0-9_-]+)\)")  # [text](method.md#ssdc) or [text](#ssdc)
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading's text (before de-duplication)."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)  # \w: letters (any script), digits and underscore
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor of a markdown file's headings (fenced code blocks skipped), duplicates numbered."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    fenced = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
            continue
        match = None if fenced else HEADING.match(line)
        if match is None:
            continue
        base = github_anchor(match.group(1))
        n = seen.get(base, 0)
        out.add(base if n == 0 else f"{base}-{n}")
        seen[base] = n + 1
    return out


def test_github_anchor_rule():
    assert github_anchor("SSDC") == "ssdc"
    assert github_anchor("RPI and RPT") == "rpi-and-rpt"
    assert github_anchor("PE scaling (alpha)") == "pe-scaling-alpha"
    assert github_anchor("PE-to-content norm ratio") == "pe-to-content-norm-ratio"
    assert github_anchor("How a study's report decides the claims") == "how-a-studys-report-decides-the-claims"
    assert github_anchor("`token_permutation` and x.y") == "token_permutation-and-xy"


def test_duplicate_headings_are_numbered(tmp_path):
    doc = tmp_path / "d.md"
    doc.write_text("# A\n\n## Notes\n\n```\n# not a heading\n```\n\n## Notes\n")
    assert anchors(doc) == {"a", "notes", "notes-1"}


def _citations() -> list[tuple[str, Path, str]]:
    """(where, target file, anchor) of every cited docs anchor."""
    import timm_posgeom

    found = []
    for folder in CODE_DIRS:
        base = ROOT / folder
        if folder == "timm_posgeom" and not base.is_dir():  # the sdist's tests run against the installed wheel
            base = Path(timm_posgeom.__file__).resolve().parent
        for path in sorted(base.rglob("*")):
            if path.suffix not in (".py", ".md", ".yaml", ".yml", ".txt", ".html", ".j2") or not path.is_file():
                continue
            label = f"{folder}/{path.relative_to(base)}"
            for line_no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                for name, anchor in CITED.findall(line):
                    found.append((f"{label}:{line_no}", ROOT / "docs" / name, anchor))
    for path in sorted(DOCS.glob("*.md")):
        for line_no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            where = f"{path.relative_to(ROOT)}:{line_no}"
            for name, anchor in CITED.findall(line):
                found.append((where, ROOT / "docs" / name, anchor))
            for name, anchor in LINK.findall(line):
                found.append((where, (path.parent / name) if name else path, anchor))
    return found


def test_the_code_and_docs_cite_docs_anchors():
    cited = _citations()
    assert any(a == "ssdc" for _, _, a in cited) and any(a == "delta-ssdc" for _, _, a in cited)


@pytest.mark.parametrize("where, target, anchor", _citations(), ids=lambda v: str(v) if isinstance(v, str) else "")
def test_every_cited_docs_anchor_exists(where, target, anchor):
    assert target.is_file(), f"{where} cites {target.name}#{anchor}: no such file"
    assert anchor in anchors(target), f"{where} cites {target.name}#{anchor}: no such heading"
