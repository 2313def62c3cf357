"""The bad-input suite, class 4 of issue 54: options a runner accepts but drops on the way.

``posgeom zoo M --labels as-is`` scored accuracy with the default label check: the zoo matched the labels itself,
then called ``fragility`` without ``labels``. Here every setting is set away from its default and each library
function it concerns is spied on (the real function still runs, on a micro model and a few synthetic images): a
setting that does not arrive is a silent wrong. Three layers are checked, each against the setting's own value:

* :func:`timm_posgeom.protocol.measure_model`: every :class:`~timm_posgeom.protocol.Protocol` setting reaches
  every function it concerns (``CONCERNS`` names them all; a new setting without its entry fails);
* the zoo's and the study's measuring of one model: every option of their configs reaches the same functions;
* the command line: every measuring flag of ``posgeom zoo`` and ``posgeom study`` lands in the protocol.
"""

from __future__ import annotations

import argparse
import inspect
import sys
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
import timm
import torch
from faultsuite import judge

pytestmark = [pytest.mark.xdist_group("fault_options"), pytest.mark.filterwarnings("ignore:clean accuracy is 0")]

SPIED = {
    "timm_posgeom.probes": ("probe_ssdc", "attention_measures", "position_probe"),
    "timm_posgeom.robustness": ("fragility", "alpha_sweep", "sweep_ssdc"),
    "timm_posgeom.data.eval_data": ("eval_loader",),
}
# the modules whose calls are the runner's own (the library's calls inside the library are its business)
CALLERS = ("timm_posgeom.protocol", "timm_posgeom.app.zoo.measure", "timm_posgeom.app.study.measure")
IMG, DEPTH = 32, 2


