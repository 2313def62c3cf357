"""Module paths that moved when the package was cut into rooms by idea (issue 49), kept for one release.

``import timm_posgeom.data.shifts`` (or ``from timm_posgeom.data.shifts import JPEG``) still works: it warns once with a
``DeprecationWarning`` naming the new path and gives the module that now lives there (the same module object,
so its names, its state and a patch of it are the new module's). CHANGELOG.md lists these paths under
"Deprecated"; the next release removes this file and its one line in ``__init__.py``.

Only users reach these paths: the package, its tests, scripts, benchmarks and experiments import the new ones
(``tests/test_rooms.py`` fails otherwise). Nothing here is imported until an old path is.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from types import FrameType
from typing import Any

# old module path -> its new path: every module path 0.1.0 had or documented that has moved. Only strings: the
# library imports nothing of the application, and a target is imported when its old path is.
MOVED: dict[str, str] = {
    # the runtime of a measurement
    "timm_posgeom.distributed": "timm_posgeom.measuring.distributed",
    "timm_posgeom.seeding": "timm_posgeom.measuring.seeding",
    # what every result shares
    "timm_posgeom.intervals": "timm_posgeom.results.intervals",
    "timm_posgeom.jsonio": "timm_posgeom.results.jsonio",
    "timm_posgeom.plotting": "timm_posgeom.results.plotting",
    # images and what is done to them before the model
    "timm_posgeom.eval_data": "timm_posgeom.data.eval_data",
    "timm_posgeom.labels": "timm_posgeom.data.labels",
    "timm_posgeom.shifts": "timm_posgeom.data.shifts",
    "timm_posgeom.synthetic": "timm_posgeom.data.synthetic",
    "timm_posgeom.transforms": "timm_posgeom.data.transforms",
    # what is measured
    "timm_posgeom.factory": "timm_posgeom.models.factory",
    # the SSDC probe (one package) and what the package measures on a model
    "timm_posgeom.probes.accumulator": "timm_posgeom.probes.ssdc_probe.accumulator",
    "timm_posgeom.probes.probe": "timm_posgeom.probes.ssdc_probe.probe",
    "timm_posgeom.probes.result": "timm_posgeom.probes.ssdc_probe.result",
    "timm_posgeom.probes.spearman": "timm_posgeom.probes.ssdc_probe.spearman",
    "timm_posgeom.support": "timm_posgeom.probes.support",
    # robustness: what a shift does to a model's accuracy
    "timm_posgeom.imagenet_c": "timm_posgeom.robustness.imagenet_c",
    "timm_posgeom.imagenet_c_result": "timm_posgeom.robustness.imagenet_c_result",
    "timm_posgeom.imagenet_c_tree": "timm_posgeom.robustness.imagenet_c_tree",
    "timm_posgeom.scores": "timm_posgeom.robustness.scores",
    "timm_posgeom.shift_size": "timm_posgeom.robustness.shift_size",
    # the application's report (timm_posgeom.app.report itself is the package, with the names report.py had)
    "timm_posgeom.app.claims": "timm_posgeom.app.report.claims",
    "timm_posgeom.app.report_figures": "timm_posgeom.app.report.figures",
    "timm_posgeom.app.report_header": "timm_posgeom.app.report.header",
    "timm_posgeom.app.verdicts": "timm_posgeom.app.report.verdicts",
}


def _importer_stacklevel() -> int:
    """The ``stacklevel`` that points a warning raised in :meth:`_Alias.exec_module` at the line that imported
    the old path: the first frame outside importlib and this file. The warnings module itself passes over
    importlib's bootstrap frames without counting them (so that a warning raised by an import reaches its
    importer); those are not counted here either."""
    level = 1
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        name, file = frame.f_globals.get("__name__", ""), frame.f_code.co_filename
        bootstrap = "importlib" in file and "_bootstrap" in file
        if not bootstrap and name != __name__ and not name.startswith("importlib"):
            return level
        frame = frame.f_back
        level += 0 if bootstrap else 1
    return 1


class _Alias(importlib.abc.Loader):
    """Loads an old path as the module at its new path, with a ``DeprecationWarning``."""

    def __init__(self, new: str):
        self.new = new

    def create_module(self, spec: Any) -> None:
        return None  # a plain module, replaced below

    def exec_module(self, module: Any) -> None:
        old = module.__name__
        warnings.warn(
            f"{old} has moved to {self.new}: import it from there ({old} is removed in the next release)",
            DeprecationWarning,
            stacklevel=_importer_stacklevel(),
        )
        # the import statement returns what sys.modules holds under the name once the loader is done
        sys.modules[old] = importlib.import_module(self.new)


class MovedModuleFinder(importlib.abc.MetaPathFinder):
    """Finds the old paths of :data:`MOVED` (and nothing else) for the import system."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        new = MOVED.get(name)
        return None if new is None else importlib.util.spec_from_loader(name, _Alias(new))


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (once): before the path finders, so that an old copy of a moved
    file (another install, an editable install of an older checkout) is never imported in its place."""
    if not any(isinstance(f, MovedModuleFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, MovedModuleFinder())
