"""Bad-input suite, class "unbounded requests" (issue 54, class 6): a count is checked against what it will cost.

The generator walks the real parser: every integer option of every command that runs on data is given a huge
value (10^9; the seed 10^30). A count that costs with its size (workers: a process each; the input size: tokens
and memory; classes: a head; RPI permutations: a forward pass and running sums each; seeds: a training run of
every condition each; the shift size) is refused in one line before any work, saying the most it may be. A count
that only bounds the work (``--max-images``, ``--probe-images``, ``--batch-size``) means "all": the same output as
the data's own size. Every case runs in one child process whose memory is limited (6 GiB) and where each command
has 60 s (``faultsuite.cli_batch``): past either it counts as a traceback or a hang, never a test run that eats
the machine. Beside them, the library: ``rpi_permutations`` at most 10,000, and fewer when the running sums would
pass 4 GiB (the count that fits named, before the first forward pass).

Before: ``posgeom probe MODEL --data D --rpi --rpi-permutations 1000000000`` printed nothing and grew past 4 GB;
``--num-workers 100000`` started workers until the machine gave out; ``--img-size 100000`` and ``--num-classes
10^9`` died in a MemoryError traceback; ``--seed 10^30`` said "Overflow when unpacking long long"."""

from __future__ import annotations

import argparse

import numpy as np
import pytest
import torch
from faultsuite import cli_batch, judge, library, library_refused, refused, right
from PIL import Image

from timm_posgeom.cli.main import build_parser

pytestmark = pytest.mark.xdist_group("unbounded")

NOPE, APE = "posgeom_vit_micro_patch8_64_nope", "posgeom_vit_micro_patch8_64_ape"
IMAGES = 8  # the data's validation images (and training images)
HUGE = 10**9
BOUNDED = {"num_workers", "img_size", "num_classes", "rpi_permutations", "num_seeds", "seeds", "shift_size", "seed"}
ALL_OF_THEM = {"max_images", "probe_images", "batch_size", "images"}  # a bound on the work: huge means all


def _base(command: str, data, out) -> list:
    """A quick run of ``command`` on ``data`` into ``out``."""
    fast = ["--data", data, "--num-workers", "0", "--no-progress", "--out", out]
    tiny = ["--set", "model_kwargs.depth=1", "--set", "model_kwargs.embed_dim=16", "--set", "model_kwargs.num_heads=2"]
    return {
        "probe": ["probe", NOPE, *fast, "--img-size", "32"],
        "attention": ["attention", NOPE, *fast, "--img-size", "32"],
        "fragility": ["fragility", NOPE, *fast, "--img-size", "32", "--labels", "as-is"],
        "sweep": [
            "sweep",
            APE,
            *fast,
            "--img-size",
            "32",
            "--labels",
            "as-is",
            "--alphas",
            "1,0",
            "--rpi-permutations",
            "2",
        ],
        "zoo": ["zoo", NOPE, *fast, "--img-size", "32", "--rpi-permutations", "2", "--extras", "none"],
        "train": ["train", "--data", data, "--out", out, "--no-progress", "--set", "epochs=1", "--set", "batch_size=4"]
        + ["--set", "img_size=16", "--set", "workers=0", *tiny],
        "study": ["study", "--preset", "demo", "--data", data, "--out", out, "--dry-run"],
    }[command]


def _count_options() -> list[tuple[str, str, str]]:
    """(command, flag, dest) of every integer option of the commands that run on data."""
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    found = []
    for command in ("probe", "attention", "fragility", "sweep", "zoo", "train", "study"):
        for action in sub.choices[command]._actions:
            if action.type is int and action.option_strings:
                dest = "num_seeds" if action.option_strings == ["--seeds"] else action.dest  # the old name
                found.append((command, action.option_strings[-1], dest))
    return found


OPTIONS = _count_options()


def test_the_generator_walks_every_commands_counts():
    walked = {(c, d) for c, _, d in OPTIONS}
    for expected in [
        ("probe", "rpi_permutations"),
        ("zoo", "num_workers"),
        ("study", "num_seeds"),
        ("probe", "num_classes"),
    ]:
        assert expected in walked, expected
    assert {d for _, _, d in OPTIONS} <= BOUNDED | ALL_OF_THEM, {d for _, _, d in OPTIONS} - BOUNDED - ALL_OF_THEM
    assert len(OPTIONS) >= 40


