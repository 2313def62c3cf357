"""posgeom zoo: many models measured the same way, one row per model, resumable model by model.

Offline and small: random-init timm models (a ViT with a learned table, an eva02 with a table and
RoPE) and one of our exported runs (``local-dir:``), at 112 px on the first 16 of 24 Imagenette
validation images written to a parquet folder of their own.
"""

from __future__ import annotations

import csv
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
from conftest import IMAGENETTE

from timm_posgeom.app.records import ZooModel
from timm_posgeom.app.zoo import (
    ZooConfig,
    csv_columns,
    filter_models,
    layer_summary,
    read_models_file,
    relative_depth,
    safe_name,
    versions,
)
from timm_posgeom.cli import main
from timm_posgeom.data import load_split
from timm_posgeom.data.eval_data import eval_loader
from timm_posgeom.data.labels import map_by_name
from timm_posgeom.data.shifts import PAPER_SHIFTS
from timm_posgeom.models.factory import create_model
from timm_posgeom.probes import probe_ssdc
from timm_posgeom.robustness import alpha_sweep, fragility

# pytest-xdist (CI): the whole module on one worker, so that the zoo and export of its module fixtures are made once
pytestmark = pytest.mark.xdist_group("zoo")

IMG, N, BATCH = 112, 16, 8
VIT = "vit_tiny_patch16_224"  # a learned absolute table, 12 blocks
ROPE = "eva02_tiny_patch14_224"  # a learned table and axial RoPE, 12 blocks, no classifier (num_classes 0)
COMMON = [
    "--no-pretrained",
    "--img-size",
    str(IMG),
    "--max-images",
    str(N),
    "--batch-size",
    str(BATCH),
    "--num-workers",
    "0",
    "--no-progress",
]


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """Small tensors on a shared CPU: one torch thread is several times faster than two competing."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    """The first 24 Imagenette validation images as a parquet folder (class names kept)."""
    if not IMAGENETTE.exists():
        pytest.skip("../shared/data/imagenette is not present")
    import pyarrow as pa
    import pyarrow.parquet as pq

    source = pq.ParquetFile(IMAGENETTE / "data" / "validation-00000-of-00001.parquet")
    batch = next(source.iter_batches(batch_size=24))
    table = pa.Table.from_batches([batch]).replace_schema_metadata(source.schema_arrow.metadata)
    root = tmp_path_factory.mktemp("imagenette24")
    (root / "data").mkdir()
    pq.write_table(table, root / "data" / "validation-00000-of-00001.parquet")
    return root


@pytest.fixture(scope="module")
def export(tmp_path_factory, data_dir) -> str:
    """One of our runs as `posgeom train` exports it (config.json with the class names, safetensors)."""
    from timm_posgeom.app.hub import export_for_hub

    classes = load_split(data_dir, "validation").classes
    torch.manual_seed(1)
    model = timm.create_model("posgeom_vit_micro_patch8_64_rope", num_classes=10, img_size=IMG)
    folder = tmp_path_factory.mktemp("run") / "export"
    export_for_hub(
        model,
        folder,
        dict(img_size=IMG, num_classes=10),
        dict(input_size=(3, IMG, IMG), num_classes=10, label_names=classes),
    )
    return f"local-dir:{folder}"


@pytest.fixture(scope="module")
def zoo(tmp_path_factory, data_dir, export) -> Path:
    """The three models measured once, named through a models file."""
    out = tmp_path_factory.mktemp("zoo")
    models_file = out.parent / "models.txt"
    models_file.write_text(f"# a zoo\n{VIT}\n\n{ROPE}   # RoPE\n{export}\n{VIT}\n")
    assert main(["zoo", "--models-file", str(models_file), "--data", str(data_dir), "--out", str(out), *COMMON]) == 0
    return out


def _rows(out: Path) -> dict[str, dict[str, str]]:
    with open(out / "zoo.csv", newline="") as f:
        return {row["model"]: row for row in csv.DictReader(f)}


def _cell(value: float | None) -> float | None:
    return None if value is None or math.isnan(value) else value


def _loader(model, data):
    return eval_loader(model, data, max_images=N, batch_size=BATCH, num_workers=0)


def _number(text: str) -> float | None:
    return float(text) if text else None


@pytest.mark.slow
def test_csv_has_one_row_per_model_equal_to_direct_measurements(zoo, data_dir, export):
    rows = _rows(zoo)
    assert list(rows) == [VIT, ROPE, export]
    with open(zoo / "zoo.csv", newline="") as f:
        assert next(csv.reader(f)) == csv_columns(ZooConfig(data=str(data_dir)))
    data = load_split(data_dir, "validation", subset=N)
    for name, pe, labels in (
        (VIT, "absolute position table", "imagenet-1k head"),
        (ROPE, "absolute position table; axial RoPE", None),  # headless (MIM weights' cfg)
        (export, "our model's PE 'rope'", "recorded class names"),
    ):
        row = rows[name]
        record = ZooModel.read(zoo / "models" / f"{safe_name(name)}.json")
        assert row["status"] == "ok" and record.status == "ok"
        torch.manual_seed(0)
        model = create_model(name, img_size=IMG).eval()
        assert row["weights"] == ("loaded" if name == export else "random-init")
        assert row["img_size"] == str(IMG) and row["pe_kinds"] == pe and (labels or "") in row["labels"]
        assert float(row["param_count"]) == pytest.approx(sum(p.numel() for p in model.parameters()) / 1e6, abs=5e-4)

        normal = probe_ssdc(model, _loader(model, data), progress=False)
        rpi = probe_ssdc(model, _loader(model, data), rpi=True, seed=0, progress=False)
        assert record.ssdc == pytest.approx(normal.per_layer, abs=1e-9)
        assert record.rpi_ssdc == pytest.approx(rpi.per_layer, abs=1e-9)
        assert float(row["delta_ssdc_rpi"]) == pytest.approx(rpi.per_layer[1] - rpi.per_layer[0], abs=1e-6)
        for prefix, values in (("ssdc", normal.per_layer), ("rpi_ssdc", rpi.per_layer)):
            assert float(row[f"{prefix}_first"]) == pytest.approx(values[0], abs=1e-6)
            assert float(row[f"{prefix}_last"]) == pytest.approx(values[-1], abs=1e-6)
            assert float(row[f"{prefix}_peak"]) == pytest.approx(max(values), abs=1e-6)
            assert int(row[f"{prefix}_peak_layer"]) == values.index(max(values))
            assert float(row[f"{prefix}_mean"]) == pytest.approx(sum(values) / len(values), abs=1e-6)
        assert [float(v) for v in row["rpi_ssdc_per_layer"].split()] == pytest.approx(rpi.per_layer, abs=1e-6)

        matched, how = map_by_name(model, data)
        if labels is None:  # no top-1, no FS: empty cells and the reason
            assert matched is None and how == "the model has no classifier head" and how in row["notes"]
            assert row["labels"] == row["top1"] == row["n_images"] == row["fs_jpeg:5"] == row["fs_blur:2.5:5"] == ""
            continue
        assert labels in how
        frag = fragility(model, matched, PAPER_SHIFTS, batch_size=BATCH, num_workers=0, max_images=N, progress=False)
        assert float(row["top1"]) == pytest.approx(frag.clean_accuracy, rel=1e-5)  # a fraction, as FS
        assert int(row["n_images"]) == N == int(row["probe_images"])
        for shift in PAPER_SHIFTS:
            expected = _cell(frag.fs[shift])
            got = _number(row[f"fs_{shift}"])
            assert got == (None if expected is None else pytest.approx(expected, abs=1e-6))
        assert row["timm_version"] == timm.__version__ and row["timm_posgeom_version"]


def test_attention_and_position_columns_equal_direct_measurements(zoo, data_dir, export):
    from torch.utils.data import Subset

    from timm_posgeom import attention_measures, position_probe

    rows = _rows(zoo)
    data = load_split(data_dir, "validation", subset=N)
    for name in (VIT, ROPE, export):
        row, record = rows[name], ZooModel.read(zoo / "models" / f"{safe_name(name)}.json")
        torch.manual_seed(0)
        model = create_model(name, img_size=IMG).eval()
        att = attention_measures(model, _loader(model, data), progress=False, distributed="off")
        heads = att.mean_distance  # (L, heads)
        np.testing.assert_allclose(np.array(record.attention_distance_heads, dtype=float), heads, atol=1e-9)
        assert record.attention_distance == pytest.approx(heads.mean(1).tolist(), abs=1e-9)
        assert record.attention_entropy == pytest.approx(att.entropy.mean(1).tolist(), abs=1e-9)
        assert [float(v) for v in row["attn_distance_per_layer"].split()] == pytest.approx(heads.mean(1), abs=1e-5)
        halves = [_loader(model, Subset(data, range(0, N // 2))), _loader(model, Subset(data, range(N // 2, N)))]
        for rpi, got in ((False, record.position_accuracy), (True, record.position_accuracy_rpi)):
            direct = position_probe(model, *halves, rpi=rpi, batch_size=BATCH, progress=False, distributed="off")
            assert got == pytest.approx(direct.accuracy.tolist(), abs=1e-12)
        ((h, w),) = {tuple(g) for g in record.grid_sizes}
        assert record.position_chance == pytest.approx(1 / (h * w))  # 7 x 7, 8 x 8 and 14 x 14 grids here
    md = (zoo / "zoo.md").read_text()
    assert "## Attention and position, per block" in md and all(f"`{m}`" in md for m in (VIT, ROPE))


def test_figures_and_markdown_name_every_model(zoo, export):
    md = (zoo / "zoo.md").read_text()
    for name in (VIT, ROPE, export):
        assert f"`{name}`" in md
    assert "Random-init models" in md
    assert "Versions: " + ", ".join(f"{k} {v}" for k, v in versions().items()) + "." in md
    for figure in ("zoo_ssdc_depth.png", "zoo_fragility_vs_delta.png"):
        path = zoo / "figures" / figure
        assert path.stat().st_size > 10_000 and f"figures/{figure}" in md
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_rerun_measures_nothing_again_and_other_settings_are_refused(zoo, data_dir, capsys):
    before = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in (zoo / "models").iterdir()}
    assert main(["zoo", "--data", str(data_dir), "--out", str(zoo), *COMMON]) == 0  # no MODEL: the zoo's own
    assert "3 models (0 measured now, 3 kept)" in capsys.readouterr().out
    changed = [a if a != str(N) else "8" for a in COMMON]
    with pytest.raises(SystemExit) as e:
        main(["zoo", VIT, "--data", str(data_dir), "--out", str(zoo), *changed])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "measured with other settings (max_images: 16 -> 8)" in err
    assert "--allow-changes" in err
    assert {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in (zoo / "models").iterdir()} == before


def test_markdown_names_models_measured_with_other_versions(zoo, data_dir, tmp_path, capsys):
    """zoo.md named the first model's versions as those of every model, also in a zoo resumed after an
    upgrade."""
    import json
    import shutil

    copy = tmp_path / "zoo"
    shutil.copytree(zoo, copy)
    path = next(p for p in (copy / "models").iterdir() if json.loads(p.read_text())["model"] == ROPE)
    record = json.loads(path.read_text())
    record["versions"]["timm"] = "0.0.1"
    path.write_text(json.dumps(record))
    assert main(["zoo", "--data", str(data_dir), "--out", str(copy), *COMMON]) == 0
    assert "3 models (0 measured now, 3 kept)" in capsys.readouterr().out
    assert f"(this invocation); timm 0.0.1 for {ROPE}." in (copy / "zoo.md").read_text()


@pytest.mark.slow
def test_a_model_that_fails_gives_an_error_row_and_the_zoo_goes_on(tmp_path, data_dir, export, capsys):
    out = tmp_path / "zoo"
    code = main(
        ["zoo", "no_such_model_xyz", export, "--data", str(data_dir), "--out", str(out), "--alphas", "1,0", *COMMON]
    )
    assert code == 1
    err = capsys.readouterr().err
    assert "1 model(s) failed" in err and "no_such_model_xyz: load: ModelLoadError: unknown model" in err
    rows = _rows(out)
    assert rows["no_such_model_xyz"]["status"] == "error" and "unknown model" in rows["no_such_model_xyz"]["error"]
    assert rows["no_such_model_xyz"]["top1"] == "" and rows[export]["status"] == "ok"
    assert "## Failed" in (out / "zoo.md").read_text()
    # the sweep's columns are alpha_sweep's numbers
    torch.manual_seed(0)
    model = create_model(export).eval()
    data = load_split(data_dir, "validation", subset=N)
    sweep = alpha_sweep(
        model,
        data,
        [1.0, 0.0],
        ("jpeg:5",),
        probe_images=N,
        batch_size=BATCH,
        num_workers=0,
        max_images=N,
        progress=False,
    )
    assert rows[export]["sweep_alphas"] == "1 0"
    assert [float(v) for v in rows[export]["sweep_delta_ssdc_rpi"].split()] == pytest.approx(sweep.delta_ssdc, abs=1e-6)
    fs = [_cell(v) for v in sweep.fs["jpeg:5"]]
    got = [None if v == "nan" else float(v) for v in rows[export]["sweep_fs_jpeg:5"].split()]
    assert got == [None if v is None else pytest.approx(v, abs=1e-6) for v in fs]
    # a rerun measures the failed model again, and only it
    record = out / "models" / f"{safe_name(export)}.json"
    stamp = record.stat().st_mtime_ns
    assert main(["zoo", "--data", str(data_dir), "--out", str(out), "--alphas", "1,0", *COMMON]) == 1
    assert "1 measured now, 1 kept" in capsys.readouterr().out and record.stat().st_mtime_ns == stamp
    # other settings, allowed: measured again, the former record kept beside the new one
    fewer = [a if a != str(N) else "4" for a in COMMON]
    assert main(["zoo", "--data", str(data_dir), "--out", str(out), "--alphas", "1,0", "--allow-changes", *fewer]) == 1
    assert ZooModel.read(record).settings["max_images"] == 4 and ZooModel.read(record).probe_images == 4
    assert ZooModel.read(record.with_name(record.name + ".replaced-1")).settings["max_images"] == N
    assert _rows(out)[export]["n_images"] == "4"


@pytest.mark.slow
def test_killed_while_measuring_the_second_model_a_rerun_keeps_the_first(tmp_path, data_dir, export, capsys):
    out = tmp_path / "zoo"
    first = out / "models" / f"{safe_name(export)}.json"
    second = out / "models" / f"{safe_name(ROPE)}.json"
    cmd = [
        sys.executable,
        "-m",
        "timm_posgeom.cli",
        "zoo",
        export,
        ROPE,
        VIT,
        "--data",
        str(data_dir),
        "--out",
        str(out),
        *COMMON,
    ]
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]), MPLBACKEND="Agg", OMP_NUM_THREADS="1")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 300
        while not first.exists():
            assert proc.poll() is None, "the zoo ended before its first model was recorded"
            assert time.time() < deadline, "no record of the first model after 300 s"
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)  # now measuring the second model (eva02: seconds)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not second.exists(), "the second model finished before the kill: nothing was interrupted"
    stamp, content = first.stat().st_mtime_ns, first.read_bytes()
    assert main(["zoo", export, ROPE, VIT, "--data", str(data_dir), "--out", str(out), *COMMON]) == 0
    captured = capsys.readouterr().out
    assert f"{export}: measured before, kept" in captured and "2 measured now, 1 kept" in captured
    assert first.stat().st_mtime_ns == stamp and first.read_bytes() == content
    for name in (ROPE, VIT):
        assert ZooModel.read(out / "models" / f"{safe_name(name)}.json").status == "ok"
    assert list(_rows(out)) == [export, ROPE, VIT]


def _table(out: Path) -> dict[str, dict[str, str]]:
    """zoo.csv's rows without the columns that time the run."""
    return {name: {k: v for k, v in row.items() if k != "elapsed_s"} for name, row in _rows(out).items()}


