"""scripts/verdicts.py (issue 39): the current verdicts per study, and side by side the rule before issue 39, each
change alone and today's, from each study's results.json."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from studies import paper_like, paper_seeds, results_of

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "verdicts.py"


@pytest.fixture(scope="module")
def verdicts():
    spec = importlib.util.spec_from_file_location("verdicts_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_it_prints_the_current_verdicts_and_what_changed_them(verdicts, tmp_path, capsys):
    (tmp_path / "four").mkdir()
    results_of(paper_seeds(4)).write(tmp_path / "four" / "results.json")
    (tmp_path / "one").mkdir()
    results_of(paper_like(0)).write(tmp_path / "one" / "results.json")
    assert verdicts.main([str(tmp_path / "four"), f"one seed={tmp_path / 'one'}"]) == 0
    out = capsys.readouterr().out
    assert "| four | 4 (no PE, APE, sincos, RoPE, RPT) | held | held | held | held | held |" in out
    assert (
        "| one seed | 1 (no PE, APE, sincos, RoPE, RPT) | one seed | one seed | one seed | one seed | one seed |" in out
    )
    # one seed: held under rule 2026-11, which only the one-seed change moves (in bold), not decided under 2026-12
    row = next(line for line in out.splitlines() if line.startswith("| one seed | 3. RPT like no PE |"))
    assert row.split(" | ")[2:] == ["held", "held", "held", "**one seed**", "held", "held", "**one seed** |"]
    assert verdicts.main(["--evidence", str(tmp_path / "one")]) == 0
    text = capsys.readouterr().out
    assert "- 2026-11: held. no PE: mean SSDC" in text and "- 2026-12: one seed: not decided" in text


def test_a_study_without_results_is_one_line(verdicts, tmp_path):
    with pytest.raises(SystemExit, match="results.json: no results"):
        verdicts.main([str(tmp_path)])
