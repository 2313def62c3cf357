"""Command-line options shared by the commands (``probe``, ``fragility``, ``sweep``, ``zoo``): defined once, here.

One name and one meaning per idea: the same flag has the same default and help in every command that takes
it (``tests/test_package.py`` compares them across every command's ``--help``). ``--max-images`` bounds all
the work of a command unless a more specific option (``--probe-images``) says otherwise.

Nothing here imports torch or timm: ``posgeom --help`` and argument errors answer without them; the
heavy imports happen in the commands' ``run()``.

The same model and data flags, with the same defaults, and one loader (:func:`load_model_and_data`):
every measuring command accepts the same data sources (a Hub id, a parquet folder, an ImageFolder
tree, ``synthetic``) and preprocesses the same model the same way.
"""
from __future__ import annotations

import argparse
import sys
from typing import Any

from ..protocol import PROBE_IMAGES, RPI_PERMUTATIONS, SPEC_FORMS


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="timm model name, hf-hub:ORG/NAME or local-dir:PATH")
    p.add_argument("--checkpoint", default=None, help="a checkpoint file to load into the model")
    p.add_argument("--pretrained", action="store_true",
                   help="load the timm name's pretrained weights (always on for hf-hub: / local-dir:)")
    p.add_argument("--num-classes", type=int, default=None,
                   help="classifier size (default with --checkpoint: the dataset's number of classes)")
    add_img_size_arg(p)


def add_img_size_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--img-size", type=int, default=None,
                   help="input size S: the model is built for S x S where it has a fixed grid, and the images are "
                        "resized to S x S (dynamic-size ViTs and CNNs run at S; default: the model's own size)")


MAX_IMAGES_HELP = ("use at most the first N images of the split, for all the work (SSDC and fragility alike, "
                   "unless --probe-images says otherwise); default: the whole split")


def add_source_args(p: argparse.ArgumentParser, required: bool = True) -> None:
    """--data, --split, and a Hub or parquet set's --data-config, --revision and --streaming."""
    p.add_argument("--data", required=required,
                   help="a Hugging Face Hub id, a local parquet folder, an ImageFolder tree, or 'synthetic'")
    add_split_args(p)


def add_split_args(p: argparse.ArgumentParser) -> None:
    """--split and the Hub options (:func:`add_hub_data_args`)."""
    p.add_argument("--split", default="validation",
                   help="dataset split (default: validation); only this split is downloaded and prepared")
    add_hub_data_args(p)


def add_hub_data_args(p: argparse.ArgumentParser) -> None:
    """The options of a Hub (or parquet) data set: configuration, revision, streaming."""
    p.add_argument("--data-config", default=None, metavar="NAME",
                   help="the data set's configuration (Hub and parquet sets with several)")
    p.add_argument("--revision", default=None, help="a branch, tag or commit of a Hub data set")
    p.add_argument("--streaming", action="store_true",
                   help="stream the split's first --max-images images instead of downloading the split")


def hub_data_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """``load_split``'s config, revision and streaming from the flags of :func:`add_hub_data_args`."""
    return dict(config=args.data_config, revision=args.revision, streaming=args.streaming)


def add_max_images_arg(p: argparse.ArgumentParser) -> None:
    """--max-images: the one limit on the images of a command's work."""
    p.add_argument("--max-images", type=int, default=None, metavar="N", help=MAX_IMAGES_HELP)


def add_probe_images_arg(p: argparse.ArgumentParser) -> None:
    """--probe-images: the SSDC probe's own count, inside a command that also measures fragility."""
    p.add_argument("--probe-images", type=int, default=None, metavar="N",
                   help=f"images for SSDC under RPI (default: {PROBE_IMAGES}, the paper's count, or --max-images "
                        "if fewer)")


def add_loader_args(p: argparse.ArgumentParser) -> None:
    """--resize, --batch-size and --num-workers."""
    p.add_argument("--resize", default="paper", choices=("paper", "timm"),
                   help="paper: straight to the input size (default); timm: timm's resize + centre crop")
    p.add_argument("--batch-size", type=int, default=64, help="images per batch (default 64)")
    p.add_argument("--num-workers", type=int, default=None, help="DataLoader workers (default min(4, cpus - 1))")


def add_data_args(p: argparse.ArgumentParser) -> None:
    """The data flags of a command that measures one model: source, limit, loader, bad images."""
    add_source_args(p)
    add_max_images_arg(p)
    add_loader_args(p)
    p.add_argument("--bad-images", default="error", choices=("error", "skip"),
                   help="an image that cannot be decoded: error (default; named) or skip (checked first, left out, "
                        "listed)")


def add_labels_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--labels", default="check", choices=("check", "by-name", "as-is"),
                   help="how the data's labels meet the model's classes: check (default: refuse a different number "
                        "of classes or different class names), by-name (map the data's classes onto the model's by "
                        "its recorded class names, or an ImageNet head's WordNet ids and names), as-is (use the "
                        "indices unchecked)")


SEED_HELP = ("seed of everything random (default 0): torch before a model is built (random init), the RPI "
             "permutation, the bootstrap, random corruptions")


def add_imagenet_c_jpeg_blur_arg(p: argparse.ArgumentParser) -> None:
    """--imagenet-c-jpeg-blur (zoo, study); its old name --imagenet-c, which meant something else in
    ``fragility`` (every ImageNet-C corruption), is accepted for one release with a warning
    (:func:`imagenet_c_jpeg_blur`)."""
    p.add_argument("--imagenet-c-jpeg-blur", action="store_true",
                   help="also ImageNet-C's JPEG and blur corruptions at severities 1-5 (10 more shifts; posgeom "
                        "fragility --imagenet-c runs every ImageNet-C corruption)")
    p.add_argument("--imagenet-c", dest="imagenet_c_old_name", action="store_true", help=argparse.SUPPRESS)


