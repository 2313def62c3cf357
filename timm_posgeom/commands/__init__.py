"""Sub-commands of ``posgeom``: each module defines ``add_parser(subparsers)`` and ``run(args) -> int``."""