@pytest.mark.slow
def test_two_shards_one_after_the_other_give_the_one_process_table(zoo, data_dir, export, tmp_path, capsys):
    out = tmp_path / "sharded"
    models = [VIT, ROPE, export]  # the zoo fixture's models, in its order
    assert main(["zoo", *models, "--data", str(data_dir), "--out", str(out), "--shard", "0/2", *COMMON]) == 0
    said = capsys.readouterr()
    assert "1 model(s) of the zoo not measured yet" in said.out + said.err
    assert list(_rows(out)) == [VIT, export]  # models 0 and 2 of 3: shard 0 of 2
    assert main(["zoo", *models, "--data", str(data_dir), "--out", str(out), "--shard", "1/2", *COMMON]) == 0
    assert _table(out) == _table(zoo)
    with pytest.raises(SystemExit) as e:
        main(["zoo", "--data", str(data_dir), "--out", str(out), "--shard", "2/2", *COMMON])
    assert e.value.code == 2 and "0 <= K < N" in capsys.readouterr().err
    (out / "zoo.csv").unlink()
    assert main(["zoo", "--out", str(out), "--merge"]) == 0  # the outputs again, from the records alone
    assert _table(out) == _table(zoo)


@pytest.mark.slow
def test_two_shards_at_once_into_one_folder_lose_no_record(zoo, data_dir, export, tmp_path):
    out = tmp_path / "concurrent"
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]), MPLBACKEND="Agg", OMP_NUM_THREADS="1")
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "timm_posgeom.cli",
                "zoo",
                VIT,
                ROPE,
                export,
                "--data",
                str(data_dir),
                "--out",
                str(out),
                "--shard",
                f"{k}/2",
                *COMMON,
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for k in (0, 1)
    ]
    logs = [proc.communicate(timeout=600)[0] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], logs
    for name in (VIT, ROPE, export):
        assert ZooModel.read(out / "models" / f"{safe_name(name)}.json").status == "ok"
    assert main(["zoo", "--out", str(out), "--merge"]) == 0
    assert _table(out) == _table(zoo)


