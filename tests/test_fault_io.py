"""Bad-input suite, class "output and input failures" (issue 40, item 4): every failure to write or read is one
line with exit 2, or the right number with what was left out said in one line; never a traceback.

Generators: paths of the wrong kind (a file where a folder is expected and the reverse), corrupt YAML and
pickles, files a walk cannot read (parquet rows of garbage bytes, images over PIL's limit, GIFs and text files,
symbolic link loops), a tracker project outside ``--out``; and, in a process of its own, a full disk (a file
size limit, RLIMIT_FSIZE: a write beyond it fails with EFBIG; and a 64 KiB tmpfs where one can be mounted:
ENOSPC) and a read-only folder (a read-only tmpfs, or a folder without write permission for a user other than
root)."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess

import numpy as np
import pytest
import torch
from faultsuite import cli, cli_process, judge, refused, right
from PIL import Image

MODEL = "posgeom_vit_micro_patch8_64_nope"
APE = "posgeom_vit_micro_patch8_64_ape"
FAST = ["--img-size", "32", "--num-workers", "0", "--no-progress"]
CLASSES = ("ant", "bee")


def _pixels(i: int) -> np.ndarray:
    y, x = np.mgrid[0:16, 0:16]
    return np.stack(
        [(x * 13 + i * 40) % 256, (y * 11 + x * 3 + i * 70) % 256, ((x - y) * 7 + i * 90) % 256], -1
    ).astype(np.uint8)


def _folder(root, n: int = 2):
    for c, cls in enumerate(CLASSES):
        (root / "validation" / cls).mkdir(parents=True, exist_ok=True)
        for j in range(n):
            Image.fromarray(_pixels(2 * c + j)).save(root / "validation" / cls / f"{j}.png")
    return root


def _ssdc(out) -> list:
    return json.loads((out / "ssdc.json").read_text())["per_layer"]


def _probe(data, out, *extra):
    return cli(["probe", MODEL, "--data", data, *FAST, "--out", out, "--reduction", "mean_map", *extra])


# --------------------------------------------------------------------------------------------
# paths of the wrong kind, corrupt YAML and pickles: one line each
# --------------------------------------------------------------------------------------------
def _refusals(t):
    """(id, argv, phrase) of inputs and outputs that cannot be used, made under ``t``."""
    data, afile, adir = _folder(t / "data"), t / "afile", t / "adir"
    afile.write_text("x")
    adir.mkdir()
    (t / "bad.yaml").write_text("lr: [1,\n  epochs: {")
    (t / "list.yaml").write_text("- a\n- b\n")
    (t / "bytes.yaml").write_bytes(b"\xff\xfe\x00garbage\x80")
    (t / "bad.json").write_text("{not json")
    torch.save([1, 2, 3], t / "list.pt")
    (t / "zip.pt").write_bytes(b"PK\x03\x04" + os.urandom(200))
    probe = ["probe", MODEL, "--data", data, *FAST]
    imc = [
        "fragility",
        MODEL,
        "--data",
        data,
        *FAST,
        "--imagenet-c",
        "gaussian_noise",
        "--severities",
        "1",
        "--num-classes",
        "2",
        "--labels",
        "as-is",
        "--out",
        t / "o",
    ]
    train = ["train", "--set", "max_steps=1", "--no-progress"]
    return [
        ("probe --out FILE", [*probe, "--out", afile], "afile"),
        ("probe --out FILE/sub", [*probe, "--out", afile / "sub"], "is a file"),
        ("probe --data FILE", ["probe", MODEL, "--data", afile, *FAST, "--out", t / "o"], "afile"),
        ("probe --checkpoint DIR", [*probe, "--out", t / "o", "--checkpoint", adir], "adir"),
        ("probe --checkpoint a pickled list", [*probe, "--out", t / "o", "--checkpoint", t / "list.pt"], "list.pt"),
        ("probe --checkpoint a zip of garbage", [*probe, "--out", t / "o", "--checkpoint", t / "zip.pt"], "zip.pt"),
        ("fragility --reference DIR", [*imc, "--reference", adir], "adir"),
        ("fragility --reference corrupt JSON", [*imc, "--reference", t / "bad.json"], "bad.json"),
        ("fragility --imagenet-c-root FILE", [*imc, "--imagenet-c-root", afile], "afile"),
        (
            "fragility --imagenet-c-class-folders DIR",
            [*imc, "--imagenet-c-root", adir, "--imagenet-c-class-folders", adir],
            "adir",
        ),
        ("zoo --models-file DIR", ["zoo", "--models-file", adir, "--data", data, "--out", t / "z"], "adir"),
        ("zoo --out FILE", ["zoo", MODEL, "--data", data, "--out", afile, "--no-progress"], "afile"),
        ("zoo --merge --out FILE", ["zoo", "--merge", "--out", afile], "afile"),
        ("train --recipe DIR", ["train", "--recipe", adir, "--out", t / "t"], "adir"),
        ("train --recipe corrupt YAML", ["train", "--recipe", t / "bad.yaml", "--out", t / "t"], "not valid YAML"),
        ("train --recipe a YAML list", ["train", "--recipe", t / "list.yaml", "--out", t / "t"], "mapping"),
        ("train --recipe bytes", ["train", "--recipe", t / "bytes.yaml", "--out", t / "t"], "bytes.yaml"),
        ("train --set corrupt YAML", ["train", "--set", "model_kwargs={a: [", "--out", t / "t"], "model_kwargs"),
        ("train --set lr=[1,", ["train", "--set", "lr=[1,", "--out", t / "t"], "lr"),
        ("train --out FILE", [*train, "--out", afile], "afile"),
        ("train --out FILE/sub", [*train, "--out", afile / "sub"], "afile"),
        (
            "train tracker project outside --out",
            [*train, "--log-with", "tensorboard", "--set", "tracker_project=../elsewhere", "--out", t / "t"],
            "tracker_project",
        ),
        (
            "train tracker project absolute",
            [*train, "--log-with", "tensorboard", "--set", f"tracker_project={t / 'abs'}", "--out", t / "t"],
            "tracker_project",
        ),
        ("study --out FILE", ["study", "--out", afile], "afile"),
        ("study --set corrupt YAML", ["study", "--set", "lr=[1,", "--dry-run", "--out", t / "s"], "lr"),
        ("report FILE", ["report", afile], "afile"),
        ("card FILE", ["card", afile], "afile"),
        ("card --out DIR", ["card", adir, "--out", adir], "adir"),
        ("push FILE", ["push", afile, "--repo-id", "a/b", "--dry-run"], "afile"),
    ]


def _ids() -> list[str]:
    """The cases' ids (the generator run once in a temporary folder, at collection)."""
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        return [c[0] for c in _refusals(Path(d))]


