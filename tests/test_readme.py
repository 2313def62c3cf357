"""The README's library example runs, and its prints mean what the README says they mean.

The example (the ```python block under "## Using the library") trains a micro APE model on the
embedded synthetic set and measures it; it runs here as written, in a temporary directory, in a fresh
process. The README then states: the model reads the layout from its PE (top-1 far above chance, and
shuffling the patches under it (RPI) or scaling its PE to 0 costs most of that); JPEG q5 hardly
hurts it; SSDC without RPI is above SSDC under RPI at every layer. Each statement is checked on
what the example printed, and the output block the README shows must have the same lines.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
NUMBER = r"-?\d+\.\d+"


def section(text: str, heading: str) -> str:
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def library_example() -> tuple[str, str]:
    """(the example's code, the output block the README shows after it)."""
    text = section(README.read_text(encoding="utf-8"), "Using the library")
    blocks = re.findall(r"```(\w*)\n(.*?)```", text, flags=re.S)
    code = [body for lang, body in blocks if lang == "python"]
    shown = [body for lang, body in blocks if lang == ""]
    assert len(code) == 1 and len(shown) == 1, "expected one python block and one output block"
    return code[0], shown[0]


def shape(output: str) -> list[str]:
    """The lines of an output with every number replaced, for comparing the README's block with a run."""
    return [re.sub(NUMBER, "N", line).rstrip() for line in output.strip().splitlines()]


def parse(out: str) -> dict:
    m = re.search(rf"^top-1 ({NUMBER}), under RPI ({NUMBER}) \(chance 0\.100\)$", out, re.M)
    assert m, out
    clean, rpi = float(m[1]), float(m[2])
    m = re.search(rf"^JPEG q5 fragility score ({NUMBER}) \(95% interval ({NUMBER}) to ({NUMBER})\)$", out, re.M)
    assert m, out
    fs, lo, hi = float(m[1]), float(m[2]), float(m[3])
    m = re.search(r"^SSDC per layer +((?:-?\d\.\d+ ?)+)$", out, re.M)
    assert m, out
    plain = [float(v) for v in m[1].split()]
    m = re.search(
        rf"^SSDC per layer under RPI ((?:-?\d\.\d+ ?)+)\(delta SSDC ({NUMBER}), 95% interval ({NUMBER}) "
        rf"to ({NUMBER})\)$",
        out,
        re.M,
    )
    assert m, out
    under = [float(v) for v in m[1].split()]
    delta, delta_ci = float(m[2]), (float(m[3]), float(m[4]))
    rows, head = {}, []
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| alpha "):
            head = cells
        elif line.startswith("| ") and re.fullmatch(r"[\d.]+", cells[0]):
            row = dict(zip(head, cells))
            rows[float(cells[0])] = dict(
                delta=float(row["delta SSDC (RPI)"]), top1=float(row["clean top-1"]), fs=float(row["FS jpeg:5"])
            )
    return dict(
        clean=clean,
        rpi=rpi,
        fs=fs,
        interval=(lo, hi),
        plain=plain,
        under=under,
        delta=delta,
        delta_ci=delta_ci,
        sweep=rows,
    )


def test_readme_example_shape():
    """Fast: the example is there, uses only the public names it imports, and its output block is parseable."""
    code, shown = library_example()
    assert "import timm_posgeom" in code
    numbers = parse(shown)
    assert sorted(numbers["sweep"]) == [0.0, 0.5, 1.0]


@pytest.mark.slow
def test_readme_example_runs_and_means_what_it_says(tmp_path):
    code, shown = library_example()
    env = dict(os.environ, MPLBACKEND="Agg")
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1800
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = proc.stdout
    assert (tmp_path / "runs" / "readme-ape" / "export" / "model.safetensors").is_file()
    # the README shows what the example prints, line for line (numbers aside)
    printed = [line for line in shape(out) if not line.startswith(("posgeom_vit", "step ", "done:"))]
    assert printed == shape(shown), out
    n = parse(out)
    # top-1 far above chance (0.1) and above what content alone gives (at most 0.4, synthetic.py)
    assert n["clean"] >= 0.6, out
    # under RPI the PE points to the wrong places: down to about 0.4, what the contents alone tell
    assert n["rpi"] <= n["clean"] - 0.25 and n["rpi"] < 0.55, out
    # at alpha 0 the model has no PE left, and no layout (about 0.4 too); alpha 1 is the model as it is
    sweep = n["sweep"]
    assert sweep[1.0]["top1"] == pytest.approx(n["clean"], abs=1e-3), out
    assert sweep[0.0]["top1"] <= n["clean"] - 0.25 and sweep[0.0]["top1"] < 0.55, out
    # JPEG q5 hardly hurts a model that reads layout from its PE; the interval holds the estimate
    assert n["fs"] <= 0.15 and n["interval"][0] <= n["fs"] <= n["interval"][1], out
    assert sweep[1.0]["fs"] == pytest.approx(n["fs"], abs=1e-3), out
    # SSDC positive at every layer (nearby patches look alike), about 0 under RPI
    assert len(n["plain"]) == len(n["under"]) == 4
    assert all(p > u for p, u in zip(n["plain"], n["under"])), out
    assert min(n["plain"]) > 0.1 and max(abs(u) for u in n["under"]) < 0.2, out
    assert n["delta"] == pytest.approx(n["under"][1] - n["under"][0], abs=2e-3), out
    assert n["delta_ci"][0] <= n["delta"] <= n["delta_ci"][1] and n["delta_ci"][0] < n["delta_ci"][1], out
    assert sweep[1.0]["delta"] == pytest.approx(n["delta"], abs=1e-3), out  # alpha 1 first: the same permutations
    # a second run reuses the finished training instead of failing on it or training over it: the example's
    # part before the measurements run again (the measurements are the first run's, checked above; running them
    # twice cost CI a minute), every file of the run left as it was
    head = code[: code.index("model = timm_posgeom.create_model")]
    run_dir = tmp_path / "runs" / "readme-ape"
    before = {p: (p.stat().st_mtime_ns, p.stat().st_size) for p in run_dir.rglob("*") if p.is_file()}
    again = subprocess.run(
        [sys.executable, "-c", head], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1800
    )
    assert again.returncode == 0, again.stderr[-4000:]
    assert {p: (p.stat().st_mtime_ns, p.stat().st_size) for p in run_dir.rglob("*") if p.is_file()} == before
