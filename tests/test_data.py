"""Tests of timm_posgeom.data and timm_posgeom.data.synthetic (small, CPU)."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
from conftest import IMAGENETTE, parquet_set
from PIL import Image

from timm_posgeom.data import (
    CachedEvalDataset,
    CachedTrainDataset,
    EpochBatchSampler,
    TransformDataset,
    cache_uint8,
    crop_flip,
    eval_config,
    find_columns,
    load_split,
    make_loader,
    resolve_source,
    train_transform,
)
from timm_posgeom.data.synthetic import SYNTHETIC_CLASSES, SyntheticShapes, pink_noise
from timm_posgeom.data.transforms import eval_transform

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


# --------------------------------------------------------------------------------------------
# synthetic set
# --------------------------------------------------------------------------------------------
def test_synthetic_is_deterministic_and_any_resolution():
    a, b = SyntheticShapes(20, img_size=40, seed=3), SyntheticShapes(20, img_size=40, seed=3)
    assert torch.equal(a.render(7), b.render(7)) and a.labels == b.labels
    assert not torch.equal(a.render(7), a.render(8))
    assert not torch.equal(a.render(0), SyntheticShapes(20, img_size=40, seed=4).render(0))
    assert not torch.equal(a.render(0), SyntheticShapes(20, img_size=40, seed=3, split="validation").render(0))
    for size in (24, 97):
        image = SyntheticShapes(2, img_size=size).render(1)
        assert image.shape == (3, size, size) and image.dtype == torch.uint8
    pil, label = a[3]
    assert pil.mode == "RGB" and pil.size == (40, 40) and label == a.labels[3]


def test_synthetic_labels_are_balanced():
    ds = SyntheticShapes(200)
    assert len(SYNTHETIC_CLASSES) == 10
    assert sorted(np.bincount(ds.labels).tolist()) == [20] * 10


def test_synthetic_layout_classes_differ_only_in_position():
    # "disc top" vs "disc bottom": the mean brightness profile of the shape moves, the contents do not
    ds = SyntheticShapes(200, img_size=32)
    rows = {0: [], 1: []}
    for i, label in enumerate(ds.labels):
        if label in rows:
            image = ds.render(i).float()
            rows[label].append((image - image.mean(dim=(1, 2), keepdim=True)).abs().mean(dim=(0, 2)))
    top, bottom = torch.stack(rows[0]).mean(0), torch.stack(rows[1]).mean(0)
    assert top[:16].sum() > top[16:].sum() and bottom[16:].sum() > bottom[:16].sum()


def test_synthetic_labels_survive_a_horizontal_flip():
    """Version 1's classes 6 and 7 were "disc left of square" and "square left of disc": the recipes' flip
    augmentation swapped their labels on half the training images. No class may depend on left vs right: in
    every class holding a disc and a square, the disc is left of the square about half the time."""
    from timm_posgeom.data.synthetic import class_layout

    g = torch.Generator().manual_seed(0)
    for label in (6, 7, 8, 9):
        left = [
            next(x for k, x, _ in shapes if k == "disc") < next(x for k, x, _ in shapes if k == "square")
            for shapes in (class_layout(label, g) for _ in range(400))
        ]
        assert 0.4 < sum(left) / len(left) < 0.6, (SYNTHETIC_CLASSES[label], sum(left) / len(left))
    # and the vertical layout that tells each pair apart is kept: 6 is above 7
    top = [max(y for _, _, y in class_layout(6, g)) for _ in range(100)]
    bottom = [min(y for _, _, y in class_layout(7, g)) for _ in range(100)]
    assert max(top) < 0.5 < min(bottom)


def test_synthetic_pixels_do_not_depend_on_the_thread_count():
    """The set is identical on every machine: its FFT rounded differently on 1 and 2 threads (one pixel of
    image 22 of these 50 was off by one); images are rendered on one thread."""
    ds = SyntheticShapes(50, img_size=64)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        two = [ds.render(i) for i in range(50)]
        torch.set_num_threads(1)
        one = [ds.render(i) for i in range(50)]
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for a, b in zip(two, one))


def test_synthetic_content_is_colour_coded():
    """Discs are warm and squares cool, so content is learnt in a few hundred steps and layout is what is left."""
    ds = SyntheticShapes(60, img_size=32)
    for i, label in enumerate(ds.labels):
        if label in (0, 2):  # one disc / one square in the upper half: its colour dominates the top's extremes
            # 2 x 2 means: the position grating (period 2) averages out, the shapes' colours stay
            image = torch.nn.functional.avg_pool2d(ds.render(i).float()[None], 2)[0].repeat_interleave(2, 1)
            red_minus_blue = (image[0] - image[2])[:16]
            assert (red_minus_blue.max() > 100) == (label == 0) and (red_minus_blue.min() < -100) == (label == 2)


def _grating_amplitude(images: torch.Tensor, pattern: torch.Tensor) -> torch.Tensor:
    """(N,) least-squares amplitude of ``pattern`` (3, H, W) in uint8 ``images`` (N, 3, H, W), in 0-255 units."""
    x = images.float() - images.float().mean(dim=(2, 3), keepdim=True)
    return (x * pattern).sum(dim=(1, 2, 3)) / (pattern * pattern).sum()


def test_synthetic_grating_marks_the_half_and_jpeg_q5_removes_it():
    """Version 3's trace of position in content: horizontal lines in the upper half, vertical in the lower,
    which a model without PE can read and which the paper's JPEG q5 shift removes (its 2 x 2 chroma
    subsampling averages a colour that alternates every pixel). Version 2 had no grating: its amplitude
    was 0 and JPEG q5 cost a PE-blind model nothing it had learnt."""
    from timm_posgeom.data.shifts import parse_shift
    from timm_posgeom.data.synthetic import GRATING_AMPLITUDE, grating

    size = 64
    pattern = grating(size)
    assert pattern.view(3, size // 2, 2, size // 2, 2).sum(dim=(2, 4)).abs().max() == 0  # every 2 x 2 block: 0
    assert torch.equal(pattern[:, 0], -pattern[:, 1]) and torch.equal(pattern[:, -1, 0::2], -pattern[:, -1, 1::2])
    upper, lower = pattern.clone(), pattern.clone()
    upper[:, size // 2 :], lower[:, : size // 2] = 0, 0
    wrong = lower.roll(-(size // 2), dims=1)  # vertical lines in the upper half, which has horizontal ones
    ds = SyntheticShapes(24, img_size=size, split="validation")
    clean = torch.stack([ds.render(i) for i in range(len(ds))])
    shifted = parse_shift("jpeg:5")(clean)
    expected = GRATING_AMPLITUDE * 255
    for part in (upper, lower):  # each half carries its grating at close to the full amplitude (shapes too)
        assert (_grating_amplitude(clean, part) > 0.8 * expected).all()
        assert (_grating_amplitude(shifted, part).abs() < 0.1 * expected).all()
    assert (_grating_amplitude(clean, wrong).abs() < 0.1 * expected).all()


def test_pink_noise_spectrum_falls():
    noise = pink_noise(64, 1, torch.Generator().manual_seed(0))[0]
    power = torch.fft.rfft2(noise).abs() ** 2
    assert power[1:4, 1:4].mean() > 20 * power[20:30, 20:30].mean()
    assert abs(noise.std().item() - 1) < 1e-4


# --------------------------------------------------------------------------------------------
# sources
# --------------------------------------------------------------------------------------------
def test_resolve_source(tmp_path):
    assert resolve_source(None) == ("synthetic", None) and resolve_source("synthetic") == ("synthetic", None)
    assert resolve_source("clane9/imagenet-100") == ("hub", "clane9/imagenet-100")
    assert resolve_source(tmp_path) == ("local", str(tmp_path))
    for missing in (tmp_path / "nope", "../no/such/dir", "./nothing", "a/b/c"):
        with pytest.raises(FileNotFoundError, match="does not exist"):
            resolve_source(missing)


def test_find_columns():
    import datasets

    features = datasets.Features({"img": datasets.Image(), "fine": datasets.ClassLabel(names=["a", "b"])})
    assert find_columns(features) == ("img", "fine")
    features = datasets.Features({"image": datasets.Image(), "label": datasets.Value("int64")})
    assert find_columns(features) == ("image", "label")
    with pytest.raises(ValueError, match="cannot find"):
        find_columns(datasets.Features({"text": datasets.Value("string")}))
    # several ClassLabel columns: the first was taken, whichever it was (CIFAR-100 lists coarse after fine)
    two = {
        "image": datasets.Image(),
        "coarse_label": datasets.ClassLabel(names=["x", "y"]),
        "fine_label": datasets.ClassLabel(names=["a", "b", "c"]),
    }
    assert find_columns(datasets.Features(two)) == ("image", "fine_label")
    with pytest.raises(ValueError, match="several label columns \\(coarse, superclass\\)"):
        find_columns(
            datasets.Features(
                {
                    "image": datasets.Image(),
                    "coarse": datasets.ClassLabel(names=["x"]),
                    "superclass": datasets.ClassLabel(names=["y"]),
                }
            )
        )


@pytest.mark.skipif(not IMAGENETTE.is_dir(), reason="../shared/data/imagenette not present")
def test_imagenette_parquet_folder():
    train = load_split(IMAGENETTE, "train", subset=16)
    val = load_split(IMAGENETTE, "val", subset=8)  # alias of validation
    assert len(train) == 16 and len(val) == 8 and train.num_classes == 10 and train.classes[0] == "tench"
    image, label = train[0]
    assert image.mode == "RGB" and 0 <= label < 10 and label == train.labels[0]
    assert train.fingerprint != val.fingerprint


def test_image_folder_tree(tmp_path):
    for split in ("train", "val"):
        for cls in ("cat", "dog"):
            (tmp_path / split / cls).mkdir(parents=True)
            for i in range(3):
                Image.new("L", (20, 12), color=40 * i).save(tmp_path / split / cls / f"{i}.png")
    train = load_split(tmp_path, "train")
    val = load_split(tmp_path, "validation", subset=4)
    assert len(train) == 6 and len(val) == 4 and train.classes == ["cat", "dog"]
    image, label = train[4]
    assert image.mode == "RGB" and label == train.classes.index(Path(train.items.samples[4][0]).parent.name)
    cache = cache_uint8(train, 16)
    assert cache.images.shape == (6, 3, 16, 16) and cache.labels.tolist() == train.labels


def _tree(root, splits: dict[str, dict[str, int]]) -> None:
    for split, classes in splits.items():
        for cls, count in classes.items():
            (root / split / cls).mkdir(parents=True)
            for i in range(count):
                Image.new("RGB", (8, 8), color=(i, 0, 0)).save(root / split / cls / f"{i}.png")


def test_image_folder_splits_share_one_class_numbering(tmp_path):
    """A class missing from the validation folder renumbered every class after it there: val's 'fox' images
    carried the index of train's 'dog' (wrong accuracies, exit 0)."""
    _tree(tmp_path, {"train": {"cat": 2, "dog": 2, "fox": 2}, "val": {"cat": 2, "fox": 2}})
    train, val = load_split(tmp_path, "train"), load_split(tmp_path, "validation")
    assert train.classes == val.classes == ["cat", "dog", "fox"]
    for split in (train, val):
        for (path, label), stored in zip(split.items.samples, split.labels):
            assert label == stored == split.classes.index(Path(path).parent.name)
    assert sorted(val.labels) == [0, 0, 2, 2]
    _tree(tmp_path / "more", {"train": {"cat": 1}, "val": {"cat": 1, "emu": 1}})  # a class only in val
    assert load_split(tmp_path / "more", "train").classes == ["cat", "emu"]