@pytest.fixture(scope="module")
def refusal_cases(tmp_path_factory):
    return {c[0]: c[1:] for c in _refusals(tmp_path_factory.mktemp("io"))}


@pytest.mark.parametrize("case", _ids())
def test_an_input_or_output_that_cannot_be_used_is_one_line(refusal_cases, case, tmp_path, one_thread):
    argv, phrase = refusal_cases[case]
    run = cli(argv)
    judge("io", refused(run, phrase), "refused", run.err or run.trace)
    assert not (tmp_path.parent / "abs").exists() and not (tmp_path.parent / "elsewhere").exists()


# --------------------------------------------------------------------------------------------
# files a walk cannot read: skipped, counted and named, or refused; the numbers of the twin without them
# --------------------------------------------------------------------------------------------
def _parquet(root, kind: str, garbage_row: int = 2):
    """A parquet set of 4 images, row ``garbage_row`` garbage bytes: as an Image feature ({bytes, path}) or as a
    column of raw bytes (what a hand-made parquet file holds)."""
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    blobs = []
    for i in range(4):
        buf = io.BytesIO()
        Image.fromarray(_pixels(i)).save(buf, format="PNG")
        blobs.append(buf.getvalue())
    blobs[garbage_row] = b"\x00garbage\xff" * 5
    (root / "data").mkdir(parents=True)
    labels = pa.array([0, 1, 0, 1], pa.int64())
    if kind == "struct":
        column = pa.array(
            [{"bytes": b, "path": None} for b in blobs], type=pa.struct([("bytes", pa.binary()), ("path", pa.string())])
        )
        features = datasets.Features(image=datasets.Image(), label=datasets.ClassLabel(names=list(CLASSES)))
        table = pa.table({"image": column, "label": labels}).replace_schema_metadata(
            {"huggingface": json.dumps({"info": {"features": features.to_dict()}})}
        )
    else:
        table = pa.table({"image": pa.array(blobs, pa.binary()), "label": labels})
    pq.write_table(table, root / "data" / "validation-00000-of-00001.parquet")
    return root


