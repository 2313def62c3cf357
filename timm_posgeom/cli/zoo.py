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

from ..errors import SettingError
from ._options import (
    PRETRAINED_HELP,
    add_bad_images_arg,
    add_components_arg,
    add_device_args,
    add_imagenet_c_jpeg_blur_arg,
    add_img_size_arg,
    add_labels_arg,
    add_loader_args,
    add_max_images_arg,
    add_pretrained_arg,
    add_probe_images_arg,
    add_rpi_permutations_arg,
    add_seed_arg,
    add_site_arg,
    add_split_args,
    check_counts,
    components_arg,
    protocol_options,
)


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "zoo",
        help="measure many models (SSDC normal and under RPI, delta SSDC, fragility) and compare them",
        description="Measure every model the same way and write zoo.csv (one row per model, as timm's "
        "results/*.csv), zoo.md and figures. Resumable: a rerun into the same --out skips the models "
        "already measured with the same settings and retries the failed ones.",
    )
    _add_model_list_args(p)
    p.add_argument(
        "--data",
        default=None,
        help="a Hugging Face Hub id, a local parquet folder, an ImageFolder tree, or 'synthetic' (required "
        "unless --merge)",
    )
    add_split_args(p)
    p.add_argument("--out", default="zoo_out", help="output folder (default: zoo_out); a rerun into it resumes")
    add_pretrained_arg(
        p,
        default=None,
        help=PRETRAINED_HELP + "Default: weights for every timm name that has them, "
        "random init (marked in the weights column) for those that have none",
    )
    add_labels_arg(
        p,
        default="by-name",
        default_help="by-name (a model whose classes cannot be matched gets no "
        "top-1 and FS, with the reason, rather than an error)",
    )
    add_bad_images_arg(p)
    add_max_images_arg(p)
    add_probe_images_arg(p)
    # renamed: --images N (SSDC and fragility on the first N) is --max-images N; accepted for one release
    p.add_argument("--images", type=int, default=None, help=argparse.SUPPRESS)
    add_img_size_arg(p)
    add_site_arg(p)
    p.add_argument(
        "--alphas",
        default=None,
        help="comma-separated PE scales for an alpha sweep per model (delta SSDC under RPI, JPEG q5 FS)",
    )
    add_components_arg(p)  # the sweep's: those encodings alone
    add_imagenet_c_jpeg_blur_arg(p)
    add_loader_args(p)
    add_seed_arg(p)
    add_rpi_permutations_arg(p)
    _add_run_args(p)
    add_device_args(p)


def _add_model_list_args(p: argparse.ArgumentParser) -> None:
    """The models: names, --models-file, --filter."""
    p.add_argument(
        "models", nargs="*", metavar="MODEL", help="timm model names (ours included), hf-hub:ORG/NAME or local-dir:PATH"
    )
    p.add_argument(
        "--models-file", default=None, metavar="FILE", help="a file with one model per line ('#' starts a comment)"
    )
    p.add_argument(
        "--filter",
        default=None,
        metavar="PATTERN",
        help="timm.list_models(PATTERN): the names with pretrained weights (name.tag) unless --no-pretrained",
    )
    p.add_argument(
        "--model-set",
        default=None,
        choices=("pe-variants",),
        help="a list of models: pe-variants (timm's Naver RoPE-ViTs S/B/L, axial and mixed, with and without an "
        "absolute table; DeiT III; EVA-02; a DINOv3), with timm's published ImageNet / -R / -A / -Sketch top-1 "
        "beside the zoo's numbers",
    )


def _add_run_args(p: argparse.ArgumentParser) -> None:
    """How the zoo runs: --allow-changes, --shard, --extras, --decode-per-model, --merge."""
    p.add_argument(
        "--allow-changes",
        action="store_true",
        help="accept settings that differ from those DIR was measured with: its models are measured "
        "again (former records kept as .replaced-N)",
    )
    p.add_argument(
        "--shard",
        default=None,
        metavar="K/N",
        help="measure only the zoo's models K, K+N, K+2N, ... (0 <= K < N): one shard of a job array or "
        "of one job per node; shards may run at once into one --out (a lock per model), and each "
        "writes the table of every record present when it ends",
    )
    p.add_argument(
        "--extras",
        default="attention,position",
        help="measures beyond SSDC and fragility, comma-separated: attention (mean attention distance and "
        "entropy per block and head), position (the linear row/col position probe, normal and under "
        "RPI); 'none' for neither (default: attention,position; flat ViTs only)",
    )
    p.add_argument(
        "--decode-per-model",
        action="store_true",
        help="decode and resize the images again for every model (default: once for the zoo, and once per "
        "input configuration; the same numbers either way, this is slower; for benchmarks)",
    )
    p.add_argument(
        "--merge",
        action="store_true",
        help="measure nothing: write zoo.csv, zoo.md and the figures of --out again from every record "
        "its shards wrote, and name the models not measured yet",
    )


