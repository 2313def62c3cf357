"""Issue 39's GPU plan: one script for one lent GPU, records only (experiments/gpu/README.md).

    python3 experiments/gpu/plan.py --data data/imagenette64 --out "$OUT"     # on the GPU machine
    python experiments/gpu/plan.py --tiny --out /tmp/gpu-plan                 # a few CPU steps (tests/test_gpu_plan.py)

1. **Throughput** (first, on the idle GPU): the ``in100_paper_ape`` recipe's model (ViT-S/16, the paper's
   layers) trained with the recipe's optimiser under bf16 autocast on synthetic 224-px images held on the GPU,
   batch 128; images per second of training (and of inference), and the price of one paper run (60 epochs of
   126,689 images) in GPU-hours. The input pipeline is not measured: the price assumes it keeps up.
2. **The learning-rate x width test**: APE at widths 192 and 384 (head size 32, depth 4) x lr 1e-3 and 3.3e-4
   x seeds 0, 1, 2, each run the study's ``imagenette-cpu`` preset with the paper's init (the
   ``imagenette_cpu_ape`` recipe: 8 x 8 tokens at 64 px, 40 epochs) on the 64-px ImageFolder copy that
   experiments/scaling/make_imagenette64.py makes. All 12 train at once, one process each on the one GPU; each
   then measures itself there: top-1 on the validation split, and SSDC per layer (the paper's site, mean-map
   reduction, the first 1,000 validation images) without and under RPI with 10 permutations (seeds 0-9, the
   study's protocol), delta SSDC = layer 1 - layer 0 of their mean, with its interval over the permutations.

The weights stay in a scratch folder; ``--out`` receives four small files: ``plan.json`` (settings, versions,
timings), ``throughput.json``, ``ladder.jsonl`` (one record per run, with its training log) and ``log.txt``. A
run still training at the deadline is stopped and recorded with what it logged (``finished: false``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run from a checkout that is not installed (the GPU machine's)
    sys.path.insert(0, str(ROOT))

RECIPES = ROOT / "recipes"  # read as files: an uninstalled checkout has no timm_posgeom.recipes package
WIDTHS, LRS, SEEDS = (192, 384), (1e-3, 3.3e-4), (0, 1, 2)
PERMUTATIONS, PROBE_IMAGES = 10, 1000
PAPER_TRAIN_IMAGES, PAPER_EPOCHS, PAPER_VAL_IMAGES = 126_689, 60, 5_000
# --tiny: two runs of a few steps of a width-32 model on synthetic images, and a few throughput steps on a tiny
# ViT, on the CPU; the same code as the GPU plan with smaller numbers
TINY_RUN = [
    "data=synthetic",
    "max_train_images=64",
    "max_val_images=12",
    "batch_size=16",
    "max_steps=3",
    "epochs=1",
    "eval_every=1",
    "cache=true",
    "disk_cache=false",
    "probe_images=0",
    "checkpoint_every=100",
    "log_every=1",
]
TINY_MODEL = [
    "model_kwargs.embed_dim=32",
    "model_kwargs.depth=1",
    "model_kwargs.num_heads=2",
    "model_kwargs.patch_size=8",
    "img_size=32",
]


def ladder_recipe(width: int, lr: float, seed: int, data: str | None, extra: tuple[str, ...] = ()):
    """The run of ``posgeom study --preset imagenette-cpu --init paper --conditions ape --set
    model_kwargs.embed_dim=W --set model_kwargs.num_heads=W/32 --set lr=LR``: the same overrides in the same
    order (the study's ``--set`` values, then init, seed and data), then ``extra``."""
    from timm_posgeom.app.recipe import load_recipe

    overrides = (
        [
            f"model_kwargs.embed_dim={width}",
            f"model_kwargs.num_heads={width // 32}",
            f"lr={lr}",
            "model_kwargs.init=paper",
            f"seed={seed}",
        ]
        + ([f"data={data}"] if data else [])
        + list(extra)
    )
    return load_recipe(RECIPES / "imagenette_cpu_ape.yaml", overrides)


def rpi_ssdc(model, loader, permutations: int, device) -> dict:
    """SSDC per layer under RPI as the study measures it: ``probe_ssdc`` over ``permutations`` permutations
    (seeds 0 .. permutations - 1), their mean with its 95% interval, each permutation's values, and delta SSDC
    (layer 1 - layer 0) with its interval over the permutations."""
    from timm_posgeom import probe_ssdc

    res = probe_ssdc(
        model,
        loader,
        rpi=True,
        seed=0,
        rpi_permutations=permutations,
        reduction="mean_map",
        device=device,
        progress=False,
    )
    two = len(res.per_layer) > 1
    return dict(
        permutations=permutations,
        seeds=list(res.settings["permutation_seeds"]),
        per_permutation=res.by_permutation,
        per_layer=list(res.per_layer),
        per_layer_ci=[list(c) for c in res.per_layer_ci] if res.per_layer_ci else None,
        delta=res.delta if two else None,
        delta_ci=list(res.delta_ci) if two else None,
    )


def top1(model, loader, device) -> tuple[float, int]:
    """(top-1 accuracy, images) of ``model`` over ``loader``'s (images, labels) batches."""
    import torch

    correct = n = 0
    model.eval().to(device)
    with torch.inference_mode():
        for images, labels in loader:
            correct += (model(images.to(device)).argmax(-1).cpu() == labels).sum().item()
            n += len(labels)
    return correct / max(n, 1), n


def measure(run_dir: Path, recipe, probe_images: int, permutations: int) -> dict:
    """Top-1 on the recipe's validation split and SSDC per layer without and under RPI, on the run's export."""
    import torch

    import timm_posgeom as tp

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = tp.create_model(f"local-dir:{run_dir / 'export'}").eval().to(device)
    val = tp.load_split(
        recipe.data, recipe.val_split, img_size=recipe.img_size, seed=recipe.seed, synthetic_size=recipe.max_val_images
    )

    def probe_loader():
        return tp.eval_loader(model, val, max_images=probe_images, batch_size=128, resize="paper", num_workers=0)

    acc, n = top1(model, tp.eval_loader(model, val, batch_size=256, resize="paper", num_workers=0), device)
    plain = tp.probe_ssdc(model, probe_loader(), seed=0, device=device, progress=False)
    return dict(
        top1=acc,
        val_images=n,
        ssdc=list(plain.per_layer),
        probe_images=int(plain.settings["n_images"]),
        rpi=rpi_ssdc(model, probe_loader(), permutations, device),
    )


def child(spec_path: Path) -> None:
    """One run (``--child``): train into the scratch folder, measure, write the record."""
    import torch

    from timm_posgeom.app.recipe import Recipe
    from timm_posgeom.app.train import train

    spec = json.loads(spec_path.read_text())
    torch.set_num_threads(1)
    recipe = Recipe(**spec["recipe"]).validate()
    run_dir = Path(spec["run_dir"])
    started = time.time()
    summary = train(recipe, run_dir, progress=False)
    trained = time.time()
    record = dict(
        name=spec["name"],
        width=spec["width"],
        lr=spec["lr"],
        seed=spec["seed"],
        condition="ape",
        finished=True,
        train_s=round(trained - started, 1),
        steps=summary.steps,
        val_top1_training=summary.val_top1,
        **measure(run_dir, recipe, spec["probe_images"], spec["permutations"]),
    )
    record["measure_s"] = round(time.time() - trained, 1)
    Path(spec["record"]).write_text(json.dumps(record))


def _timed(step, batch: int, warmup: int, min_steps: int, seconds: float, sync) -> dict:
    """Images per second of ``step()`` after ``warmup`` calls, over at least ``min_steps`` calls and ``seconds``."""
    for _ in range(warmup):
        step()
    sync()
    start, steps = time.perf_counter(), 0
    while steps < min_steps or time.perf_counter() - start < seconds:
        step()
        steps += 1
    sync()
    elapsed = time.perf_counter() - start
    return dict(images_per_s=steps * batch / elapsed, steps=steps, batch=batch, s_per_step=elapsed / steps)


def throughput(tiny: bool, seconds: float) -> dict:
    """Training (and inference) images per second of the ``in100_paper_ape`` recipe's model in bf16 autocast on
    synthetic images held on the device, and the price of one paper run in GPU-hours."""
    import timm
    import torch
    import torch.nn as nn

    from timm_posgeom.app.recipe import load_recipe
    from timm_posgeom.app.train.build import build_optimizer

    recipe = load_recipe(RECIPES / "in100_paper_ape.yaml", TINY_MODEL if tiny else [])
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    model = timm.create_model(recipe.model, num_classes=100, img_size=recipe.img_size, **recipe.model_kwargs).to(device)
    batch = 4 if tiny else recipe.batch_size
    x = torch.randn(batch, 3, recipe.img_size, recipe.img_size, device=device)
    y = torch.randint(0, 100, (batch,), device=device)
    optimizer, loss_fn = build_optimizer(recipe, model), nn.CrossEntropyLoss(label_smoothing=recipe.label_smoothing)

    def train_step():
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = loss_fn(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    def infer_step():
        with torch.inference_mode(), torch.autocast(device.type, dtype=torch.bfloat16):
            model(x)

    warmup, min_steps = (1, 2) if tiny else (10, 30)
    train = _timed(train_step, batch, warmup, min_steps, seconds, sync)
    model.eval()
    infer = _timed(infer_step, batch, warmup, min_steps, seconds / 3, sync)
    train_h = PAPER_EPOCHS * PAPER_TRAIN_IMAGES / train["images_per_s"] / 3600
    eval_h = PAPER_EPOCHS * PAPER_VAL_IMAGES / infer["images_per_s"] / 3600  # one evaluation an epoch
    return dict(
        recipe="in100_paper_ape",
        model=recipe.model,
        model_kwargs=recipe.model_kwargs,
        img_size=recipe.img_size,
        optimizer=type(optimizer).__name__,
        precision="bf16 autocast",
        device=str(device),
        gpu=torch.cuda.get_device_name(0) if device.type == "cuda" else None,
        params=sum(p.numel() for p in model.parameters()),
        train=train,
        inference=infer,
        peak_memory_gib=torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None,
        paper_run=dict(
            epochs=PAPER_EPOCHS,
            train_images=PAPER_TRAIN_IMAGES,
            val_images=PAPER_VAL_IMAGES,
            train_gpu_hours=train_h,
            eval_gpu_hours=eval_h,
            gpu_hours=train_h + eval_h,
            study_gpu_hours_5_conditions_4_seeds=20 * (train_h + eval_h),
        ),
    )


def _specs(args, scratch: Path) -> list[dict]:
    """Every run of the ladder: its recipe (as a dict), scratch folder and record file."""
    widths, lrs, seeds = ((32,), LRS, (0,)) if args.tiny else (WIDTHS, LRS, SEEDS)
    extra = tuple(TINY_RUN) if args.tiny else ()
    # the runs work in the repository root: the data as a path from there (relative, as the studies record it)
    data = None if args.tiny else os.path.relpath(Path(args.data).resolve(), ROOT)
    specs = []
    for width in widths:
        for lr in lrs:
            for seed in seeds:
                name = f"w{width}_lr{lr:g}_s{seed}"
                recipe = ladder_recipe(width, lr, seed, data, extra)
                specs.append(
                    dict(
                        name=name,
                        width=width,
                        lr=lr,
                        seed=seed,
                        recipe=recipe.to_dict(),
                        run_dir=str(scratch / "runs" / name),
                        record=str(scratch / "records" / f"{name}.json"),
                        probe_images=16 if args.tiny else PROBE_IMAGES,
                        permutations=2 if args.tiny else PERMUTATIONS,
                    )
                )
    return specs


def _history(run_dir: Path) -> list[dict]:
    """The run's training log, smaller: every evaluation, and each logged training step's loss, lr and PE signals."""
    from timm_posgeom.app.train import read_metrics

    path = run_dir / "metrics.jsonl"
    keep = ("kind", "step", "epoch", "loss", "lr", "pe_ssdc", "pe_norm_ratio", "time_s")
    return [
        r if r.get("kind") == "eval" else {k: r[k] for k in keep if k in r}
        for r in (read_metrics(path) if path.is_file() else [])
        if r.get("kind") in ("train", "eval")
    ]


def _stop(procs: dict[str, subprocess.Popen], log) -> None:
    """Terminate the runs still going (the deadline came), then kill those that do not stop in 20 s."""
    for name, p in procs.items():
        if p.poll() is None:
            log(f"deadline: stopping {name}")
            p.terminate()
    end = time.time() + 20
    for p in procs.values():
        try:
            p.wait(timeout=max(0.1, end - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def ladder(args, scratch: Path, deadline: float, log) -> list[dict]:
    """Train and measure every run at once, one process each; the records, in plan order."""
    specs = _specs(args, scratch)
    (scratch / "records").mkdir(parents=True, exist_ok=True)
    (scratch / "logs").mkdir(parents=True, exist_ok=True)
    env = dict(
        os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", TORCH_ALLOW_TF32_CUBLAS_OVERRIDE="1", HF_HUB_OFFLINE="1"
    )
    procs = {}
    for spec in specs:
        path = scratch / "records" / f"{spec['name']}.spec.json"
        path.write_text(json.dumps(spec))
        with open(scratch / "logs" / f"{spec['name']}.log", "w") as out:
            procs[spec["name"]] = subprocess.Popen(
                [sys.executable, __file__, "--child", str(path)],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=ROOT,
            )
    log(f"ladder: {len(procs)} runs started at once")
    while any(p.poll() is None for p in procs.values()) and time.time() < deadline:
        time.sleep(2)
    _stop(procs, log)
    records = []
    for spec in specs:
        path, p = Path(spec["record"]), procs[spec["name"]]
        record = (
            json.loads(path.read_text())
            if path.is_file()
            else dict(
                name=spec["name"],
                width=spec["width"],
                lr=spec["lr"],
                seed=spec["seed"],
                condition="ape",
                finished=False,
            )
        )
        record.update(exit_code=p.returncode, history=_history(Path(spec["run_dir"])))
        log(
            f"{spec['name']}: exit {p.returncode}, "
            + (
                f"top-1 {record['top1']:.3f}, delta SSDC under RPI {record['rpi']['delta']:.3f}"
                if "top1" in record
                else "no measurement"
            )
        )
        records.append(record)
    return records


def _log_tails(scratch: Path, lines: int = 30) -> str:
    """The last lines of each run's own log."""
    parts = []
    for path in sorted((scratch / "logs").glob("*.log")):
        tail = path.read_text(errors="replace").replace("\r", "\n").splitlines()[-lines:]
        parts.append(f"--- {path.stem} (last {len(tail)} lines)\n" + "\n".join(tail))
    return "\n".join(parts)


def _free_device_memory() -> None:
    """Give the throughput model's memory back before the runs start (they share the GPU)."""
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _versions() -> dict:
    import platform

    import accelerate
    import timm
    import torch

    return dict(
        python=platform.python_version(),
        torch=torch.__version__,
        timm=timm.__version__,
        accelerate=accelerate.__version__,
        cuda=torch.version.cuda,
        gpu=torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    )


def run(args) -> int:
    """Throughput, then the ladder, within ``--deadline-s`` of the start; the four files into ``--out``."""
    started = time.time()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    scratch = Path(args.scratch or tempfile.mkdtemp(prefix="gpu-plan-"))
    lines: list[str] = []

    def log(message: str) -> None:
        line = f"[{time.time() - started:6.1f}s] {message}"
        print(line, flush=True)
        lines.append(line)

    deadline = args.deadline_s if args.deadline_s != float("inf") else None
    plan = dict(
        issue=39,
        tiny=args.tiny,
        data=args.data,
        deadline_s=deadline,
        stages=args.stages,
        widths=(32,) if args.tiny else WIDTHS,
        lrs=LRS,
        seeds=(0,) if args.tiny else SEEDS,
        versions=_versions(),
        scratch=str(scratch),
    )
    (out / "plan.json").write_text(json.dumps(plan, indent=1))
    if "throughput" in args.stages:
        result = throughput(args.tiny, seconds=0.0 if args.tiny else args.throughput_s)
        _free_device_memory()
        (out / "throughput.json").write_text(json.dumps(result, indent=1))
        log(
            f"throughput: {result['train']['images_per_s']:.0f} training images/s (batch {result['train']['batch']}), "
            f"one paper run {result['paper_run']['gpu_hours']:.2f} GPU-hours"
        )
    if "ladder" in args.stages:
        records = ladder(args, scratch, started + args.deadline_s - 30, log)
        with open(out / "ladder.jsonl", "w") as f:
            for record in records:
                f.write(json.dumps(record) + "\n")
        plan["runs_finished"] = sum(r["finished"] for r in records)
    plan["total_s"] = round(time.time() - started, 1)
    (out / "plan.json").write_text(json.dumps(plan, indent=1))
    log(f"done in {plan['total_s']} s")
    tails = _log_tails(scratch) if (scratch / "logs").is_dir() else ""
    (out / "log.txt").write_text("\n".join(lines) + "\n" + tails + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "runs/gpu-plan"), help="where the records go")
    parser.add_argument("--data", default="data/imagenette64", help="the 64-px ImageFolder copy of Imagenette")
    parser.add_argument("--tiny", action="store_true", help="a few CPU steps on synthetic data (CI)")
    parser.add_argument("--stages", default="throughput,ladder", help="throughput, ladder or both")
    parser.add_argument(
        "--deadline-s",
        type=float,
        default=None,
        help="the ladder stops 30 s before then (seconds from the start; default 540, none with --tiny)",
    )
    parser.add_argument("--throughput-s", type=float, default=20.0, help="seconds of timed training steps")
    parser.add_argument("--scratch", default=None, help="weights and logs (default: a new temporary folder)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(Path(args.child))
        return 0
    args.stages = tuple(s.strip() for s in args.stages.split(",") if s.strip())
    if args.deadline_s is None:  # the tiny mode runs on shared CPUs in CI: it waits for its runs
        args.deadline_s = float("inf") if args.tiny else 540.0
    if not set(args.stages) <= {"throughput", "ladder"} or not args.stages:
        print(f"error: --stages takes throughput, ladder or both, got {','.join(args.stages)!r}", file=sys.stderr)
        return 2
    if "ladder" in args.stages and not args.tiny and not Path(args.data).is_dir():
        print(
            f"error: --data {args.data} is not a folder: make it with experiments/scaling/make_imagenette64.py",
            file=sys.stderr,
        )
        return 2
    return run(args)


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the GPU machine reaches nothing: no Hub look-up may wait on it
    sys.exit(main())
