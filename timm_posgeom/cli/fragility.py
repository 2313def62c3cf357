"""``posgeom fragility MODEL --data PATH_OR_HUB_ID``: top-1 accuracy and fragility scores under shifts.

FS = 1 - A_shift / A_clean, counted exactly over every image; Wilson 95% intervals for the
accuracies, paired bootstrap for FS. Writes ``fragility.json`` and ``fragility.png`` under ``--out``.
Launched as several processes (``accelerate launch ... -m timm_posgeom.cli fragility ...``), each evaluates
its share of the batches and the main process alone writes and prints the (identical) result.
MODEL is any timm name (this package's models included), ``hf-hub:org/name`` or ``local-dir:PATH``.

``--imagenet-c [all|extra|NAME,...]``: every ImageNet-C corruption at ``--severities`` (default 1-5),
generated on the fly in one pass over the clean images, or read from the released images with
``--imagenet-c-root ROOT``; prints FS per corruption x severity and the mean FS (mCE's average, of
fragility scores; normalised by a ``--reference`` run's FS if given) and writes ``imagenet_c.json`` and
``imagenet_c.md`` (and, generated, ``fragility.json``).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..errors import PathNotFoundError, SettingError
from ..protocol import PAPER_SHIFTS
from ._options import (
    add_data_args,
    add_intervention_args,
    add_labels_arg,
    add_model_args,
    add_run_args,
    add_shift_arg,
)
from ._protocol_options import add_shift_size_arg, shift_size
from ._runner import run_measurement


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "fragility", help="accuracy and fragility score (FS) of a model under JPEG / blur shifts or all of ImageNet-C"
    )
    add_model_args(p)
    add_labels_arg(p)
    add_data_args(p)
    add_shift_arg(p, default_help=" and ".join(PAPER_SHIFTS))
    add_intervention_args(p, shared=False)
    p.add_argument("--blur-on-device", action="store_true", help="run blur shifts batched on the device")
    add_shift_size_arg(p)
    g = p.add_argument_group("ImageNet-C")
    g.add_argument(
        "--imagenet-c",
        nargs="?",
        const="all",
        default=None,
        metavar="CORRUPTIONS",
        help="ImageNet-C instead of --shift: all (its 15 corruptions, the default), extra (its 4 extras) or "
        "NAME,NAME,...; prints FS per corruption and severity and the mean FS (needs the extra "
        "timm-posgeom[imagenet-c] unless --imagenet-c-root). --batch-size counts every copy per "
        "forward here",
    )
    g.add_argument("--severities", default="1,2,3,4,5", help="ImageNet-C severities (default 1,2,3,4,5)")
    g.add_argument(
        "--imagenet-c-root",
        default=None,
        metavar="ROOT",
        help="read the released images ROOT/CORRUPTION/SEVERITY/CLASS/IMAGE instead of generating them "
        "(checked against the data's classes; the data must be the whole clean split they come from)",
    )
    g.add_argument(
        "--imagenet-c-class-folders",
        default=None,
        metavar="FILE",
        help="the tree's folder name of each class, one a line in label order (e.g. wnids; default: the class names)",
    )
    g.add_argument(
        "--imagenet-c-clean-framing",
        default="imagenet-c",
        choices=("imagenet-c", "as-is"),
        help="with --imagenet-c-root: frame the clean images as the release framed its own (short side "
        "256, centre 224 crop; default), or use them as they are (already framed so)",
    )
    g.add_argument(
        "--imagenet-c-extra-classes",
        default="error",
        choices=("error", "ignore"),
        help="class folders under ROOT that are none of the data's classes: error (default) or ignore",
    )
    g.add_argument(
        "--reference",
        default=None,
        metavar="JSON",
        help="a reference model's imagenet_c.json: also print FS normalised by its FS per corruption (like mCE)",
    )
    add_run_args(p, out="fragility_out")


def _fmt_interval(lo: float, hi: float) -> str:
    return f"[{lo:.3f}, {hi:.3f}]"


def _parse_severities(text: str) -> list[int]:
    try:
        return [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise SettingError(f"--severities needs comma-separated integers 1-5, got {text!r}") from None


def run(args: argparse.Namespace) -> int:
    if args.imagenet_c is not None or args.imagenet_c_root is not None:
        return _run_imagenet_c(args)
    from ..data.shifts import parse_shift
    from ..robustness import fragility

    shifts = args.shift or list(PAPER_SHIFTS)
    for spec in shifts:
        parse_shift(spec)  # fail on a bad spec before loading anything
    size = shift_size(args)
    if size and args.blur_on_device:
        raise SettingError(
            "--blur-on-device blurs the batch at the model's input: it cannot apply a shift at --shift-size"
        )

    def measure(model: Any, data: Any, settings: Any) -> Any:
        return fragility(
            model,
            data,
            shifts,
            labels=args.labels,
            rpi=args.rpi,
            alpha=args.alpha,
            blur_on_device=args.blur_on_device,
            settings=settings,
            shift_size=size,
        )

    return run_measurement(args, measure, _report)


def _report(args: argparse.Namespace, result: Any, out: Path) -> None:
    result.to_json(out / "fragility.json")
    result.plot(out / "fragility.png")
    at = f"  shift at {result.settings['shift_size']} px" if result.settings.get("shift_size") else ""
    print(f"{args.model}  images={result.num_images}  resize={args.resize}  rpi={args.rpi}  alpha={args.alpha}{at}")
    w = max(12, *(len(s) for s in result.shifts))
    print(f"{'':{w}s} {'top-1':>7s} {'95% CI (Wilson)':>17s} {'FS':>7s} {'95% CI (bootstrap)':>19s}")
    print(f"{'clean':{w}s} {result.clean_accuracy:7.3f} {_fmt_interval(*result.clean_interval):>17s}")
    for s in result.shifts:
        print(
            f"{s:{w}s} {result.accuracy[s]:7.3f} {_fmt_interval(*result.accuracy_interval[s]):>17s} "
            f"{result.fs[s]:7.3f} {_fmt_interval(*result.fs_interval[s]):>19s}"
        )
    print(f"wrote {out / 'fragility.json'} and {out / 'fragility.png'}")


def _run_imagenet_c(args: argparse.Namespace) -> int:
    from ..robustness.imagenet_c import imagenet_c_fragility, imagenet_c_released

    names, severities, reference, folders = _imagenet_c_inputs(args)

    def measure(model: Any, data: Any, settings: Any) -> Any:
        common = dict(labels=args.labels, rpi=args.rpi, alpha=args.alpha, settings=settings)
        if args.imagenet_c_root is None:
            return imagenet_c_fragility(model, data, names, severities, **common)
        return imagenet_c_released(
            model,
            data,
            args.imagenet_c_root,
            names,
            severities,
            class_folders=folders,
            extra_classes=args.imagenet_c_extra_classes,
            clean_framing=args.imagenet_c_clean_framing,
            **common,
        )

    return run_measurement(args, measure, lambda a, result, out: _report_imagenet_c(a, result, out, reference))


def _imagenet_c_inputs(args: argparse.Namespace) -> tuple[list[str], list[int], Any, list[str] | None]:
    """(corruptions, severities, the reference result or None, the class folders or None), each checked before
    anything is loaded."""
    from ..data.shifts import imagenet_c, imagenet_c_shifts
    from ..robustness.imagenet_c import ImageNetCResult

    if args.shift:
        raise SettingError("--shift and --imagenet-c exclude each other: run them separately")
    if args.blur_on_device:
        raise SettingError("--blur-on-device does not apply to --imagenet-c")
    if shift_size(args):
        raise SettingError("--shift-size applies to --shift, not to --imagenet-c")
    severities = _parse_severities(args.severities)
    specs = imagenet_c_shifts(args.imagenet_c or "all", severities)  # checks names and severities first
    names = list(dict.fromkeys(spec.split(":")[1] for spec in specs))
    reference = ImageNetCResult.from_json(args.reference) if args.reference else None
    folders = None
    if args.imagenet_c_class_folders:
        try:
            lines = Path(args.imagenet_c_class_folders).read_text(encoding="utf-8").splitlines()
        except UnicodeDecodeError:
            raise SettingError(
                f"--imagenet-c-class-folders {args.imagenet_c_class_folders} is not a text file (one folder name "
                "a line)"
            ) from None
        folders = [line.strip() for line in lines if line.strip()]
    if args.imagenet_c_root is None:
        for name in names:  # the imagecorruptions package: a clear line now rather than after loading the model
            imagenet_c(name, severities[0])
        if folders is not None or args.imagenet_c_extra_classes != "error":
            raise SettingError("--imagenet-c-class-folders and --imagenet-c-extra-classes need --imagenet-c-root")
    elif not Path(args.imagenet_c_root).is_dir():
        raise PathNotFoundError(f"--imagenet-c-root {args.imagenet_c_root!r} is not a folder")
    if reference is not None:
        missing = [f"{c}:{s}" for c in names for s in severities if c not in reference.fs or s not in reference.fs[c]]
        if missing:
            raise SettingError(
                f"the reference {args.reference} lacks {', '.join(missing[:4])}"
                f"{' ...' if len(missing) > 4 else ''}: run it with the same corruptions and severities"
            )
    return names, severities, reference, folders


def _report_imagenet_c(args: argparse.Namespace, result: Any, out: Path, reference: Any) -> None:
    from ..results.jsonio import write_atomic

    if reference is not None:
        result.settings["reference"] = args.reference
    table = result.to_markdown(reference=reference)
    result.to_json(out / "imagenet_c.json")
    write_atomic(out / "imagenet_c.md", table + "\n")
    written = [out / "imagenet_c.json", out / "imagenet_c.md"]
    if result.fragility is not None:
        result.fragility.settings.update(model=args.model, data=args.data, split=args.split)
        result.fragility.to_json(out / "fragility.json")
        written.append(out / "fragility.json")
    print(
        f"{args.model}  images={result.num_images}  resize={args.resize}  rpi={args.rpi}  alpha={args.alpha}  "
        f"ImageNet-C {result.source}{'' if args.imagenet_c_root is None else ' from ' + args.imagenet_c_root}"
    )
    print(table)
    print("wrote " + ", ".join(map(str, written)))
