"""Faults and mismatches a user meets: each refused with one clear line, never a silent wrong number."""

from __future__ import annotations

import json

import pytest
import timm
from PIL import Image

from timm_posgeom.app.hub import export_for_hub
from timm_posgeom.cli import main
from timm_posgeom.robustness import fragility

NAMES = ["tench", "springer", "cassette", "chainsaw", "church", "horn", "truck", "pump", "ball", "parachute"]


def _export(tmp_path, names=NAMES):
    model = timm.create_model("posgeom_vit_micro_patch8_64_nope", num_classes=len(names), img_size=32, depth=1).eval()
    cfg = dict(input_size=(3, 32, 32), num_classes=len(names), label_names=list(names))
    return export_for_hub(model, tmp_path / "export", dict(img_size=32, num_classes=len(names), depth=1), cfg)


def _folder(root, classes, per_class=2):
    for i, cls in enumerate(classes):
        (root / "validation" / cls).mkdir(parents=True)
        for j in range(per_class):
            Image.new("RGB", (40, 40), color=(20 * i, 10 * j, 90)).save(root / "validation" / cls / f"{j}.png")
    return root


def test_fragility_refuses_data_with_other_classes(tmp_path, capsys):
    """Issue 14, item 6: a 10-class model scored on a 3-class folder gave accuracy 0.056, FS 0.000, exit 0."""
    export = _export(tmp_path)
    data = _folder(tmp_path / "three", ["ball", "church", "tench"])
    argv = [
        "fragility",
        f"local-dir:{export}",
        "--data",
        str(data),
        "--shift",
        "jpeg:50",
        "--num-workers",
        "0",
        "--no-progress",
        "--out",
        str(tmp_path / "out"),
    ]
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and "the model has 10 classes but the data has 3" in err
    assert not (tmp_path / "out").exists()
    # mapped by name, the same images are scored against the model's own class indices
    assert main(argv + ["--labels", "by-name"]) == 0
    written = json.loads((tmp_path / "out" / "fragility.json").read_text())
    assert written["num_images"] == 6
    with pytest.raises(SystemExit):
        main(
            argv[:3]
            + [str(_folder(tmp_path / "other", ["ball", "zebra", "tench"]))]
            + argv[4:]
            + ["--labels", "by-name"]
        )
    assert "lack 1 of the data's (zebra)" in capsys.readouterr().err


def test_same_classes_in_another_order_are_refused_unless_mapped(tmp_path, capsys):
    export = _export(tmp_path, names=["dog", "cat"])
    data = _folder(tmp_path / "d", ["dog", "cat"])  # ImageFolder sorts: ["cat", "dog"], the other order
    argv = [
        "fragility",
        f"local-dir:{export}",
        "--data",
        str(data),
        "--shift",
        "jpeg:50",
        "--num-workers",
        "0",
        "--no-progress",
        "--out",
        str(tmp_path / "out"),
    ]
    with pytest.raises(SystemExit):
        main(argv)
    assert "--labels by-name maps them" in capsys.readouterr().err
    assert main(argv + ["--labels", "by-name"]) == 0


def test_fragility_refuses_unlabelled_images():
    """Label -1 (Hugging Face's unlabelled test rows) never matches a prediction: it was counted as wrong
    (3 right + 3 unlabelled gave clean accuracy 0.5 where it is 1.0)."""
    model = timm.create_model("posgeom_vit_micro_patch8_64_nope", num_classes=3, img_size=32, depth=1).eval()
    data = [(Image.new("RGB", (32, 32)), 0), (Image.new("RGB", (32, 32)), -1)]
    with pytest.raises(ValueError, match="label -1: the data has unlabelled images"):
        fragility(model, data, shifts=("jpeg:50",), num_workers=0, progress=False)


def test_library_fragility_refuses_labels_beyond_the_model_outputs():
    model = timm.create_model("posgeom_vit_micro_patch8_64_nope", num_classes=3, img_size=32, depth=1).eval()
    data = [(Image.new("RGB", (32, 32)), 7)]
    with pytest.raises(ValueError, match="label 7 is out of range for a model with 3 outputs"):
        fragility(model, data, shifts=("jpeg:50",), num_workers=0, progress=False)


# --------------------------------------------------------------------------------------------
# run directories (issue 14, item 4)
# --------------------------------------------------------------------------------------------
TINY = [
    "model_kwargs.embed_dim=32",
    "model_kwargs.depth=1",
    "model_kwargs.num_heads=2",
    "img_size=32",
    "batch_size=16",
    "workers=0",
    "max_train_images=160",
    "max_val_images=32",
    "log_every=1",
    "max_steps=6",
    "checkpoint_every=2",
    "keep_checkpoints=3",
]


