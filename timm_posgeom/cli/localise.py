"""``posgeom localise MODEL --data D``: where a flat timm ViT's positional encoding acts, block by block.

Activation patching between the clean run and RPI (how much of the top-1 and SSDC gap each layer restores), the
PE imprint (SSDC of constant images per block), the position probe's directions ablated per block (against a
random subspace of the same rank) and the CKA of each block at alpha 1 against alpha 0 (definitions:
docs/method.md#causal-localisation). Prints one table per measure and writes ``localisation.json`` and the
figure ``localisation.png`` under ``--out``. The position probe is fitted on the first ``--max-images`` images
of ``--fit-split`` (default: train), the other measures read ``--split``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..errors import SettingError
from ._options import (
    add_data_args,
    add_labels_arg,
    add_model_args,
    add_rpi_permutations_arg,
    add_run_args,
    hub_data_kwargs,
)
from ._runner import eval_batches, run_measurement

_MEASURES = ("patching", "imprint", "ablation", "cka")


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "localise",
        help="activation patching, the PE imprint, position-direction ablation and CKA of the encoding, per block",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
    )
    add_model_args(p)
    add_data_args(p)
    add_labels_arg(p)
    p.add_argument(
        "--measures",
        default=",".join(_MEASURES),
        help=f"comma-separated, among {', '.join(_MEASURES)} (default: all)",
    )
    p.add_argument(
        "--patch",
        default="residual",
        choices=("residual", "update"),
        help="what patching replaces at a layer: the whole residual stream (default) or the block's own update",
    )
    add_rpi_permutations_arg(p)
    p.add_argument("--colours", type=int, default=8, help="constant images of the PE imprint (default 8)")
    p.add_argument("--cka-alpha", type=float, default=0.0, help="the PE scale CKA compares alpha 1 with (default 0)")
    p.add_argument(
        "--fit-split",
        default="train",
        help="the split the position probe is fitted on (its first --max-images images; default train); 'none': "
        "the images it is ablated on",
    )
    add_run_args(p, out="localise_out")


def _measures(text: str) -> tuple[str, ...]:
    chosen = tuple(m.strip() for m in text.split(",") if m.strip())
    unknown = [m for m in chosen if m not in _MEASURES]
    if unknown or not chosen:
        raise SettingError(f"--measures: choose among {', '.join(_MEASURES)}, got {text!r}")
    return chosen


def run(args: argparse.Namespace) -> int:
    measures = _measures(args.measures)
    if args.colours < 1:
        raise SettingError(f"--colours must be >= 1, got {args.colours}")
    return run_measurement(args, lambda model, data, settings: _measure(args, measures, model, data, settings), _report)


def _measure(args: argparse.Namespace, measures: tuple[str, ...], model: Any, data: Any, settings: Any) -> Any:
    from ..data import load_split
    from ..data.labels import match_labels
    from ..localisation import localise

    data = match_labels(model, data, args.labels)
    fit = None
    if "ablation" in measures and args.fit_split != "none":
        fit_split = load_split(args.data, args.fit_split, subset=args.max_images, **hub_data_kwargs(args))
        fit = eval_batches(args, model, fit_split)
    result = localise(
        model,
        eval_batches(args, model, data),
        settings,
        measures=measures,
        patch=args.patch,
        colours=args.colours,
        alpha=args.cka_alpha,
        fit=fit,
    )
    result.settings.update(fit_split=args.fit_split, labels=args.labels, resize=args.resize)
    return result


def _report(args: argparse.Namespace, result: Any, out: Path) -> None:
    result.to_json(out / "localisation.json")
    result.plot(out / "localisation.png")
    print(f"{args.model}  measures={','.join(result.measures())}  split={args.split}")
    print(result.tables())
    print(f"wrote {out / 'localisation.json'} and {out / 'localisation.png'}")
