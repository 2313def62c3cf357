"""docs/results.md's tables come from committed records (issue 49, item 6: records are the source, renders follow).

Rather than running the studies again, each section's tables are checked against the records its runs committed
under experiments/: every number of a table (but the claims' evidence, computed by scripts/verdicts.py and checked
by tests/test_verdicts_script.py) is a number of those records, at the table's precision. A number typed by hand,
or left from an earlier run, fails."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results.md"
NUMBER = re.compile(r"(?<![\w.])-?\d*\.\d+")
RECORD_SUFFIXES = (".csv", ".md", ".json", ".jsonl")

# section heading -> the records (globs under the repository) its tables are made of
SECTIONS = {
    "What the study found on real images (a run we made)": ["experiments/scaling/**/*"],
    "Why our delta SSDC is smaller than the paper's: initialisation, width and grid": ["experiments/scaling/**/*"],
    "The width ladder: delta SSDC against width": ["experiments/scaling/**/*"],
    "Where the encoding acts: the 8 x 8 models": ["experiments/localisation/**/*"],
    "Resolution extrapolation of the trained micro models": ["experiments/extrapolation/**/*"],
    "The encoding moved: PE shuffle, PE shift and the image grid": ["experiments/interventions/**/*"],
}


def section(text: str, heading: str) -> str:
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 4)
    return text[start : end if end > 0 else None]


def table_numbers(text: str) -> list[str]:
    """The numbers of the text's tables, as written (header rows and the claims' evidence tables left out)."""
    numbers: list[str] = []
    for table in re.split(r"\n(?!\|)", text):
        rows = [line for line in table.splitlines() if line.startswith("|")]
        if len(rows) < 3 or rows[0].startswith("| claim"):
            continue
        numbers += [n for row in rows[2:] for n in NUMBER.findall(row)]
    return numbers


def record_numbers(globs: list[str], root: Path = ROOT) -> set[str]:
    """Every number of the records, as written and rounded to 1-4 decimals (with and without its leading 0)."""
    found: set[str] = set()
    for pattern in globs:
        for path in root.glob(pattern):
            if path.suffix not in RECORD_SUFFIXES or not path.is_file():
                continue
            for text in NUMBER.findall(path.read_text(errors="replace")):
                value = float(text)
                found.add(text)
                for digits in range(1, 5):
                    rounded = f"{value:.{digits}f}"
                    found.update((rounded, rounded.replace("0.", ".", 1)))
    return found


@pytest.mark.parametrize("heading", list(SECTIONS))
def test_every_number_of_a_results_table_is_in_its_records(heading):
    numbers = table_numbers(section(RESULTS.read_text(), heading))
    assert len(numbers) >= 20, f"{heading}: the section's tables hold {len(numbers)} numbers"
    records = record_numbers(SECTIONS[heading])
    unknown = sorted({n for n in numbers if n not in records})
    assert not unknown, f"{heading}: numbers in no record under {SECTIONS[heading]}: {unknown[:10]}"


def test_the_check_sees_a_number_no_record_holds(tmp_path):
    text = "\n## S\n\n| a | b |\n|---|---|\n| x | 0.123 |\n| y | -0.456 |\n\n| claim | v |\n|---|---|\n| 1 | 0.9 |\n"
    assert table_numbers(section(text, "S")) == ["0.123", "-0.456"]  # the claims' table left out
    (tmp_path / "r.json").write_text('{"a": 0.12345, "b": -0.4564}')
    records = record_numbers(["*.json"], tmp_path)
    assert "0.123" in records and ".123" in records and "-0.456" in records and "0.124" not in records