def test_a_model_locked_by_a_live_shard_is_left_to_it(tmp_path, data_dir, export, capsys):
    from timm_posgeom.app.rundir import RunLock

    out = tmp_path / "zoo"
    folder = out / "locks" / safe_name(export)
    folder.mkdir(parents=True)
    held = RunLock(folder)
    held.acquire()  # this live process "measures" it
    try:
        assert main(["zoo", export, "--data", str(data_dir), "--out", str(out), *COMMON]) == 0
    finally:
        held.release()
    said = capsys.readouterr()
    # never counted as measured or kept: the holder is named, with how to clear its lock if it is gone
    assert f"{export}: not measured here: " in said.out and f"in use by process {os.getpid()}" in said.out
    assert "(0 measured now, 0 kept)" in said.out and "1 model(s) not measured here, locked by another" in said.err
    assert not (out / "models" / f"{safe_name(export)}.json").exists()


def test_images_decoded_once_give_the_same_batches_and_scores_bit_for_bit(data_dir):
    from timm_posgeom.data import relabel_by_name
    from timm_posgeom.data.eval_data import DecodedImages

    data = load_split(data_dir, "validation", subset=N)
    shared = DecodedImages(data)
    model = timm.create_model(VIT, num_classes=10, img_size=IMG).eval()
    for resize in ("paper", "timm"):
        direct = torch.cat([x for x, _ in eval_loader(model, data, resize=resize, num_workers=0)])
        # workers: the resized images were made in this process, before the workers forked
        once = torch.cat([x for x, _ in eval_loader(model, shared, resize=resize, num_workers=2)])
        assert torch.equal(direct, once)
    assert len(shared._resized) == 2 and shared.keep == 2  # one entry per input configuration
    a = fragility(model, data, num_workers=0, progress=False)
    b = fragility(model, shared, num_workers=2, progress=False)
    assert a.accuracy == b.accuracy and a.clean_accuracy == b.clean_accuracy
    mapped = relabel_by_name(shared, list(reversed(shared.classes)))  # a relabelling reads the shared images
    direct_mapped = relabel_by_name(data, list(reversed(data.classes)))
    assert [mapped[i][1] for i in range(N)] == [direct_mapped[i][1] for i in range(N)]
    assert (
        fragility(model, mapped, num_workers=0, progress=False).accuracy
        == fragility(model, direct_mapped, num_workers=0, progress=False).accuracy
    )