class Spy:
    """Every call of the spied library functions made by a runner: (function, its arguments bound by name, the
    function's defaults filled in)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.calls: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for module_name, names in SPIED.items():
            module = sys.modules.get(module_name) or __import__(module_name, fromlist=["_"])
            for name in names:
                monkeypatch.setattr(module, name, self._wrap(name, getattr(module, name)))

    def _wrap(self, name: str, real: Callable) -> Callable:
        signature = inspect.signature(real)

        def spy(*args: Any, **kwargs: Any) -> Any:
            if sys._getframe(1).f_globals.get("__name__") in CALLERS:
                bound = signature.bind(*args, **kwargs)
                bound.apply_defaults()
                self.calls[name].append(dict(bound.arguments))
            return real(*args, **kwargs)

        return spy


def received(call: dict[str, Any], name: str) -> Any:
    """What a call gave ``name``: its own argument, a keyword of its ``**options``, or its MeasureSettings' field
    (explicit settings, else the defaults the function would use)."""
    from timm_posgeom.measuring.settings import MeasureSettings

    if name in call:
        return call[name]
    options = call.get("options") or {}
    if name in options:
        return options[name]
    settings = call.get("settings") or MeasureSettings()
    return getattr(settings, name, None)  # an option of the function's own, not given: its default, None


def length(data: Any) -> int:
    """The images a loader reads."""
    return len(data.dataset)


# setting -> (function, what the call received, the value due): every setting, every function it concerns
Check = tuple[str, Callable[[dict[str, Any]], Any], Callable[[Any], Any]]


def _same(name: str) -> Callable[[dict[str, Any]], Any]:
    return lambda call: received(call, name)


def concerns() -> dict[str, list[Check]]:
    """What each protocol setting concerns: (function, how to read what a call received, what it should be
    from the protocol ``p``). Calls are those the runner makes; every call of the function must agree."""
    settings_of = ("fragility", "alpha_sweep", "probe_ssdc", "attention_measures")
    loaders = ("eval_loader",)
    return {
        "max_images": [("fragility", _same("max_images"), lambda p: p.max_images)],
        "probe_images": [
            ("probe_ssdc", lambda c: length(c["data"]), lambda p: p.probe_count()),
            ("alpha_sweep", _same("probe_images"), lambda p: p.probe_count()),
            ("attention_measures", lambda c: length(c["data"]), lambda p: min(p.probe_count(), p.attention_images)),
            ("position_probe", lambda c: length(c["train"]) + length(c["test"]), lambda p: p.probe_count()),
        ],
        "sweep_images": [("alpha_sweep", _same("max_images"), lambda p: p.sweep_images)],
        "rpi_permutations": [(f, _same("rpi_permutations"), lambda p: p.rpi_permutations) for f in settings_of],
        "seed": [(f, _same("seed"), lambda p: p.seed) for f in (*settings_of, "position_probe")],
        "alphas": [("alpha_sweep", lambda c: tuple(c["alphas"]), lambda p: p.alphas)],
        "alpha_components": [
            ("alpha_sweep", lambda c: tuple(received(c, "components") or ()) or None, lambda p: p.alpha_components)
        ],
        "sweep_shifts": [("alpha_sweep", lambda c: tuple(c["shifts"]), lambda p: p.sweep_shifts)],
        "shifts": [("fragility", lambda c: tuple(c["shifts"]), lambda p: p.shifts)],
        "shift_size": [("fragility", _same("shift_size"), lambda p: {None, p.shift_size})],
        "labels": [(f, _same("labels"), lambda p: p.labels) for f in ("fragility", "alpha_sweep")],
        "img_size": [(f, _same("img_size"), lambda p: p.img_size) for f in (*loaders, "fragility", "alpha_sweep")],
        "resize": [(f, _same("resize"), lambda p: p.resize) for f in (*loaders, "fragility", "alpha_sweep")],
        "site": [(f, _same("site"), lambda p: p.site) for f in ("probe_ssdc", "alpha_sweep", "position_probe")],
        "reduction": [("probe_ssdc", _same("reduction"), lambda p: p.reduction)],
        "extras": [
            ("attention_measures", _same("rpi"), lambda p: {False, True}),
            ("position_probe", _same("rpi"), lambda p: {False, True}),
        ],
        "attention_layers": [("attention_measures", _same("layers"), lambda p: [DEPTH - 1])],
        "attention_images": [("attention_measures", lambda c: length(c["data"]), lambda p: p.attention_images)],
        "batch_size": [
            (f, _same("batch_size"), lambda p: p.batch_size)
            for f in (*loaders, "fragility", "alpha_sweep", "position_probe")
        ],
        "num_workers": [(f, _same("num_workers"), lambda p: p.num_workers) for f in (*loaders, "fragility")],
        "device": [
            (f, lambda c: str(received(c, "device")), lambda p: str(p.device)) for f in (*settings_of, "position_probe")
        ],
        "progress": [(f, _same("progress"), lambda p: p.progress) for f in (*settings_of, "position_probe")],
    }


def _verdict(calls: list[dict[str, Any]], read: Callable, due: Any) -> tuple[str, Any]:
    """right when the function was called and every call received ``due`` (a set: the calls' values are its
    members, each at least once), else silent_wrong; with what was received."""
    got = [read(c) for c in calls]
    if isinstance(due, set):
        ok = bool(got) and set(map(_key, got)) == set(map(_key, due))
    else:
        ok = bool(got) and all(_key(g) == _key(due) for g in got)
    return ("right" if ok else "silent_wrong"), got


def _key(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def _cases() -> Iterator[Any]:
    for setting, checks in concerns().items():
        for function, _, _ in checks:
            yield pytest.param(setting, function, id=f"{setting}->{function}")


# --------------------------------------------------------------------------------------------
# the model and data every case measures
# --------------------------------------------------------------------------------------------
def _model(num_classes: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return timm.create_model(
        "posgeom_vit_micro_patch8_64_ape",
        num_classes=num_classes,
        img_size=IMG,
        embed_dim=32,
        depth=DEPTH,
        num_heads=2,
    ).eval()


@pytest.fixture(scope="module")
def val() -> Any:
    from timm_posgeom.data import load_split

    return load_split("synthetic", "validation", synthetic_size=12, img_size=48)


@pytest.fixture(scope="module")
def export(tmp_path_factory, val) -> Path:
    """The micro model as ``posgeom train`` exports a run (``local-dir:`` loads it)."""
    from timm_posgeom.app.hub import export_for_hub

    folder = tmp_path_factory.mktemp("run") / "export"
    export_for_hub(
        _model(val.num_classes),
        folder,
        dict(img_size=IMG, num_classes=val.num_classes, embed_dim=32, depth=DEPTH, num_heads=2),
    )
    return folder


AWAY = dict(  # every measuring setting away from its default (and from the others' values, where a number)
    max_images=7,
    probe_images=6,
    sweep_images=5,
    rpi_permutations=2,
    seed=3,
    alphas=(1.0, 0.5),
    alpha_components=("ape",),
    sweep_shifts=("blur:1.5",),
    shifts=("jpeg:10", "blur:1.5"),
    shift_size=40,
    labels="as-is",
    img_size=IMG,
    resize="timm",
    site="block_output",
    reduction="both",
    extras=("attention", "attention_rpi", "position"),
    attention_layers=1,
    attention_images=4,
    batch_size=3,
    num_workers=0,
    device="cpu",
    progress=True,
)


@pytest.fixture(scope="module")
def protocol_calls(val) -> tuple[Any, dict[str, list[dict[str, Any]]]]:
    """measure_model under a protocol with every setting away from its default, its library calls spied."""
    from timm_posgeom.protocol import Protocol, measure_model

    protocol = Protocol(**AWAY)
    assert all(getattr(protocol, f.name) != f.default for f in fields(Protocol)), "a setting left at its default"
    with pytest.MonkeyPatch.context() as mp:
        spy = Spy(mp)
        measure_model(_model(val.num_classes), val, protocol)
    return protocol, spy.calls


def test_the_checks_name_every_setting_of_the_protocol():
    """A new setting of the protocol must say which library functions it concerns, and be checked there."""
    from timm_posgeom.protocol import PROTOCOL_FIELDS

    assert set(concerns()) == set(PROTOCOL_FIELDS) and set(AWAY) == set(PROTOCOL_FIELDS)


@pytest.mark.slow
@pytest.mark.parametrize("setting, function", list(_cases()))
def test_every_protocol_setting_reaches_every_function_it_concerns(protocol_calls, setting, function):
    protocol, calls = protocol_calls
    read, due = next((r, d) for f, r, d in concerns()[setting] if f == function)
    outcome, got = _verdict(calls[function], read, due(protocol))
    judge("options", outcome, "right", f"{setting} -> {function}: received {got}, due {due(protocol)}")


@pytest.mark.slow
def test_the_sweep_without_matched_labels_still_receives_its_settings(val):
    """Labels that cannot be matched leave FS out; the sweep's SSDC part alone (sweep_ssdc) is measured, and it
    too receives the site, the alphas, the seed and the RPI permutations."""
    from timm_posgeom.protocol import Protocol, measure_model

    protocol = Protocol(**dict(AWAY, labels="check", extras=(), shift_size=None))
    with pytest.MonkeyPatch.context() as mp:
        spy = Spy(mp)
        measured = measure_model(_model(val.num_classes + 1), val, protocol)  # one class more: labels refused
    (call,) = spy.calls["sweep_ssdc"]
    got = (call["site"], tuple(call["alphas"]), call["settings"].seed, call["settings"].rpi_permutations)
    due = (protocol.site, protocol.alphas, protocol.seed, protocol.rpi_permutations)
    outcome = "right" if got == due and length(call["loader"]) == protocol.probe_count() else "silent_wrong"
    judge("options", outcome, "right", (got, due))
    assert measured.fragility is None and measured.alpha_sweep is None and len(measured.sweep_ssdc) == 2


# --------------------------------------------------------------------------------------------
# the runners: the zoo's and the study's measuring of one model
# --------------------------------------------------------------------------------------------
# the options the zoo had before the protocol (so that this section runs on that code too), away from their
# defaults; progress is measure_model's own argument
ZOO_OPTIONS = (
    "max_images", "probe_images", "rpi_permutations", "seed", "alphas", "shifts", "labels", "img_size", "resize",
    "site", "batch_size", "num_workers", "device",
)  # fmt: skip
ZOO_AWAY = {**{k: AWAY[k] for k in ZOO_OPTIONS}, "extras": ("attention", "position")}


@pytest.fixture(scope="module")
def zoo_calls(val, export) -> tuple[Any, dict[str, list[dict[str, Any]]]]:
    """The zoo's measuring of one model with every option away from its default, its library calls spied."""
    from timm_posgeom.app.zoo import ZooConfig
    from timm_posgeom.app.zoo.measure import measure_model

    config = ZooConfig(data="synthetic", pretrained="off", **ZOO_AWAY)
    with pytest.MonkeyPatch.context() as mp:
        spy = Spy(mp)
        record = measure_model(f"local-dir:{export}", config, val, progress=True)
    assert record.status == "ok", record.error
    return config, spy.calls


