"""Data-parallel measuring (timm_posgeom.measuring.distributed): the helpers alone, the sharding simulated
process by process, and probe_ssdc / fragility / alpha_sweep / the CLI under a real two-process
launch compared with one process."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import sys
import textwrap
import time

import numpy as np
import pytest
import torch
from conftest import accelerate_launch_argv, assert_json_close, launch_env, run_launched
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

import timm_posgeom  # noqa: F401  (registers the models)
from timm_posgeom.measuring import distributed
from timm_posgeom.probes.ssdc_probe.accumulator import Moments
from timm_posgeom.probes.streaming import Shard, image_batches

# The measurement, run once by two launched processes and once here: a tiny random-init ViT, 21
# synthetic images (odd: uneven shards), batches of 4 (the last one partial).
SCRIPT = textwrap.dedent("""
    import sys

    import importlib.util

    import numpy as np
    import timm
    import torch

    import timm_posgeom  # noqa: F401
    from timm_posgeom import interventions
    from timm_posgeom.measuring import distributed
    from timm_posgeom.cli import main as cli
    from timm_posgeom.data.eval_data import eval_loader
    from timm_posgeom.results.jsonio import dumps
    from timm_posgeom.probes import probe_ssdc
    from timm_posgeom.robustness import alpha_sweep, fragility
    from timm_posgeom.data.synthetic import SyntheticShapes


    RANDOM_SHIFTS = ["imagenet-c:gaussian_noise:3"] if importlib.util.find_spec("imagecorruptions") else []


    def ssdc_dict(result):
        return result.to_dict(include_maps=True)


    class Broken(torch.utils.data.Dataset):  # item 5 fails: in batch 1, process 1's alone when shared
        def __len__(self):
            return 9

        def __getitem__(self, i):
            if i == 5:
                raise ValueError("bad item 5")
            return torch.zeros(3, 64, 64)


    def failure(fn):
        try:
            fn()
        except Exception as e:
            return [type(e).__name__, str(e)]
        return None


    def frag_dict(result):
        out = result.to_dict()
        out["correct"] = {k: v.astype(int).tolist() for k, v in result.correct.items()}
        return out


    def measure(cli_out=None):
        torch.manual_seed(0)
        model = timm.create_model("posgeom_vit_micro_patch8_64_ape", num_classes=2, global_pool="avg").eval()
        with torch.no_grad():  # a random head (timm's starts near zero): predictions vary between images
            model.head.weight.normal_()
            model.head.bias.zero_()
        shapes = SyntheticShapes(21, img_size=64, split="validation")
        data = [(shapes[i][0], shapes[i][1] % 2) for i in range(len(shapes))]  # 2 classes: accuracy near 1/2
        loader = eval_loader(model, data, batch_size=4, num_workers=0)
        images = torch.cat([x for x, _ in loader])
        out = {
            "world": distributed.world_size(),
            "loader": ssdc_dict(probe_ssdc(model, loader, reduction="both", progress=False)),
            "loader_rpi": ssdc_dict(probe_ssdc(model, loader, reduction="both", rpi=True, seed=3, max_images=19,
                                               progress=False)),
            "tensor": ssdc_dict(probe_ssdc(model, images, reduction="both", batch_size=4, max_images=18,
                                           progress=False)),
            "batches": ssdc_dict(probe_ssdc(model, [(images[i:i + 3], None) for i in range(0, 21, 3)],
                                            reduction="both", rpi=True, seed=5, max_images=11, progress=False)),
            # a random ImageNet-C corruption (seeded per image index) when the extra is installed
            "fragility": frag_dict(fragility(model, data, ["jpeg:5", "blur:2.5:5", *RANDOM_SHIFTS], batch_size=4,
                                             num_workers=0, progress=False)),
            # under RPI, forwards in pieces of 3 copies: each batch's pieces share its permutation
            "fragility_rpi_pieces": frag_dict(fragility(model, data, ["jpeg:5"], batch_size=4, num_workers=0,
                                                        rpi=True, seed=1, max_images=17, forward_size=3,
                                                        progress=False)),
        }
        applied = []  # the permutation each forward applies, in this process's order
        permute = interventions.permutation.permute_tokens
        interventions.permutation.permute_tokens = lambda x, perm, layout: (applied.append(perm.tolist()),
                                                                             permute(x, perm, layout))[1]
        try:
            out["fragility_rpi"] = frag_dict(fragility(model, data, ["jpeg:5"], batch_size=4, num_workers=0,
                                                       rpi=True, seed=1, max_images=17, progress=False))
        finally:
            interventions.permutation.permute_tokens = permute
        out["fragility_rpi_perms"] = applied
        sweep = alpha_sweep(model, data, [1.0, 0.5], ["jpeg:5"], probe_images=9, batch_size=4, num_workers=0,
                            progress=False)
        # a failure on one process is raised on every one (no process left waiting); so are different calls
        out["failure"] = failure(lambda: probe_ssdc(model, torch.utils.data.DataLoader(Broken(), batch_size=4),
                                                    progress=False))
        out["mismatch"] = failure(lambda: probe_ssdc(model, images, max_images=5 + distributed.rank(),
                                                     progress=False))
        out["sweep"] = {"delta": sweep.delta_ssdc, "fs": sweep.fs,
                        "rows": [r.to_dict() for r in sweep.rows]}
        if cli_out is not None:
            common = ["posgeom_vit_micro_patch8_64_ape", "--data", "synthetic", "--max-images", "13",
                      "--batch-size", "4", "--num-workers", "0", "--no-progress", "--num-classes", "10"]
            assert cli(["probe", *common, "--rpi", "--out", cli_out + "/probe"]) == 0
            assert cli(["fragility", *common, "--shift", "jpeg:5", "--labels", "as-is",
                        "--out", cli_out + "/fragility"]) == 0
        return out


    if __name__ == "__main__":
        prefix, cli_out = sys.argv[1], sys.argv[2]
        result = measure(cli_out)
        with open(f"{prefix}.{distributed.rank()}.json", "w") as f:
            f.write(dumps(result))
