"""What resolution extrapolation costs: ``extrapolate`` against the plain forwards it makes, per input size.

For each size S of ``--sizes`` and each mode of ``--modes``, in one run, interleaved, the minimum (and the median)
over ``--repeats`` of three timings:

* ``extrapolate(model, data, [S], [mode])``: top-1 over ``--top1-images`` images, SSDC clean and under RPI (K =
  ``--rpi-permutations``) and the attention measures over ``--probe-images`` of them: everything a row holds,
  with the model carried to S and restored;
* the same measures by hand: the model at S (carried outside the timing), then ``fragility`` (top-1), and
  ``probe_ssdc`` (clean and under RPI) and ``attention_measures`` (entropy and distance) on ``eval_loader``'s
  batches at S: what a user would call at each size without ``extrapolate``, so the ratio is ``extrapolate``'s
  own cost (carrying the PE, restoring the model, reading the images once per size);
* the plain forwards of the same images at S: the model at S as above, the same images read by ``eval_loader``
  at S (resized from their source, as extrapolate reads them), then ``model(x)`` under ``torch.inference_mode``
  on the top-1 images once and on the probe images 2 + K times (clean SSDC, K permutations, attention): the
  forwards alone, so the ratio is what the measures themselves add.

Both read the same decoded images (a fresh :class:`~timm_posgeom.data.eval_data.DecodedImages` for every timing, made
outside it, so that none reuses another's resized images). Printed: seconds and the ratios of extrapolate to the
measures by hand and to the plain forwards, per size and mode, and the load average. At the training size
extrapolate carries nothing (every mode is the model itself), so the sizes worth timing are the others.
``--breakdown SIZE`` adds each probe measure alone on the probe images at SIZE against one plain forward of them:
where the measures' own cost goes.

The model is this package's micro model at random init (the cost does not depend on the weights); the images are
Imagenette's validation images where ``--data`` names a copy, else the synthetic set. Run:
``python benchmarks/bench_extrapolate.py --data PATH`` (with ``--sizes 32,128,224 --repeats 3``: about 25 minutes on
2 CPU cores shared with other work).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import timm
import torch

import timm_posgeom  # noqa: F401  (registers the models)
from timm_posgeom.data.eval_data import DecodedImages, eval_loader
from timm_posgeom.resolution import at_input_size, extrapolate


def _time(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _source(path: str | None, images: int):
    if path:
        from timm_posgeom import load_split

        return load_split(path, "validation", subset=images)
    from timm_posgeom import SyntheticShapes

    return SyntheticShapes(images, split="validation")


def _plain(model, data, size: int, mode: str, args) -> float:
    """Seconds of the plain forwards of one row at ``size`` (the model carried there outside the timing)."""
    with at_input_size(model, size, mode):

        def run():
            with torch.inference_mode():
                for x, _ in eval_loader(model, data, max_images=args.top1_images, batch_size=args.batch, num_workers=0):
                    model(x)
                probe = list(
                    eval_loader(model, data, max_images=args.probe_images, batch_size=args.batch, num_workers=0)
                )
                for _ in range(2 + args.rpi_permutations):
                    for x, _ in probe:
                        model(x)

        return _time(run)


def _by_hand(model, data, size: int, mode: str, args) -> float:
    """Seconds of the same measures called one by one on the model at ``size`` (carried there outside the timing)."""
    from timm_posgeom import attention_measures, fragility, probe_ssdc
    from timm_posgeom.probes.attention_measures import AttentionEntropy, MeanAttentionDistance

    settings = dict(batch_size=args.batch, progress=False, rpi_permutations=args.rpi_permutations)
    with at_input_size(model, size, mode):

        def run():
            fragility(
                model, data, (), labels="as-is", max_images=args.top1_images, img_size=size, num_workers=0, **settings
            )
            loader = eval_loader(model, data, max_images=args.probe_images, batch_size=args.batch, num_workers=0)
            probe_ssdc(model, loader, **settings)
            probe_ssdc(model, loader, rpi=True, **settings)
            attention_measures(model, loader, measures=[MeanAttentionDistance(), AttentionEntropy()], **settings)

        return _time(run)


def _extrapolate(model, data, size: int, mode: str, args) -> float:
    return _time(
        lambda: extrapolate(
            model,
            data,
            [size],
            [mode],
            probe_images=args.probe_images,
            max_images=args.top1_images,
            rpi_permutations=args.rpi_permutations,
            batch_size=args.batch,
            num_workers=0,
            progress=False,
            labels="as-is",
        )
    )


def breakdown(model, source, size: int, mode: str, args) -> None:
    """Each probe measure alone on the probe images at ``size``, against one plain forward of them (min over
    ``--repeats``): where the measures' own cost goes."""
    from timm_posgeom import attention_measures, probe_ssdc
    from timm_posgeom.probes.attention_measures import AttentionEntropy, MeanAttentionDistance

    settings = dict(batch_size=args.batch, progress=False)
    with at_input_size(model, size, mode):
        batches = list(
            eval_loader(
                model, DecodedImages(source), max_images=args.probe_images, batch_size=args.batch, num_workers=0
            )
        )

        def forward():
            with torch.inference_mode():
                for x, _ in batches:
                    model(x)

        cases = {
            "one plain forward": forward,
            "probe_ssdc": lambda: probe_ssdc(model, batches, **settings),
            f"probe_ssdc under RPI (K = {args.rpi_permutations})": lambda: probe_ssdc(
                model, batches, rpi=True, rpi_permutations=args.rpi_permutations, **settings
            ),
            "attention_measures (entropy, distance)": lambda: attention_measures(
                model, batches, measures=[MeanAttentionDistance(), AttentionEntropy()], **settings
            ),
        }
        forward()  # warm up
        times = {name: min(_time(fn) for _ in range(args.repeats)) for name, fn in cases.items()}
    print(f"\n{args.probe_images} probe images at {size} px ({mode}), min of {args.repeats}:")
    for name, seconds in times.items():
        print(f"  {name}: {seconds:.2f} s = {seconds / times['one plain forward']:.2f} plain forwards")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default=None, help="an Imagenette copy (parquet folder); default: synthetic")
    parser.add_argument("--model", default="posgeom_vit_micro_patch8_64_rope")
    parser.add_argument("--sizes", default="32,128,256")
    parser.add_argument("--modes", default="rope-native,rope-interp")
    parser.add_argument("--top1-images", type=int, default=128)
    parser.add_argument("--probe-images", type=int, default=32)
    parser.add_argument("--rpi-permutations", type=int, default=3)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--breakdown", type=int, default=None, metavar="SIZE", help="also each measure alone at SIZE")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = timm.create_model(args.model, num_classes=10).eval()
    source = _source(args.data, max(args.top1_images, args.probe_images))
    cases = [(int(s), m) for s in args.sizes.split(",") for m in args.modes.split(",")]
    times: dict[tuple, list[float]] = {}
    _extrapolate(model, DecodedImages(source), cases[0][0], cases[0][1], args)  # warm up
    for _ in range(args.repeats):
        for size, mode in cases:
            for kind, fn in (("extrapolate", _extrapolate), ("by hand", _by_hand), ("plain", _plain)):
                times.setdefault((size, mode, kind), []).append(fn(model, DecodedImages(source), size, mode, args))
    print(
        f"{args.model}, {args.top1_images} top-1 images, {args.probe_images} probe images, K = "
        f"{args.rpi_permutations}, batch {args.batch}, torch threads {torch.get_num_threads()}, "
        f"load {os.getloadavg()[0]:.2f}, min (median) of {args.repeats}"
    )
    print(
        "| size | mode | extrapolate s | by hand s | plain forwards s | / by hand (of medians) | / plain (of medians) |"
    )
    print("|---|---|---|---|---|---|---|")
    for size, mode in cases:
        ext, hand, plain = (times[(size, mode, kind)] for kind in ("extrapolate", "by hand", "plain"))
        print(
            f"| {size} | {mode} | {min(ext):.2f} | {min(hand):.2f} | {min(plain):.2f} "
            f"| {min(ext) / min(hand):.3f}x ({statistics.median(ext) / statistics.median(hand):.3f}x) "
            f"| {min(ext) / min(plain):.3f}x ({statistics.median(ext) / statistics.median(plain):.3f}x) |"
        )
    if args.breakdown:
        breakdown(model, source, args.breakdown, cases[0][1], args)


if __name__ == "__main__":
    main()
