"""``posgeom probe MODEL --data PATH_OR_HUB_ID``: SSDC per layer of any timm ViT on a dataset.

Prints a per-layer table and writes ``ssdc.json`` and ``ssdc.png`` under ``--out``.
MODEL is any timm name (this package's models included), ``hf-hub:org/name`` or ``local-dir:PATH``.
"""
from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("probe", help="SSDC per layer of a timm ViT on a dataset (optionally under RPI)")
    p.add_argument("model", help="timm model name, hf-hub:ORG/NAME or local-dir:PATH")
    p.add_argument("--data", required=True, help="dataset folder or Hugging Face Hub id (datasets.load_dataset)")
    p.add_argument("--split", default="validation", help="dataset split (default: validation)")
    p.add_argument("--checkpoint", default=None, help="a checkpoint file to load into the model")
    p.add_argument("--pretrained", action="store_true",
                   help="load the timm name's pretrained weights (always on for hf-hub: / local-dir:)")
    p.add_argument("--num-classes", type=int, default=None, help="classifier size (to match --checkpoint)")
    p.add_argument("--rpi", action="store_true", help="random permutation of patch tokens at inference")
    p.add_argument("--seed", type=int, default=0,
                   help="seeds torch before the model is built (random init) and the RPI permutation (default 0)")
    p.add_argument("--alpha", type=float, default=None, help="scale the positional encoding by alpha")
    p.add_argument("--site", default="attn_input", choices=("attn_input", "block_output"))
    p.add_argument("--reduction", default="both", choices=("mean_map", "per_image", "both"))
    p.add_argument("--distance", default="manhattan", choices=("manhattan", "euclidean", "chebyshev"))
    p.add_argument("--max-images", type=int, default=None, help="probe at most N images")
    p.add_argument("--img-size", type=int, default=None, help="input size S (model built for S x S)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--device", default=None, help="cpu, cuda, ... (default: cuda when available)")
    p.add_argument("--image-key", default=None, help="the dataset's image column (default: image/img/first Image)")
    p.add_argument("--out", default="probe_out", help="output folder for ssdc.json and ssdc.png")
    p.add_argument("--no-progress", action="store_true")


def create_model(name: str, pretrained: bool = False, checkpoint: str | None = None,
                 img_size: int | None = None, num_classes: int | None = None) -> torch.nn.Module:
    """A timm model by name, ``hf-hub:`` or ``local-dir:`` (those two load their weights)."""
    import timm

    import timm_posgeom  # noqa: F401  (registers this package's models)

    kwargs: dict[str, Any] = {}
    if img_size is not None:
        kwargs["img_size"] = img_size
    if num_classes is not None:
        kwargs["num_classes"] = num_classes
    if checkpoint is not None and not Path(checkpoint).is_file():
        raise FileNotFoundError(f"checkpoint not found: {checkpoint}")
    pretrained = pretrained or name.startswith(("hf-hub:", "hf_hub:", "local-dir:"))
    return timm.create_model(name, pretrained=pretrained, checkpoint_path=checkpoint or "", **kwargs)


def image_batches(data: str, split: str, model: torch.nn.Module, batch_size: int, max_images: int | None,
                  img_size: int | None = None, image_key: str | None = None) -> tuple[Iterator[torch.Tensor], int]:
    """Batches (B, 3, H, W) of a Hugging Face dataset under the model's timm eval transform.

    ``data`` is a local dataset folder or a Hub id for ``datasets.load_dataset``. Grayscale / RGBA
    images are converted to RGB. Returns the iterator and the number of images it will yield.
    """
    import datasets
    from timm.data import create_transform, resolve_data_config

    if not Path(data).exists() and "/" not in data:
        raise FileNotFoundError(f"dataset not found: {data} (a local folder or a Hub id 'org/name')")
    ds = datasets.load_dataset(data, split=split)
    if max_images is not None:
        ds = ds.select(range(min(max_images, len(ds))))
    key = image_key or _image_column(ds)
    config = resolve_data_config({}, model=model)
    if img_size is not None:
        config["input_size"] = (3, img_size, img_size)
    transform = create_transform(**config, is_training=False)

    def batches() -> Iterator[torch.Tensor]:
        for start in range(0, len(ds), batch_size):
            rows = ds[start:start + batch_size][key]
            yield torch.stack([transform(img.convert("RGB")) for img in rows])
    return batches(), len(ds)


def _image_column(ds) -> str:
    import datasets

    for name in ("image", "img"):
        if name in ds.column_names:
            return name
    for name, feature in ds.features.items():
        if isinstance(feature, datasets.Image):
            return name
    raise ValueError(f"no image column in the dataset (columns: {ds.column_names}); pass --image-key")


def run(args: argparse.Namespace) -> int:
    from ..interventions import pe_scale
    from ..probes import probe_ssdc

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(args.seed)
    model = create_model(args.model, args.pretrained, args.checkpoint, args.img_size, args.num_classes)
    model.to(device)
    batches, n = image_batches(args.data, args.split, model, args.batch_size, args.max_images, args.img_size,
                               args.image_key)
    if n == 0:
        raise ValueError(f"the {args.split!r} split of {args.data} is empty")
    scale = pe_scale(model, args.alpha) if args.alpha is not None else contextlib.nullcontext()
    with scale:
        result = probe_ssdc(model, batches, site=args.site, rpi=args.rpi, seed=args.seed, reduction=args.reduction,
                            distance=args.distance, max_images=args.max_images, progress=not args.no_progress)
    result.metadata.update(model=args.model, data=args.data, split=args.split, alpha=args.alpha,
                           checkpoint=args.checkpoint)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result.to_json(out / "ssdc.json")
    result.plot(out / "ssdc.png")
    print(f"{args.model}  site={args.site}  rpi={args.rpi}  alpha={args.alpha}  images={result.metadata['n_images']}"
          f"  grid={tuple(result.metadata['grid_size'])}")
    print(result.table())
    print(f"wrote {out / 'ssdc.json'} and {out / 'ssdc.png'}")
    return 0