""")


# --------------------------------------------------------------------------------------------
# the helpers, alone
# --------------------------------------------------------------------------------------------
def test_alone_every_helper_is_the_identity(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert not distributed.is_initialized()
    assert distributed.setup() == 1 and distributed.world_size() == 1 and distributed.rank() == 0
    assert distributed.is_main() and distributed.default_device() is None
    x = torch.arange(5, dtype=torch.float64)
    assert distributed.all_reduce_sum(x) is x
    assert distributed.all_gather_objects({"a": 1}) == [{"a": 1}]
    assert distributed.broadcast_object(7) == 7
    assert distributed.shared_seed(None) is None and distributed.shared_seed(3) == 3
    distributed.check_same(("x", 1), "settings")
    with distributed.fail_together(), distributed.main_process_first():
        pass
    with pytest.raises(KeyError), distributed.fail_together():
        raise KeyError("alone: raised as is")
    values = np.array([[1, 0], [0, 1], [1, 1]], dtype=bool)
    assert (distributed.gather_in_order(values, [2, 0, 1], 3) == values[[1, 2, 0]]).all()
    with pytest.raises(RuntimeError, match="1 missing"):
        distributed.gather_in_order(values[:2], [0, 1], 3)
    with pytest.raises(RuntimeError, match="more than once"):
        distributed.gather_in_order(values, [0, 0, 1], 3)


def test_port_zero_is_refused_before_any_wait(monkeypatch):
    # accelerate 1.1's `launch --main_process_port 0` gives the workers MASTER_PORT=0: they would retry port 0
    # until the rendezvous timeout
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "0")
    with pytest.raises(RuntimeError, match="MASTER_PORT=0"):
        distributed.setup()
    assert not distributed.is_initialized()


def test_launch_environment_is_read_before_setup(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("LOCAL_RANK", "2")
    monkeypatch.setenv("ACCELERATE_USE_CPU", "1")
    assert distributed.world_size() == 4 and distributed.rank() == 2 and not distributed.is_main()
    assert distributed.default_device() == "cpu"


@pytest.mark.parametrize("n, batch, world", [(21, 4, 2), (21, 4, 3), (8, 4, 3), (3, 4, 2), (20, 5, 4)])
def test_sequential_batches_partition_the_items(n, batch, world):
    shards = [distributed.sequential_batches(n, batch, world, r) for r in range(world)]
    batches = sorted((b for shard in shards for b in shard), key=lambda b: b.start)
    assert [list(b) for b in batches] == [list(range(s, min(s + batch, n))) for s in range(0, n, batch)]
    sizes = [sum(len(b) for b in shard) for shard in shards]
    assert sum(sizes) == n and max(len(s) for s in shards) - min(len(s) for s in shards) <= 1
    dropped = [distributed.sequential_batches(n, batch, world, r, drop_last=True) for r in range(world)]
    assert sum(len(b) for shard in dropped for b in shard) == (n // batch) * batch


def test_shard_dataloader_keeps_the_loader_and_its_batches():
    data = TensorDataset(torch.arange(21.0))
    loader = DataLoader(data, batch_size=4, num_workers=0)
    whole = [b[0].tolist() for b in loader]
    for limit, expected in ((None, 21), (10, 10), (40, 21)):
        parts = []
        for r in range(3):
            sharded, seen = distributed.shard_dataloader(loader, limit, 3, r)
            assert seen == expected and sharded.dataset is data
            parts += [(k, b[0].tolist()) for k, b in zip(distributed.own_batches(99, 3, r), sharded)]
        flat = [x for _, b in sorted(parts) for x in b]
        assert flat == [x for b in whole for x in b][:expected]
    assert distributed.shard_dataloader(DataLoader(data, batch_size=4, shuffle=True), None, 2, 0) is None
    assert distributed.shard_dataloader([torch.zeros(2, 3, 8, 8)], None, 2, 0) is None

    class Stream(IterableDataset):
        def __iter__(self):
            return iter(torch.zeros(4, 3, 8, 8))

    assert distributed.shard_dataloader(DataLoader(Stream(), batch_size=2), None, 2, 0) is None


def _shard_batches(data, world, max_images=None, batch_size=4):
    """Every simulated process's batches of ``data`` (as lists of image ids), and its seen count; each batch
    comes with the global index of its first image (checked: the image ids are the indices)."""
    out = []
    for r in range(world):
        shard = Shard(data, batch_size, world, r, max_images, presharded=False)
        batches = []
        for offset, x in shard:
            ids = x[:, 0, 0, 0].long().tolist()
            assert ids == list(range(offset, offset + len(ids)))
            batches.append(ids)
        out.append((batches, shard.seen))
    return out


@pytest.mark.parametrize("kind", ["tensor", "loader", "list"])
@pytest.mark.parametrize("max_images", [None, 10, 21, 50])
def test_shards_together_are_the_single_process_batches(kind, max_images):
    images = torch.arange(21.0)[:, None, None, None].expand(21, 3, 4, 4).contiguous()
    data = {
        "tensor": images,
        "loader": DataLoader(TensorDataset(images), batch_size=4),
        "list": [images[i : i + 4] for i in range(0, 21, 4)],
    }[kind]
    expected = list(range(21))[:max_images]
    single = [x[:, 0, 0, 0].long().tolist() for x in image_batches(data, 4)]
    for world in (1, 2, 3, 8):
        shards = _shard_batches(data, world, max_images)
        assert {seen for _, seen in shards} == {len(expected)}
        got = sorted(x for batches, _ in shards for b in batches for x in b)
        assert got == expected
        for r, (batches, _) in enumerate(shards):  # process r holds global batches r, r + W, ... as they were
            assert batches == [
                b[: max(0, len(expected) - 4 * k)]
                for k, b in enumerate(single)
                if k % world == r and 4 * k < len(expected)
            ]


def test_a_shuffling_loader_without_a_seed_is_refused():
    loader = DataLoader(TensorDataset(torch.zeros(8, 3, 4, 4)), batch_size=2, shuffle=True)
    with pytest.raises(ValueError, match="shuffling DataLoader"):
        Shard(loader, None, 2, 0, None, presharded=False)


def test_moments_merge_equals_one_stream():
    values = torch.randn(37, dtype=torch.float64)
    values[[3, 20]] = math.nan
    one = Moments()
    for chunk in values.split(4):
        one.update(chunk)
    parts = [Moments() for _ in range(3)]
    for k, chunk in enumerate(values.split(4)):
        parts[k % 3].update(chunk)
    merged = Moments()
    for part in [Moments(), *parts]:  # an empty process too
        merged.merge(part.state())
    assert (merged.n, merged.n_nan) == (one.n, one.n_nan) == (35, 2)
    assert merged.mean == pytest.approx(one.mean, abs=1e-14) and merged.m2 == pytest.approx(one.m2, rel=1e-13)


def test_unknown_modes_are_refused():
    import timm

    from timm_posgeom.probes import probe_ssdc
    from timm_posgeom.robustness import fragility

    model = timm.create_model("posgeom_vit_micro_patch8_64_ape", num_classes=2, img_size=32)
    with pytest.raises(ValueError, match="distributed mode"):
        probe_ssdc(model, torch.zeros(1, 3, 32, 32), distributed="yes")
    with pytest.raises(ValueError, match="distributed must be"):
        fragility(model, [(None, 0)], ["jpeg:5"], distributed="presharded")


# --------------------------------------------------------------------------------------------
# two launched processes against one
# --------------------------------------------------------------------------------------------


@pytest.mark.xdist_group("launch")  # one launch at a time (ports, cores)
def test_a_launch_past_its_timeout_leaves_no_process(tmp_path):
    # a launcher whose worker sits in a session of its own (as torchrun's do) and never ends
    launcher = textwrap.dedent("""
        import subprocess, sys, time
        worker = subprocess.Popen([sys.executable, "-c", "import time; print('worker up', flush=True); time.sleep(600)"],
                                  start_new_session=True)
        open(sys.argv[1], "w").write(str(worker.pid))
        worker.wait()
    """)
    pid_file = tmp_path / "worker.pid"
    with pytest.raises(pytest.fail.Exception, match="ran past 3 s") as failed:
        run_launched([sys.executable, "-c", launcher, str(pid_file)], env=dict(os.environ), timeout=3)
    assert "worker up" in str(failed.value)
    import psutil

    pid = int(pid_file.read_text())
    for _ in range(100):  # killed (a zombie until whoever inherited it reaps it)
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                break
        except psutil.NoSuchProcess:
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"the worker {pid} outlived its launch")


@pytest.mark.slow
@pytest.mark.xdist_group("launch")  # one launch at a time (ports, cores)
def test_two_launched_processes_equal_one(tmp_path):
    script = tmp_path / "measure.py"
    script.write_text(SCRIPT)
    cmd = accelerate_launch_argv(str(script), str(tmp_path / "launched"), str(tmp_path / "cli2"))
    run = run_launched(cmd, env=launch_env(), timeout=300, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-4000:]
    rank0 = json.loads((tmp_path / "launched.0.json").read_text())
    rank1 = json.loads((tmp_path / "launched.1.json").read_text())
    assert rank0["world"] == 2
    # under RPI each image was permuted as in one process (its own permutation, from the seed and its index)
    perms = [rank0.pop("fragility_rpi_perms"), rank1.pop("fragility_rpi_perms")]
    failures = [rank0.pop("failure"), rank1.pop("failure")]
    assert failures[1] == ["ValueError", "bad item 5"]
    assert failures[0] == ["ValueError", "bad item 5 (on process 1 of 2)"]
    for mismatch in (rank0.pop("mismatch"), rank1.pop("mismatch")):
        assert mismatch[0] == "ValueError" and "the processes differ in probe_ssdc settings" in mismatch[1]
    assert rank0 == rank1  # every process returns the same (reduced) result

    namespace: dict = {"__name__": "measure"}  # the same measurement, in this one process
    exec(compile(SCRIPT, str(script), "exec"), namespace)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        single = json.loads(namespace["dumps"](namespace["measure"](str(tmp_path / "cli1"))))
    finally:
        torch.set_num_threads(threads)
    assert single.pop("world") == 1 and rank0.pop("world") == 2
    single_perms = single.pop("fragility_rpi_perms")
    assert single.pop("failure") == ["ValueError", "bad item 5"] and single.pop("mismatch") is None
    assert len(single_perms) == 5 and [len(p) for p in perms] == [3, 2]  # 17 images: batches 0-4
    assert [perms[k % 2][k // 2] for k in range(5)] == single_perms
    assert len({tuple(map(tuple, p)) for p in single_perms}) == 5

    # counts, per-image correctness, accuracies, FS and every interval: exactly
    for key in ("fragility", "fragility_rpi", "fragility_rpi_pieces"):
        assert rank0[key]["counts"] == single[key]["counts"] and rank0[key]["correct"] == single[key]["correct"]
        assert_json_close(rank0[key], single[key], 0.0, key)
    assert single["fragility_rpi_pieces"]["correct"] == single["fragility_rpi"]["correct"]
    has_extra = importlib.util.find_spec("imagecorruptions") is not None  # then a random corruption, seeded per image
    assert ("imagenet-c:gaussian_noise:3" in rank0["fragility"]["shifts"]) == has_extra
    assert rank0["fragility"]["num_images"] == 21 and rank0["fragility_rpi"]["num_images"] == 17
    # SSDC: image counts, per-image counts and the RPI permutation exactly; sums to float rounding
    for key, n in (("loader", 21), ("loader_rpi", 19), ("tensor", 18), ("batches", 11)):
        assert rank0[key]["metadata"]["n_images"] == n
        assert [s["n"] for s in rank0[key]["per_image"]] == [n] * 4
        assert rank0[key]["permutation"] == single[key]["permutation"]
        assert_json_close(rank0[key], single[key], 1e-6, key)
    assert rank0["loader_rpi"]["permutation"] is not None and rank0["loader_rpi"]["content_per_layer"]
    assert_json_close(rank0["sweep"], single["sweep"], 1e-6, "sweep")

    # the CLI under the launch: the main process alone wrote and printed, the same numbers as one process
    assert run.stdout.count("wrote ") == 2, run.stdout
    # (ssdc.json has its settings under "settings" and under their old name "metadata")
    for name, sections in (("probe/ssdc.json", ("settings", "metadata")), ("fragility/fragility.json", ("settings",))):
        two = json.loads((tmp_path / "cli2" / name).read_text())
        one = json.loads((tmp_path / "cli1" / name).read_text())
        for section in sections:
            assert two[section].pop("processes") == 2 and "processes" not in one[section]
        assert_json_close(two, one, 1e-6, name)
    assert json.loads((tmp_path / "cli2" / "probe" / "ssdc.json").read_text())["metadata"]["n_images"] == 13
