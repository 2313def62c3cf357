"""Command-line options shared by ``probe``, ``fragility`` and ``sweep``: defined once, here.

The same model and data flags, with the same defaults, and one loader (:func:`load_model_and_data`):
every measuring command accepts the same data sources (a Hub id, a parquet folder, an ImageFolder
tree, ``synthetic``) and preprocesses the same model the same way.
"""
from __future__ import annotations

import argparse
import sys
from typing import Any

from ..shifts import SPEC_FORMS


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="timm model name, hf-hub:ORG/NAME or local-dir:PATH")
    p.add_argument("--checkpoint", default=None, help="a checkpoint file to load into the model")
    p.add_argument("--pretrained", action="store_true",
                   help="load the timm name's pretrained weights (always on for hf-hub: / local-dir:)")
    p.add_argument("--num-classes", type=int, default=None,
                   help="classifier size (default with --checkpoint: the dataset's number of classes)")
    p.add_argument("--img-size", type=int, default=None,
                   help="input size S: the model is built for S x S where it has a fixed grid, and the images are "
                        "resized to S x S (dynamic-size ViTs and CNNs run at S; default: the model's own size)")


def add_data_args(p: argparse.ArgumentParser, max_images_help: str = "use only the first N images") -> None:
    p.add_argument("--data", required=True,
                   help="a Hugging Face Hub id, a local parquet folder, an ImageFolder tree, or 'synthetic'")
    p.add_argument("--split", default="validation", help="dataset split (default: validation)")
    p.add_argument("--max-images", type=int, default=None, help=max_images_help)
    p.add_argument("--resize", default="paper", choices=("paper", "timm"),
                   help="paper: straight to the input size (default); timm: timm's resize + centre crop")
    p.add_argument("--batch-size", type=int, default=64, help="images per batch (default 64)")
    p.add_argument("--num-workers", type=int, default=None, help="DataLoader workers (default min(4, cpus - 1))")
    p.add_argument("--bad-images", default="error", choices=("error", "skip"),
                   help="an image that cannot be decoded: error (default; named) or skip (checked first, left out, "
                        "listed)")


def add_labels_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--labels", default="check", choices=("check", "by-name", "as-is"),
                   help="how the data's labels meet the model's classes: check (default: refuse a different "
                        "number of classes, or different class names when the model records them), by-name (map "
                        "the data's class names onto the model's), as-is (use the indices unchecked)")


def match_labels(model: Any, data: Any, policy: str) -> Any:
    """The data split whose labels index the model's classes, or ValueError (one line) for a mismatch.

    An accuracy computed with mismatched labels is a silent wrong number: a 10-class model scored on
    a 3-class folder gives an accuracy and an FS that mean nothing."""
    from ..data import relabel_by_name

    if policy == "as-is":
        return data
    names = list((getattr(model, "pretrained_cfg", None) or {}).get("label_names") or [])
    model_classes = getattr(model, "num_classes", None)
    if policy == "by-name":
        if not names:
            raise ValueError("--labels by-name needs the model's class names (an export of posgeom train records "
                             "them in config.json); this model has none")
        return relabel_by_name(data, names)
    data_names = list(getattr(data, "classes", []) or [])
    if model_classes and data_names and model_classes != len(data_names):
        raise ValueError(f"the model has {model_classes} classes but the data has {len(data_names)}: accuracy and "
                         "FS would be meaningless; use the data the model was trained on, --labels by-name to map "
                         "classes by name, or --labels as-is if the indices match")
    if names and data_names and names != data_names:
        same_set = sorted(names) == sorted(data_names)
        raise ValueError(f"the model's class names differ from the data's ({names[:3]}... vs {data_names[:3]}...)"
                         + ("; the same classes in another order: --labels by-name maps them" if same_set else
                            "; pass --labels by-name to map them or --labels as-is to use the indices unchecked"))
    return data


def add_run_args(p: argparse.ArgumentParser, out: str, seed_help: str) -> None:
    p.add_argument("--seed", type=int, default=0, help=seed_help)
    p.add_argument("--device", default=None, help="cpu, cuda, ... (default: cuda when available)")
    p.add_argument("--out", default=out, help=f"output folder (default: {out})")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


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
    for flag in ("batch_size", "max_images", "num_workers", "img_size", "num_classes", "probe_images"):
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
    data = load_split(args.data, args.split, subset=args.max_images if subset else None)
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