# --------------------------------------------------------------------------------------------
# parts
# --------------------------------------------------------------------------------------------
class _Split:
    def __init__(self, classes):
        self.classes = classes
        self.labels = list(range(len(classes)))


def test_labels_match_imagenet_heads_by_wordnet_id_or_unique_name_only():
    model = timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=16, depth=1)  # a 1000-class head
    assert map_by_name(model, load_or_stub(["n01440764", "goldfish"]))[0].labels == [0, 1]
    matched, why = map_by_name(model, load_or_stub(["tench", "crane"]))  # two ImageNet classes are "crane"
    assert matched is None and "crane (ambiguous)" in why
    matched, why = map_by_name(model, load_or_stub(["cat", "dog"]))
    assert matched is None and "neither WordNet ids nor names" in why
    ten = timm.create_model("vit_tiny_patch16_224", img_size=32, depth=1, num_classes=10)
    matched, why = map_by_name(ten, load_or_stub([str(i) for i in range(10)]))
    assert matched is None and "no recorded class names and are not an ImageNet head" in why


def load_or_stub(classes):
    """A split of one image per class (labels 0..n-1), with those class names."""
    from PIL import Image

    from timm_posgeom.data import ImageSplit

    items = [Image.new("RGB", (8, 8)) for _ in classes]
    return ImageSplit(items, classes, list(range(len(classes))), "stub", lambda ds, i: (ds[i], i))


