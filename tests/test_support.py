"""The support matrix: one small model of every timm family, measured, and docs/support.md equal to it."""

from __future__ import annotations

from pathlib import Path

import pytest

from timm_posgeom.support import MATRIX, build_matrix_model, check_support, parse_support_table

DOC = Path(__file__).resolve().parents[1] / "docs" / "support.md"

# Global-attention ViTs: with every PE removed their blocks must be exactly permutation-equivariant
# (convit was not: pe_scale left its GPSA positional attention in place).
GLOBAL_ATTENTION = {
    "beit",
    "cait",
    "convit",
    "deit",
    "eva",
    "naflexvit",
    "vision_transformer",
    "vision_transformer_relpos",
}


@pytest.fixture(scope="module")
def documented() -> dict[str, dict[str, str]]:
    return parse_support_table(DOC.read_text())


def test_docs_list_exactly_the_matrix(documented):
    assert sorted(documented) == sorted(e.model for e in MATRIX)
    assert len({e.family for e in MATRIX}) == len(MATRIX)


@pytest.mark.parametrize("entry", MATRIX, ids=lambda e: e.family)
def test_support_row(entry, documented, one_thread):
    row = check_support(
        build_matrix_model(entry), entry.model, img_size=(entry.img_size, entry.img_size), family=entry.family
    )
    assert row.restored, f"{entry.model}: pe_scale did not restore the state bit for bit"
    assert not row.probe.startswith("refused"), f"{entry.model}: {row.probe}"
    if entry.family in GLOBAL_ATTENTION:
        assert row.equivariance == "exact", f"{entry.model}: {row.equivariance}"
    doc = documented[entry.model]
    measured = row.to_dict() | {"model": doc["model"], "restored": "yes"}
    assert measured == doc, "docs/support.md differs from this run: python scripts/support_matrix.py rewrites it"
