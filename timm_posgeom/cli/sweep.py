"""``posgeom sweep MODEL --data PATH_OR_HUB_ID --alphas 1,0.9,...``: PE scale vs structure and robustness.

Per alpha: delta SSDC and per-layer SSDC under RPI, clean accuracy, FS per shift. Writes
``sweep.json``, ``sweep.md`` and ``sweep.png`` (delta SSDC and FS against alpha) under ``--out``.
Launched as several processes (``accelerate launch ... -m timm_posgeom.cli sweep ...``), each alpha's
probe and evaluation are shared by batch; the main process alone writes and prints.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..protocol import DEFAULT_ALPHAS
from ._options import (  # noqa: F401  (parse_alphas: its old home, still importable)
    add_components_arg,
    add_data_args,
    add_labels_arg,
    add_model_args,
    add_probe_images_arg,
    add_rpi_permutations_arg,
    add_run_args,
    add_shift_arg,
    add_site_arg,
    components_arg,
    parse_alphas,
)
from ._runner import run_measurement


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("sweep", help="alpha sweep: delta SSDC under RPI and FS as the PE is scaled")
    add_model_args(p)
    add_labels_arg(p)
    add_data_args(p)
    add_shift_arg(p, default_help="jpeg:5")
    p.add_argument(
        "--alphas",
        default=",".join(f"{a:g}" for a in DEFAULT_ALPHAS),
        help="comma-separated PE scales (default 1,0.9,...,0.1)",
    )
    add_probe_images_arg(p)
    add_rpi_permutations_arg(p)
    add_site_arg(p)
    p.add_argument(
        "--patch-only",
        action="store_true",
        help="scale only patch rows of an APE table (default: class row too, as the paper)",
    )
    add_components_arg(p)
    add_run_args(p, out="sweep_out")


def run(args: argparse.Namespace) -> int:
    from ..data.shifts import parse_shift
    from ..robustness import alpha_sweep

    alphas = parse_alphas(args.alphas)
    shifts = args.shift or ["jpeg:5"]
    for spec in shifts:
        parse_shift(spec)

    def measure(model: Any, data: Any, settings: Any) -> Any:
        # the whole split: alpha_sweep applies --max-images to all its work, and --probe-images (when given) to SSDC
        return alpha_sweep(
            model,
            data,
            alphas,
            shifts,
            labels=args.labels,
            probe_images=args.probe_images,
            site=args.site,
            include_prefix=not args.patch_only,
            components=components_arg(args),
            settings=settings.replace(max_images=args.max_images),
        )

    return run_measurement(args, measure, _report, subset=False)


def _report(args: argparse.Namespace, result: Any, out: Path) -> None:
    from ..results.jsonio import write_atomic

    result.to_json(out / "sweep.json")
    write_atomic(out / "sweep.md", result.to_markdown() + "\n")
    result.plot(out / "sweep.png")
    print(result.to_markdown())
    print(f"wrote {out / 'sweep.json'}, {out / 'sweep.md'} and {out / 'sweep.png'}")