def test_models_file_names_and_filter(tmp_path):
    path = tmp_path / "models.txt"
    path.write_text("# header\nvit_tiny_patch16_224  # inline\n\n  local-dir:/x/y \n")
    assert read_models_file(path) == ["vit_tiny_patch16_224", "local-dir:/x/y"]
    assert safe_name("vit_tiny_patch16_224.augreg_in21k") == "vit_tiny_patch16_224.augreg_in21k"
    assert safe_name("local-dir:/a/b") != safe_name("local-dir:/a_b") and "/" not in safe_name("hf-hub:o/n")
    assert filter_models("vit_tiny_patch16_22*", "off") == ["vit_tiny_patch16_224"]
    assert all("." in n for n in filter_models("vit_tiny_patch16_22*", "auto"))  # name.tag, as timm lists weights
    assert relative_depth(1) == [0.0] and relative_depth(3) == [0.0, 0.5, 1.0]
    assert layer_summary([0.1, None, 0.3, 0.2]) == dict(
        first=0.1, last=0.2, peak=0.3, peak_layer=2, mean=pytest.approx(0.2)
    )


def test_no_models_is_one_line_and_writes_nothing(tmp_path, data_dir, capsys):
    with pytest.raises(SystemExit) as e:
        main(["zoo", "--data", str(data_dir), "--out", str(tmp_path / "zoo")])
    assert e.value.code == 2 and "no models to measure" in capsys.readouterr().err
    assert not (tmp_path / "zoo").exists()