def test_first_images_of_an_image_folder_mix_the_classes(tmp_path):
    """ImageFolder lists samples by class: "the first 40" (a subset, --max-images, the study's probe images)
    were the first two classes of four; the order is now fixed and mixed, as in the parquet sets."""
    from collections import Counter

    from timm_posgeom.data.eval_data import eval_loader

    _tree(tmp_path, {"train": {c: 25 for c in "abcd"}})
    sub = load_split(tmp_path, "train", subset=40)
    assert len(sub) == 40 and len(Counter(sub.labels)) == 4 and max(Counter(sub.labels).values()) < 20
    full = load_split(tmp_path, "train")
    assert full.labels[:40] == sub.labels and load_split(tmp_path, "train").labels == full.labels  # fixed order
    model = timm.create_model("posgeom_vit_micro_patch8_64_nope", img_size=16, num_classes=4, depth=1)
    seen = Counter(int(t) for _, y in eval_loader(model, full, max_images=40, num_workers=0) for t in y)
    assert sum(seen.values()) == 40 and len(seen) == 4


def test_disk_cache_of_an_image_folder_follows_its_content(tmp_path):
    """Issue 14, item 3: the cache key covered paths and count only; overwritten images were read stale."""
    root = tmp_path / "data"
    for cls in ("cat", "dog"):
        (root / "train" / cls).mkdir(parents=True)
        for i in range(2):
            Image.new("RGB", (16, 16), color=(10, 10, 10)).save(root / "train" / cls / f"{i}.png")
    first = cache_uint8(load_split(root, "train"), 16, cache_dir=tmp_path / "cache")
    assert int(first.images.max()) == 10
    for path in (root / "train").rglob("*.png"):  # same paths, same count, new pixels
        Image.new("RGB", (16, 16), color=(200, 200, 200)).save(path)
    second = cache_uint8(load_split(root, "train"), 16, cache_dir=tmp_path / "cache")
    assert int(second.images.min()) == 200
    assert len(list((tmp_path / "cache").glob("*.pt"))) == 2


