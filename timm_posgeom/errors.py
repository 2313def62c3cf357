"""The package's user errors: one base class and one way to say them on one line.

Everything may import this module and it imports nothing of the package, so it sits at the bottom of the
layers (docs/architecture.md). A user error means bad input, a refused operation or a missing optional
dependency, never a bug: the command line catches :data:`USER_ERRORS` and prints :func:`one_line` of the
error with exit status 2; anything else keeps its traceback.
"""
from __future__ import annotations

__all__ = ["PosgeomError", "USER_ERRORS", "one_line"]


class PosgeomError(Exception):
    """Base class of this package's user errors (each also derives from the builtin it refines, e.g.
    ``ValueError`` or ``TypeError``, so code that caught the builtin still catches it)."""


# The builtins the library raises for bad input (a missing path, a bad value, an unwritable folder) are
# user errors too: they carry a message written for the user.
USER_ERRORS: tuple[type[BaseException], ...] = (PosgeomError, ValueError, FileNotFoundError, FileExistsError,
                                                PermissionError)


def one_line(error: BaseException, first_line: bool = False) -> str:
    """The error's own message on one line.

    A user error raised in a DataLoader worker arrives wrapped in the worker's traceback text, whose last
    line is that message; whitespace runs (newlines too) become single spaces, or with ``first_line``
    only the first line is kept (a third party's message whose later lines are detail); an empty message
    is the error's class name."""
    text = str(error).strip()
    if "Original Traceback" in text:
        last = text.splitlines()[-1]
        text = last.split(": ", 1)[1] if ": " in last else last
    if first_line and text:
        text = text.splitlines()[0]
    return " ".join(text.split()) or type(error).__name__