def _zoo_cases() -> Iterator[Any]:
    for setting, checks in concerns().items():
        if setting in ZOO_AWAY or setting == "progress":
            for function, _, _ in checks:
                yield pytest.param(setting, function, id=f"zoo:{setting}->{function}")


class _Due:
    """The values due from a runner's config, read like a protocol's (its fields by the protocol's names)."""

    def __init__(self, config: Any, **fixed: Any):
        self.config, self.fixed = config, fixed

    def __getattr__(self, name: str) -> Any:
        if name in self.fixed:
            return self.fixed[name]
        return getattr(self.config, name)

    def probe_count(self) -> int:
        from timm_posgeom.protocol import probe_count

        return probe_count(self.probe_images, self.max_images)


@pytest.mark.slow
@pytest.mark.parametrize("setting, function", list(_zoo_cases()))
def test_every_zoo_option_reaches_every_function_it_concerns(zoo_calls, setting, function):
    """The example of the issue: --labels as-is never reached fragility or the sweep."""
    config, calls = zoo_calls
    due_from = _Due(config, progress=True, attention_images=10**9, sweep_images=config.max_images)
    read, due = next((r, d) for f, r, d in concerns()[setting] if f == function)
    if (setting, function) == ("extras", "attention_measures"):  # the zoo's attention: without RPI
        due = lambda p: {False}  # noqa: E731
    outcome, got = _verdict(calls[function], read, due(due_from))
    judge("options", outcome, "right", f"zoo {setting} -> {function}: received {got}, due {due(due_from)}")


