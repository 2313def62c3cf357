"""The support matrix: one small model of every timm family, measured, and docs/support.md equal to it."""

from __future__ import annotations

from pathlib import Path

import pytest

from timm_posgeom.probes.support import MATRIX, build_matrix_model, check_support, parse_support_table

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
    "qwen3_vit",
    "deepseek_vit",  # its norms compute in float32 whatever the model's dtype: equivariant to that rounding
    "gemma4_vit",  # its x / y table and 2-D RoPE scaled to 0 by pe_scale
    "vision_transformer",
    "vision_transformer_relpos",
}
# timm's VLM towers: probed per block (the blocks of `encoder`), RPI at `encoder.patch_embed` (gemma4: its projection)
VLM_TOWERS = {"qwen3_vit", "deepseek_vit", "gemma4_vit"}


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
        assert row.equivariance.startswith("exact"), f"{entry.model}: {row.equivariance}"
        assert row.equivariance == "exact" or entry.family == "deepseek_vit", f"{entry.model}: {row.equivariance}"
    if entry.family in VLM_TOWERS:
        assert row.probe.startswith("attn_input") and row.rpi == "yes", f"{entry.model}: {row.probe}, {row.rpi}"
    doc = documented[entry.model]
    measured = row.to_dict() | {"model": doc["model"], "restored": "yes"}
    assert measured == doc, "docs/support.md differs from this run: python scripts/support_matrix.py rewrites it"
