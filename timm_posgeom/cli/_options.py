"""Command-line options shared by the commands: defined once, here.

One name and one meaning per idea, in every command (``tests/test_vocabulary.py`` reads every command's
parser against the list of ideas; ``tests/test_package.py`` compares defaults and help texts):

* ``--max-images N``: at most the first N images of a split, for all the command's work (train and study:
  of each split). ``--probe-images N``: the SSDC probe's own count, where a command also measures
  something else (sweep, zoo, study; train: SSDC under RPI at each evaluation).
* ``--seed S`` is a seed value; ``--num-seeds N`` (study) is a count of seeds (0 .. N-1).
* ``--imagenet-c [CORRUPTIONS]`` is ImageNet-C's corruptions (fragility); ``--imagenet-c-jpeg-blur`` is its
  JPEG and blur only (zoo, study).
* ``--pretrained`` / ``--no-pretrained``: the timm name's weights or random init, in every command that
  builds models (default: random init; zoo: weights where a name has them).
* ``--labels``, ``--bad-images``, ``--device``, ``--split`` (train and study: ``--train-split``,
  ``--val-split``), ``--data-config``, ``--revision``, ``--streaming``: the same in every command that reads
  labelled data, images, runs on a device or reads a Hub or parquet set. A recipe's keys have the flags'
  names (``max_train_images``, ``max_val_images``, ``probe_images``, ``bad_images``, ``data_config``...).

An old name keeps working for one release (:func:`add_renamed_arg`): a one-line notice on stderr, then the
new name's meaning. Abbreviated flags are not accepted (they would be more names for one idea).

Nothing here imports torch or timm: ``posgeom --help`` and argument errors answer without them; the
heavy imports happen in the commands' ``run()``.

The same model and data flags, with the same defaults, and one loader (:func:`load_model_and_data`):
every measuring command accepts the same data sources (a Hub id, a parquet folder, an ImageFolder
tree, ``synthetic``) and preprocesses the same model the same way.

The measuring flags are the :class:`~timm_posgeom.protocol.Protocol`'s settings, under its names (``--max-images``
is ``max_images``, ``--rpi-permutations`` is ``rpi_permutations``...): :func:`protocol_options` maps the flags a
command has to the protocol, in one place, for every measuring command (``tests/test_fault_options.py`` sets each one
and finds it in the protocol, and in every library function it concerns).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..defaults import IMAGENET_C_JPEG_BLUR, PAPER_SHIFTS
from ..errors import DataError, SettingError
from ..protocol import PROBE_IMAGES, PROTOCOL_FIELDS, RPI_PERMUTATIONS, SPEC_FORMS, Protocol, parse_alpha_spec


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="timm model name, hf-hub:ORG/NAME or local-dir:PATH")
    p.add_argument("--checkpoint", default=None, help="a checkpoint file to load into the model")
    add_pretrained_arg(p, default=False, help=PRETRAINED_HELP + "Default: random init")
    p.add_argument(
        "--num-classes",
        type=int,
        default=None,
        help="classifier size (default with --checkpoint: the dataset's number of classes)",
    )
    add_img_size_arg(p)


def add_img_size_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--img-size",
        type=int,
        default=None,
        help="input size S: the model is built for S x S where it has a fixed grid, and the images are "
        "resized to S x S (dynamic-size ViTs and CNNs run at S; default: the model's own size)",
    )


MAX_IMAGES_HELP = "use at most the first N images of the split, for all the work; default: the whole split"

PRETRAINED_HELP = (
    "--pretrained loads a timm name's weights (a name without any fails); --no-pretrained builds it at "
    "random init (seeded by --seed); hf-hub: and local-dir: always load theirs. "
)


def add_pretrained_arg(p: argparse.ArgumentParser, default: bool | None, help: str) -> None:
    """--pretrained / --no-pretrained: the one switch of a timm name's weights (``default`` None: zoo's auto)."""
    p.add_argument("--pretrained", default=default, action=argparse.BooleanOptionalAction, help=help)


class _Renamed(argparse.Action):
    """An old flag name: its value is kept aside (``namespace.renamed_flags``) and given to the new name
    after parsing, by :func:`apply_renamed`, with a one-line notice."""

    def __init__(self, option_strings, dest, new_flag: str = "", new_dest: str = "", **kwargs):
        self.new_flag, self.new_dest = new_flag, new_dest
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        value = True if self.nargs == 0 else values
        renamed = dict(getattr(namespace, "renamed_flags", None) or {})
        renamed[option_string or self.option_strings[0]] = (self.new_flag, self.new_dest, value)
        namespace.renamed_flags = renamed


def add_renamed_arg(p: argparse.ArgumentParser, old: str, new: str, **kwargs: Any) -> None:
    """Accept ``old``, the former name of ``new`` (already added to ``p``), for one release: hidden from
    --help; ``kwargs`` (type, nargs...) as ``new``'s. A flag taking no value: ``nargs=0``."""
    new_dest = next(a.dest for a in p._actions if new in a.option_strings)
    p.add_argument(
        old,
        dest=argparse.SUPPRESS,
        default=argparse.SUPPRESS,
        action=_Renamed,
        new_flag=new,
        new_dest=new_dest,
        help=argparse.SUPPRESS,
        **kwargs,
    )


