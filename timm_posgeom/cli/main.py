"""posgeom: probe, stress, train and report on positional encodings in timm ViTs."""
from __future__ import annotations

import argparse
import importlib
import os
import sys

from ..errors import USER_ERRORS, one_line

# One module per sub-command in this package, each with add_parser() and run().
COMMANDS = ("models", "recipes", "probe", "attention", "fragility", "sweep", "train", "study", "zoo", "report", "card", "push")


def _command_modules():
    for name in COMMANDS:
        try:
            yield name, importlib.import_module(f"timm_posgeom.cli.{name}")
        except ModuleNotFoundError as e:  # a command still being written: leave it out of the parser
            if e.name != f"timm_posgeom.cli.{name}":
                raise


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="posgeom", description=__doc__)
    parser.add_argument("--version", action="version", version=version_line())
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for _, module in _command_modules():
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    module = importlib.import_module(f"timm_posgeom.cli.{args.command}")
    try:
        return int(module.run(args) or 0)
    except USER_ERRORS as e:  # one line on stderr, exit 2; anything else is a bug and keeps its traceback
        parser.exit(2, f"posgeom {args.command}: error: {one_line(e)}\n")
    except BrokenPipeError:  # `posgeom ... | head`: the reader left; not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0