def test_imagenet_c_flag_adds_its_jpeg_and_blur_at_every_severity(tmp_path, data_dir, monkeypatch):
    """`posgeom zoo --imagenet-c-jpeg-blur` measures the paper's shifts and ImageNet-C's JPEG and blur at severities 1-5."""
    import timm_posgeom.app.zoo as zoo_mod

    seen = {}

    def fake_run_zoo(names, config, out, **kwargs):
        seen["shifts"] = config.shifts
        raise KeyboardInterrupt  # stop before measuring anything

    monkeypatch.setattr(zoo_mod, "run_zoo", fake_run_zoo)
    assert (
        main(
            [
                "zoo",
                "vit_tiny_patch16_224",
                "--imagenet-c-jpeg-blur",
                "--data",
                str(data_dir),
                "--out",
                str(tmp_path / "zoo"),
            ]
        )
        == 130
    )
    assert seen["shifts"] == tuple(PAPER_SHIFTS) + tuple(
        f"imagenet-c:{n}:{s}" for n in ("jpeg_compression", "gaussian_blur") for s in range(1, 6)
    )


def test_a_model_whose_weights_changed_under_its_name_is_not_kept(tmp_path, data_dir, capsys):
    """A new export in the same local-dir: was skipped as 'measured before' and its old numbers kept. It is
    now refused with one line, and measured again with --allow-changes."""
    from timm_posgeom.app.hub import export_for_hub

    classes = load_split(data_dir, "validation").classes
    folder = tmp_path / "run" / "export"

    def export(seed):
        torch.manual_seed(seed)
        model = timm.create_model("posgeom_vit_micro_patch8_64_ape", num_classes=10, img_size=IMG, depth=2)
        export_for_hub(
            model,
            folder,
            dict(img_size=IMG, num_classes=10, depth=2),
            dict(input_size=(3, IMG, IMG), num_classes=10, label_names=classes),
        )

    export(1)
    name, out = f"local-dir:{folder}", tmp_path / "zoo"
    argv = ["zoo", name, "--data", str(data_dir), "--out", str(out), *COMMON]
    assert main(argv) == 0
    first = ZooModel.read(next((out / "models").glob("*.json")))
    assert first.weights_key.startswith(f"local-dir:{folder.resolve()}|")
    assert main(argv) == 0 and "(0 measured now, 1 kept)" in capsys.readouterr().out  # unchanged: kept
    time.sleep(0.01)
    export(2)  # other weights, same name
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1 and "weights" in err and "--allow-changes" in err
    assert main(argv + ["--allow-changes"]) == 0 and "(1 measured now, 0 kept)" in capsys.readouterr().out
    second = ZooModel.read(next((out / "models").glob("*.json")))
    assert second.weights_key != first.weights_key and second.rpi_ssdc != first.rpi_ssdc
    assert len(list((out / "models").glob("*.replaced-1"))) == 1