def apply_renamed(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Give each old flag's value to its new name, with a one-line notice on stderr; ValueError when both
    names were given."""
    for old, (new, dest, value) in (getattr(args, "renamed_flags", None) or {}).items():
        if getattr(args, dest, None) != parser.get_default(dest) and getattr(args, dest, None) != value:
            raise SettingError(f"{old} is the old name of {new}: give only {new}")
        print(
            f"posgeom {args.command}: warning: {old} is deprecated and will be removed in the next release: "
            f"use {new} (the same)",
            file=sys.stderr,
        )
        setattr(args, dest, value)


def add_source_args(p: argparse.ArgumentParser, required: bool = True) -> None:
    """--data, --split, and a Hub or parquet set's --data-config, --revision and --streaming."""
    p.add_argument(
        "--data",
        required=required,
        help="a Hugging Face Hub id, a local parquet folder, an ImageFolder tree, or 'synthetic'",
    )
    add_split_args(p)


def add_split_args(p: argparse.ArgumentParser) -> None:
    """--split and the Hub options (:func:`add_hub_data_args`)."""
    p.add_argument(
        "--split",
        default="validation",
        help="dataset split (default: validation); only this split is downloaded and prepared",
    )
    add_hub_data_args(p)


def add_hub_data_args(p: argparse.ArgumentParser) -> None:
    """The options of a Hub (or parquet) data set: configuration, revision, streaming."""
    p.add_argument(
        "--data-config",
        default=None,
        metavar="NAME",
        help="the data set's configuration (Hub and parquet sets with several)",
    )
    p.add_argument("--revision", default=None, help="a branch, tag or commit of a Hub data set")
    p.add_argument(
        "--streaming",
        action="store_true",
        help="stream the first --max-images images of the split instead of downloading it (needs --max-images)",
    )


def hub_data_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """``load_split``'s config, revision and streaming from the flags of :func:`add_hub_data_args`."""
    return dict(config=args.data_config, revision=args.revision, streaming=args.streaming)


def add_max_images_arg(p: argparse.ArgumentParser) -> None:
    """--max-images: the one limit on the images of a command's work."""
    p.add_argument("--max-images", type=int, default=None, metavar="N", help=MAX_IMAGES_HELP)


def add_probe_images_arg(p: argparse.ArgumentParser) -> None:
    """--probe-images: the SSDC probe's own count, inside a command that also measures fragility."""
    p.add_argument(
        "--probe-images",
        type=int,
        default=None,
        metavar="N",
        help=f"images for SSDC under RPI (default: {PROBE_IMAGES}, the paper's count, or --max-images if fewer)",
    )


def add_loader_args(p: argparse.ArgumentParser) -> None:
    """--resize, --batch-size and --num-workers."""
    p.add_argument(
        "--resize",
        default="paper",
        choices=("paper", "timm"),
        help="paper: straight to the input size (default); timm: timm's resize + centre crop",
    )
    p.add_argument("--batch-size", type=int, default=64, help="images per batch (default 64)")
    p.add_argument("--num-workers", type=int, default=None, help="DataLoader workers (default min(4, cpus - 1))")


BAD_IMAGES = ("error", "skip")
BAD_IMAGES_HELP = "an image that cannot be decoded: error (named) or skip (checked first, left out, listed)"


def add_bad_images_arg(p: argparse.ArgumentParser, default: str | None = "error", default_help: str = "error") -> None:
    """--bad-images error|skip (``default`` None: the recipe's, in train and study)."""
    p.add_argument(
        "--bad-images", default=default, choices=BAD_IMAGES, help=f"{BAD_IMAGES_HELP}; default: {default_help}"
    )


def add_data_args(p: argparse.ArgumentParser) -> None:
    """The data flags of a command that measures one model: source, limit, loader, bad images."""
    add_source_args(p)
    add_max_images_arg(p)
    add_loader_args(p)
    add_bad_images_arg(p)


LABELS_HELP = (
    "how the data's labels meet the model's classes: check (refuse a different number of classes or "
    "different class names), by-name (map the data's classes onto the model's by its recorded class "
    "names, or an ImageNet head's WordNet ids and names), as-is (use the indices unchecked)"
)


def add_labels_arg(p: argparse.ArgumentParser, default: str = "check", default_help: str = "check") -> None:
    p.add_argument(
        "--labels",
        default=default,
        choices=("check", "by-name", "as-is"),
        help=f"{LABELS_HELP}; default: {default_help}",
    )


SEED_HELP = (
    "seed of everything random (default 0): torch before a model is built (random init), the RPI "
    "permutation, the bootstrap, random corruptions"
)


class _Refused(argparse.Action):
    """A flag that means something else in another command: refused here with a pointer (one line, exit 2)."""

    def __init__(self, option_strings, dest, message: str = "", **kwargs):
        self.message = message
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        parser.exit(2, f"{parser.prog}: error: {self.message}\n")


def add_imagenet_c_jpeg_blur_arg(p: argparse.ArgumentParser) -> None:
    """--imagenet-c-jpeg-blur (zoo, study). ``--imagenet-c`` is fragility's alone (every ImageNet-C
    corruption): its former use here for JPEG and blur only is refused with a pointer to the new name."""
    p.add_argument(
        "--imagenet-c-jpeg-blur",
        action="store_true",
        help="also ImageNet-C's JPEG and blur corruptions at severities 1-5 (10 more shifts; posgeom "
        "fragility --imagenet-c runs every ImageNet-C corruption)",
    )
    p.add_argument(
        "--imagenet-c",
        dest=argparse.SUPPRESS,
        default=argparse.SUPPRESS,
        nargs="?",
        action=_Refused,
        help=argparse.SUPPRESS,
        message="--imagenet-c is fragility's (every ImageNet-C corruption); ImageNet-C's JPEG and blur "
        "here is --imagenet-c-jpeg-blur",
    )


RPI_PERMUTATIONS_HELP = (
    f"RPI permutations (default {RPI_PERMUTATIONS}): every SSDC and attention number under RPI is "
    "the mean over K seeded permutations (seeds SEED .. SEED+K-1; an alpha sweep draws K afresh "
    "for each alpha), with a 95%% interval over them; 1 gives no interval"
)
RPI_HELP = (
    "random permutation of the patch tokens at inference, before any PE: SSDC and attention average over "
    "--rpi-permutations shared permutations; accuracy (fragility) gives each image a permutation of its own"
)


def add_rpi_permutations_arg(p: argparse.ArgumentParser) -> None:
    """--rpi-permutations K: the permutations every measurement under RPI averages over."""
    p.add_argument("--rpi-permutations", type=int, default=None, metavar="K", help=RPI_PERMUTATIONS_HELP)


def add_intervention_args(p: argparse.ArgumentParser, shared: bool = True) -> None:
    """--rpi, --rpi-permutations and --alpha: the interventions a measuring command applies
    (docs/method.md#rpi-and-rpt). ``shared``: RPI averages over shared permutations (SSDC, attention: the flag
    --rpi-permutations); else each image has its own (accuracy: no such flag)."""
    p.add_argument("--rpi", action="store_true", help=RPI_HELP)
    if shared:
        add_rpi_permutations_arg(p)
    p.add_argument(
        "--alpha",
        type=_alpha,
        default=None,
        metavar="ALPHA",
        help="scale the positional encoding by ALPHA, or each encoding by its own: COMPONENT=ALPHA,... "
        "(e.g. ape=0,rope=1; pe_inventory's components; those not named keep their scale)",
    )


def _alpha(text: str) -> Any:
    """--alpha: a number or COMPONENT=ALPHA pairs (argparse says a ValueError in one line)."""
    try:
        return parse_alpha_spec(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_components_arg(p: argparse.ArgumentParser) -> None:
    """--components: the positional encodings an intervention acts on (pe_inventory's component names)."""
    p.add_argument(
        "--components",
        default=None,
        metavar="NAMES",
        help="the positional encodings to act on, comma-separated (pe_inventory's components: ape, sincos, rope, "
        "relative, ...), the others kept as they are; default: every one",
    )


def components_arg(args: argparse.Namespace) -> list[str] | None:
    """--components as a list of names (None: every encoding)."""
    text = getattr(args, "components", None)
    names = [c.strip() for c in text.split(",") if c.strip()] if text else []
    return names or None


def add_distance_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--distance",
        default="manhattan",
        choices=("manhattan", "euclidean", "chebyshev"),
        help="grid distance of SSDC (default manhattan; attention's mean attention distance is always Euclidean)",
    )


def add_seed_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seed", type=int, default=0, help=SEED_HELP)


DEVICE_HELP = "cpu, cuda, ... (default: cuda when available)"


def add_device_args(p: argparse.ArgumentParser, device_help: str = DEVICE_HELP) -> None:
    """--device and --no-progress."""
    p.add_argument("--device", default=None, help=device_help)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def add_run_args(p: argparse.ArgumentParser, out: str) -> None:
    """--seed, --device, --out (default ``out``) and --no-progress."""
    add_seed_arg(p)
    p.add_argument("--out", default=out, help=f"output folder (default: {out})")
    add_device_args(p)


def add_shift_arg(p: argparse.ArgumentParser, default_help: str) -> None:
    p.add_argument(
        "--shift",
        action="append",
        default=None,
        metavar="SPEC",
        help=f"a shift, repeatable (default: {default_help}); forms: " + "; ".join(SPEC_FORMS),
    )


def add_site_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--site",
        default="auto",
        choices=("auto", "attn_input", "block_output", "stage_output"),
        help="probe site: auto (default: attn_input for a flat ViT, stage_output otherwise), the input of "
        "each block's attention (the paper's), each block's output, or each stage's feature map "
        "(hierarchical ViTs, CNNs: each on its own grid)",
    )


