"""Every interval a command writes stands beside the number it belongs to: each table, CSV and JSON of probe,
sweep, attention, fragility and zoo is parsed, and each interval must contain the point estimate next to it
(an interval of another number, such as the per-image mean's beside the mean map's SSDC, fails)."""

from __future__ import annotations

import csv
import json
import math
import re
from pathlib import Path

import pytest

from timm_posgeom.cli import main as cli

COMMON = [
    "--data",
    "synthetic",
    "--max-images",
    "12",
    "--batch-size",
    "4",
    "--num-workers",
    "0",
    "--no-progress",
    "--device",
    "cpu",
]
MODEL = ["posgeom_vit_micro_patch8_64_ape", "--num-classes", "10"]
NUMBER = r"(?:-?\d+\.\d+|nan)"
PAIR = re.compile(rf"\[({NUMBER}), ({NUMBER})\]")


def _inside(value: float | None, low: float | None, high: float | None, where: str) -> int:
    """1 when an interval was checked (0 when the value or the interval does not exist); fails when the
    value lies outside [low, high] (to the printed precision)."""
    if value is None or low is None or high is None or any(math.isnan(float(v)) for v in (value, low, high)):
        return 0
    assert float(low) - 1e-4 <= float(value) <= float(high) + 1e-4, f"{where}: {value} not in [{low}, {high}]"
    return 1


def check_json(node, where: str = "$") -> int:
    """Walk a written JSON: ``X`` beside ``X_ci`` ([low, high], or a list of them), beside ``X_ci_low`` and
    ``X_ci_high`` (same shape), a dict with ``mean``/``ci_low``/``ci_high``, and ``fs`` beside ``fs_interval``."""
    checked = 0
    if isinstance(node, list):
        return sum(check_json(v, f"{where}[{i}]") for i, v in enumerate(node))
    if not isinstance(node, dict):
        return 0
    if {"mean", "ci_low", "ci_high"} <= set(node):
        checked += _inside(node["mean"], node["ci_low"], node["ci_high"], where)
    for key, value in node.items():
        if f"{key}_ci" in node and node[f"{key}_ci"] is not None:
            checked += _pairs(value, node[f"{key}_ci"], f"{where}.{key}")
        if f"{key}_ci_low" in node:
            checked += _arrays(value, node[f"{key}_ci_low"], node[f"{key}_ci_high"], f"{where}.{key}")
        if key in ("fs", "accuracy") and isinstance(value, dict) and isinstance(node.get(f"{key}_interval"), dict):
            for shift, v in value.items():
                checked += _pairs(v, node[f"{key}_interval"].get(shift), f"{where}.{key}.{shift}")
        checked += check_json(value, f"{where}.{key}")
    return checked


def _pairs(value, ci, where: str) -> int:
    if ci is None or value is None:
        return 0
    if isinstance(value, list):
        return sum(_pairs(v, c, f"{where}[{i}]") for i, (v, c) in enumerate(zip(value, ci)))
    return _inside(value, ci[0], ci[1], where)


def _arrays(value, low, high, where: str) -> int:
    if isinstance(value, list):
        return sum(_arrays(v, lo, hi, f"{where}[{i}]") for i, (v, lo, hi) in enumerate(zip(value, low, high)))
    return _inside(value, low, high, where)


def check_text_table(text: str, where: str) -> int:
    """A plain-text table (probe, attention): every column ``X_ci95`` holds the interval of column ``X``; a
    line ``name ...: value [low, high]`` holds a value and its interval."""
    checked = 0
    lines = text.splitlines()
    for k, line in enumerate(lines):
        head = line.split()
        if not any(c.endswith("_ci95") for c in head):
            continue
        for row in lines[k + 1 :]:
            cells = re.findall(rf"\[{NUMBER}, {NUMBER}\]|\S+", row)
            if len(cells) != len(head):
                break
            for i, name in enumerate(head):
                if name.endswith("_ci95"):
                    value = head.index(name[:-5])
                    low, high = PAIR.match(cells[i]).groups()
                    checked += _inside(float(cells[value]), float(low), float(high), f"{where}: {name} of {row}")
    for line in lines:
        match = re.search(rf"\): ({NUMBER}) \[({NUMBER}), ({NUMBER})\]$", line)
        if match:
            checked += _inside(*map(float, match.groups()), f"{where}: {line}")
    return checked


def check_markdown(text: str, where: str) -> int:
    """A markdown table: a column ``X 95% CI`` holds the interval of column ``X``; a cell ``v [low, high]``
    holds a number and its interval."""
    checked = 0
    lines = [line for line in text.splitlines() if line.startswith("|")]
    head: list[str] = []
    for line in lines:
        cells = [c.strip() for c in line.strip("|").split("|")]
        if set("".join(cells)) <= set("-: "):
            continue
        if not any(PAIR.search(c) for c in cells) and not any(re.fullmatch(NUMBER, c) for c in cells):
            head = cells
            continue
        for i, cell in enumerate(cells):
            for value, low, high in re.findall(rf"({NUMBER}) \[({NUMBER}), ({NUMBER})\]", cell):
                checked += _inside(float(value), float(low), float(high), f"{where}: {cell}")
            name = head[i] if i < len(head) else ""
            if name.endswith(" 95% CI") and name[:-7] in head and PAIR.fullmatch(cell):
                low, high = PAIR.fullmatch(cell).groups()
                value = cells[head.index(name[:-7])]
                checked += _inside(float(value), float(low), float(high), f"{where}: {name} in {line}")
    return checked