def test_weights_key_names_the_hub_revision_in_the_local_cache(tmp_path, monkeypatch):
    import huggingface_hub.constants

    from timm_posgeom.app.zoo import weights_key

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    assert weights_key("hf-hub:org/model", "loaded") is None  # not cached yet
    ref = tmp_path / "models--org--model" / "refs" / "main"
    ref.parent.mkdir(parents=True)
    ref.write_text("abc123\n")
    assert weights_key("hf-hub:org/model", "loaded") == "hub:org/model@abc123"
    ref.write_text("def456")  # a new revision pulled into the cache
    assert weights_key("hf-hub:org/model", "loaded") == "hub:org/model@def456"
    (tmp_path / "models--timm--vit_tiny_patch16_224.augreg_in21k_ft_in1k" / "refs").mkdir(parents=True)
    (tmp_path / "models--timm--vit_tiny_patch16_224.augreg_in21k_ft_in1k" / "refs" / "main").write_text("c0ffee")
    assert weights_key("vit_tiny_patch16_224.augreg_in21k_ft_in1k", "pretrained") == (
        "hub:timm/vit_tiny_patch16_224.augreg_in21k_ft_in1k@c0ffee"
    )
    assert weights_key("vit_tiny_patch16_224", "random-init") == "random-init"


def test_old_names_still_work_for_one_release_with_a_warning(tmp_path, capsys):
    with pytest.warns(DeprecationWarning, match="use max_images=N"):
        config = ZooConfig(data="synthetic", images=16)
    assert config.max_images == config.probe_images == 16
    assert (
        ZooConfig(data="synthetic").probe_count() == 1000
        and ZooConfig(data="synthetic", max_images=8).probe_count() == 8
    )
    from timm_posgeom.app import zoo

    with pytest.warns(DeprecationWarning, match="timm_posgeom.data.labels.map_by_name"):
        assert zoo.match_labels(torch.nn.Identity(), None) == (None, "the model has no classifier head")
    with pytest.raises(SystemExit):  # --images N: a warning, then the zoo as with --max-images N (here: no models)
        main(["zoo", "--data", "synthetic", "--out", str(tmp_path / "zoo"), "--images", "4"])
    err = capsys.readouterr().err
    assert "--images is deprecated" in err and "use --max-images N" in err and "no models to measure" in err
    with pytest.raises(SystemExit):  # --imagenet-c is fragility's alone: here a pointer to --imagenet-c-jpeg-blur
        main(["zoo", "--data", "synthetic", "--out", str(tmp_path / "zoo"), "--imagenet-c"])
    err = capsys.readouterr().err
    assert "--imagenet-c-jpeg-blur" in err and "no models to measure" not in err