def imagenet_c_jpeg_blur(args: argparse.Namespace) -> bool:
    """Whether --imagenet-c-jpeg-blur was given (or its old name, with a warning on stderr)."""
    if getattr(args, "imagenet_c_old_name", False):
        print(f"posgeom {args.command}: warning: --imagenet-c is deprecated here and will be removed in the next "
              "release: use --imagenet-c-jpeg-blur (the same: ImageNet-C's JPEG and blur, severities 1-5)",
              file=sys.stderr)
        return True
    return bool(args.imagenet_c_jpeg_blur)


RPI_PERMUTATIONS_HELP = (f"RPI permutations (default {RPI_PERMUTATIONS}): every SSDC and attention number under RPI is "
                         "the mean over K seeded permutations (seeds SEED .. SEED+K-1; an alpha sweep draws K afresh "
                         "for each alpha), with a 95%% interval over them; 1 gives no interval")
RPI_HELP = ("random permutation of the patch tokens at inference, before any PE: SSDC and attention average over "
            "--rpi-permutations shared permutations; accuracy (fragility) gives each image a permutation of its own")


def add_rpi_permutations_arg(p: argparse.ArgumentParser) -> None:
    """--rpi-permutations K: the permutations every measurement under RPI averages over."""
    p.add_argument("--rpi-permutations", type=int, default=None, metavar="K", help=RPI_PERMUTATIONS_HELP)


def add_intervention_args(p: argparse.ArgumentParser, shared: bool = True) -> None:
    """--rpi, --rpi-permutations and --alpha: the interventions a measuring command applies
    (docs/method.md#rpi-and-rpt). ``shared``: RPI averages over shared permutations (SSDC, attention: the flag
    --rpi-permutations); else each image has its own (accuracy: no such flag)."""
    p.add_argument("--rpi", action="store_true", help=RPI_HELP)
    if shared:
        add_rpi_permutations_arg(p)
    p.add_argument("--alpha", type=float, default=None, help="scale the positional encoding by alpha")


def add_distance_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--distance", default="manhattan", choices=("manhattan", "euclidean", "chebyshev"),
                   help="grid distance of SSDC (default manhattan; attention's mean attention distance is always "
                        "Euclidean)")


def add_seed_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seed", type=int, default=0, help=SEED_HELP)


def add_device_args(p: argparse.ArgumentParser) -> None:
    """--device and --no-progress."""
    p.add_argument("--device", default=None, help="cpu, cuda, ... (default: cuda when available)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def add_run_args(p: argparse.ArgumentParser, out: str) -> None:
    """--seed, --device, --out (default ``out``) and --no-progress."""
    add_seed_arg(p)
    p.add_argument("--out", default=out, help=f"output folder (default: {out})")
    add_device_args(p)


def add_shift_arg(p: argparse.ArgumentParser, default_help: str) -> None:
    p.add_argument("--shift", action="append", default=None, metavar="SPEC",
                   help=f"a shift, repeatable (default: {default_help}); forms: " + "; ".join(SPEC_FORMS))


def add_site_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--site", default="auto", choices=("auto", "attn_input", "block_output", "stage_output"),
                   help="probe site: auto (default: attn_input for a flat ViT, stage_output otherwise), the input of "
                        "each block's attention (the paper's), each block's output, or each stage's feature map "
                        "(hierarchical ViTs, CNNs: each on its own grid)")


def check_counts(args: argparse.Namespace) -> None:
    """Refuse counts no run could use (one line, before anything is loaded)."""
    for flag in ("batch_size", "max_images", "num_workers", "img_size", "num_classes", "probe_images", "images",
                 "rpi_permutations"):
        value = getattr(args, flag, None)
        low = 0 if flag == "num_workers" else 1
        if value is not None and value < low:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= {low}, got {value}")


def load_model_and_data(args: argparse.Namespace, subset: bool = True) -> tuple[Any, Any, str]:
    """(model on its device in eval mode, the data split, device) from the shared arguments; the split cut
    to ``--max-images`` when ``subset`` (a command whose probe has its own count passes False).

    torch is seeded with ``--seed`` before the model is built (a random-init model is reproducible).
    """
    import torch

    from ..data import check_images, load_split
    from ..factory import create_model

    check_counts(args)
    data = load_split(args.data, args.split, subset=args.max_images if subset else None, **hub_data_kwargs(args))
    if args.bad_images == "skip":
        data = check_images(data, "skip", progress=not args.no_progress)
        if data.skipped:
            print(f"left out {len(data.skipped)} image(s) that cannot be decoded: {'; '.join(data.skipped[:5])}"
                  f"{' ...' if len(data.skipped) > 5 else ''}", file=sys.stderr)
    if len(data) == 0:
        raise ValueError(f"the {args.split!r} split of {args.data} is empty")
    num_classes = args.num_classes
    if num_classes is None and args.checkpoint is not None:
        num_classes = data.num_classes
    torch.manual_seed(args.seed)
    model = create_model(args.model, pretrained=args.pretrained, checkpoint=args.checkpoint,
                         img_size=args.img_size, num_classes=num_classes)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    model.to(device).eval()
    return model, data, device
