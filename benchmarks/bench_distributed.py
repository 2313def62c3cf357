"""Benchmark of data-parallel measuring (issue 15): throughput of ``probe_ssdc`` with 1 and 2 processes,
measured in one run on this machine (and on GPUs when there are some).

The probe reads :func:`~timm_posgeom.data.eval_data.eval_loader` batches of synthetic images (rendered on the
fly, so each process renders only its own shard) through a random-init ViT, reduction "both". One
process runs alone (no launcher) with every core, and with one core (the kernels of each of W
single-thread processes); W processes run under ``accelerate launch`` (CPU: its torchrun-based
launcher with ACCELERATE_USE_CPU=1, gloo), each with cores / W torch threads. Each configuration probes ``--repeats`` times after a warm-up; the minimum wall
time of a whole probe (sharding, forward, SSDC and the reduction across processes) gives images/s.
The per-layer SSDC of W processes is compared with one process's (it must agree to float rounding).

Process start-up (imports, model build, rendezvous) is not timed: it is paid once per launch, not per
image. The machine may be shared: minima over repeats are reported, with the load average.
Run: ``python benchmarks/bench_distributed.py`` (about 2-3 minutes on 2 CPU cores).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time


def _worker(args: argparse.Namespace) -> None:
    """One process of a configuration: probe ``--repeats`` times; the main process writes the timings."""
    import timm
    import torch

    import timm_posgeom  # noqa: F401  (registers the models)
    from timm_posgeom.data.eval_data import eval_loader
    from timm_posgeom.data.synthetic import SyntheticShapes
    from timm_posgeom.measuring import distributed
    from timm_posgeom.probes import probe_ssdc

    world = distributed.setup()
    torch.set_num_threads(max(1, args.threads))
    device = args.device if args.device != "cuda" else (distributed.default_device() or "cuda")
    torch.manual_seed(0)
    model = timm.create_model(args.model, img_size=args.img).eval().to(device)
    data = SyntheticShapes(args.images, img_size=args.img, split="validation")
    loader = eval_loader(model, data, batch_size=args.batch, num_workers=0)

    def probe(n: int):
        return probe_ssdc(model, loader, reduction="both", max_images=n, progress=False)

    probe(min(args.images, args.batch * world))  # warm-up: allocator, thread pool, kernels
    times, result = [], None
    for _ in range(args.repeats):
        distributed.all_gather_objects(None)  # start together
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        start = time.perf_counter()
        result = probe(args.images)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    slowest = [max(ts) for ts in zip(*distributed.all_gather_objects(times))]  # the run ends with its last process
    if distributed.is_main():
        with open(args.out, "w") as f:
            json.dump(
                {
                    "world": world,
                    "times": slowest,
                    "per_layer": result.per_layer,
                    "n_images": result.metadata["n_images"],
                    "threads": torch.get_num_threads(),
                },
                f,
            )


def _free_port() -> int:
    """A port free now (accelerate before 1.7 hands ``--main_process_port 0`` to the workers as port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(world: int, device: str, threads: int, args: argparse.Namespace, out: str) -> dict:
    """Start one configuration (W processes, or one alone) and read its main process's timings."""
    worker = [
        __file__,
        "--_worker",
        "--out",
        out,
        "--device",
        device,
        "--threads",
        str(threads),
        "--model",
        args.model,
        "--images",
        str(args.images),
        "--batch",
        str(args.batch),
        "--img",
        str(args.img),
        "--repeats",
        str(args.repeats),
    ]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        env.pop(key, None)
    if world == 1:
        cmd = [sys.executable, *worker]
    else:
        cmd = [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--multi_gpu",
            "--num_processes",
            str(world),
            "--num_machines",
            "1",
            "--mixed_precision",
            "no",
            "--dynamo_backend",
            "no",
            "--main_process_port",
            str(_free_port()),
            "--num_cpu_threads_per_process",
            str(threads),
            *worker,
        ]
        if device == "cpu":
            env["ACCELERATE_USE_CPU"] = "1"
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{world} process(es) on {device} failed:\n{proc.stderr[-3000:]}")
    with open(out) as f:
        return json.load(f)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="vit_small_patch16_224")
    p.add_argument("--images", type=int, default=96)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--img", type=int, default=224)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--processes", type=int, nargs="+", default=[1, 2], help="configurations on CPU (default 1 2)")
    p.add_argument("--no-gpu", action="store_true", help="skip the GPU configurations")
    p.add_argument("--_worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    p.add_argument("--device", default="cpu", help=argparse.SUPPRESS)
    p.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args._worker:
        _worker(args)
        return

    import torch

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    print(
        f"torch {torch.__version__}, {cores} CPU cores, load average {os.getloadavg()[0]:.2f}; {args.model}, "
        f"{args.images} synthetic images of {args.img} px, batch {args.batch}, reduction 'both', "
        f"min of {args.repeats} repeats"
    )
    # one process with every core, one process with one core (the kernels of each of W single-thread
    # processes: its SSDC must agree to float64 rounding), then W processes with cores / W threads each
    configs = [(1, "cpu", cores)] + ([(1, "cpu", 1)] if cores > 1 else [])
    configs += [(w, "cpu", max(1, cores // w)) for w in args.processes if w > 1]
    gpus = torch.cuda.device_count() if not args.no_gpu else 0
    if gpus:
        configs += [(1, "cuda", max(1, cores // 2))] + (
            [(gpus, "cuda", max(1, cores // (2 * gpus)))] if gpus > 1 else []
        )
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i, (world, device, threads) in enumerate(configs):
            results[(world, device, threads)] = _run(world, device, threads, args, os.path.join(tmp, f"{i}.json"))
    for device in ("cpu", "cuda"):
        rows = [(w, t, r) for (w, d, t), r in results.items() if d == device]
        if not rows:
            continue
        base = rows[0][2]
        for world, threads, r in rows:
            assert r["n_images"] == args.images, r
            same = next((b for w, t, b in rows if w == 1 and t == threads), base)  # same kernels per process
            rate = args.images / min(r["times"])
            ratio = min(base["times"]) / min(r["times"])
            diff = max(abs(a - b) for a, b in zip(r["per_layer"], same["per_layer"]))
            print(
                f"{device:4s} {world} process(es) x {threads} thread(s): {rate:7.2f} images/s "
                f"(best {min(r['times']):.2f} s; all {', '.join(f'{t:.2f}' for t in r['times'])}) -> "
                f"{ratio:.2f}x of 1 process x {rows[0][1]}; max |SSDC diff| vs 1 process x {threads}: {diff:.1e}"
            )
    if not gpus and not args.no_gpu:
        print("no GPU here: GPU configurations skipped")
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