def test_synthetic_split_sizes_and_subset():
    assert len(load_split(None, "train", subset=30)) == 30
    assert len(load_split("synthetic", "validation", synthetic_size=12)) == 12


# --------------------------------------------------------------------------------------------
# transforms and the uint8 cache
# --------------------------------------------------------------------------------------------
def test_crop_flip():
    image = torch.arange(2 * 6 * 6, dtype=torch.uint8).reshape(2, 6, 6)
    assert torch.equal(crop_flip(image, pad=0, hflip=0.0), image)
    assert torch.equal(crop_flip(image, pad=0, hflip=1.0), image.flip(-1))
    g = torch.Generator().manual_seed(0)
    out = [crop_flip(image, pad=2, hflip=0.5, generator=g) for _ in range(20)]
    assert all(o.shape == image.shape and o.dtype == torch.uint8 for o in out)
    assert len({o.sum().item() for o in out}) > 1


def test_cache_and_cached_datasets(tmp_path):
    split = load_split(None, "train", subset=12, img_size=16)
    cache = cache_uint8(split, 16, cache_dir=tmp_path)
    assert cache.images.dtype == torch.uint8 and cache.images.shape == (12, 3, 16, 16)
    assert torch.equal(cache.images[5], split.items.render(5))
    files = list(tmp_path.glob("uint8-16px-*.pt"))
    assert len(files) == 1
    again = cache_uint8(split, 16, cache_dir=tmp_path)  # read back from disk
    assert torch.equal(again.images, cache.images)

    train = CachedTrainDataset(cache, MEAN, STD, crop_pad=4, seed=1)
    x0, y0 = train[3]
    assert x0.shape == (3, 16, 16) and x0.dtype == torch.float32 and y0 == split.labels[3]
    assert torch.equal(train[3][0], x0)  # same (seed, epoch, index): same crop
    train.set_epoch(1)
    assert any(not torch.equal(train[i][0], CachedTrainDataset(cache, MEAN, STD, seed=1)[i][0]) for i in range(12))
    x, _ = CachedEvalDataset(cache, MEAN, STD)[3]
    expected = (cache.images[3].float() / 255 - torch.tensor(MEAN).view(3, 1, 1)) / torch.tensor(STD).view(3, 1, 1)
    assert torch.allclose(x, expected)