def _count_limits(args: argparse.Namespace) -> dict[str, tuple[int, str]]:
    """flag dest -> (the most it may ask, what each unit costs), for the counts ``args`` gives."""
    from ..measuring.settings import MAX_CLASSES, MAX_IMG_SIZE, MAX_RPI_PERMUTATIONS, max_workers

    limits = {
        "num_workers": (max_workers(), "4 per CPU here: each worker is a process of its own"),
        "img_size": (MAX_IMG_SIZE, "px a side: a ViT's tokens grow with its square"),
        "shift_size": (MAX_IMG_SIZE, "px a side"),
        "num_classes": (MAX_CLASSES, "the head holds classes x width weights"),
        "rpi_permutations": (MAX_RPI_PERMUTATIONS, "each is a forward pass of every image"),
    }
    if getattr(args, "num_seeds", None) is not None:  # the study's own bound
        from ..app.study.config import MAX_SEEDS

        limits["num_seeds"] = (MAX_SEEDS, "each seed trains every condition once")
    return limits


def check_counts(args: argparse.Namespace) -> None:
    """Refuse counts no run could use (one line, before anything is loaded): below their least, above what they
    would cost (:func:`_count_limits`), a seed beyond 64 bits."""
    for flag, (high, why) in _count_limits(args).items():
        value = getattr(args, flag, None)
        if isinstance(value, int) and value > high:
            raise SettingError(f"--{flag.replace('_', '-')} must be at most {high:,} ({why}), got {value:,}")
    seed = getattr(args, "seed", None)
    if isinstance(seed, int) and not -(2**63) <= seed < 2**63:
        raise SettingError(f"--seed must fit in 64 bits (from -2**63 to 2**63 - 1), got {seed}")
    for flag in (
        "batch_size",
        "max_images",
        "num_workers",
        "img_size",
        "num_classes",
        "probe_images",
        "images",
        "rpi_permutations",
        "num_seeds",
    ):
        value = getattr(args, flag, None)
        # train's --probe-images 0: no SSDC at its evaluations (the recipe's probe_images: 0)
        low = 0 if flag == "num_workers" or (flag == "probe_images" and getattr(args, "command", "") == "train") else 1
        if value is not None and value < low:
            raise SettingError(f"--{flag.replace('_', '-')} must be >= {low}, got {value}")


