"""``posgeom extrapolate MODEL --data D --sizes 32,64,128,256 --modes auto``: a ViT at input sizes it never saw.

Per input size and mode (how the positional encoding is carried to the new grid: ``posgeom extrapolate --help``
lists them): top-1 with its interval, SSDC per layer, delta SSDC under RPI with its interval over the
permutations, attention entropy and mean distance per layer, FS per ``--shift`` if any. Writes
``extrapolate.json``, ``extrapolate.csv`` and ``extrapolate.md`` under ``--out`` as each row is measured, and
``extrapolate.png`` (top-1, delta SSDC and attention entropy against the scale, one line per mode) at the end. A
rerun into the same ``--out`` measures only the rows that are missing (docs/guide.md#resolution-extrapolation).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ._options import (
    add_data_args,
    add_labels_arg,
    add_model_args,
    add_probe_images_arg,
    add_rpi_permutations_arg,
    add_run_args,
    add_shift_arg,
    hub_data_kwargs,
)

# the modes and their meanings (resolution.carry.MODE_HELP, which imports torch): written here for --help
MODES_HELP = (
    "none (a model without PE), timm (timm's own: set_input_size or the dynamic size), ape-bilinear, ape-bicubic, "
    "ape-bilinear-aa, ape-bicubic-aa (the APE table resampled, antialias off/on), sincos-rebuild, sincos-interp "
    "(the sincos table computed at the new grid, or resampled), rope-native (positions extend), rope-interp "
    "(position interpolation into the trained range)"
)


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "extrapolate",
        help="resolution extrapolation: top-1, SSDC, delta SSDC under RPI and attention at input sizes a model never saw",
        description="Measure one ViT at several input sizes, its positional encoding carried to each size in "
        "several modes; writes extrapolate.json/.csv/.md and extrapolate.png under --out, row by row. Resumable: "
        "a rerun into the same --out measures only the missing rows.",
    )
    add_model_args(p)
    add_labels_arg(p)
    add_data_args(p)
    p.add_argument(
        "--sizes",
        default=None,
        help="comma-separated square input sizes in pixels, multiples of the patch size (default: 0.5, 1, 2, 3 and "
        "4 times the training size); images are resized from their source to each",
    )
    p.add_argument(
        "--modes",
        default="auto",
        help=f"comma-separated modes, or auto (default: every mode the model takes): {MODES_HELP}",
    )
    add_probe_images_arg(p)
    add_rpi_permutations_arg(p)
    add_shift_arg(p, default_help="none")
    p.add_argument(
        "--allow-changes",
        action="store_true",
        help="accept settings that differ from those --out was measured with: every row is measured again "
        "(former files kept as .replaced-N)",
    )
    add_run_args(p, out="extrapolate_out")


def run(args: argparse.Namespace) -> int:
    from ..app.extrapolation import extrapolate_into
    from ..measuring import distributed
    from ..resolution import check_modes, check_sizes, extrapolate
    from ._options import load_model_and_data
    from ._runner import measure_settings

    world = distributed.setup()
    if args.device is None and world > 1:
        args.device = distributed.default_device()
    with distributed.main_process_first():
        model, data, device = load_model_and_data(args, subset=False)
    sizes, modes = check_sizes(model, args.sizes), check_modes(model, args.modes)  # refused before any work
    settings = measure_settings(args, device).replace(max_images=args.max_images)

    def measure(resume: Any, on_row: Any) -> Any:
        return extrapolate(
            model,
            data,
            sizes,
            modes,
            probe_images=args.probe_images,
            shifts=args.shift or (),
            labels=args.labels,
            settings=settings,
            resume=resume,
            on_row=on_row,
        )

    main = distributed.is_main()
    result = extrapolate_into(
        Path(args.out), measure, _run_settings(args), allow_changes=args.allow_changes, write=main, log=_say
    )
    if main:
        print(result.table())
        print(
            f"wrote {', '.join(str(Path(args.out) / f) for f in ('extrapolate.json', 'extrapolate.csv', 'extrapolate.png'))}"
        )
    return 0


def _say(text: str) -> None:
    print(text, file=sys.stderr)


def _run_settings(args: argparse.Namespace) -> dict[str, Any]:
    """What the run measures beyond the library's settings: the model as named and its weights, the data."""
    from ..app.zoo.measure import weights_key

    weights = "pretrained" if args.pretrained else "random-init"
    if args.model.startswith(("local-dir:", "hf-hub:", "hf_hub:")):
        weights = "loaded"
    return {
        "model_name": args.model,
        "weights_key": weights_key(args.model, weights),
        "checkpoint": args.checkpoint,
        "img_size": args.img_size,
        "num_classes": args.num_classes,
        "data": args.data,
        "split": args.split,
        "max_images": args.max_images,
        "bad_images": args.bad_images,
        **hub_data_kwargs(args),
    }