def _twin_without(root, rows: list[int]):
    """An ImageFolder of the parquet set's good rows (row i: class i % 2), as the probe must read them."""
    for i in range(4):
        if i not in rows:
            (root / "validation" / CLASSES[i % 2]).mkdir(parents=True, exist_ok=True)
            Image.fromarray(_pixels(i)).save(root / "validation" / CLASSES[i % 2] / f"{i}.png")
    return root


@pytest.mark.parametrize("kind", ["struct", "binary"])
@pytest.mark.parametrize("policy", ["error", "skip"])
def test_a_parquet_row_of_garbage_bytes_is_named_or_skipped(tmp_path, kind, policy, one_thread):
    """A column of raw bytes gave an AttributeError traceback, under --bad-images skip too."""
    data = _parquet(tmp_path / "pq", kind)
    run = _probe(data, tmp_path / "out", "--bad-images", policy)
    if policy == "error":
        judge("io", refused(run, "cannot decode row 2"), "refused", run.err or run.trace)
        return
    twin = _probe(_twin_without(tmp_path / "twin", [2]), tmp_path / "out-twin")
    ok = run.code == 0 and "left out 1 image(s)" in run.err and _ssdc(tmp_path / "out") == _ssdc(tmp_path / "out-twin")
    judge("io", right(run, ok and twin.code == 0), "right", run.err or run.trace)


@pytest.mark.parametrize("policy", ["error", "skip"])
def test_an_image_over_pils_size_limit_is_named_or_skipped(tmp_path, policy, monkeypatch, one_thread):
    """PIL's DecompressionBombError (over twice MAX_IMAGE_PIXELS) escaped as a traceback."""
    data = _folder(tmp_path / "d")
    Image.fromarray(np.zeros((64, 64, 3), np.uint8)).save(data / "validation" / "ant" / "huge.png")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # 64 x 64 = 4,096 > 2 x 1,000: refused by PIL
    run = _probe(data, tmp_path / "out", "--bad-images", policy)
    if policy == "error":
        judge("io", refused(run, "over PIL's limit"), "refused", run.err or run.trace)
        return
    twin = _probe(_folder(tmp_path / "twin"), tmp_path / "out-twin")
    ok = "left out 1 image(s)" in run.err and run.code == 0 and _ssdc(tmp_path / "out") == _ssdc(tmp_path / "out-twin")
    judge("io", right(run, ok and twin.code == 0), "right", run.err or run.trace)


def _left_out(kind: str, root):
    """A tree with what a walk must leave out (and name), and the names it must give."""
    data = _folder(root)
    ant = data / "validation" / "ant"
    if kind == "gif":
        Image.fromarray(_pixels(9)).save(ant / "extra.gif")
        return data, ["extra.gif"]
    if kind == "text":
        (ant / "notes.txt").write_text("not an image")
        (ant / ".DS_Store").write_bytes(b"\x00\x01")
        return data, ["notes.txt", ".DS_Store"]
    if kind == "loop":  # a link back to the split folder: followed, it read every class again under 'ant'
        os.symlink("..", ant / "loop")
        return data, ["loop (a symlink loop)"]
    if kind == "other class":  # a link into another class: its images would count as 'ant'
        os.symlink("../bee", ant / "bees")
        return data, ["bees (a link into another class)"]
    if kind == "self loop":
        os.symlink(".", ant / "again")
        return data, ["again (a symlink loop)"]
    raise ValueError(kind)


@pytest.mark.parametrize("kind", ["gif", "text", "loop", "other class", "self loop"])
def test_a_walk_names_what_it_leaves_out_in_one_line_and_reads_the_rest_once(tmp_path, kind, one_thread):
    data, names = _left_out(kind, tmp_path / "d")
    run = _probe(data, tmp_path / "out")
    _probe(_folder(tmp_path / "twin"), tmp_path / "out-twin")
    said = [line for line in run.lines if "warning: left out" in line]
    ok = (
        run.code == 0
        and len(said) == 1
        and all(n in said[0] for n in names)
        and _ssdc(tmp_path / "out") == _ssdc(tmp_path / "out-twin")
        and json.loads((tmp_path / "out" / "ssdc.json").read_text())["settings"]["n_images"] == 4
    )
    judge("io", right(run, ok), "right", run.err or run.trace)


