"""What measured a number: the package versions of the process that did, and one line that says which
runs (or models) were measured with which.

A resumed study or zoo mixes the work of several invocations, each maybe with other packages installed:
the versions of the invocation that wrote ``results.json`` are not necessarily those that trained or
measured its runs. Each run records its own (``summary.json``: the process that finished the training;
``eval.json``: every set that measured a part of it), and reports name them all.
"""

from __future__ import annotations

import platform
from collections.abc import Mapping, Sequence

__all__ = ["package_versions", "describe_versions"]


def package_versions(training: bool = True) -> dict[str, str]:
    """Python, torch, timm and timm-posgeom versions; with ``training``, also accelerate and datasets."""
    import timm
    import torch

    from ..version import __version__

    out = dict(python=platform.python_version(), torch=torch.__version__, timm=timm.__version__)
    if training:
        import accelerate
        import datasets

        out.update(accelerate=accelerate.__version__, datasets=datasets.__version__)
    out["timm_posgeom"] = __version__
    return out


def _fmt(versions: Mapping[str, str]) -> str:
    return ", ".join(f"{k} {v}" for k, v in versions.items())


def describe_versions(
    current: Mapping[str, str],
    measured: Sequence[tuple[str, Sequence[Mapping[str, str] | None]]],
    label: str = "this invocation",
) -> str:
    """One sentence (no final period) naming the versions the numbers were measured with.

    ``current``: the versions of the invocation that writes the report (``label`` names it). ``measured``: per run (or model),
    its label and the version sets that measured its parts, ``None`` for a part measured before versions
    were recorded. When every part was measured with ``current``, that is all the sentence says; otherwise
    it names, per other set, only the packages that differ and the runs measured with it, and the runs
    whose versions were not recorded.
    """
    current = dict(current)
    others: dict[tuple[tuple[str, str], ...], list[str]] = {}  # each other set (as written) -> its runs
    unrecorded: list[str] = []
    for name, sets in measured:
        for versions in sets:
            if versions is None:
                group = unrecorded
            elif dict(versions) != current:
                group = others.setdefault(tuple(versions.items()), [])
            else:
                continue
            if name not in group:
                group.append(name)
    if not others and not unrecorded:
        return _fmt(current)
    parts = [f"{_fmt(current)} ({label})"]
    for items, labels in others.items():
        versions = dict(items)
        differ = {k: v for k, v in versions.items() if current.get(k) != v}
        differ.update({k: "absent" for k in current if k not in versions})
        parts.append(f"{_fmt(differ)} for {', '.join(labels)}")
    if unrecorded:
        parts.append(f"not recorded for {', '.join(unrecorded)} (measured before per-run versions were kept)")
    return "; ".join(parts)