def _merge(args: argparse.Namespace) -> int:
    from ..app.zoo import merge_zoo

    if args.models or args.models_file or args.filter or args.model_set or args.shard:
        raise SettingError(
            "--merge measures nothing: give only --out (and no models, --models-file, --filter, --model-set or --shard)"
        )
    summary, missing = merge_zoo(args.out)
    print(f"{len(summary.records)} models: {args.out}/zoo.csv, {args.out}/zoo.md, {args.out}/figures/")
    if missing:
        print(f"{len(missing)} model(s) not measured yet: {', '.join(missing)}", file=sys.stderr)
    return 0


def _legacy_images(args: argparse.Namespace) -> None:
    """``--images N``, the old name of ``--max-images N`` (and of ``--probe-images N`` when not given), for one
    release."""
    if args.images is None:
        return
    if args.max_images is not None:
        raise SettingError("--images is the old name of --max-images: give only --max-images")
    print(
        "posgeom zoo: warning: --images is deprecated and will be removed in the next release: use "
        "--max-images N (the same: SSDC and fragility on the first N images)",
        file=sys.stderr,
    )
    args.max_images = args.images
    if args.probe_images is None:
        args.probe_images = args.images


def _names(args: argparse.Namespace, pretrained: str) -> list[str]:
    """The models asked for: the arguments, then --models-file, then --filter, then --model-set."""
    from ..app.zoo import filter_models, model_set, read_models_file

    names = list(args.models)
    if args.model_set:
        names += [n for n in model_set(args.model_set) if n not in names]
    if args.models_file:
        names += read_models_file(args.models_file)
    if args.filter:
        names += filter_models(args.filter, pretrained)
    return names


def zoo_config(args: argparse.Namespace, pretrained: str) -> Any:
    """The :class:`~timm_posgeom.app.zoo.ZooConfig` of the flags: the measuring flags by their protocol names
    (:func:`~timm_posgeom.cli._options.protocol_options`), then the zoo's own."""
    from ..app.zoo import ZooConfig

    measuring = protocol_options(args)
    measuring.pop("progress")  # how it runs, not what it measures: run_zoo's own
    return ZooConfig(
        data=args.data,
        split=args.split,
        pretrained=pretrained,
        alpha_components=tuple(components_arg(args) or ()) or None,
        shared_decode=not args.decode_per_model,
        data_config=args.data_config,
        revision=args.revision,
        streaming=args.streaming,
        bad_images=args.bad_images,
        **measuring,
    )


def run(args: argparse.Namespace) -> int:
    from ..app.zoo import is_main_process, parse_shard, run_zoo

    if args.merge:
        return _merge(args)
    if args.data is None:
        raise SettingError("--data is required (the images every model is measured on)")
    check_counts(args)
    _legacy_images(args)
    pretrained = {None: "auto", True: "on", False: "off"}[args.pretrained]
    names = _names(args, pretrained)
    config = zoo_config(args, pretrained)
    try:
        summary = run_zoo(
            names,
            config,
            args.out,
            allow_changes=args.allow_changes,
            progress=not args.no_progress,
            shard=parse_shard(args.shard) if args.shard else None,
        )
    except KeyboardInterrupt:
        if is_main_process():
            print(
                f"\ninterrupted: the finished models are kept in {args.out}/models; the same command continues",
                file=sys.stderr,
            )
        return 130
    if not is_main_process():
        return 1 if summary.failed else 0
    print(
        f"{len(summary.records)} models ({len(summary.measured)} measured now, {len(summary.skipped)} kept): "
        f"{args.out}/zoo.csv, {args.out}/zoo.md, {args.out}/figures/"
    )
    if summary.locked:  # never counted as measured: another process holds them (or held them and is gone)
        print(
            f"{len(summary.locked)} model(s) not measured here, locked by another process (see above for how to "
            f"clear a lock whose process is gone): {', '.join(summary.locked[:5])}"
            f"{' ...' if len(summary.locked) > 5 else ''}",
            file=sys.stderr,
        )
    if summary.failed:
        print(f"{len(summary.failed)} model(s) failed:", file=sys.stderr)
        for r in summary.failed:
            print(f"  {r.model}: {r.error}", file=sys.stderr)
        return 1
    return 0
