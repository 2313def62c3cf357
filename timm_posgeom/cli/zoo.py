"""``posgeom zoo MODEL [MODEL ...] --data D --out DIR``: measure many models the same way, one row per model.

Per model: SSDC per layer (per stage for hierarchical models), normal and under RPI, delta SSDC, clean
top-1 and FS under the paper's shifts (where the data's labels match the model's classes), optionally
an alpha sweep. Writes ``DIR/models/<name>.json`` as each model finishes, then ``zoo.csv``, ``zoo.md``
and ``figures/``. A rerun into the same DIR skips the models already measured with the same settings.
"""
from __future__ import annotations

import argparse
import sys
from typing import Any

from ._options import add_site_arg, check_counts


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "zoo", help="measure many models (SSDC normal and under RPI, delta SSDC, fragility) and compare them",
        description="Measure every model the same way and write zoo.csv (one row per model, as timm's "
                    "results/*.csv), zoo.md and figures. Resumable: a rerun into the same --out skips the models "
                    "already measured with the same settings and retries the failed ones.")
    p.add_argument("models", nargs="*", metavar="MODEL",
                   help="timm model names (ours included), hf-hub:ORG/NAME or local-dir:PATH")
    p.add_argument("--models-file", default=None, metavar="FILE",
                   help="a file with one model per line ('#' starts a comment)")
    p.add_argument("--filter", default=None, metavar="PATTERN",
                   help="timm.list_models(PATTERN): the names with pretrained weights (name.tag) unless --no-pretrained")
    p.add_argument("--data", default=None,
                   help="a Hugging Face Hub id, a local parquet folder, an ImageFolder tree, or 'synthetic' (required "
                        "unless --merge)")
    p.add_argument("--split", default="validation", help="dataset split (default: validation)")
    p.add_argument("--out", default="zoo_out", help="output folder (default: zoo_out); a rerun into it resumes")
    p.add_argument("--pretrained", default=None, action=argparse.BooleanOptionalAction,
                   help="timm names: --pretrained loads timm's weights (a name without any fails); --no-pretrained "
                        "builds every timm name at random init (seeded by --seed). Default: weights for every timm "
                        "name that has them, random init (marked in the weights column) for those that have none. "
                        "hf-hub: and local-dir: always load theirs")
    p.add_argument("--images", type=int, default=1000,
                   help="the first N images of the split for SSDC and for fragility (default 1000, the paper's)")
    p.add_argument("--img-size", type=int, default=None,
                   help="measure every model at S x S (default: each model's own input size)")
    p.add_argument("--resize", default="paper", choices=("paper", "timm"),
                   help="paper: straight to the input size (default); timm: timm's resize + centre crop")
    add_site_arg(p)
    p.add_argument("--alphas", default=None,
                   help="comma-separated PE scales for an alpha sweep per model (delta SSDC under RPI, JPEG q5 FS)")
    p.add_argument("--imagenet-c", action="store_true",
                   help="also ImageNet-C's JPEG and blur corruptions at severities 1-5 (10 more shifts)")
    p.add_argument("--batch-size", type=int, default=64, help="images per batch (default 64)")
    p.add_argument("--num-workers", type=int, default=None, help="DataLoader workers (default min(4, cpus - 1))")
    p.add_argument("--seed", type=int, default=0,
                   help="seeds random init (before each model is built), the RPI permutation and the bootstrap")
    p.add_argument("--device", default=None, help="cpu, cuda, ... (default: cuda when available)")
    p.add_argument("--allow-changes", action="store_true",
                   help="accept settings that differ from those DIR was measured with: its models are measured "
                        "again (former records kept as .replaced-N)")
    p.add_argument("--shard", default=None, metavar="K/N",
                   help="measure only the zoo's models K, K+N, K+2N, ... (0 <= K < N): one shard of a job array or "
                        "of one job per node; shards may run at once into one --out (a lock per model), and each "
                        "writes the table of every record present when it ends")
    p.add_argument("--decode-per-model", action="store_true",
                   help="decode and resize the images again for every model (default: once for the zoo, and once per "
                        "input configuration; the same numbers either way, this is slower; for benchmarks)")
    p.add_argument("--merge", action="store_true",
                   help="measure nothing: write zoo.csv, zoo.md and the figures of --out again from every record "
                        "its shards wrote, and name the models not measured yet")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def _merge(args: argparse.Namespace) -> int:
    from ..app.zoo import merge_zoo

    if args.models or args.models_file or args.filter or args.shard:
        raise ValueError("--merge measures nothing: give only --out (and no models, --models-file, --filter or --shard)")
    summary, missing = merge_zoo(args.out)
    print(f"{len(summary.records)} models: {args.out}/zoo.csv, {args.out}/zoo.md, {args.out}/figures/")
    if missing:
        print(f"{len(missing)} model(s) not measured yet: {', '.join(missing)}", file=sys.stderr)
    return 0


def run(args: argparse.Namespace) -> int:
    from ..app.zoo import ZooConfig, filter_models, is_main_process, parse_shard, read_models_file, run_zoo

    if args.merge:
        return _merge(args)
    from ..shifts import IMAGENET_C, PAPER_SHIFTS, imagenet_c_shifts
    from .sweep import parse_alphas

    if args.data is None:
        raise ValueError("--data is required (the images every model is measured on)")
    check_counts(args)
    if args.images < 1:
        raise ValueError(f"--images must be >= 1, got {args.images}")
    pretrained = {None: "auto", True: "on", False: "off"}[args.pretrained]
    names = list(args.models)
    if args.models_file:
        names += read_models_file(args.models_file)
    if args.filter:
        names += filter_models(args.filter, pretrained)
    shifts = list(PAPER_SHIFTS) + (imagenet_c_shifts(list(IMAGENET_C)) if args.imagenet_c else [])  # its JPEG and blur, severities 1-5
    config = ZooConfig(data=args.data, split=args.split, images=args.images, site=args.site, resize=args.resize,
                       img_size=args.img_size, pretrained=pretrained, shifts=tuple(shifts),
                       alphas=tuple(parse_alphas(args.alphas)) if args.alphas else None, seed=args.seed,
                       batch_size=args.batch_size, num_workers=args.num_workers, device=args.device,
                       shared_decode=not args.decode_per_model)
    try:
        summary = run_zoo(names, config, args.out, allow_changes=args.allow_changes, progress=not args.no_progress,
                          shard=parse_shard(args.shard) if args.shard else None)
    except KeyboardInterrupt:
        if is_main_process():
            print(f"\ninterrupted: the finished models are kept in {args.out}/models; the same command continues",
                  file=sys.stderr)
        return 130
    if not is_main_process():
        return 1 if summary.failed else 0
    print(f"{len(summary.records)} models ({len(summary.measured)} measured now, {len(summary.skipped)} kept): "
          f"{args.out}/zoo.csv, {args.out}/zoo.md, {args.out}/figures/")
    if summary.failed:
        print(f"{len(summary.failed)} model(s) failed:", file=sys.stderr)
        for r in summary.failed:
            print(f"  {r.model}: {r.error}", file=sys.stderr)
        return 1
    return 0