def check_csv(path: Path) -> int:
    """``X`` beside ``X_ci_low`` and ``X_ci_high`` (numbers, or space-separated series of them)."""
    checked = 0
    with open(path) as f:
        rows = list(csv.DictReader(f))
    for row in rows:
        for key in row:
            if key.endswith("_ci_low") and key[:-7] in row:
                base = key[:-7]
                values, lows, highs = (row[base].split(), row[key].split(), row[f"{base}_ci_high"].split())
                for v, lo, hi in zip(values, lows, highs):
                    checked += _inside(float(v), float(lo), float(hi), f"{path.name}: {base} of {row['model']}")
    return checked


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    out = tmp_path_factory.mktemp("outputs")
    printed = {}
    import contextlib
    import io

    def run(name, args):
        buffer = io.StringIO()
        with contextlib.redirect_stdout(buffer):
            assert cli(args) == 0
        printed[name] = buffer.getvalue()

    run("probe", ["probe", *MODEL, *COMMON, "--out", str(out / "probe")])
    run("probe_rpi", ["probe", *MODEL, *COMMON, "--rpi", "--rpi-permutations", "3", "--out", str(out / "probe_rpi")])
    run(
        "sweep",
        [
            "sweep",
            *MODEL,
            *COMMON,
            "--alphas",
            "1,0.5",
            "--rpi-permutations",
            "2",
            "--labels",
            "as-is",
            "--out",
            str(out / "sweep"),
        ],
    )
    run("attention", ["attention", *MODEL, *COMMON, "--rpi", "--rpi-permutations", "2", "--out", str(out / "att")])
    run(
        "fragility",
        ["fragility", *MODEL, *COMMON, "--shift", "jpeg:5", "--labels", "as-is", "--out", str(out / "frag")],
    )
    run(
        "zoo",
        [
            "zoo",
            "posgeom_vit_micro_patch8_64_ape",
            "posgeom_vit_micro_patch8_64_nope",
            "--no-pretrained",
            *COMMON,
            "--alphas",
            "1,0",
            "--rpi-permutations",
            "2",
            "--extras",
            "none",
            "--out",
            str(out / "zoo"),
        ],
    )
    return out, printed


def test_probe_tables_and_json(outputs):
    out, printed = outputs
    assert check_text_table(printed["probe"], "probe") >= 4 * 2 + 1  # ssdc and img_mean per layer, the rise
    assert check_text_table(printed["probe_rpi"], "probe --rpi") >= 4 * 3 + 1  # ssdc, img_mean, content; delta
    assert "delta SSDC under RPI" in printed["probe_rpi"] and "delta SSDC" not in printed["probe"]
    for name in ("probe", "probe_rpi"):
        assert check_json(json.loads((out / name / "ssdc.json").read_text()), name) >= 9


def test_sweep_attention_fragility_outputs(outputs):
    out, printed = outputs
    assert check_markdown(printed["sweep"], "sweep") >= 2 * 2  # delta SSDC, top-1 per alpha (FS: NaN at random init)
    assert check_markdown((out / "sweep" / "sweep.md").read_text(), "sweep.md") >= 4
    assert check_json(json.loads((out / "sweep" / "sweep.json").read_text()), "sweep.json") >= 6
    assert check_text_table(printed["attention"], "attention") >= 4 * 4
    assert check_json(json.loads((out / "att" / "attention.json").read_text()), "attention.json") >= 4 * 4
    assert check_json(json.loads((out / "frag" / "fragility.json").read_text()), "fragility.json") >= 2


def test_zoo_csv_and_markdown(outputs):
    out, _ = outputs
    assert check_csv(out / "zoo" / "zoo.csv") >= 2 * 8
    assert check_markdown((out / "zoo" / "zoo.md").read_text(), "zoo.md") >= 2 * 3
    for path in sorted((out / "zoo" / "models").glob("*.json")):
        assert check_json(json.loads(path.read_text()), path.name) >= 8


def test_the_checkers_catch_an_interval_of_another_number():
    """The old probe table printed the per-image mean's interval beside the mean map's SSDC: caught."""
    old = "layer    ssdc  ssdc_ci95\n    0  0.3760  [0.1510, 0.1840]\n"
    with pytest.raises(AssertionError, match="not in"):
        check_text_table(old, "old")
    with pytest.raises(AssertionError, match="not in"):
        check_json({"per_layer": [0.376], "per_layer_ci": [[0.151, 0.184]]})
    with pytest.raises(AssertionError, match="not in"):
        check_markdown("| a | a 95% CI |\n|---|---|\n| 0.5 | [0.1, 0.2] |\n", "md")
