"""``posgeom attention MODEL --data D``: attention measures per block and head of a flat timm ViT.

Mean attention distance, attention entropy and attention SSDC per block and head (definitions:
docs/attention.md), optionally under RPI (``--rpi``) and PE scaling (``--alpha``). Prints a per-layer
table (mean over heads and the range over heads) and writes ``attention.json`` and the per-head figure
``attention.png`` under ``--out``. Launched as several processes, each measures its share of the batches
and the sums are reduced; the main process alone writes and prints.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ._options import add_data_args, add_distance_arg, add_intervention_args, add_model_args, add_run_args
from ._runner import eval_batches, run_measurement


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "attention", help="mean attention distance, entropy and SSDC per block and head of a flat timm ViT on a dataset"
    )
    add_model_args(p)
    add_data_args(p)
    add_intervention_args(p)
    add_distance_arg(p)
    add_run_args(p, out="attention_out")


def run(args: argparse.Namespace) -> int:
    return run_measurement(args, lambda model, data, settings: _measure(args, model, data, settings), _report)


def _measure(args: argparse.Namespace, model: Any, data: Any, settings: Any) -> Any:
    from ..probes import attention_measures

    loader = eval_batches(args, model, data)
    result = attention_measures(
        model, loader, rpi=args.rpi, alpha=args.alpha, distance=args.distance, settings=settings
    )
    result.settings.update(resize=args.resize)
    return result


def _report(args: argparse.Namespace, result: Any, out: Path) -> None:
    result.to_json(out / "attention.json")
    result.plot(out / "attention.png")
    md = result.settings
    print(
        f"{args.model}  rpi={args.rpi}  alpha={args.alpha}  images={md['n_images']}  "
        f"grid={'x'.join(map(str, md['grid_size']))}  heads={md['num_heads']}"
    )
    print(result.table())
    print(f"wrote {out / 'attention.json'} and {out / 'attention.png'}")
