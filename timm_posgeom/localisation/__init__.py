"""Causal localisation: where inside a ViT its positional encoding acts (docs/method.md#causal-localisation).

* :func:`activation_patching` - the clean residual stream patched into an RPI run, layer by layer: how much
  of the clean-minus-RPI gap in top-1 and SSDC each layer restores (:mod:`.patching`);
* :func:`pe_imprint` - the SSDC of constant images' tokens per block: the structure the PE alone puts there,
  no data needed (:mod:`.imprint`);
* :func:`position_ablation` - the position probe's directions ablated at each block, then top-1 and SSDC
  again, against a random subspace of the same rank (:mod:`.ablation`);
* :func:`encoding_cka` - CKA of each block at alpha 1 against alpha 0 (:mod:`.encoding_cka`);
* :func:`localise` - the four together, as ``posgeom localise`` runs them (:mod:`.combined`).

Each is called as ``f(model, data, settings, **own_arguments)`` with a
:class:`~timm_posgeom.measuring.MeasureSettings` and returns a :class:`~.result.LayerCurves` whose every
number stands beside its 95% interval. What they share: :mod:`.tracing` (one forward with the residual
stream recorded and one block's output replaced), :mod:`.tally` (summed maps and hits per image group),
:mod:`.batches` (images with their labels), :mod:`.result`.
"""

from .ablation import AblationResult, position_ablation
from .combined import MEASURES, LocalisationResult, localise
from .encoding_cka import EncodingCKAResult, encoding_cka
from .imprint import ImprintResult, pe_imprint
from .patching import PATCH_MODES, PatchingResult, activation_patching
from .result import LayerCurves

__all__ = [
    "activation_patching",
    "PatchingResult",
    "PATCH_MODES",
    "pe_imprint",
    "ImprintResult",
    "position_ablation",
    "AblationResult",
    "encoding_cka",
    "EncodingCKAResult",
    "LayerCurves",
    "localise",
    "LocalisationResult",
    "MEASURES",
]
