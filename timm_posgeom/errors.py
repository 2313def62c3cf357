"""The package's user errors: one base class and one way to say them on one line.

Everything may import this module and it imports nothing of the package, so it sits at the bottom of the
layers (docs/architecture.md). A user error means bad input, a refused operation or a missing optional
dependency, never a bug: it is one of the package's own classes (:class:`PosgeomError` and its subclasses, each
also the builtin it refines), or what a file system answers about the user's paths and disk
(:func:`io_error_line`). The command line says :func:`user_error_line` of it with exit status 2; anything else,
a builtin ``ValueError`` from our code or a dependency included, is a bug: it keeps its traceback, and a last line
says so and where to report it (``cli/main.py``).

The generic classes here hold the ideas every layer meets: :class:`SettingError` (a setting out of its range or
choices), :class:`DataError` (data that cannot be measured as given), :class:`PathNotFoundError` (a path or a name
that names nothing), :class:`ResultFileError` (a results file that is not the result it should be); a module with an idea of its own defines its class beside it (``ProtocolError``,
``RecipeError``, ``BadImageError``, ...).
"""

from __future__ import annotations

import errno
import importlib
from types import ModuleType

__all__ = [
    "PosgeomError",
    "MissingDependencyError",
    "SettingError",
    "DataError",
    "PathNotFoundError",
    "ResultFileError",
    "USER_ERRORS",
    "user_error_line",
    "one_line",
    "require",
    "APP_MODULES",
    "io_error_line",
    "NonFiniteWarning",
    "IntervalWarning",
    "nonfinite_message",
]


class PosgeomError(Exception):
    """Base class of this package's user errors (each also derives from the builtin it refines, e.g.
    ``ValueError`` or ``TypeError``, so code that caught the builtin still catches it)."""


class MissingDependencyError(PosgeomError, ImportError):
    """An optional dependency is missing or unusable; the message says what to install."""


class SettingError(PosgeomError, ValueError):
    """A setting out of its range or not among its choices: an argument of a measuring function (a count, a
    size, an alpha, a site, layers, a policy), a model's constructor argument, a configuration's value, a
    command's flags alone or together. The message names the setting, what it takes and what it got."""


class DataError(PosgeomError, ValueError):
    """Data that cannot be measured as given: no such split, no images, an item that is not an image with a label,
    a label that is no class index of the model, images whose size the model cannot take."""


class PathNotFoundError(PosgeomError, FileNotFoundError):
    """A path or a name the user gave that names nothing: data, a checkpoint, a recipe, an accelerate config, a
    models file, a folder of released images."""


class ResultFileError(PosgeomError, ValueError):
    """A results file given to be read (``imagenet_c.json``, an extrapolation's JSON) that is not the result it
    should be: of another kind, damaged, or missing what it records."""


# The modules of the [app] extra (pyproject.toml) that the package imports: the application (training, study,
# zoo, reports, Hub cards) and the command line need them; the library imports them only inside the functions
# that use them, through :func:`require`.
APP_MODULES = ("accelerate", "datasets", "matplotlib", "jinja2", "markdown", "yaml", "filelock")


def require(module: str, needed_for: str, extra: str = "app") -> ModuleType:
    """``importlib.import_module(module)``, or, when its top-level package is not installed, a
    :class:`MissingDependencyError` whose one line says what needs it and which extra installs it, e.g.
    ``require("datasets", "reading a Hub or parquet data set")``. A package that is installed but fails to
    import (one of its own dependencies missing) raises its own error."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        top = module.split(".")[0]
        if (e.name or "").split(".")[0] != top:
            raise
        raise MissingDependencyError(
            f"{needed_for} needs {top}, which is not installed: it comes with the "
            f"[{extra}] extra (pip install 'timm-posgeom[{extra}]')"
        ) from None


# The package's own classes: no builtin, which a bug raises as well (a bare ValueError from our code or a
# dependency keeps its traceback). What the file system says about the user's paths: io_error_line.
USER_ERRORS: tuple[type[BaseException], ...] = (PosgeomError,)


# What a file system answers about a path or a write: the user's disk, folders and paths, never our bug.
_IO_ERRNOS = frozenset(
    getattr(errno, name)
    for name in (
        "ENOSPC",
        "EDQUOT",
        "EFBIG",
        "EROFS",
        "ENOTDIR",
        "EISDIR",
        "ENAMETOOLONG",
        "ELOOP",
        "EACCES",
        "EPERM",
        "EEXIST",
        "ENOENT",
        "EXDEV",
        "EMLINK",
        "ETXTBSY",
        "EIO",
    )
    if hasattr(errno, name)
)
_IO_HINTS = {
    getattr(errno, k): v
    for k, v in (
        ("ENOSPC", "the disk is full: free some space or write elsewhere"),
        ("EDQUOT", "the disk quota is used up: free some space or write elsewhere"),
        ("EFBIG", "the file would exceed the size this process may write (ulimit -f)"),
        ("EROFS", "the file system is read-only: write elsewhere"),
        ("ENOTDIR", "a path expected to be a folder is a file"),
        ("EISDIR", "a path expected to be a file is a folder"),
        ("ELOOP", "a symbolic link loop"),
    )
    if hasattr(errno, k)
}


def io_error_line(error: BaseException) -> str | None:
    """One line for an OSError a file system raises about the user's paths (a full disk, a read-only folder, a
    file where a folder is expected, ...), naming the path and what to do; None for any other error (a bug
    keeps its traceback)."""
    if not isinstance(error, OSError) or error.errno not in _IO_ERRNOS:
        return None
    where = f"{error.filename}" + (f" -> {error.filename2}" if error.filename2 else "") if error.filename else ""
    text = f"{error.strerror or type(error).__name__}" + (f": {where}" if where else "")
    hint = _IO_HINTS.get(error.errno)
    return " ".join(f"{text} ({hint})".split()) if hint else " ".join(text.split())


def user_error_line(error: BaseException) -> str | None:
    """The one line that says a user error (:data:`USER_ERRORS`: :func:`one_line`; an OSError of the user's paths
    or disk: :func:`io_error_line`), or None for any other error: a bug, which keeps its traceback."""
    if isinstance(error, USER_ERRORS):
        return one_line(error)
    return io_error_line(error)


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


class NonFiniteWarning(RuntimeWarning):
    """A measure met numbers that are not finite (NaN or inf: logits, tokens, attention weights): the values
    they feed are NaN, never a number made from them (an argmax of NaN logits would be class 0)."""


class IntervalWarning(RuntimeWarning):
    """An interval could not be made and is NaN (its number is still given): e.g. a mean map so large that the
    jackknife's group sums would not fit in memory."""


def nonfinite_message(what: str, count: int, total: int, result: str) -> str:
    """``"<what> are not finite (NaN or inf) in <count> of <total> images: <result>"``, one line."""
    return f"{what} are not finite (NaN or inf) in {count} of {total} image(s): {result}"