STUDY_FIXED = dict(
    seed=0, reduction="both", labels="check", site="auto", resize="paper", img_size=None, alpha_components=None
)  # the study sweeps every PE of its models (one each)


@pytest.fixture(scope="module")
def study_calls(tmp_path_factory, val, export) -> tuple[Any, dict[str, list[dict[str, Any]]]]:
    """The study's measuring of one trained run with every option of its config away from its default."""
    from timm_posgeom.app.study import preset_config
    from timm_posgeom.app.study.measure import Measuring, eval_settings, measure_run
    from timm_posgeom.app.study.plan import PlannedRun

    run_dir = tmp_path_factory.mktemp("study") / "runs" / "ape_s0"
    run_dir.mkdir(parents=True)
    (run_dir / "export").symlink_to(export, target_is_directory=True)
    options = {k: AWAY[k] for k in ("max_images", "probe_images", "sweep_images", "rpi_permutations", "alphas")}
    options.update({k: AWAY[k] for k in ("shift_size", "batch_size", "device", "attention_layers")})
    config = preset_config("demo", shifts=AWAY["shifts"], attention_images=4, num_workers=1, **options)
    config.extras = ("attention", "attention_rpi")
    m = Measuring(config=config, val=val, settings=eval_settings(config, val), versions={}, log=lambda s: None)
    with pytest.MonkeyPatch.context() as mp:
        spy = Spy(mp)
        measure_run(PlannedRun("ape", 0, run_dir, "x", (), None), m)  # type: ignore[arg-type]
    return config, spy.calls


def _study_cases() -> Iterator[Any]:
    skip = {"sweep_shifts", "extras", "progress", *STUDY_FIXED}  # not options of the study: its own constants
    for setting, checks in concerns().items():
        if setting not in skip:
            for function, _, _ in checks:
                if function != "position_probe":  # not a measure of the study
                    yield pytest.param(setting, function, id=f"study:{setting}->{function}")


@pytest.mark.slow
@pytest.mark.parametrize("setting, function", list(_study_cases()))
def test_every_study_option_reaches_every_function_it_concerns(study_calls, setting, function):
    config, calls = study_calls
    due_from = _Due(config, **STUDY_FIXED, shifts=tuple(config.shifts), alphas=tuple(config.alphas))
    read, due = next((r, d) for f, r, d in concerns()[setting] if f == function)
    outcome, got = _verdict(calls[function], read, due(due_from))
    judge("options", outcome, "right", f"study {setting} -> {function}: received {got}, due {due(due_from)}")


