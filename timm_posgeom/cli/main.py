"""posgeom: probe, stress, train and report on positional encodings in timm ViTs."""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
import warnings

from ..errors import APP_MODULES, USER_ERRORS, io_error_line, one_line
from ._options import apply_renamed, check_counts

# One module per sub-command in this package, each with add_parser() and run().
COMMANDS = (
    "models",
    "recipes",
    "probe",
    "attention",
    "localise",
    "fragility",
    "sweep",
    "extrapolate",
    "intervene",
    "train",
    "study",
    "zoo",
    "report",
    "card",
    "push",
    "weights",
)
# What each command needs of the [app] extra (errors.APP_MODULES), checked before it runs: the measuring
# commands write figures (matplotlib), the application's commands need all of it. `posgeom models` needs none.
_FIGURES = ("matplotlib",)
NEEDS_APP = {
    "probe": _FIGURES,
    "attention": _FIGURES,
    "localise": _FIGURES,
    "fragility": _FIGURES,
    "sweep": _FIGURES,
    "extrapolate": _FIGURES,
    "intervene": _FIGURES,
    **dict.fromkeys(("recipes", "train", "study", "zoo", "report", "card", "push"), APP_MODULES),
}


def _command_modules():
    """Every command's module: one that fails to import fails loudly (a command silently missing from the parser
    would read as a user's typo)."""
    for name in COMMANDS:
        yield name, importlib.import_module(f"timm_posgeom.cli.{name}")


def version_line() -> str:
    """``posgeom X (timm Y, torch Z)``, from the installed distributions' metadata (nothing imported)."""
    from importlib.metadata import PackageNotFoundError, version

    from ..version import __version__

    def installed(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"

    return f"posgeom {__version__} (timm {installed('timm')}, torch {installed('torch')})"


class Parser(argparse.ArgumentParser):
    """argparse's parser, refusing an explicit empty value (``--data ""``, ``--shard=``, an empty MODEL): an
    unset shell variable (``--data "$DATA"``) must not read as the flag's default. One line, exit 2; the
    subcommands' parsers are of this class too (``add_subparsers`` makes them so). Abbreviated flags are
    refused: each would be one more name for an idea (``--seed`` was taken for a count of seeds in study)."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def _get_values(self, action: argparse.Action, arg_strings: list[str]):
        if action.nargs != argparse.PARSER and any(s == "" for s in arg_strings):
            what = "/".join(action.option_strings) or action.metavar or action.dest
            self.exit(
                2,
                f"{self.prog}: error: argument {what}: an empty value was given (an unset variable?); "
                "give a value or leave the flag out\n",
            )
        return super()._get_values(action, arg_strings)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="posgeom", description=__doc__)
    parser.add_argument("--version", action="version", version=version_line())
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for _, module in _command_modules():
        module.add_parser(sub)
    return parser


def command_parser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    """The parser of one subcommand of :func:`build_parser`'s ``parser``."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[command]


def missing_app_modules(command: str) -> list[str]:
    """The modules of the [app] extra that ``command`` needs and that are not installed (none imported)."""
    import importlib.util

    return [m for m in NEEDS_APP.get(command, ()) if importlib.util.find_spec(m) is None]


def _app_extra_line(command: str, missing: list[str]) -> str:
    return (
        f"posgeom {command}: error: needs the [app] extra ({', '.join(missing)} not installed): "
        "pip install 'timm-posgeom[app]'\n"
    )


def _one_line_warning(command: str):
    """A ``warnings.showwarning`` that says a warning on one line of stderr, ``posgeom CMD: warning: ...``
    (Python's own shows two, the second a line of our source)."""

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        text = " ".join(str(message).split()) or category.__name__
        print(f"posgeom {command}: warning: {text}", file=file or sys.stderr)

    return show


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)  # parsed before torch or timm is imported: --help and bad flags answer at once
    missing = missing_app_modules(args.command)
    if missing:  # said before any work, rather than failing at its end
        parser.exit(2, _app_extra_line(args.command, missing))
    module = importlib.import_module(f"timm_posgeom.cli.{args.command}")
    try:
        apply_renamed(args, command_parser(parser, args.command))  # old flag names: a notice, then the new
        check_counts(args)  # counts no run could use, refused before anything heavy is loaded
        with warnings.catch_warnings():
            warnings.showwarning = _one_line_warning(args.command)
            return int(module.run(args) or 0)
    except ModuleNotFoundError as e:  # a module of the [app] extra that the table above did not foresee
        top = (e.name or "").split(".")[0]
        if top not in APP_MODULES:
            raise
        parser.exit(2, _app_extra_line(args.command, [top]))
    except USER_ERRORS as e:  # one line on stderr, exit 2; anything else is a bug and keeps its traceback
        text = one_line(e)
        labels = sys.modules.get("timm_posgeom.data.labels")  # not imported here: data/ imports torch
        if labels is not None and isinstance(
            e, labels.LabelMismatchError
        ):  # the library names its parameter; the command line, its flag
            text = re.sub(r"labels='([\w-]+)'", r"--labels \1", text)
        parser.exit(2, f"posgeom {args.command}: error: {text}\n")
    except BrokenPipeError:  # `posgeom ... | head`: the reader left; not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as e:  # a full disk, a read-only folder, a path of the wrong kind: one line; else a bug
        text = io_error_line(e)
        if text is None:
            raise
        parser.exit(2, f"posgeom {args.command}: error: {text}\n")
