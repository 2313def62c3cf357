"""Bad-input suite, class "two-pass measures" (issue 54, class 5): a measure that reads its data more than once and
compares the passes (CKA: once per model; the alpha sweep's SSDC: once per alpha) checks that every pass reads the
first pass's images in its order (``probes.streaming.SamePasses``: each image's fingerprint), and refuses in one
line a loader it cannot trust: a shuffling DataLoader, random transforms, a one-shot iterator.

Before: ``cka(model, model, DataLoader(shuffle=True))`` gave a diagonal of [-0.024, 0.258, 0.059, -0.024] instead
of 1; the sweep compared alphas measured on other images."""

from __future__ import annotations

import numpy as np
import pytest
import timm
import torch
from faultsuite import judge, library, library_refused
from torch.utils.data import DataLoader, Dataset, TensorDataset

MODEL = "posgeom_vit_micro_patch8_64_ape"


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    m = timm.create_model(MODEL, img_size=32, depth=2, embed_dim=32, num_heads=2, num_classes=2).eval()
    with torch.no_grad():
        m.pos_embed.normal_(0, 1)  # a PE that shapes the tokens: SSDC under RPI differs by image
    return m


@pytest.fixture(scope="module")
def images():
    return torch.rand(24, 3, 32, 32, generator=torch.Generator().manual_seed(1))


class Flipping(Dataset):
    """Random horizontal flips: a training transform, each read another image."""

    def __init__(self, images: torch.Tensor) -> None:
        self.images = images

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.images[i].flip(-1) if torch.rand(()) < 0.5 else self.images[i]


def _loaders(images: torch.Tensor) -> dict:
    labelled = TensorDataset(images, torch.zeros(len(images), dtype=torch.long))
    return {
        "a shuffling DataLoader": lambda: DataLoader(labelled, batch_size=8, shuffle=True),
        "random transforms": lambda: DataLoader(Flipping(images), batch_size=8),
        "a one-shot iterator": lambda: iter([images[:8], images[8:16], images[16:]]),
    }


UNTRUSTED = ["a shuffling DataLoader", "random transforms", "a one-shot iterator"]


@pytest.mark.parametrize("loader", UNTRUSTED)
def test_cka_refuses_data_whose_passes_differ(model, images, loader, one_thread):
    """The issue's example: a shuffling DataLoader gave CKA of a model with itself far from 1 on the diagonal."""
    from timm_posgeom.probes import cka

    torch.manual_seed(3)
    _, error, trace = library(lambda: cka(model, model, _loaders(images)[loader](), progress=False))
    judge("passes", library_refused(error, "read other images than the first"), "refused", trace)


def test_cka_of_a_model_with_itself_on_a_fixed_loader_is_one(model, images, one_thread):
    from timm_posgeom.probes import cka

    loader = DataLoader(TensorDataset(images, torch.zeros(len(images))), batch_size=8)
    result, error, trace = library(lambda: cka(model, model, loader, progress=False))
    ok = error is None and np.allclose(np.diag(result.matrix), 1.0, atol=1e-9)
    judge("passes", "right" if ok else ("traceback" if error else "silent_wrong"), "right", trace or result.matrix)


@pytest.mark.parametrize("loader", UNTRUSTED[:2])
def test_the_sweeps_ssdc_refuses_data_whose_passes_differ(model, images, loader, one_thread):
    """Each alpha read other images (max_images 8 of a shuffled 24): a delta SSDC that changed with the draw."""
    from timm_posgeom.measuring.settings import MeasureSettings
    from timm_posgeom.robustness import sweep_ssdc

    torch.manual_seed(4)
    settings = MeasureSettings(max_images=8, rpi_permutations=2, progress=False, distributed="off")
    call = lambda: sweep_ssdc(model, _loaders(images)[loader](), [1.0, 0.5, 0.0], settings=settings)  # noqa: E731
    _, error, trace = library(call)
    judge("passes", library_refused(error, "read other images than the first"), "refused", trace)


def test_the_sweeps_ssdc_on_a_fixed_loader_is_each_alphas_probe(model, images, one_thread):
    from timm_posgeom.interventions import pe_scale
    from timm_posgeom.measuring.settings import MeasureSettings
    from timm_posgeom.probes import probe_ssdc
    from timm_posgeom.robustness import sweep_ssdc

    loader = DataLoader(TensorDataset(images, torch.zeros(len(images))), batch_size=8)
    settings = MeasureSettings(max_images=16, rpi_permutations=2, progress=False, distributed="off")
    got, error, trace = library(lambda: sweep_ssdc(model, loader, [1.0, 0.5], settings=settings))
    want = []
    for j, alpha in enumerate([1.0, 0.5]):
        with pe_scale(model, alpha):
            want.append(probe_ssdc(model, loader, rpi=True, settings=settings.replace(seed=2 * j)).per_layer)
    ok = error is None and all(np.allclose(g.per_layer, w, atol=1e-9) for g, w in zip(got, want))
    judge("passes", "right" if ok else ("traceback" if error else "silent_wrong"), "right", trace or (got, want))
