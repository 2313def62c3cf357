"""One record schema: typed records round-trip through one strict JSON writer; foreign files are refused."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
import torch
from studies import one_run_study, record_ssdc

from timm_posgeom.app.records import (
    SCHEMA_VERSION,
    HistoryPoint,
    RecordError,
    RunEval,
    RunSummary,
    SSDCSummary,
    StudyResults,
    SweepSummary,
)
from timm_posgeom.results.jsonio import dumps, nan_if_none, replacing, write_atomic, write_json


def test_round_trip_through_the_files(tmp_path):
    results = one_run_study()
    path = results.write(tmp_path / "results.json")
    raw = json.loads(path.read_text())
    assert raw["schema"] == "timm-posgeom/study-results" and raw["schema_version"] == SCHEMA_VERSION
    again = StudyResults.read(path)
    assert again == results
    assert isinstance(again.runs[0].eval.alpha_sweep, SweepSummary) and isinstance(
        again.runs[0].history[0], HistoryPoint
    )


def test_nan_is_written_one_way_and_the_json_is_strict(tmp_path):
    path = record_ssdc(nan=True).write(tmp_path / "u.json")
    text = path.read_text()
    assert "NaN" not in text and json.loads(text)["per_layer"] == [0.5, None]
    assert SSDCSummary.read(path).per_layer == [0.5, None]
    # tensors and numpy values become plain JSON; an unknown type is an error, never a silent str()
    assert json.loads(dumps({"t": torch.tensor([1.0, float("inf")]), "n": np.float32(0.5), "k": (1, 2)})) == {
        "t": [1.0, None],
        "n": 0.5,
        "k": [1, 2],
    }
    with pytest.raises(TypeError, match="no JSON form for object"):
        dumps({"x": object()})


def test_the_reader_turns_what_the_writer_made_none_back_into_nan(tmp_path):
    """One converter each way (jsonio): `to_jsonable` writes NaN as None, `nan_if_none` reads it back as NaN, at
    any depth (a record's per-layer lists, its intervals, FS per shift)."""
    value = {"per_layer": [0.5, math.nan], "ci": [[0.1, math.inf], [None, 0.3]], "fs": {"jpeg:5": math.nan}, "n": 2}
    back = nan_if_none(json.loads(dumps(value)))
    assert back["per_layer"][0] == 0.5 and math.isnan(back["per_layer"][1]) and back["n"] == 2
    assert [[math.isnan(v) for v in pair] for pair in back["ci"]] == [[False, True], [True, False]]
    assert math.isnan(back["fs"]["jpeg:5"]) and math.isnan(nan_if_none(None)) and nan_if_none("x") == "x"


def test_no_module_converts_nan_and_none_on_its_own():
    """The converters live in jsonio, the one writer; a module that writes its own (`math.nan if v is None`,
    `v if isfinite(v) else None`) would drift from them. (probes/pe_table.py returns None for "no table", its
    API, not a record's NaN.)"""
    from pathlib import Path

    import timm_posgeom

    own = re.compile(r"(math|np)\.nan if [\w.\[\]]+ is None|isfinite\([^)]*\) else None|None if [^\n]*isfinite")
    for path in Path(timm_posgeom.__file__).parent.rglob("*.py"):
        if path.name not in ("jsonio.py", "pe_table.py"):
            assert not own.search(path.read_text()), f"{path.name} converts NaN / None on its own: use jsonio's"


def test_keys_renamed_since_a_schema_are_read_under_their_new_names():
    """One rename map (RENAMED_KEYS) for every kind: schema 4's SSDC `delta` and a zoo record's `delta_ssdc` are
    `rise`."""
    from timm_posgeom.app.records import RENAMED_KEYS, ZooModel

    old = {k: v for k, v in record_ssdc().to_dict().items() if k != "rise"} | {"delta": -0.25, "schema_version": 4}
    assert SSDCSummary.from_dict(old).rise == -0.25
    zoo = dict(model="m", status="ok", settings={}, versions={}, elapsed_s=1.0, measured_at="now", delta_ssdc=0.5)
    assert ZooModel.from_dict(zoo).rise == 0.5
    assert RENAMED_KEYS == {"ssdc-summary": {"delta": "rise"}, "zoo-model": {"delta_ssdc": "rise"}}
    with pytest.raises(RecordError, match="unknown keys \\['delta'\\]"):  # both: the former is not read over the new
        SSDCSummary.from_dict(old | {"rise": 0.1})


def test_write_is_atomic(tmp_path, monkeypatch):
    path = write_json(tmp_path / "a.json", {"v": 1})

    def boom(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("os.replace", boom)
    with pytest.raises(KeyboardInterrupt):
        write_json(path, {"v": 2})
    assert json.loads(path.read_text()) == {"v": 1}  # the old file is intact


def test_write_atomic_writes_text_and_bytes_and_leaves_no_temporary_file(tmp_path):
    assert write_atomic(tmp_path / "t.md", "é\n").read_text(encoding="utf-8") == "é\n"
    assert write_atomic(tmp_path / "b.png", b"\x89PNG").read_bytes() == b"\x89PNG"
    assert write_atomic(tmp_path / "t.md", "again").read_text() == "again"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.png", "t.md"]
    with pytest.raises(FileNotFoundError):
        write_atomic(tmp_path / "no_such_folder" / "x", "x")


def test_replacing_a_folder_swaps_it_whole_or_not_at_all(tmp_path):
    folder = tmp_path / "export"
    for version in ("1", "2"):
        with replacing(folder) as tmp:
            tmp.mkdir()
            (tmp / "config.json").write_text(version)
            assert not (folder / "config.json").exists() or (folder / "config.json").read_text() == "1"
        assert [p.name for p in folder.iterdir()] == ["config.json"] and (folder / "config.json").read_text() == version
    with pytest.raises(KeyboardInterrupt), replacing(folder) as tmp:  # killed half way: the former one stays
        tmp.mkdir()
        (tmp / "config.json").write_text("3")
        raise KeyboardInterrupt
    assert (folder / "config.json").read_text() == "2" and sorted(p.name for p in tmp_path.iterdir()) == ["export"]


def test_results_to_json_write_atomically(tmp_path, monkeypatch):
    """The result classes' to_json(path) wrote with Path.write_text: a kill half way left a truncated file."""
    from timm_posgeom.probes.ssdc_probe.result import SSDCResult
    from timm_posgeom.robustness import AlphaSweepResult

    results = [SSDCResult(per_layer=[0.5], layers=[0]), AlphaSweepResult(rows=[], shifts=[])]
    for k, result in enumerate(results):
        path = tmp_path / f"{k}.json"
        written = result.to_json(path)
        assert json.loads(path.read_text()) == json.loads(written)

    def boom(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("os.replace", boom)
    for k, result in enumerate(results):
        with pytest.raises(KeyboardInterrupt):
            result.to_json(tmp_path / f"{k}.json", indent=None)  # other text: the file would change
        assert (tmp_path / f"{k}.json").read_text().startswith("{\n")  # the former file is intact
    assert sorted(p.name for p in tmp_path.iterdir()) == ["0.json", "1.json"]


def test_foreign_and_other_version_files_are_refused_naming_the_file(tmp_path):
    summary = RunSummary(model="m", steps=1, epochs=1.0, train_images=1, val_images=1, processes=1, time_s=1.0)
    path = summary.write(tmp_path / "summary.json")
    with pytest.raises(
        RecordError, match=r"summary.json: a 'timm-posgeom/run-summary' record, not timm-posgeom/run-eval"
    ):
        RunEval.read(path)
    raw = json.loads(path.read_text())
    (tmp_path / "v2.json").write_text(json.dumps(dict(raw, schema_version=SCHEMA_VERSION + 1)))
    with pytest.raises(RecordError, match=f"v2.json: schema version {SCHEMA_VERSION + 1}"):
        RunSummary.read(tmp_path / "v2.json")
    (tmp_path / "old.json").write_text(json.dumps({"steps": 3}))
    with pytest.raises(RecordError, match="old.json: not a timm-posgeom run-summary record"):
        RunSummary.read(tmp_path / "old.json")
    (tmp_path / "extra.json").write_text(json.dumps(dict(raw, surprise=1)))
    with pytest.raises(RecordError, match=r"extra.json: unknown keys \['surprise'\]"):
        RunSummary.read(tmp_path / "extra.json")
    (tmp_path / "torn.json").write_text(path.read_text()[:20])
    with pytest.raises(RecordError, match="torn.json: not valid JSON"):
        RunSummary.read(tmp_path / "torn.json")
    missing = {k: v for k, v in raw.items() if k != "steps"}
    (tmp_path / "missing.json").write_text(json.dumps(missing))
    with pytest.raises(RecordError, match=r"missing.json: missing keys \['steps'\]"):
        RunSummary.read(tmp_path / "missing.json")
    with pytest.raises(RecordError, match="nowhere.json: no such file"):
        RunSummary.read(tmp_path / "nowhere.json")


def test_report_refuses_a_foreign_results_file(tmp_path):
    from timm_posgeom.cli import main

    (tmp_path / "results.json").write_text(json.dumps({"runs": [], "config": {}}))
    with pytest.raises(SystemExit) as e:
        main(["report", str(tmp_path)])
    assert e.value.code == 2


def test_version_1_results_still_read_and_version_2_keeps_the_rpi_permutations(tmp_path):
    """Schema version 2 added SSDCSummary.rpi_permutations / rpi_by_permutation (issue 32): a results.json
    written by version 1 (neither key) still reads, as one permutation; a version 2 file round-trips them."""
    from timm_posgeom.app.records import READABLE_VERSIONS
    from timm_posgeom.app.report.claims import rpi_cube

    assert SCHEMA_VERSION >= 2 and {1, 2} <= set(READABLE_VERSIONS)  # 3 added summary.json's weights hashes
    raw = one_run_study().to_dict()
    raw["schema_version"] = 1
    for key in ("rpi_permutations", "rpi_by_permutation"):  # what version 1 wrote
        for run in raw["runs"]:
            run["eval"]["ssdc"].pop(key)
            run["untrained"].pop(key)
    (tmp_path / "v1.json").write_text(json.dumps(raw))
    old = StudyResults.read(tmp_path / "v1.json")
    assert old.runs[0].eval.ssdc.rpi_by_permutation is None and old.runs[0].eval.ssdc.rpi_per_layer == [0.1, 0.2]
    assert rpi_cube(old.runs).shape == (1, 1, 2)  # one seed, one permutation, two layers
    new = one_run_study()
    new.runs[0].eval.ssdc.rpi_permutations = [0, 1, 2]
    new.runs[0].eval.ssdc.rpi_by_permutation = [[0.1, 0.2], [0.0, 0.1], [0.2, 0.3]]
    again = StudyResults.read(new.write(tmp_path / "v2.json"))
    assert again == new and rpi_cube(again.runs).shape == (1, 3, 2)
    assert json.loads((tmp_path / "v2.json").read_text())["schema_version"] == SCHEMA_VERSION


def test_version_4_keeps_attention_per_head_and_version_3_results_still_read(tmp_path):
    """Schema version 4 added RunEval.attention (issue 33: attention per head in the study): it round-trips,
    NaN heads as null; a version 3 results.json (no such key) still reads, with None."""
    from timm_posgeom.app.records import AttentionSummary

    assert SCHEMA_VERSION >= 4
    results = one_run_study()
    results.runs[0].eval.attention = AttentionSummary(
        n_images=8,
        layers=[0, 3],
        grid=[8, 8],
        mean_distance=[[1.0, 2.0], [3.0, math.nan]],
        entropy=[[0.5, 0.6], [0.7, 0.8]],
        ssdc=[[0.1, 0.2], [0.3, 0.4]],
        rpi_mean_distance=[[4.0, 4.1], [4.2, 4.3]],
    )
    again = StudyResults.read(results.write(tmp_path / "v4.json"))
    attention = again.runs[0].eval.attention
    assert isinstance(attention, AttentionSummary) and attention.mean_distance == [[1.0, 2.0], [3.0, None]]
    assert attention.layers == [0, 3] and attention.rpi_entropy is None
    raw = one_run_study().to_dict()
    raw["schema_version"] = 3
    assert "attention" in raw["runs"][0]["eval"]
    del raw["runs"][0]["eval"]["attention"]  # what version 3 wrote
    (tmp_path / "v3.json").write_text(json.dumps(raw))
    assert StudyResults.read(tmp_path / "v3.json").runs[0].eval.attention is None
