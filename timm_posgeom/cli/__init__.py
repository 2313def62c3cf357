"""The ``posgeom`` command line: argument parsing and one module per sub-command, on top of the
application (:mod:`timm_posgeom.app`) and the library. Nothing below imports it (docs/architecture.md).

    posgeom COMMAND ...                       # the console script: timm_posgeom.cli:main
    python -m timm_posgeom.cli COMMAND ...    # the same, e.g. under `accelerate launch` or `torchrun`
"""

from .main import main

__all__ = ["main"]
