"""The package version: one place, read by pyproject.toml (setuptools ``attr``) and ``posgeom --version``."""

__version__ = "0.1.0"
