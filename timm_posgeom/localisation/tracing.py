"""One forward pass of a flat timm ViT with its residual stream recorded, and optionally one block's output
replaced: what activation patching and direction ablation are made of (docs/method.md#causal-localisation).

Layer ``-1`` is the input of block 0 (the patch tokens with their prefix tokens and any additive position
table: the embedding), layer ``b >= 0`` the output of block ``b`` (the residual stream). A block's input and
output are (B, T, C) tokens (NHWC blocks, samvit's, are read flat as (B, H * W, C)); the last N = H * W
are the patch tokens in token-slot order, the first T - N are prefix tokens (class, registers).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn as nn

from ..errors import DataError, NonFiniteWarning, nonfinite_message
from ..interventions import token_permutation
from ..probes.sites import ProbeSites

__all__ = ["EMBEDDING", "Trace", "Edit", "traced_forward", "align", "similarity_maps", "hits"]

EMBEDDING = -1
"""The layer index of the embedding: the input of block 0."""

Edit = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""``edit(block_input, block_output) -> new_output`` (both (B, T, C) or the block's own shape); at the
embedding both arguments are block 0's input and the result replaces it."""


@dataclass
class Trace:
    """What one forward pass left: the model's output and, for the recorded layers, block inputs and outputs.

    ``inputs[b]`` is block b's input, ``outputs[b]`` its output (``outputs[-1]`` = ``inputs[0]``: the
    embedding), each a (B, T, C) view of what the block saw or returned (after any edit)."""

    logits: torch.Tensor
    inputs: dict[int, torch.Tensor] = field(default_factory=dict)
    outputs: dict[int, torch.Tensor] = field(default_factory=dict)


def _flat(x: torch.Tensor) -> torch.Tensor:
    return x if x.ndim == 3 else x.reshape(x.shape[0], -1, x.shape[-1])


def _first(value):
    return value[0] if isinstance(value, (tuple, list)) else value


def _replace_first(value, new: torch.Tensor):
    if isinstance(value, tuple):
        return (new, *value[1:])
    if isinstance(value, list):
        return [new, *value[1:]]
    return new


def _hooks(sites: ProbeSites, trace: Trace, record: set[int], edit: tuple[int, Edit] | None) -> list:
    """Hooks that record ``record``'s inputs and outputs into ``trace`` and apply ``edit`` (layer, function)."""
    handles = []
    edit_layer, function = edit if edit is not None else (None, None)

    def before(index: int):
        def hook(module, args, kwargs):
            x = args[0] if args else kwargs["x"]
            if index == 0 and edit_layer == EMBEDDING and function is not None:
                x = function(_flat(x), _flat(x)).reshape(x.shape)
                args, kwargs = ((x, *args[1:]), kwargs) if args else (args, {**kwargs, "x": x})
            if index in record:
                trace.inputs[index] = _flat(x)
            if index == 0 and EMBEDDING in record:
                trace.outputs[EMBEDDING] = _flat(x)
            return args, kwargs

        return hook

    def after(index: int):
        def hook(module, args, kwargs, output):
            out = _first(output)
            if index == edit_layer and function is not None:
                x = args[0] if args else kwargs["x"]
                out = function(_flat(x), _flat(out)).reshape(out.shape)
                output = _replace_first(output, out)
            if index in record:
                trace.outputs[index] = _flat(out)
            return output

        return hook

    for index, block in enumerate(sites.blocks):
        handles.append(block.register_forward_pre_hook(before(index), with_kwargs=True))
        handles.append(block.register_forward_hook(after(index), with_kwargs=True))
    return handles


def traced_forward(
    model: nn.Module,
    sites: ProbeSites,
    images: torch.Tensor,
    permutation: torch.Tensor | None = None,
    record: set[int] | None = None,
    edit: tuple[int, Edit] | None = None,
) -> Trace:
    """Run ``model(images)`` once (no grad), recording and editing the residual stream.

    Args:
        model: a flat timm ViT in eval mode.
        sites: its :func:`~timm_posgeom.probes.find_sites`.
        images: (B, C, H, W) on the model's device.
        permutation: (N,) token permutation applied after the patch embedding and before any PE (RPI: slot i
            holds patch p[i], :func:`~timm_posgeom.interventions.token_permutation`); None: none.
        record: layers whose input and output to keep (``-1``: the embedding; default none).
        edit: (layer, function): replace that layer's output by ``function(block_input, block_output)``.
    """
    trace = Trace(logits=torch.empty(0))
    handles = _hooks(sites, trace, set(record or ()), edit)
    try:
        with torch.no_grad():
            if permutation is None:
                trace.logits = model(images)
            else:
                with token_permutation(model, per="given") as handle:
                    handle.give(permutation)
                    trace.logits = model(images)
    finally:
        for h in handles:
            h.remove()
    return trace


def align(clean: torch.Tensor, permutation: torch.Tensor) -> torch.Tensor:
    """The clean run's tokens (B, T, C) moved to the slots of the permuted run: prefix tokens as they are, patch
    slot i given the clean token of patch p[i] (where slot i's content came from); T - N prefix tokens."""
    n = permutation.numel()
    prefix = clean.shape[1] - n
    return torch.cat([clean[:, :prefix], clean[:, prefix:][:, permutation.to(clean.device)]], dim=1)


def similarity_maps(tokens: torch.Tensor, permutation: torch.Tensor | None, n_patches: int) -> torch.Tensor:
    """(B, N, N) float64 on the CPU: the cosine-similarity map of each image's patch tokens, in content order
    (row j is the token holding patch j: under a permutation p, slot argsort(p)[j]); docs/method.md#ssdc."""
    patches = tokens[:, tokens.shape[1] - n_patches :].float()
    if permutation is not None:
        patches = patches[:, torch.argsort(permutation.to(patches.device))]
    unit = patches / patches.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    return (unit @ unit.transpose(1, 2)).to(torch.float64).cpu()


def hits(logits: torch.Tensor, labels: torch.Tensor | None) -> torch.Tensor | None:
    """(B,) float: 1 where the arg-max of (B, classes) ``logits`` is the image's label, 0 where not, NaN where the
    logits are not finite (an arg-max of NaN logits is no prediction; with a :class:`NonFiniteWarning`); None
    without labels."""
    if labels is None:
        return None
    if logits.ndim != 2:
        raise ValueError(f"top-1 needs (B, classes) logits, the model returned {tuple(logits.shape)}")
    if labels.numel() and (int(labels.max()) >= logits.shape[-1] or int(labels.min()) < 0):
        raise DataError(
            f"labels {int(labels.min())}..{int(labels.max())} do not index the model's {logits.shape[-1]} classes"
        )
    right = (logits.argmax(dim=-1).cpu() == labels).to(torch.float64)
    finite = torch.isfinite(logits).all(dim=-1).cpu()
    if not bool(finite.all()):
        bad = int((~finite).sum())
        warnings.warn(
            nonfinite_message("logits", bad, len(finite), "their top-1 is NaN"), NonFiniteWarning, stacklevel=3
        )
        right[~finite] = math.nan
    return right