def _tiny(*overrides):
    from timm_posgeom.app.recipe import load_recipe

    return load_recipe(None, TINY + list(overrides))


def test_a_second_training_into_a_locked_run_is_refused_and_a_dead_holder_is_taken_over(tmp_path, capsys):
    from conftest import lock_holder

    from timm_posgeom.app.train import RunDirError, train

    out = tmp_path / "run"
    out.mkdir()
    sleeper = lock_holder(out)  # another process training into it
    try:
        with pytest.raises(RunDirError, match=f"in use by process {sleeper.pid}"):
            train(_tiny(), out, progress=False)
        assert not (out / "metrics.jsonl").exists()
    finally:
        sleeper.kill()
        sleeper.wait()
    summary = train(_tiny(), out, progress=False)  # the holder is dead now: taken over, with a message
    assert summary.steps == 6 and "taking over the lock" in capsys.readouterr().out
    assert not (out / ".lock").exists() and not (out / ".holder.json").exists()  # released at the end


def test_resume_with_another_recipe_is_refused_unless_allowed(tmp_path, capsys):
    from timm_posgeom.app.train import RunDirError, train

    out = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):  # stop after the first checkpoint, as a Ctrl-C would
        _interrupt_after_checkpoint(lambda: train(_tiny(), out, progress=False))
    with pytest.raises(RunDirError, match=r"another recipe \(lr: 0.001 -> 0.01\).*--allow-changes"):
        train(_tiny("lr=0.01"), out, resume=True, progress=False)
    with pytest.raises(
        RunDirError, match="model: 'posgeom_vit_micro_patch8_64_ape' -> 'posgeom_vit_micro_patch8_64_rope'"
    ):
        train(_tiny("model=posgeom_vit_micro_patch8_64_rope"), out, resume=True, progress=False)
    summary = train(_tiny("lr=0.01", "log_every=3"), out, resume=True, progress=False, allow_changes=True)
    assert summary.steps == 6 and summary.resumed_from == "step_00000002"
    change = json.loads((out / "recipe_changes.jsonl").read_text().splitlines()[0])
    assert change == {"step": 2, "changes": {"lr": [0.001, 0.01]}}  # log_every does not change results


def _interrupt_after_checkpoint(run):
    from timm_posgeom.app.train import loop

    real = loop.save_checkpoint

    def save_then_stop(*args, **kwargs):
        real(*args, **kwargs)
        raise KeyboardInterrupt

    loop.save_checkpoint = save_then_stop
    try:
        run()
    finally:
        loop.save_checkpoint = real


def test_a_finished_run_is_never_retrained_over(tmp_path):
    import shutil

    from timm_posgeom.app.train import RunDirError, train

    out = tmp_path / "run"
    train(_tiny(), out, progress=False)
    exported = (out / "export" / "model.safetensors").read_bytes()
    shutil.rmtree(out / "checkpoints")
    with pytest.raises(FileExistsError, match="a finished run"):
        train(_tiny(), out, progress=False)
    with pytest.raises(RunDirError, match="finished run whose checkpoints were removed"):
        train(_tiny(), out, resume=True, progress=False)
    assert (out / "export" / "model.safetensors").read_bytes() == exported