def load_model_and_data(args: argparse.Namespace, subset: bool = True) -> tuple[Any, Any, str]:
    """(model on its device in eval mode, the data split, device) from the shared arguments; the split cut
    to ``--max-images`` when ``subset`` (a command whose probe has its own count passes False).

    torch is seeded with ``--seed`` before the model is built (a random-init model is reproducible).
    """
    import torch

    from ..data import check_images, load_split
    from ..models.factory import create_model

    check_counts(args)
    data = load_split(args.data, args.split, subset=args.max_images if subset else None, **hub_data_kwargs(args))
    if args.bad_images == "skip":
        data = check_images(data, "skip", progress=not args.no_progress)
        if data.skipped:
            print(
                f"left out {len(data.skipped)} image(s) that cannot be decoded: {'; '.join(data.skipped[:5])}"
                f"{' ...' if len(data.skipped) > 5 else ''}",
                file=sys.stderr,
            )
    if len(data) == 0:
        raise DataError(f"the {args.split!r} split of {args.data} is empty")
    num_classes = args.num_classes
    if num_classes is None and args.checkpoint is not None:
        num_classes = data.num_classes
    torch.manual_seed(args.seed)
    model = create_model(
        args.model,
        pretrained=args.pretrained,
        checkpoint=args.checkpoint,
        img_size=args.img_size,
        num_classes=num_classes,
    )
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    model.to(device).eval()
    return model, data, device


