"""``posgeom intervene MODEL --data D``: top-1 and SSDC under interventions on positions.

``--measure pe-shuffle`` (the encoding permuted, beside the model as it is and RPI), ``pe-shift`` (the encoding
translated by ``--shifts`` patches) and ``tile-shuffle`` (the image cut into g x g tiles, ``--grids``, the tiles
permuted); all three by default (a measure that does not apply, e.g. a PE measure on a model without a PE it can
move, is then left out with a warning), each written as soon as it is measured: ``MEASURE.json``, ``MEASURE.md`` and
``MEASURE.png`` under ``--out`` (docs/method.md#pe-shuffle-and-pe-shift, docs/method.md#image-grid-shuffle).
Permutations follow the RPI protocol (``--rpi-permutations`` K, seeds ``--seed`` .. ``--seed`` + K - 1).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ..errors import SettingError
from ._options import (
    add_components_arg,
    add_data_args,
    add_labels_arg,
    add_model_args,
    add_probe_images_arg,
    add_rpi_permutations_arg,
    add_run_args,
    add_site_arg,
    components_arg,
)
from ._runner import run_measurement

MEASURES = ("pe-shuffle", "pe-shift", "tile-shuffle")
_SHIFTS = "0,0.25,0.5,0.75,1,1.5,2,3,4"  # measure_pe_shift's DEFAULT_PE_SHIFTS, said without importing torch


def _numbers(text: str, flag: str, cast: Any = float) -> list[Any]:
    """``"0,0.5,1"`` -> [0.0, 0.5, 1.0] (``cast`` each); ValueError naming ``flag`` otherwise."""
    try:
        values = [cast(p) for p in (p.strip() for p in text.split(",")) if p]
    except ValueError:
        values = []
    if not values:
        raise SettingError(f"{flag} needs comma-separated numbers, got {text!r}")
    return values


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "intervene", help="top-1 and SSDC with the PE shuffled or shifted, or the image's tiles shuffled"
    )
    add_model_args(p)
    add_labels_arg(p)
    add_data_args(p)
    p.add_argument(
        "--measure",
        action="append",
        choices=MEASURES,
        default=None,
        help="what to measure, repeatable (default: all three): pe-shuffle (the encoding permuted, with RPI "
        "beside it), pe-shift (the encoding translated), tile-shuffle (the image's tiles permuted)",
    )
    add_components_arg(p)  # pe-shuffle with every encoding moved also moves each alone
    p.add_argument(
        "--shifts", default=_SHIFTS, help=f"pe-shift: shifts in patches, comma-separated (default {_SHIFTS})"
    )
    p.add_argument("--direction", default="xy", choices=("x", "y", "xy"), help="pe-shift: along columns, rows or both")
    p.add_argument(
        "--edge", default="clamp", choices=("clamp", "wrap"), help="pe-shift: a learned table beyond its edge"
    )
    p.add_argument("--grids", default=None, help="tile-shuffle: tiles per side, comma-separated (default 1,2,4,8...)")
    add_probe_images_arg(p)
    add_rpi_permutations_arg(p)
    add_site_arg(p)
    add_run_args(p, out="intervene_out")


def run(args: argparse.Namespace) -> int:
    from ..errors import one_line
    from ..interventions import PEMoveError

    shifts = _numbers(args.shifts, "--shifts")
    grids = _numbers(args.grids, "--grids", int) if args.grids else None
    components = components_arg(args)
    for name in args.measure or MEASURES:

        def measure(model: Any, data: Any, settings: Any, name: str = name) -> Any:
            from ..robustness import position_interventions as pi

            common = dict(
                labels=args.labels,
                probe_images=args.probe_images,
                site=args.site,
                settings=settings.replace(max_images=args.max_images),
            )
            if name == "pe-shuffle":
                return pi.measure_pe_shuffle(model, data, components=components, **common)
            if name == "pe-shift":
                return pi.measure_pe_shift(
                    model, data, shifts, direction=args.direction, edge=args.edge, components=components, **common
                )
            return pi.measure_tile_shuffle(model, data, grids, **common)

        try:
            status = run_measurement(args, measure, _report, subset=False)
        except PEMoveError as e:
            if args.measure:  # asked for by name: an error
                raise
            print(f"posgeom intervene: warning: {name} not measured: {one_line(e)}", file=sys.stderr)
            continue
        if status:
            return status
    return 0


def _report(args: argparse.Namespace, result: Any, out: Path) -> None:
    from ..results.jsonio import write_atomic

    stem = result.measure.replace("_", "-")
    result.to_json(out / f"{stem}.json")
    write_atomic(out / f"{stem}.md", result.to_markdown() + "\n")
    result.plot(out / f"{stem}.png")
    print(
        f"{args.model}  {stem}  images={result.settings['num_images']}  probe images={result.settings['probe_images']}"
    )
    print(result.to_markdown())
    print(f"wrote {out / stem}.json, .md and .png")
