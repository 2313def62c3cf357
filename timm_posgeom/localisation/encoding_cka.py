"""How much of each layer the positional encoding explains: linear CKA of every block at alpha 1 against the
same block with the encoding scaled to alpha (0 by default: removed) (docs/method.md#cka-of-the-encoding).

The model and a copy of it under :func:`~timm_posgeom.pe_scale` read the same images; :func:`~timm_posgeom.cka`
compares their blocks (minibatch CKA with the unbiased HSIC, each image's patch tokens flattened). CKA 1: the
block's representation of the images is the same without the encoding, up to rotation and scale; lower: the
encoding shapes it. A model without positional encoding is its own copy at alpha 0, CKA 1 at every block where
the images vary (computed, not assumed). Intervals: the delete-a-batch jackknife of :func:`~timm_posgeom.cka`.
"""

from __future__ import annotations

import contextlib
import copy
from typing import Any, ClassVar

import numpy as np
import torch.nn as nn

from ..interventions import pe_inventory, pe_scale
from ..measuring.settings import MeasureSettings
from ..probes.cka import cka
from .result import LayerCurves

__all__ = ["encoding_cka", "EncodingCKAResult"]


class EncodingCKAResult(LayerCurves):
    """Per block ``cka`` (L,): CKA of the block at alpha 1 against the same block at ``settings["alpha"]``, its
    interval in ``intervals["cka"]``; ``matrix`` (L, L) every block against every block, with its interval."""

    kind: ClassVar[str] = "encoding-cka"


def encoding_cka(
    model: nn.Module,
    data: Any,
    settings: MeasureSettings | None = None,
    *,
    alpha: float = 0.0,
    site: str = "attn_input",
    **options: Any,
) -> EncodingCKAResult:
    """CKA of each block at alpha 1 against alpha ``alpha`` (module docstring).

    Args:
        model: a flat timm ViT whose PE :func:`~timm_posgeom.pe_scale` can scale (or without PE).
        data: a (n, C, H, W) tensor or batches that can be read twice in the same order (an ``eval_loader``);
            batches of 4 images or more (the unbiased HSIC).
        settings: :class:`~timm_posgeom.measuring.MeasureSettings` of :func:`~timm_posgeom.cka` (``max_images``,
            ``batch_size``, ``device``, ``progress``); fields as keywords too.
        alpha: the scale of the encoding in the copy (0: removed).
        site: ``attn_input`` or ``block_output``.

    Raises:
        PEScaleError: the model has a positional encoding that ``pe_scale`` cannot scale.
    """
    settings, _ = MeasureSettings.resolve("encoding_cka", settings, options)
    scaled = copy.deepcopy(model)
    found = pe_inventory(scaled)  # nothing: no PE, and the copy at alpha 0 is the model itself
    scaling = pe_scale(scaled, alpha) if found else contextlib.nullcontext()
    with scaling:
        result = cka(model, scaled, data, site=site, settings=settings.replace(distributed="off"))
    pe = ", ".join(e.kind.split(" (")[0] for e in found) if found else "none found: the copy is the model itself"
    low, high = result.matrix_ci if result.matrix_ci is not None else (np.nan * result.matrix,) * 2
    return EncodingCKAResult(
        layers=result.layers_a,
        values={"cka": np.diag(result.matrix).copy(), "matrix": result.matrix},
        intervals={"cka": (np.diag(low).copy(), np.diag(high).copy()), "matrix": (low, high)},
        settings={**result.settings, "alpha": alpha, "pe": pe, "intervals": result.settings["interval"]},
    )
