"""One name per idea, one meaning per name: every ``posgeom`` subcommand's parser, read against the list of
ideas below (issue 42). Adding a flag for an idea listed here means using its one name; a new idea that
several commands share gets an entry."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

import pytest

# the commands by what they do
MEASURING = {"probe", "attention", "fragility", "sweep", "extrapolate", "intervene"}  # one model, one split
READ_DATA = MEASURING | {"zoo", "train", "study"}  # read images of a data set
BUILD_TIMM_NAMES = MEASURING | {"zoo"}  # build a timm name (train and study build from a recipe, at random init)
# score the data's labels against a model's classes
SCORE_LABELS = {"fragility", "sweep", "extrapolate", "intervene", "zoo"}


@dataclass(frozen=True)
class Idea:
    flag: str  # its one name
    commands: set[str]  # every command it applies to: each must take it
    # names that read as the same idea and must not be live flags anywhere (an old one may stay hidden for one
    # release, as an alias of `flag`: DEPRECATED below)
    other_names: set[str] = field(default_factory=set)


IDEAS = {
    "at most the first N images, for all the work": Idea(
        "--max-images",
        READ_DATA,
        {
            "--images",
            "--num-images",
            "--n-images",
            "--subset",
            "--train-subset",
            "--val-subset",
            "--eval-images",
            "--max-train-images",
            "--max-val-images",
            "--synthetic-size",
            "--limit",
        },
    ),
    "the SSDC probe's own count of images": Idea(
        "--probe-images",
        {"sweep", "extrapolate", "intervene", "zoo", "train", "study"},
        {"--ssdc-images", "--rpi-ssdc-images"},
    ),
    "a seed value": Idea("--seed", MEASURING | {"zoo", "train"}, {"--random-seed"}),
    "a number of seeds": Idea("--num-seeds", {"study"}, {"--seeds", "--n-seeds"}),
    "ImageNet-C's corruptions (all, extra or named)": Idea("--imagenet-c", {"fragility"}, {"--imagenet-c-all"}),
    "ImageNet-C's JPEG and blur only": Idea("--imagenet-c-jpeg-blur", {"zoo", "study"}),
    "a timm name's weights or random init": Idea("--pretrained", BUILD_TIMM_NAMES, {"--random-init", "--weights"}),
    "how the data's labels meet the model's classes": Idea("--labels", SCORE_LABELS, {"--label-map", "--match-labels"}),
    "an image that cannot be decoded": Idea("--bad-images", READ_DATA, {"--skip-bad-images", "--on-bad-image"}),
    "the device": Idea("--device", READ_DATA, {"--accelerator", "--gpu"}),
    "the split measured": Idea("--split", MEASURING | {"zoo"}),
    "the training split": Idea("--train-split", {"train", "study"}),
    "the validation split": Idea("--val-split", {"train", "study"}, {"--validation-split", "--eval-split"}),
    "a data set's configuration": Idea("--data-config", READ_DATA, {"--dataset-config", "--config-name"}),
    "a Hub data set's revision": Idea("--revision", READ_DATA),
    "streaming the first images": Idea("--streaming", READ_DATA, {"--stream"}),
    "a run's export folder": Idea("--export", {"card", "push"}, {"--weights", "--export-dir"}),
}

# old names accepted for one release (hidden, a one-line notice): old -> new
DEPRECATED = {"--images": "--max-images", "--seeds": "--num-seeds", "--weights": "--export"}
# a name that is another command's, refused here with a pointer (never silently another meaning)
REFUSED = {"--imagenet-c": {"zoo", "study"}}
# recipe keys named after the flags that set them
RECIPE_KEYS = {
    "--max-images": {"max_train_images", "max_val_images"},
    "--probe-images": {"probe_images"},
    "--bad-images": {"bad_images"},
    "--data-config": {"data_config"},
    "--revision": {"revision"},
    "--streaming": {"streaming"},
    "--train-split": {"train_split"},
    "--val-split": {"val_split"},
    "--seed": {"seed"},
}
OLD_RECIPE_KEYS = {"train_subset", "val_subset", "synthetic_size", "rpi_ssdc_images"}


def _parsers() -> dict[str, argparse.ArgumentParser]:
    from timm_posgeom.cli.main import COMMANDS, build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert sorted(sub.choices) == sorted(COMMANDS)
    return dict(sub.choices)


def _flags(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {flag: a for a in parser._actions for flag in a.option_strings if flag not in ("-h", "--help")}


def _meaning(action: argparse.Action) -> tuple:
    """What a flag does, as the parser says it: its kind of action, what it takes (a text and a path are the same
    to a user) and its choices."""
    kind = getattr(action.type, "__name__", action.type)
    return (
        type(action).__name__,
        action.nargs,
        action.const,
        "text" if kind in (None, "str", "Path") else kind,
        tuple(action.choices or ()),
    )


def _hidden(action: argparse.Action) -> bool:
    return action.help is argparse.SUPPRESS


def test_every_command_takes_each_idea_by_its_one_name():
    parsers = _parsers()
    missing = {
        idea: sorted(i.commands - {c for c, p in parsers.items() if i.flag in _flags(p)}) for idea, i in IDEAS.items()
    }
    assert not {k: v for k, v in missing.items() if v}, f"commands without the flag of an idea they do: {missing}"
    for command, parser in parsers.items():
        for flag, action in _flags(parser).items():
            for idea, i in IDEAS.items():
                if flag in i.other_names and not _hidden(action):
                    pytest.fail(f"posgeom {command} {flag}: a second name for {idea!r}, whose flag is {i.flag}")


def test_one_meaning_per_flag_across_the_commands():
    by_flag: dict[str, dict[str, tuple]] = {}
    for command, parser in _parsers().items():
        for flag, action in _flags(parser).items():
            if flag in DEPRECATED or command in REFUSED.get(flag, ()):
                continue
            by_flag.setdefault(flag, {})[command] = _meaning(action)
    two = {flag: meanings for flag, meanings in by_flag.items() if len(set(meanings.values())) > 1}
    assert not two, f"one flag, several meanings: {two}"
    # a seed is a value wherever it is taken; a count of seeds is an int too, under its own name
    assert all(m[3] == "int" for m in by_flag["--seed"].values())


def test_hidden_names_are_old_names_or_refusals_only():
    for command, parser in _parsers().items():
        for flag, action in _flags(parser).items():
            if not _hidden(action):
                continue
            if flag in DEPRECATED:
                new = DEPRECATED[flag]
                assert new in _flags(parser), f"posgeom {command} {flag}: the old name of {new}, which it lacks"
            else:
                assert command in REFUSED.get(flag, ()), f"posgeom {command} {flag}: hidden, and no old name"


def test_flags_are_never_abbreviated():
    """An abbreviation is one more name for a flag (`study --seed 3` once meant three seeds)."""
    assert all(not p.allow_abbrev for p in _parsers().values())


def test_recipe_keys_are_named_after_the_flags():
    from timm_posgeom.app.recipe import Recipe

    keys = set(Recipe.keys())
    train = _flags(_parsers()["train"])
    for flag, names in RECIPE_KEYS.items():
        assert flag in train and names <= keys, (flag, names - keys)
    assert not keys & OLD_RECIPE_KEYS


def test_an_old_name_works_with_a_one_line_notice_and_refuses_the_new_one_beside_it(capsys):
    from timm_posgeom.cli._options import apply_renamed
    from timm_posgeom.cli.main import build_parser, command_parser

    parser = build_parser()
    args = parser.parse_args(["study", "--seeds", "3", "--dry-run"])
    apply_renamed(args, command_parser(parser, "study"))
    err = capsys.readouterr().err.strip().splitlines()
    assert args.num_seeds == 3 and len(err) == 1 and "--seeds is deprecated" in err[0] and "--num-seeds" in err[0]
    args = parser.parse_args(["card", "run", "--weights", "export_ema"])
    apply_renamed(args, command_parser(parser, "card"))
    assert args.export == "export_ema"
    args = parser.parse_args(["study", "--seeds", "3", "--num-seeds", "2"])
    with pytest.raises(ValueError, match="--seeds is the old name of --num-seeds: give only --num-seeds"):
        apply_renamed(args, command_parser(parser, "study"))


@pytest.mark.parametrize("command", ["zoo", "study"])
def test_imagenet_c_outside_fragility_is_refused_with_a_pointer(capsys, command):
    from timm_posgeom.cli.main import main

    with pytest.raises(SystemExit) as e:
        main([command, "--imagenet-c", "--dry-run"] if command == "study" else [command, "--imagenet-c"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and "--imagenet-c-jpeg-blur" in err[0]
