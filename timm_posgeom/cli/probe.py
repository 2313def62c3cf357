"""``posgeom probe MODEL --data D``: SSDC per layer of any timm ViT (per stage of a hierarchical ViT or CNN).

Prints a per-layer table and writes ``ssdc.json`` and ``ssdc.png`` under ``--out``. Launched as several
processes (``accelerate launch ... -m timm_posgeom.cli probe ...``), each probes its share of the batches,
the sums are reduced, and the main process alone writes and prints (see :mod:`timm_posgeom.measuring.distributed`).
MODEL is any timm name (this package's models included), ``hf-hub:org/name`` or ``local-dir:PATH``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ._options import (
    add_data_args,
    add_distance_arg,
    add_intervention_args,
    add_model_args,
    add_run_args,
    add_site_arg,
)
from ._runner import eval_batches, run_measurement


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "probe", help="SSDC per layer (ViTs) or per stage (hierarchical ViTs, CNNs) of a timm model on a dataset"
    )
    add_model_args(p)
    add_data_args(p)
    add_site_arg(p)
    add_intervention_args(p)
    p.add_argument("--reduction", default="both", choices=("mean_map", "per_image", "both"))
    add_distance_arg(p)
    add_run_args(p, out="probe_out")


def run(args: argparse.Namespace) -> int:
    return run_measurement(args, lambda model, data, settings: _measure(args, model, data, settings), _report)


def _measure(args: argparse.Namespace, model: Any, data: Any, settings: Any) -> Any:
    from ..probes import probe_ssdc

    loader = eval_batches(args, model, data)
    result = probe_ssdc(
        model,
        loader,
        site=args.site,
        rpi=args.rpi,
        reduction=args.reduction,
        distance=args.distance,
        alpha=args.alpha,
        settings=settings,
    )
    result.settings.update(resize=args.resize)
    return result


def _report(args: argparse.Namespace, result: Any, out: Path) -> None:
    result.to_json(out / "ssdc.json")
    result.plot(out / "ssdc.png")
    grids = sorted({tuple(g) for g in result.settings["grid_sizes"]}, reverse=True)
    perms = f" ({result.settings['rpi_permutations']} permutations)" if args.rpi else ""
    print(
        f"{args.model}  site={result.settings['site']}  rpi={args.rpi}{perms}  alpha={args.alpha}  "
        f"images={result.settings['n_images']}  grid={', '.join('x'.join(map(str, g)) for g in grids)}"
    )
    print(result.table())
    print(f"wrote {out / 'ssdc.json'} and {out / 'ssdc.png'}")
