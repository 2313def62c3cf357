"""Benchmark of the SSDC probe (issue 3), all three figures measured in one run on this machine.

(a) ``probe_ssdc`` over all 12 sites of ViT-S/16 (batch 32, 224 px, reduction "both") relative to a
    plain forward pass of the same batch (both without autograd). Target <= 1.05x. The probe stops
    the forward after its last site, so the ratio to a forward stopped there (the probe's own work:
    similarity maps, SSDC, sums) is printed as well, and each reduction alone on that batch. Then, per
    reduction ("mean_map", the default, and "both"), the probe against a forward and against itself without
    the interval over images' 20 jackknife group sums: what that interval costs.
(b) per-image SSDC of 256 maps of 196 tokens: ``ssdc`` on the batch relative to a loop of
    ``scipy.stats.spearmanr`` over the maps. Target >= 50x faster. Also printed: the floor of an exact
    sort-based method here, the time to read the pairs of every map and sort them, nothing else.
(c) peak memory (max RSS of a fresh process) of a probe over 256 vs 2,048 images, streamed in batches
    of 32 generated on the fly. Target: flat.

Timings are interleaved and the minimum over ``--repeats`` is reported (medians too): the machine may
be shared. Run: ``python benchmarks/bench_probe.py`` (about 3-4 minutes on 2 CPU cores).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import timm
import torch

import timm_posgeom  # noqa: F401  (registers the models)
from timm_posgeom.probes import grid_positions, pair_distances, probe_ssdc, ssdc


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bench_probe_vs_forward(model_name: str, batch: int, img: int, repeats: int) -> dict:
    torch.manual_seed(0)
    model = timm.create_model(model_name, img_size=img).eval()
    x = torch.randn(batch, 3, img, img)

    def forward():
        with torch.inference_mode():
            model(x)

    def probe(reduction: str = "both"):
        probe_ssdc(model, x, reduction=reduction, batch_size=None, progress=False)

    class _Stop(Exception):
        pass

    def _stop(*_):
        raise _Stop

    def forward_to_last_site():  # what the probe must run anyway: up to the last block's norm1
        handle = model.blocks[-1].norm1.register_forward_hook(_stop)
        try:
            with torch.inference_mode():
                model(x)
        except _Stop:
            pass
        finally:
            handle.remove()

    others = ("mean_map", "per_image")  # each reduction alone on the same batch (mean_map is the default)
    forward(), probe(), forward_to_last_site(), *(probe(r) for r in others)  # warm up (allocator, caches, pool)
    fwd, prb, part = [], [], []
    alone: dict[str, list[float]] = {r: [] for r in others}
    for _ in range(repeats):
        fwd.append(_timed(forward))
        prb.append(_timed(probe))
        part.append(_timed(forward_to_last_site))
        for r in others:
            alone[r].append(_timed(lambda r=r: probe(r)))
    return {
        "forward_min_s": min(fwd),
        "probe_min_s": min(prb),
        "ratio_min": min(prb) / min(fwd),
        "ratio_median": statistics.median(prb) / statistics.median(fwd),
        "sites": len(model.blocks),
        "partial_min_s": min(part),
        "work_ratio": min(prb) / min(part),
        "alone": {r: (min(t) / min(fwd), statistics.median(t) / statistics.median(fwd)) for r, t in alone.items()},
    }


def bench_interval_cost(model_name: str, batch: int, img: int, repeats: int, batches: int) -> dict:
    """The interval over images' own cost: ``probe_ssdc`` without RPI with its 20 jackknife group sums against
    the same probe with none (the groups set to 0 for the comparison alone), per reduction, interleaved, over
    ``batches`` batches (the groups' SSDC is ranked once per call, after the last batch)."""
    from timm_posgeom.probes.ssdc_probe import probe as probe_module

    torch.manual_seed(0)
    model = timm.create_model(model_name, img_size=img).eval()
    x = torch.randn(batch * batches, 3, img, img)
    groups = probe_module.JACKKNIFE_GROUPS

    def run(reduction: str, with_groups: bool) -> float:
        probe_module.JACKKNIFE_GROUPS = groups if with_groups else 0
        try:
            return _timed(lambda: probe_ssdc(model, x, reduction=reduction, batch_size=batch, progress=False))
        finally:
            probe_module.JACKKNIFE_GROUPS = groups

    def forward() -> None:
        with torch.inference_mode():
            for chunk in x.split(batch):
                model(chunk)

    cases = [(r, g) for r in ("mean_map", "both") for g in (True, False)]
    times: dict = {c: [] for c in cases}
    fwd: list[float] = []
    for c in cases:
        run(*c)  # warm up
    for _ in range(repeats):
        fwd.append(_timed(forward))
        for c in cases:
            times[c].append(run(*c))
    out = {"forward_min_s": min(fwd)}
    for r in ("mean_map", "both"):
        out[r] = {
            "min_s": min(times[(r, True)]),
            "vs_forward": min(times[(r, True)]) / min(fwd),
            "vs_forward_median": statistics.median(times[(r, True)]) / statistics.median(fwd),
            "vs_no_groups": min(times[(r, True)]) / min(times[(r, False)]),
            "vs_no_groups_median": statistics.median(times[(r, True)]) / statistics.median(times[(r, False)]),
        }
    return out


def bench_ssdc_vs_scipy(n_maps: int, grid: int, repeats: int) -> dict:
    from scipy.stats import spearmanr

    gen = torch.Generator().manual_seed(0)
    tokens = torch.nn.functional.normalize(torch.randn(n_maps, grid * grid, 384, generator=gen), dim=-1)
    maps = tokens @ tokens.transpose(1, 2)  # (B, N, N) float32 cosine maps
    neg_d = -pair_distances(grid_positions((grid, grid))).numpy()
    iu = np.triu_indices(grid * grid, 1)
    maps_np = maps.numpy()

    def scipy_loop():
        return [spearmanr(m[iu], neg_d).statistic for m in maps_np]

    # The floor of any exact sort-based method with numpy: read each map's pairs i < j and sort them
    # (as the float64 keys ``ssdc`` sorts), nothing else, over the same number of threads.
    flat = maps_np.reshape(n_maps, -1)
    pair_index = iu[0] * grid * grid + iu[1]
    rows = 16

    def read_and_sort(i: int) -> None:
        np.take(flat[i : i + rows], pair_index, axis=1).astype(np.float64).sort(axis=1)

    pool = ThreadPoolExecutor(max_workers=torch.get_num_threads())

    def floor():
        list(pool.map(read_and_sort, range(0, n_maps, rows)))

    ours = ssdc(maps, (grid, grid))
    ref = scipy_loop()
    t_ours, t_scipy, t_floor = [], [], []
    for _ in range(repeats):
        t_ours.append(_timed(lambda: ssdc(maps, (grid, grid))))
        t_floor.append(_timed(floor))
        if len(t_scipy) < 2:
            t_scipy.append(_timed(scipy_loop))
    pool.shutdown()
    return {
        "ours_min_s": min(t_ours),
        "scipy_min_s": min(t_scipy),
        "speedup": min(t_scipy) / min(t_ours),
        "floor_min_s": min(t_floor),
        "floor_speedup": min(t_scipy) / min(t_floor),
        "max_abs_diff": float(np.abs(ours.double().numpy() - np.array(ref)).max()),
    }


def _memory_child(model_name: str, n_images: int, batch: int, img: int) -> None:
    """Run in a fresh process: probe n_images random images, print the max RSS in MiB."""
    torch.manual_seed(0)
    model = timm.create_model(model_name, img_size=img).eval()

    def batches():
        gen = torch.Generator().manual_seed(1)
        for start in range(0, n_images, batch):
            yield torch.randn(min(batch, n_images - start), 3, img, img, generator=gen)

    result = probe_ssdc(model, batches(), reduction="both", progress=False)
    assert result.metadata["n_images"] == n_images
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


def bench_memory(model_name: str, counts: list[int], batch: int, img: int) -> dict:
    out = {}
    for n in counts:
        proc = subprocess.run(
            [
                sys.executable,
                __file__,
                "--_memory-child",
                str(n),
                "--model",
                model_name,
                "--batch",
                str(batch),
                "--img",
                str(img),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        out[n] = float(proc.stdout.strip().splitlines()[-1])
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="vit_small_patch16_224")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--img", type=int, default=224)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--maps", type=int, default=256)
    p.add_argument("--interval-batches", type=int, default=4, help="batches of the interval's cost (a)")
    p.add_argument("--mem-images", type=int, nargs="+", default=[256, 2048])
    p.add_argument("--skip-memory", action="store_true")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--_memory-child", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args._memory_child is not None:
        _memory_child(args.model, args._memory_child, args.batch, args.img)
        return

    if args.threads:
        torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, timm {timm.__version__}, "
        f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs"
    )
    a = bench_probe_vs_forward(args.model, args.batch, args.img, args.repeats)
    print(
        f"(a) probe_ssdc over {a['sites']} sites of {args.model} (batch {args.batch}, {args.img} px, "
        f"reduction 'both'): {a['probe_min_s']:.3f} s vs forward {a['forward_min_s']:.3f} s -> "
        f"{a['ratio_min']:.3f}x (median ratio {a['ratio_median']:.3f}x; target <= 1.05x)"
    )
    print(
        f"    the probe stops after the last site (block {a['sites'] - 1}'s norm1); relative to a forward "
        f"stopped there ({a['partial_min_s']:.3f} s) it costs {a['work_ratio']:.3f}x: its own work"
    )
    print(
        "    each reduction alone, the same batch: "
        + "; ".join(f"{r!r} {lo:.3f}x (median ratio {med:.3f}x)" for r, (lo, med) in a["alone"].items())
    )
    j = bench_interval_cost(args.model, args.batch, args.img, args.repeats, args.interval_batches)
    for r in ("mean_map", "both"):
        print(
            f"    reduction {r!r} over {args.interval_batches} batches (without RPI, with the interval over "
            f"images): {j[r]['min_s']:.3f} s -> "
            f"{j[r]['vs_forward']:.3f}x a forward (median ratio {j[r]['vs_forward_median']:.3f}x); its 20 "
            f"jackknife group sums cost {j[r]['vs_no_groups']:.3f}x the same probe without them (median "
            f"{j[r]['vs_no_groups_median']:.3f}x)"
        )
    b = bench_ssdc_vs_scipy(args.maps, 14, args.repeats)
    print(
        f"(b) per-image SSDC of {args.maps} maps of 196 tokens: {b['ours_min_s'] * 1e3:.1f} ms vs scipy loop "
        f"{b['scipy_min_s'] * 1e3:.0f} ms -> {b['speedup']:.1f}x faster (target >= 50x); "
        f"max |diff| {b['max_abs_diff']:.1e}"
    )
    print(
        f"    floor: only reading the pairs and sorting them as float64 (numpy's sort, {torch.get_num_threads()} "
        f"threads) takes {b['floor_min_s'] * 1e3:.1f} ms -> {b['floor_speedup']:.1f}x"
    )
    if not args.skip_memory:
        mem = bench_memory(args.model, args.mem_images, args.batch, args.img)
        lo, hi = mem[min(mem)], mem[max(mem)]
        print(
            "(c) peak RSS: "
            + ", ".join(f"{n} images {v:.0f} MiB" for n, v in mem.items())
            + f" -> ratio {hi / lo:.3f} (target: flat)"
        )
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
