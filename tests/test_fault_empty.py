"""Bad-input suite, class "empty values" (issue 40, item 3): an explicit empty value (``--data ""``, ``--shard=``,
an empty MODEL: what an unset shell variable gives) is refused in one line with exit 2, for every option that
takes a value of every subcommand, never read as the option's default (``--data ""`` measured the synthetic set).

The generator walks the real parser (:func:`timm_posgeom.cli.main.build_parser`): a new flag is covered the day
it is added."""

from __future__ import annotations

import argparse

import pytest
from faultsuite import cli, judge, refused

from timm_posgeom.cli.main import build_parser


def _takes_value(action: argparse.Action) -> bool:
    if isinstance(action, (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)):
        return False
    return action.nargs != 0 and not isinstance(action, argparse.BooleanOptionalAction)


def _cases() -> list[tuple[str, list[str], str]]:
    """(id, argv, the argument's name in the message) for every subcommand x option that takes a value: the
    option given as ``--flag ""`` and as ``--flag=``, a positional given as ``""``."""
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    cases = []
    for command, parser in sub.choices.items():
        positionals = [a for a in parser._actions if not a.option_strings and _takes_value(a)]
        filler = ["x" for a in positionals if a.nargs not in ("?", "*")]
        for action in parser._actions:
            if not _takes_value(action):
                continue
            if action.option_strings:
                flag = action.option_strings[-1]
                cases.append((f"{command} {flag} ''", [command, *filler, flag, ""], flag))
                cases.append((f"{command} {flag}=", [command, *filler, f"{flag}="], flag))
            else:
                name = action.metavar or action.dest
                cases.append((f"{command} {name}=''", [command, ""], name))
    return cases


CASES = _cases()


def test_the_generator_covers_every_option_that_takes_a_value():
    ids = {c[0] for c in CASES}
    for expected in (
        "probe --data ''",
        "zoo --shard ''",
        "train --set ''",
        "study --data ''",
        "zoo MODEL=''",
        "fragility --imagenet-c-root ''",
        "probe model=''",
        "card --out ''",
        "push --repo-id ''",
    ):
        assert expected in ids, expected
    assert len(CASES) > 120


@pytest.mark.parametrize("argv,name", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_an_explicit_empty_value_is_refused_in_one_line(argv, name):
    run = cli(argv)
    judge("empty", refused(run, f"argument {name}: an empty value"), "refused", run.err or run.trace)


def test_an_empty_data_is_never_the_synthetic_set(tmp_path):
    """The issue's example: ``posgeom probe M --data ""`` measured the built-in synthetic set, exit 0."""
    run = cli(
        [
            "probe",
            "posgeom_vit_micro_patch8_64_nope",
            "--data",
            "",
            "--max-images",
            "2",
            "--img-size",
            "32",
            "--num-workers",
            "0",
            "--no-progress",
            "--out",
            tmp_path / "out",
        ]
    )
    judge("empty", refused(run, "--data: an empty value"), "refused", run.err or run.trace)
    assert not (tmp_path / "out").exists()