def test_a_damaged_image_cache_is_made_again(tmp_path, monkeypatch, one_thread):
    """A cache file cut by a full disk (or written by hand): a torch.load traceback; now decoded again, said."""
    from timm_posgeom.data import cache_uint8, load_split

    monkeypatch.setenv("TIMM_POSGEOM_CACHE", str(tmp_path / "cache"))
    split = load_split(_folder(tmp_path / "d"), "validation")
    first = cache_uint8(split, 16, cache_dir=tmp_path / "cache")
    (cached,) = (tmp_path / "cache").glob("*.pt")
    cached.write_bytes(cached.read_bytes()[:100])
    with pytest.warns(RuntimeWarning, match="cannot be read"):
        again = cache_uint8(split, 16, cache_dir=tmp_path / "cache")
    ok = torch.equal(again.images, first.images)
    judge("io", "right" if ok else "silent_wrong", "right")


# --------------------------------------------------------------------------------------------
# a full disk and a read-only folder, in a process of their own
# --------------------------------------------------------------------------------------------
def _mountable() -> bool:
    """Whether this machine lets us mount a tmpfs in a private mount namespace (root, or user namespaces)."""
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        [
            "unshare",
            "-m",
            "sh",
            "-c",
            "mount -t tmpfs -o size=64k tmpfs /mnt 2>/dev/null || mount -t tmpfs -o size=64k tmpfs /tmp",
        ],
        capture_output=True,
    )
    return probe.returncode == 0


def _in_tmpfs(mount, options: str) -> list[str]:
    """The prefix that runs a command with a fresh tmpfs (``options``: size=..., ro) mounted at ``mount``."""
    return ["unshare", "-m", "sh", "-c", f'mount -t tmpfs -o {options} tmpfs "{mount}" && exec "$0" "$@"']


FULL = {
    "probe": lambda d: ["probe", MODEL, "--data", d, *FAST],
    "zoo": lambda d: [
        "zoo",
        MODEL,
        "--data",
        d,
        *FAST,
        "--no-pretrained",
        "--rpi-permutations",
        "2",
        "--extras",
        "none",
    ],
    "train": lambda d: [
        "train",
        "--set",
        "max_steps=2",
        "--set",
        "max_train_images=32",
        "--set",
        "max_val_images=6",
        "--set",
        "model_kwargs.depth=1",
        "--set",
        "img_size=32",
        "--set",
        "batch_size=16",
        "--set",
        "workers=0",
        "--set",
        "checkpoint_every=1",
        "--no-progress",
    ],
}


@pytest.mark.slow
@pytest.mark.parametrize("command", list(FULL))
def test_a_full_disk_is_one_line(tmp_path, command):
    """A write limit (RLIMIT_FSIZE: EFBIG, as ENOSPC on a full disk): the first file that does not fit is named;
    training's checkpoints (written by safetensors) raised a SafetensorError traceback."""
    data = _folder(tmp_path / "d")
    run = cli_process([*FULL[command](data), "--out", tmp_path / "out"], file_limit=3000)
    judge("io", refused(run, "File too large"), "refused", run.err)
    assert not list((tmp_path / "out").rglob(".tmp*")), "a temporary file left behind"


@pytest.mark.slow
@pytest.mark.skipif(not _mountable(), reason="no tmpfs can be mounted here (the RLIMIT_FSIZE case stands for it)")
@pytest.mark.parametrize("options,phrase", [("size=64k", "No space left on device"), ("ro", "Read-only file system")])
def test_a_full_or_read_only_file_system_is_one_line(tmp_path, options, phrase):
    data = _folder(tmp_path / "d")
    mount = tmp_path / "mnt"
    mount.mkdir()
    run = cli_process(["probe", APE, "--data", data, *FAST, "--out", mount / "out"], wrap=_in_tmpfs(mount, options))
    judge("io", refused(run, phrase), "refused", run.err)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a folder without write permission")
def test_a_folder_without_write_permission_is_one_line(tmp_path, one_thread):
    data = _folder(tmp_path / "d")
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        run = _probe(data, locked / "out")
    finally:
        locked.chmod(0o700)
    judge("io", refused(run, "Permission denied"), "refused", run.err or run.trace)