def parse_alphas(text: str) -> list[float]:
    """``"1,0.9,0.5"`` -> [1.0, 0.9, 0.5]; each alpha a finite number >= 0."""
    from ..pos.common import check_alpha

    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise SettingError(f"--alphas needs comma-separated numbers, got {text!r}")
    return [check_alpha(p) for p in parts]


def parse_extras(text: str) -> tuple[str, ...]:
    """``"attention,position"`` -> ("attention", "position"); ``none`` (or nothing) -> ()."""
    return tuple(e.strip() for e in text.split(",") if e.strip() and e.strip() != "none")


# flags whose value is not the setting as parsed: read by protocol_options below
_READ_APART = frozenset({"alphas", "shifts", "extras", "shift_size", "progress"})


def protocol_options(args: argparse.Namespace) -> dict[str, Any]:
    """The :class:`~timm_posgeom.protocol.Protocol` settings the measuring flags of ``args`` give, by their one name:
    every flag whose destination is a setting's name (``--max-images``, ``--probe-images``, ``--rpi-permutations``,
    ``--seed``, ``--site``, ``--resize``, ``--img-size``, ``--batch-size``, ``--num-workers``, ``--device``,
    ``--labels``...), and ``--alphas A,B,..``, ``--shift SPEC`` (repeatable) / ``--imagenet-c-jpeg-blur`` (the
    paper's shifts and ImageNet-C's JPEG and blur), ``--extras A,B`` (``none``), ``--shift-size PX`` (0: None),
    ``--no-progress``. A flag the command lacks, or left at None, is left out: the command's default applies."""
    values = {
        name: getattr(args, name)
        for name in PROTOCOL_FIELDS
        if name not in _READ_APART and getattr(args, name, None) is not None
    }
    if isinstance(getattr(args, "alphas", None), str):
        values["alphas"] = tuple(parse_alphas(args.alphas))
    shifts = list(getattr(args, "shift", None) or ())
    if getattr(args, "imagenet_c_jpeg_blur", False):
        shifts = [*(shifts or PAPER_SHIFTS), *IMAGENET_C_JPEG_BLUR]
    if shifts:
        values["shifts"] = tuple(shifts)
    if isinstance(getattr(args, "extras", None), str):
        values["extras"] = parse_extras(args.extras)
    if getattr(args, "shift_size", None) is not None:
        if args.shift_size < 0:
            raise SettingError(
                f"--shift-size must be a size in px >= 1, or 0 (at the model's input), got {args.shift_size}"
            )
        values["shift_size"] = args.shift_size or None
    if hasattr(args, "no_progress"):
        values["progress"] = not args.no_progress
    return values


def protocol_from_args(args: argparse.Namespace, **defaults: Any) -> Protocol:
    """The :class:`~timm_posgeom.protocol.Protocol` of a measuring command: ``defaults`` (the command's own), then
    every setting its flags give (:func:`protocol_options`); ProtocolError (one line) for a setting none can use."""
    return Protocol(**{**defaults, **protocol_options(args)})
