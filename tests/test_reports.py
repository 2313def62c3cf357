"""Records are the source, renders follow (issue 49): every committed study report is what today's code renders from
the study's records (`posgeom report STUDY` rebuilds it; its figures are drawn from the records and the runs' probe
maps, which live outside git, so the page is compared with the figures it shows left as they are)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from timm_posgeom.app.report import write_report

ROOT = Path(__file__).resolve().parents[1]
STUDIES = sorted(p.parent.relative_to(ROOT) for p in (ROOT / "experiments" / "scaling").glob("*/results.json"))


def test_there_are_committed_reports():
    assert len(STUDIES) >= 11 and all((ROOT / s / "report.md").is_file() for s in STUDIES)


@pytest.mark.parametrize("study", STUDIES, ids=[s.name for s in STUDIES])
def test_a_committed_report_equals_a_fresh_render_of_its_records(study, tmp_path, monkeypatch):
    copy = tmp_path / study
    shutil.copytree(ROOT / study, copy, ignore=shutil.ignore_patterns("*.safetensors", "maps.pt", "report.*"))
    monkeypatch.chdir(tmp_path)  # the page names the study's path as `posgeom report` is given it, from the root
    write_report(study, figures=False)
    for name in ("report.md", "report.html"):
        fresh, committed = (copy / name).read_text(), (ROOT / study / name).read_text()
        assert fresh == committed, f"{study / name} is not today's render: `posgeom report {study}` rebuilds it"
    assert os.listdir(copy / "figures") == os.listdir(ROOT / study / "figures")  # no figure drawn or lost