def test_resume_falls_back_to_the_newest_intact_checkpoint(tmp_path, capsys):
    from timm_posgeom.app.train import train

    full = train(_tiny(), tmp_path / "full", progress=False)
    out = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        _interrupt_after_checkpoint(lambda: train(_tiny("checkpoint_every=2"), out, progress=False))
    with pytest.raises(KeyboardInterrupt):  # a second interrupted invocation: checkpoints at 2 and 4
        _interrupt_after_checkpoint(lambda: train(_tiny(), out, resume=True, progress=False))
    newest = sorted((out / "checkpoints").glob("step_*"))[-1]
    assert newest.name == "step_00000004"
    for f in newest.iterdir():  # truncate every file of the newest checkpoint
        if f.is_file():
            f.write_bytes(f.read_bytes()[: max(1, f.stat().st_size // 3)])
    summary = train(_tiny(), out, resume=True, progress=False)
    assert "checkpoint step_00000004 is damaged" in capsys.readouterr().out
    assert summary.resumed_from == "step_00000002" and summary.steps == 6
    assert summary.val_top1 == pytest.approx(full.val_top1)


# --------------------------------------------------------------------------------------------
# damaged images (issue 14, item 5)
# --------------------------------------------------------------------------------------------
def _folder_with_a_truncated_jpeg(root):
    for split in ("train", "validation"):
        for i, cls in enumerate(("cat", "dog")):
            (root / split / cls).mkdir(parents=True)
            for j in range(8):
                Image.new("RGB", (40, 40), color=(60 * i, 10 * j, 90)).save(root / split / cls / f"{j}.jpg", quality=90)
    bad = root / "validation" / "dog" / "3.jpg"
    bad.write_bytes(bad.read_bytes()[:200])  # truncated: the header reads, the pixels do not
    return bad


@pytest.mark.slow
def test_training_names_a_damaged_validation_image_before_the_first_epoch(tmp_path, capsys):
    def train_main(argv: list[str]) -> int:  # `posgeom train ARGV`: its exit status
        try:
            return main(["train", *argv])
        except SystemExit as e:
            return e.code

    bad = _folder_with_a_truncated_jpeg(tmp_path / "data")

    def argv(out, *extra):
        args = ["--out", str(tmp_path / out), "--no-progress", "--data", str(tmp_path / "data")]
        for item in TINY[:6] + ["batch_size=8", "max_steps=2", *extra]:
            args += ["--set", item]
        return args

    assert train_main(argv("run")) == 2
    err = capsys.readouterr().err
    assert f"cannot be decoded: {bad}" in err and "bad_images=skip" in err
    assert not (tmp_path / "run" / "checkpoints").exists()  # refused before any training step
    # with the uint8 cache, building it is the check (no second decode): still named, one line, before training
    assert train_main(argv("run3", "cache=true", "disk_cache=false", "workers=1")) == 2
    err = capsys.readouterr().err
    assert f"cannot decode {bad}" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "run3" / "checkpoints").exists()
    assert train_main(argv("run2", "bad_images=skip")) == 0
    from timm_posgeom.app.records import RunSummary

    summary = RunSummary.read(tmp_path / "run2" / "summary.json")
    assert [s.split(": ")[0] for s in summary.skipped_images] == [str(bad)] and summary.val_images == 15


@pytest.mark.parametrize("workers", ["0", "1"])
def test_probe_and_fragility_name_a_damaged_image_in_one_line(tmp_path, capsys, workers):
    bad = _folder_with_a_truncated_jpeg(tmp_path / "data")
    argv = [
        "probe",
        "posgeom_vit_micro_patch8_64_nope",
        "--data",
        str(tmp_path / "data"),
        "--img-size",
        "32",
        "--num-workers",
        workers,
        "--no-progress",
        "--out",
        str(tmp_path / "out"),
    ]
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1
    assert f"cannot decode {bad}" in err and "Traceback" not in err
    assert main(argv + ["--bad-images", "skip"]) == 0
    assert "left out 1 image(s)" in capsys.readouterr().err
    assert json.loads((tmp_path / "out" / "ssdc.json").read_text())["metadata"]["n_images"] == 15
    frag = [
        "fragility",
        "posgeom_vit_micro_patch8_64_nope",
        "--num-classes",
        "2",
        "--labels",
        "as-is",
        *argv[2:],
        "--shift",
        "jpeg:50",
    ]
    with pytest.raises(SystemExit):
        main(frag)
    err = capsys.readouterr().err
    assert f"cannot decode {bad}" in err and len(err.strip().splitlines()) == 1
    assert main(frag + ["--bad-images", "skip"]) == 0
    assert json.loads((tmp_path / "out" / "fragility.json").read_text())["num_images"] == 15


# --------------------------------------------------------------------------------------------
# one line, exit 2 (issue 14, item 7)
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "argv,message",
    [
        (["probe", "vit_smal_patch16_224", "--data", "synthetic"], "did you mean vit_small_patch16_224"),
        (
            ["probe", "posgeom_vit_micro_patch8_64_ape", "--data", "synthetic", "--batch-size", "0"],
            "--batch-size must be >= 1, got 0",
        ),
        (
            ["fragility", "posgeom_vit_micro_patch8_64_ape", "--data", "synthetic", "--max-images", "0"],
            "--max-images must be >= 1",
        ),
        (["train", "--out", "{tmp}/t", "--set", "interpolation=nosuch"], "interpolation must be one of"),
        (["train", "--out", "{tmp}/t", "--set", "model=vit_tiny_patch16_22"], "did you mean vit_tiny_patch16_224"),
        (["study", "--out", "{tmp}/full"], "already holds a study; pass --resume"),
        (["study", "--preset", "imagenette-cpu", "--data", "{tmp}/nowhere", "--dry-run"], "does not exist"),
    ],
)
def test_user_errors_are_one_line_and_exit_2(tmp_path, capsys, argv, message):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "something").write_text("")
    with pytest.raises(SystemExit) as e:
        main([a.replace("{tmp}", str(tmp_path)) for a in argv])
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