def _folder(root):
    rng = np.random.default_rng(0)
    for split in ("train", "validation"):
        for cls in ("ant", "bee"):
            (root / split / cls).mkdir(parents=True, exist_ok=True)
            for j in range(IMAGES // 2):
                Image.fromarray(rng.integers(0, 256, (20, 20, 3), dtype=np.uint8)).save(root / split / cls / f"{j}.png")
    return root


# options whose run at the data's size prints otherwise than the run without them (the dry run lists the count; a
# training run logs SSDC under RPI only with --probe-images): compared with that run, the others with the run
# without the option
AT_SIZE = {("train", "--probe-images"), ("study", "--max-images"), ("study", "--probe-images")}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Each option's huge value; each command without any, and where needed (AT_SIZE) the option at the data's
    size: run in one child process with limited memory and time."""
    root = tmp_path_factory.mktemp("unbounded")
    data = _folder(root / "data")
    argvs, keys = [], []
    for command in dict.fromkeys(c for c, _, _ in OPTIONS):
        argvs.append(_base(command, data, root / command))
        keys.append((command, None, None))
    for command, flag, dest in OPTIONS:
        huge = 10**30 if dest == "seed" else HUGE
        for value in (huge, IMAGES) if (command, flag) in AT_SIZE else (huge,):
            argvs.append([*_base(command, data, root / f"{command}{flag}{value}"), flag, str(value)])
            keys.append((command, flag, value))
    synthetic = [a for a in _base("train", None, root / "synthetic") if a not in ("--data", None)]
    argvs.append([*synthetic, "--max-images", str(HUGE)])  # on synthetic data, the images drawn
    keys.append(("train", "synthetic", HUGE))
    return dict(zip(keys, cli_batch(argvs, memory=6 * 2**30, seconds=90)))


def _table(run) -> list[str]:
    """The printed numbers of a run: its output lines, those naming files or the settings left out."""
    return [
        line
        for line in run.out.splitlines()
        if line.strip() and "wrote" not in line and "/" not in line and "steps in" not in line and "report" not in line
    ]


@pytest.mark.slow
@pytest.mark.parametrize("command,flag,dest", OPTIONS, ids=[f"{c} {f}" for c, f, _ in OPTIONS])
def test_a_huge_count_is_refused_or_means_all(runs, command, flag, dest):
    if dest in BOUNDED:
        run = runs[(command, flag, 10**30 if dest == "seed" else HUGE)]
        outcome = refused(run, "must fit in 64 bits" if dest == "seed" else "must be at most")
    else:  # the dry run of a study lists the count it was given
        same = runs[(command, flag, IMAGES)] if (command, flag) in AT_SIZE else runs[(command, None, None)]
        run = runs[(command, flag, HUGE)]
        huge = [line.replace(str(HUGE), str(IMAGES)) for line in _table(run)]
        outcome = right(run, same.code == 0 and huge == _table(same))
    judge("unbounded", outcome, "refused" if dest in BOUNDED else "right", run.out[-2000:] + run.err + run.trace)


@pytest.mark.slow
def test_a_synthetic_split_of_a_billion_images_is_refused(runs, tmp_path):
    """Training on synthetic data draws max_images images: a billion labels were drawn up front."""
    run = runs[("train", "synthetic", HUGE)]
    judge("unbounded", refused(run, "a synthetic split holds from 0 to 10,000,000 images"), "refused", run.err)


# --------------------------------------------------------------------------------------------
# the library: RPI permutations, and their running sums against the memory budget
# --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def model():
    import timm

    torch.manual_seed(0)
    return timm.create_model(NOPE, img_size=64, depth=2, embed_dim=32, num_heads=2, num_classes=2).eval()


@pytest.mark.parametrize("call", ["probe_ssdc", "run_measures", "MeasureSettings"])
def test_more_than_ten_thousand_permutations_are_refused(model, call):
    from timm_posgeom.measuring.settings import MeasureSettings
    from timm_posgeom.probes import attention_measures, probe_ssdc

    images = torch.rand(2, 3, 64, 64)
    fn = {
        "probe_ssdc": lambda: probe_ssdc(model, images, rpi=True, rpi_permutations=HUGE, progress=False),
        "run_measures": lambda: attention_measures(model, images, rpi=True, rpi_permutations=HUGE, progress=False),
        "MeasureSettings": lambda: MeasureSettings(rpi_permutations=10_001),
    }[call]
    _, error, trace = library(fn)
    judge("unbounded", library_refused(error, "10,000"), "refused", trace)


@pytest.mark.parametrize("call", ["probe_ssdc", "run_measures"])
def test_permutations_whose_running_sums_pass_the_budget_are_refused_with_the_count_that_fits(model, call, monkeypatch):
    """The sums are checked before the first forward pass (probe_ssdc) or after one permutation's (run_measures)."""
    from timm_posgeom.measuring import settings as measuring
    from timm_posgeom.probes import attention_measures, probe_ssdc

    monkeypatch.setattr(measuring, "MEMORY_BUDGET_BYTES", 2**20)  # 1 MiB: an 8 x 8 grid's sums are 17 KiB each
    images = torch.rand(2, 3, 64, 64)
    fn = {
        "probe_ssdc": lambda: probe_ssdc(model, images, rpi=True, rpi_permutations=500, progress=False),
        "run_measures": lambda: attention_measures(model, images, rpi=True, rpi_permutations=500, progress=False),
    }[call]
    _, error, trace = library(fn)
    judge("unbounded", library_refused(error, "use at most"), "refused", trace)