def test_transform_dataset_seeding_is_local_and_repeatable():
    split = load_split(None, "train", subset=6, img_size=32)
    tf = train_transform(32, "timm", MEAN, STD, auto_augment="rand-m9-mstd0.5-inc1", reprob=0.25)
    ds = TransformDataset(split, tf, seed=0)
    states = random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state()
    first = ds[2][0]
    assert random.getstate() == states[0] and np.array_equal(np.random.get_state()[1], states[1])
    assert torch.equal(torch.get_rng_state(), states[2])
    assert torch.equal(ds[2][0], first) and first.shape == (3, 32, 32)
    ds.set_epoch(1)
    assert not torch.equal(ds[2][0], first)


def test_eval_transforms():
    image = Image.new("RGB", (80, 40), color=(255, 0, 0))
    for resize in ("paper", "timm"):
        x = eval_transform(eval_config(32, MEAN, STD), resize)(image)
        assert x.shape == (3, 32, 32)
    with pytest.raises(ValueError, match="resize must be one of paper, timm"):
        eval_transform(eval_config(32), "other")
    # augment "none" is the paper's eval pipeline, from the one owner of eval transforms
    assert torch.equal(train_transform(32, "none", MEAN, STD)(image), eval_transform(eval_config(32, MEAN, STD))(image))
    assert train_transform(32, "none", MEAN, STD)(image).shape == (3, 32, 32)
    assert train_transform(32, "crop_flip", MEAN, STD)(image).shape == (3, 32, 32)


