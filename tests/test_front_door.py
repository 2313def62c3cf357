"""The front door and the documentation site: what the README promises, what the site is built from.

The site itself is built in CI with ``mkdocs build --strict`` (CONTRIBUTING.md); these checks need no
mkdocs: every public name has an API entry, every page of the navigation exists, the relative links of
the README and docs/ lead to files that exist, the citation names this version, and the README keeps
its two contract commands (the main job, and the tests that ``.ci/run`` follows).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

import timm_posgeom

ROOT = Path(__file__).resolve().parents[1]
MAIN_JOB = 'python3 -m venv .venv && . .venv/bin/activate && pip install ".[app]" && posgeom study'
TESTS = (
    'python3 -m venv .venv && . .venv/bin/activate && pip install -e ".[dev]" && python -m pytest -q '
    "&& python scripts/run_timm_model_tests.py"
)
GENERATED = {"index.md": "README.md", "contributing.md": "CONTRIBUTING.md"}  # scripts/mkdocs_hooks.py


def need(path: Path) -> Path:
    if not path.exists():  # the sdist carries docs/, README, CITATION.cff and mkdocs.yml, not .ci/
        pytest.skip(f"{path.name} is not in this tree")
    return path


def readme() -> str:
    return (ROOT / "README.md").read_text(encoding="utf-8")


def test_readme_is_a_front_door():
    text = readme()
    assert len(text.splitlines()) <= 200
    for heading in (
        "Install and run the main job",
        "Using the library",
        "The command line",
        "Models",
        "Install and run the tests",
        "Documentation",
        "Citation",
    ):
        assert f"\n## {heading}\n" in text, heading
    assert text.count("```python") == 1  # one example, the one tests/test_readme.py runs


def test_readme_contract_commands():
    text = readme()
    assert f"```bash\n{MAIN_JOB}\n```" in text
    # the block's mark (tests/test_doc_examples.py) on the line before its fence
    assert re.search(
        rf"## Install and run the tests\n\n(<!-- not runnable: [^\n]* -->\n)?```bash\n{re.escape(TESTS)}\n```", text
    )


def test_ci_installs_as_the_readme_says():
    ci = need(ROOT / ".ci" / "run").read_text()
    # the README's test command, step by step, in order
    steps = [s.strip() for s in TESTS.split("&&")]
    positions = [ci.find("\n" + s + "\n") for s in steps]
    assert -1 not in positions and positions == sorted(positions), positions
    # then the documentation site, in strict mode, after the tests
    assert 'pip install -e ".[docs]"' in ci and "mkdocs build --strict" in ci
    assert ci.index("mkdocs build --strict") > positions[-1]


def api_entries() -> set[str]:
    entries = set()
    for page in need(ROOT / "docs" / "api").glob("*.md"):
        entries |= set(re.findall(r"^::: ([\w.]+)$", page.read_text(), flags=re.M))
    return entries


def test_every_public_name_has_an_api_entry():
    entries = api_entries()
    missing = [n for n in timm_posgeom.__all__ if n != "__version__" and f"timm_posgeom.{n}" not in entries]
    assert not missing, f"add '::: timm_posgeom.NAME' to a page of docs/api/: {missing}"
    # and the entry points of the application and the command line
    assert {"timm_posgeom.app.train.train", "timm_posgeom.app.study.run_study", "timm_posgeom.cli.main.main"} <= entries


def test_every_api_entry_exists():
    import importlib

    for entry in api_entries():
        module, _, name = entry.rpartition(".")
        assert hasattr(importlib.import_module(module), name), entry


def nav_pages(nav) -> list[str]:
    pages = []
    for item in nav:
        value = next(iter(item.values())) if isinstance(item, dict) else item
        pages += nav_pages(value) if isinstance(value, list) else [value]
    return pages


def test_every_nav_page_exists_and_every_doc_is_in_the_nav():
    config = yaml.safe_load(need(ROOT / "mkdocs.yml").read_text())
    pages = nav_pages(config["nav"])
    for page in pages:
        assert (ROOT / GENERATED[page]).is_file() if page in GENERATED else (ROOT / "docs" / page).is_file(), page
    docs = {p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md")}
    assert docs <= set(pages), f"pages not in the nav of mkdocs.yml: {sorted(docs - set(pages))}"


def relative_links(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
    return [t for t in re.findall(r"\]\(([^)\s]+)\)", text) if not re.match(r"[a-z]+:", t) and not t.startswith("#")]


@pytest.mark.parametrize("name", ["README.md", "CONTRIBUTING.md", "docs"])
def test_relative_links_lead_to_files(name):
    """As GitHub shows them (mkdocs checks the site's links and anchors in CI)."""
    files = [ROOT / name] if name.endswith(".md") else sorted((ROOT / name).rglob("*.md"))
    for path in files:
        for target in relative_links(need(path)):
            assert (path.parent / target.split("#")[0]).exists(), f"{path.name}: {target}"


def test_citation_names_this_version_and_the_paper():
    cff = yaml.safe_load(need(ROOT / "CITATION.cff").read_text())
    assert cff["version"] == timm_posgeom.__version__
    assert cff["license"] == "Apache-2.0" and "timm-posgeom" in cff["title"]
    paper = cff["preferred-citation"]
    assert paper["title"].startswith("Positional Encodings Anchor Spatial Structure in Vision Transformers")
    assert paper["year"] == 2026 and paper["authors"][0]["family-names"] == "Mannes"
    assert "2606.00124" in paper["url"]
    assert "2606.00124" in readme().split("\n## Citation\n")[1]
