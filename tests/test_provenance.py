"""Which versions measured which numbers: one sentence for reports, from each run's own record."""

from __future__ import annotations

import accelerate
import timm
import torch

from timm_posgeom import __version__
from timm_posgeom.app.provenance import describe_versions, package_versions

NOW = dict(python="3.12.0", torch="2.9.0", accelerate="1.16.0", timm_posgeom="0.1.0")


def test_package_versions_are_the_installed_ones():
    v = package_versions()
    assert v["torch"] == torch.__version__ and v["timm"] == timm.__version__
    assert v["accelerate"] == accelerate.__version__ and v["timm_posgeom"] == __version__
    assert "accelerate" not in package_versions(training=False) and set(package_versions(training=False)) < set(v)


def test_every_run_measured_with_this_invocations_versions_names_them_only():
    text = describe_versions(NOW, [("ape s0", [NOW, NOW]), ("ape s1", [dict(NOW)])])
    assert text == "python 3.12.0, torch 2.9.0, accelerate 1.16.0, timm_posgeom 0.1.0"


def test_runs_measured_with_other_or_unrecorded_versions_are_named():
    """A resumed study's report named the resuming invocation's versions only: runs measured earlier
    with accelerate 1.15.0 read as measured with 1.16.0."""
    old = dict(NOW, accelerate="1.15.0")
    text = describe_versions(
        NOW,
        [
            ("ape s0", [old, old]),
            ("ape s1", [old, NOW]),
            ("nope s0", [NOW, None]),
            ("nope s1", [dict(NOW, timm_posgeom="0.0.9")]),
        ],
    )
    assert text.startswith("python 3.12.0, torch 2.9.0, accelerate 1.16.0, timm_posgeom 0.1.0 (this invocation); ")
    assert "; accelerate 1.15.0 for ape s0, ape s1;" in text  # only what differs, each run once
    assert "; timm_posgeom 0.0.9 for nope s1;" in text
    assert text.endswith("; not recorded for nope s0 (measured before per-run versions were kept)")
    missing = describe_versions(NOW, [("rpt s0", [{k: v for k, v in NOW.items() if k != "accelerate"}])])
    assert "accelerate absent for rpt s0" in missing
