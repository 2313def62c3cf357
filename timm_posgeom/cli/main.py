"""posgeom: probe, stress, train and report on positional encodings in timm ViTs."""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
import warnings
from typing import Any

from ..errors import APP_MODULES, user_error_line
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


def _where_to_report() -> str:
    """Where a bug is reported: the issue tracker (or else the repository) the installed package's metadata names
    (pyproject.toml's [project.urls]), or the developers when it names none."""
    from importlib.metadata import PackageNotFoundError, metadata

    try:
        urls = dict(u.split(", ", 1) for u in metadata("timm-posgeom").get_all("Project-URL") or [] if ", " in u)
    except PackageNotFoundError:
        urls = {}
    found = {k.lower().replace(" ", ""): v for k, v in urls.items()}
    for label in ("issues", "bugtracker", "tracker", "repository", "source", "homepage"):
        if label in found:
            return f"at {found[label]}"
    return "to the timm-posgeom developers"


def bug_line(command: str) -> str:
    """The line after the traceback of an error that is no user error: a bug, to report, and where."""
    return (
        f"posgeom {command}: this is a bug in timm-posgeom or a library it uses, not a mistake in what was asked: "
        f"please report it {_where_to_report()}, with the command, the traceback above and {version_line()}"
    )


class _BugHook:
    """``sys.excepthook`` while a command runs: Python's own traceback, then :func:`bug_line` (a bug of ours or a
    dependency's ends the program so; a user error never reaches here)."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __call__(self, kind: type[BaseException], value: BaseException, tb: Any) -> None:
        sys.__excepthook__(kind, value, tb)
        if issubclass(kind, Exception):
            print(bug_line(self.command), file=sys.stderr)


def _report_bugs(command: str) -> None:
    """Let an exception that ends the program (a bug) end with :func:`bug_line`; a hook of another program's
    (IPython's) is left alone, and a caller of :func:`main` in Python still gets the exception itself."""
    if sys.excepthook is sys.__excepthook__ or isinstance(sys.excepthook, _BugHook):
        sys.excepthook = _BugHook(command)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)  # parsed before torch or timm is imported: --help and bad flags answer at once
    _report_bugs(args.command)
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
    except BrokenPipeError:  # `posgeom ... | head`: the reader left; not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as e:  # a user error (ours, or a file system's about a path): one line, exit 2
        text = user_error_line(e)
        if text is None:  # a bug: its traceback, and the line that says so (_report_bugs)
            raise
        labels = sys.modules.get("timm_posgeom.data.labels")  # not imported here: data/ imports torch
        if labels is not None and isinstance(e, labels.LabelMismatchError):
            # the library names its parameter; the command line, its flag
            text = re.sub(r"labels='([\w-]+)'", r"--labels \1", text)
        parser.exit(2, f"posgeom {args.command}: error: {text}\n")