# --------------------------------------------------------------------------------------------
# the command line: every measuring flag lands in the protocol
# --------------------------------------------------------------------------------------------
# posgeom zoo's flags that are not measuring settings (what to measure, where to write, how to run)
ZOO_OWN = {
    "help", "models", "models_file", "filter", "data", "split", "data_config", "revision", "streaming", "out",
    "pretrained", "bad_images", "images", "allow_changes", "shard", "decode_per_model", "merge", "no_progress",
    "imagenet_c", "model_set",
}  # fmt: skip
# posgeom zoo's measuring flags, set away from their defaults, and the protocol they must give
ZOO_FLAGS = {
    "--max-images": ("7", "max_images", 7),
    "--probe-images": ("6", "probe_images", 6),
    "--img-size": ("32", "img_size", 32),
    "--site": ("block_output", "site", "block_output"),
    "--alphas": ("1,0.5", "alphas", (1.0, 0.5)),
    "--imagenet-c-jpeg-blur": (None, "shifts", None),
    "--resize": ("timm", "resize", "timm"),
    "--batch-size": ("3", "batch_size", 3),
    "--num-workers": ("1", "num_workers", 1),
    "--seed": ("3", "seed", 3),
    "--rpi-permutations": ("2", "rpi_permutations", 2),
    "--labels": ("as-is", "labels", "as-is"),
    "--device": ("cpu", "device", "cpu"),
    "--extras": ("attention_rpi", "extras", ("attention_rpi",)),
    "--components": ("ape", "alpha_components", ("ape",)),  # of a sweep: with --alphas (SWEEP_FOR)
}
SWEEP_FOR = {"--components": ["--alphas", "1,0.5"]}  # flags that need another to mean anything


def _parser(command: str) -> argparse.ArgumentParser:
    from timm_posgeom.cli.main import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[command]


def _dests(command: str) -> set[str]:
    return {a.dest for a in _parser(command)._actions if a.dest != argparse.SUPPRESS}


def _flag_cases(command: str, flags: dict[str, tuple]) -> Iterator[Any]:
    for flag in flags:
        yield pytest.param(command, flag, id=f"{command} {flag}")


# posgeom study's flags that are not measuring settings
STUDY_OWN = {
    "help", "preset", "data", "num_seeds", "conditions", "heldout", "out", "resume", "allow_changes", "dry_run",
    "overrides", "init", "train_split", "val_split", "data_config", "revision", "streaming", "bad_images",
    "imagenet_c",
}  # fmt: skip
STUDY_FLAGS = {
    "--max-images": ("48", "max_images", 48),
    "--probe-images": ("24", "probe_images", 24),
    "--rpi-permutations": ("2", "rpi_permutations", 2),
    "--imagenet-c-jpeg-blur": (None, "shifts", None),
    "--shift-size": ("96", "shift_size", 96),
    "--device": ("cpu", "device", "cpu"),
}
COMMANDS = {  # command -> (its own flags, its measuring flags, the argv before them)
    "zoo": (ZOO_OWN, ZOO_FLAGS, ["zoo", "M", "--data", "synthetic"]),
    "study": (STUDY_OWN, STUDY_FLAGS, ["study", "--preset", "demo"]),
}


def _protocol(argv: list[str]) -> Any:
    """The protocol posgeom ARGV measures with (the study's of an APE run)."""
    from timm_posgeom.cli import study, zoo
    from timm_posgeom.cli.main import build_parser

    args = build_parser().parse_args(argv)
    return zoo.zoo_config(args, "off").protocol() if argv[0] == "zoo" else study.study_config(args).protocol("ape")


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_flag_is_a_measuring_setting_or_the_commands_own(command):
    """A new flag of posgeom zoo or study must be mapped (*_FLAGS, checked below) or declared the command's own."""
    own, mapped, _ = COMMANDS[command]
    flags = {a.dest for a in _parser(command)._actions if any(o in mapped for o in a.option_strings)}
    assert _dests(command) - flags - own == set()


@pytest.mark.parametrize("command, flag", [*_flag_cases("zoo", ZOO_FLAGS), *_flag_cases("study", STUDY_FLAGS)])
def test_every_measuring_flag_lands_in_the_protocol(command, flag):
    from timm_posgeom.defaults import IMAGENET_C_JPEG_BLUR, PAPER_SHIFTS

    _, flags, argv = COMMANDS[command]
    argv = [*argv, *SWEEP_FOR.get(flag, [])]
    value, setting, due = flags[flag]
    if setting == "shifts":
        due = (*PAPER_SHIFTS, *IMAGENET_C_JPEG_BLUR)
    default = getattr(_protocol(argv), setting)
    got = getattr(_protocol([*argv, flag, *([value] if value else [])]), setting)
    outcome = "right" if got == due and default != due else "silent_wrong"
    judge("options", outcome, "right", f"{command} {flag} {value}: protocol {setting}={got!r}, due {due!r}")