# --------------------------------------------------------------------------------------------
# sampling
# --------------------------------------------------------------------------------------------
def test_epoch_batch_sampler_shards_and_resumes():
    n, bs, world = 50, 4, 2
    shards = [EpochBatchSampler(n, bs, world, rank, seed=5) for rank in range(world)]
    batches = [list(s) for s in shards]
    assert all(len(b) == n // (bs * world) == len(s) for b, s in zip(batches, shards))
    seen = [i for b in batches for batch in b for i in batch]
    assert len(seen) == len(set(seen)) == (n // (bs * world)) * bs * world
    full = list(shards[0])
    shards[0].set_epoch(0, start_batch=2)
    assert list(shards[0]) == full[2:] and len(shards[0]) == len(full) - 2
    shards[0].set_epoch(1)
    assert list(shards[0]) != full
    evals = [EpochBatchSampler(11, 4, 3, rank, shuffle=False, drop_last=False) for rank in range(3)]
    covered = sorted(i for s in evals for batch in s for i in batch)
    assert covered == list(range(11))


def test_loader_leaves_global_rng_alone():
    split = load_split(None, "train", subset=8, img_size=16)
    ds = CachedTrainDataset(cache_uint8(split, 16), MEAN, STD, seed=0)
    state = torch.get_rng_state()
    batches = list(make_loader(ds, EpochBatchSampler(8, 4), workers=0))
    assert torch.equal(torch.get_rng_state(), state)
    assert batches[0][0].shape == (4, 3, 16, 16) and batches[0][1].dtype == torch.int64


# --------------------------------------------------------------------------------------------
# Hub-style parquet sets: one split at a time, configs, streaming
# --------------------------------------------------------------------------------------------


@pytest.fixture
def fresh_hf_cache(tmp_path, monkeypatch):
    """datasets' cache in a fresh folder: what a load prepares can be seen there."""
    import datasets

    cache = tmp_path / "hf-cache"
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
    return cache


def test_only_the_asked_split_is_prepared(tmp_path, fresh_hf_cache):
    root = parquet_set(tmp_path / "set")
    val = load_split(root, "validation", config="big")
    assert len(val) == 6 and val.classes == ["c0", "c1", "c2", "c3"]
    prepared = sorted(p.name for p in fresh_hf_cache.rglob("*.arrow"))
    assert prepared and all("validation" in name for name in prepared), prepared  # no train split prepared
    small = load_split(root, "val", config="small")  # the config chooses the data; aliases still work
    assert small.classes == ["c0", "c1", "c2"] and len(small) == 6


def test_a_configuration_the_data_lacks_is_a_user_error_in_one_line(tmp_path, fresh_hf_cache, capsys):
    """datasets refuses it with a builtin ValueError, which the command line now takes for a bug: the data's
    reader says it as a DataSourceError (one line, exit 2)."""
    from timm_posgeom.cli import main
    from timm_posgeom.data import DataSourceError

    root = parquet_set(tmp_path / "set")
    capsys.readouterr()  # what writing the set said
    with pytest.raises(DataSourceError, match="'nope' not found"):
        load_split(root, "validation", config="nope")
    argv = ["probe", "posgeom_vit_micro_patch8_64_ape", "--data", str(root), "--data-config", "nope"]
    with pytest.raises(SystemExit) as e:
        main([*argv, "--max-images", "2", "--no-progress", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("posgeom probe: error: cannot load data") and err.count("\n") == 1


def test_streaming_reads_the_same_first_items_and_needs_a_count(tmp_path, fresh_hf_cache):
    from timm_posgeom.data import data_identity

    root = parquet_set(tmp_path / "set")
    streamed = load_split(root, "train", config="big", subset=5, streaming=True)
    assert not list(fresh_hf_cache.rglob("*.arrow"))  # a stream prepares nothing
    loaded = load_split(root, "train", config="big", subset=5)
    # the same images to the pixel (the stored JPEG bytes, not decoded and encoded again) and labels
    assert data_identity(streamed, images=5) == data_identity(loaded, images=5)
    with pytest.raises(ValueError, match="streaming reads the first N items"):
        load_split(root, "train", config="big", streaming=True)
    with pytest.raises(ValueError, match="not to the synthetic set"):
        load_split("synthetic", "train", subset=4, streaming=True)


def test_cli_streams_a_config_of_a_hub_style_set_and_probes_the_same_images(tmp_path, fresh_hf_cache, capsys):
    import json

    from timm_posgeom.cli import main

    root = parquet_set(tmp_path / "set")
    common = [
        "probe",
        "posgeom_vit_micro_patch8_64_nope",
        "--data",
        str(root),
        "--data-config",
        "big",
        "--max-images",
        "4",
        "--batch-size",
        "2",
        "--num-workers",
        "0",
        "--no-progress",
    ]
    assert main(common + ["--streaming", "--out", str(tmp_path / "streamed")]) == 0
    assert not list(fresh_hf_cache.rglob("*.arrow"))  # nothing downloaded or prepared
    assert main(common + ["--out", str(tmp_path / "loaded")]) == 0
    streamed, loaded = (json.loads((tmp_path / d / "ssdc.json").read_text()) for d in ("streamed", "loaded"))
    assert streamed["per_layer"] == loaded["per_layer"] and streamed["metadata"]["n_images"] == 4
    with pytest.raises(SystemExit) as e:  # a stream needs its length
        main(
            [
                "probe",
                "posgeom_vit_micro_patch8_64_nope",
                "--data",
                str(root),
                "--data-config",
                "big",
                "--streaming",
                "--out",
                str(tmp_path / "x"),
                "--no-progress",
            ]
        )
    assert e.value.code == 2 and "--max-images" in capsys.readouterr().err


def test_fragility_and_the_alpha_sweep_read_a_stream_as_its_first_max_images(tmp_path, fresh_hf_cache):
    """Issue 30 item 7: the library's fragility and alpha sweep take a streamed dataset (a
    ``datasets.IterableDataset``, or any iterable without a length) as its first ``max_images`` items, with the
    numbers of the same images loaded; a stream without ``max_images`` is refused in one line."""
    import datasets
    import timm

    from timm_posgeom import alpha_sweep, fragility

    root = parquet_set(tmp_path / "set")
    files = {"validation": str(root / "big" / "validation-00000-of-00001.parquet")}
    stream = datasets.load_dataset("parquet", data_files=files, split="validation", streaming=True)
    assert not hasattr(stream, "__len__")
    loaded = datasets.load_dataset("parquet", data_files=files, split="validation")
    torch.manual_seed(0)
    model = timm.create_model("posgeom_vit_micro_patch8_64_ape", num_classes=4).eval()
    opts = dict(max_images=5, batch_size=2, num_workers=0, seed=0, progress=False)
    on_stream, on_loaded = fragility(model, stream, **opts), fragility(model, loaded, **opts)
    assert on_stream.num_images == on_loaded.num_images == 5
    assert on_stream.clean_accuracy == on_loaded.clean_accuracy and on_stream.fs == on_loaded.fs
    generator = fragility(model, ((row["image"], row["label"]) for row in loaded), **opts)  # no features: as-is
    assert generator.num_images == 5 and generator.clean_accuracy == on_loaded.clean_accuracy
    sweep = alpha_sweep(model, stream, alphas=(1.0, 0.0), probe_images=3, **opts)
    assert sweep.settings["probe_images"] == 3 and sweep.rows[0].fragility.num_images == 5
    with pytest.raises(ValueError, match="stream .*give max_images"):
        fragility(model, stream, batch_size=2, num_workers=0, progress=False)


def test_cli_fragility_streams_the_same_images_as_it_loads(tmp_path, fresh_hf_cache):
    import json

    from timm_posgeom.cli import main

    root = parquet_set(tmp_path / "set")
    common = [
        "fragility",
        "posgeom_vit_micro_patch8_64_nope",
        "--data",
        str(root),
        "--data-config",
        "big",
        "--max-images",
        "4",
        "--batch-size",
        "2",
        "--num-workers",
        "0",
        "--no-progress",
        "--num-classes",
        "4",
    ]
    assert main(common + ["--streaming", "--out", str(tmp_path / "streamed")]) == 0
    assert not list(fresh_hf_cache.rglob("*.arrow"))  # nothing prepared
    assert main(common + ["--out", str(tmp_path / "loaded")]) == 0
    streamed, loaded = (json.loads(next((tmp_path / d).glob("*.json")).read_text()) for d in ("streamed", "loaded"))
    assert streamed["fs"] == loaded["fs"] and streamed["num_images"] == loaded["num_images"] == 4


@pytest.mark.parametrize("where", ["synthetic", "imagenette", "folder"])
def test_a_split_the_data_lacks_is_refused_naming_the_splits_it_has(where, tmp_path, imagenette_path):
    """``--split test`` on data with train and validation read validation silently, recorded as "test"."""
    from timm_posgeom.data import load_split

    source = {"synthetic": "synthetic", "imagenette": str(imagenette_path), "folder": str(tmp_path)}[where]
    if where == "folder":
        for split in ("train", "val"):
            (tmp_path / split / "cat").mkdir(parents=True)
            Image.new("RGB", (8, 8)).save(tmp_path / split / "cat" / "a.png")
    with pytest.raises(ValueError, match=r"no split 'test' in the data; it has the split\(s\): .*(train|val)"):
        load_split(source, "test", subset=2)
    assert len(load_split(source, "val", subset=2)) >= 1  # an alias of validation still reads it


def test_the_cli_refuses_a_missing_split_in_one_line(capsys):
    from timm_posgeom.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(
            [
                "probe",
                "posgeom_vit_micro_patch8_64_ape",
                "--data",
                "synthetic",
                "--split",
                "test",
                "--no-progress",
                "--max-images",
                "2",
            ]
        )
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1 and "no split 'test'" in err[0] and "validation" in err[0]
