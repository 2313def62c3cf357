from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

import timm_posgeom  # noqa: F401  (registers the models)

# Real images: the project's shared Imagenette copy beside the checkout, or POSGEOM_IMAGENETTE (e.g. when
# the tests run from an unpacked sdist).
IMAGENETTE = Path(os.environ.get("POSGEOM_IMAGENETTE") or Path(__file__).resolve().parents[1].parent / "shared" / "data" / "imagenette")


@pytest.fixture(autouse=True)
def _seed_and_threads():
    torch.manual_seed(0)
    yield


@pytest.fixture
def one_thread():
    """Tiny tensors: one torch thread is faster than two fighting over a shared CPU."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def imagenette_path() -> Path:
    if not IMAGENETTE.exists():
        pytest.skip("../shared/data/imagenette is not present")
    return IMAGENETTE
