"""Random token permutation on any timm ViT (RPI / RPT; docs/method.md#rpi-and-rpt): a forward hook on the
patch embedding permutes the token contents before any positional encoding, in whichever layout the model
emits them; nested contexts on one model, and forwards the permutation did not reach, are refused."""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
import torch.nn as nn
from torch.utils.hooks import RemovableHandle

from ..errors import PosgeomError, SettingError

__all__ = [
    "token_permutation",
    "TokenPermutation",
    "TokenPermutationError",
    "TokenPermutationUnsupported",
    "active_permutations",
    "check_unpermuted",
    "find_embed_module",
    "vlm_encoder",
]


def find_embed_module(model: nn.Module) -> nn.Module:
    """The module whose output is the patch-token contents before any positional encoding.

    ``patch_embed`` for the flat timm ViT families (vision_transformer, deit, eva incl. RoPE, beit,
    relpos, cait, ours) and hierarchical ones whose ``patch_embed`` is one module (swin, pit, ...);
    ``embeds.norm`` for naflexvit (its ``embeds`` adds the PE after its norm); ``stem`` for the MLP
    models whose patch embedding is called so (mixer, resmlp, gmlp). timm's VLM towers (qwen3_vit,
    deepseek_vit, gemma4_vit) keep theirs in ``encoder.patch_embed`` (NHWC tokens for qwen3 and deepseek);
    gemma4's adds its position table inside, so its projection ``input_proj`` is the one permuted. A
    ``patch_embed`` that is a container (crossvit's ``ModuleList`` of branches) is refused: it is never
    called itself.
    """
    model = vlm_encoder(model)
    embeds = getattr(model, "embeds", None)
    if embeds is not None and hasattr(embeds, "norm") and hasattr(embeds, "proj"):
        return embeds.norm
    patch_embed = getattr(model, "patch_embed", None)
    if isinstance(patch_embed, (nn.ModuleList, nn.ModuleDict)):
        raise TokenPermutationUnsupported(
            f"{type(model).__name__}.patch_embed is a {type(patch_embed).__name__} of "
            f"{len(patch_embed)} branches (a multi-branch model such as crossvit), never called as one "
            "module: token permutation does not support it"
        )
    if isinstance(patch_embed, nn.Module):
        projection = getattr(patch_embed, "input_proj", None)
        if isinstance(projection, nn.Module) and hasattr(patch_embed, "position_embedding_table"):
            return projection  # gemma4_vit: patches -> input_proj -> + the 2-D table, all inside patch_embed
        return patch_embed
    stem = getattr(model, "stem", None)
    if isinstance(stem, nn.Module) and type(stem).__name__ == "PatchEmbed":
        return stem
    raise TokenPermutationUnsupported(
        f"{type(model).__name__} has no `patch_embed` (nor naflexvit `embeds.norm`, nor a PatchEmbed `stem`): token "
        "permutation (RPI) needs the module that embeds the patches, which CNNs and hybrid models do not have; probe "
        "it without RPI"
    )


def vlm_encoder(model: nn.Module) -> nn.Module:
    """The module that holds the patch embedding and the blocks: ``model.encoder`` for timm's VLM towers
    (qwen3_vit, deepseek_vit, gemma4_vit: a classifier around an encoder), else ``model`` itself."""
    encoder = getattr(model, "encoder", None)
    if (
        getattr(model, "patch_embed", None) is None
        and isinstance(encoder, nn.Module)
        and isinstance(getattr(encoder, "patch_embed", None), nn.Module)
        and isinstance(getattr(encoder, "blocks", None), (nn.ModuleList, nn.Sequential))
    ):
        return encoder
    return model


def _embed_channels(module: nn.Module) -> int | None:
    """Channels of the patch tokens a patch-embedding module emits (its last conv), or None."""
    convs = [m for m in module.modules() if isinstance(m, nn.Conv2d)]
    return convs[-1].out_channels if convs else None


def _token_layout(x: torch.Tensor, module: nn.Module) -> str:
    """``"NLC"``, ``"NHWC"`` or ``"NCHW"`` for the output of the patch embedding, found from its channel
    count (and its ``output_fmt`` when the shape alone is ambiguous); ValueError when it cannot be told."""
    channels = _embed_channels(module)
    fmt = str(getattr(module, "output_fmt", "") or "").split(".")[-1].upper()
    if x.ndim == 3:
        if channels is not None and x.shape[-1] != channels:
            raise ValueError(f"the patch embedding emits {tuple(x.shape)}, not (B, N, {channels}) tokens")
        return "NLC"
    if x.ndim != 4:
        raise ValueError(
            f"cannot permute tokens of a tensor of shape {tuple(x.shape)}: expected (B,N,C), (B,H,W,C) or (B,C,H,W)"
        )
    last, second = x.shape[-1] == channels, x.shape[1] == channels
    if channels is not None and last != second:
        return "NHWC" if last else "NCHW"
    if fmt in ("NHWC", "NCHW"):
        return fmt
    raise ValueError(f"cannot tell whether the patch embedding's output {tuple(x.shape)} is NHWC or NCHW")


def permute_tokens(x: torch.Tensor, perm: torch.Tensor, layout: str) -> torch.Tensor:
    """Permute the token axis of (B, N, C), (B, H, W, C) or (B, C, H, W) so that slot i holds token perm[i].

    ``perm`` (N,) applies to every image; (G, N) applies perm[g] to the g-th of G equal chunks of the batch
    (G = B: one permutation per image)."""
    if perm.ndim == 2:
        groups = perm.shape[0]
        if x.shape[0] % groups:
            raise ValueError(f"{groups} permutations cannot be applied to equal chunks of a batch of {x.shape[0]}")
        if layout == "NLC":  # one gather: chunk g's token axis indexed by perm[g]
            chunks = x.reshape(groups, -1, *x.shape[1:])
            index = perm[:, None, :, None].expand(-1, chunks.shape[1], -1, x.shape[-1])
            return chunks.gather(2, index).reshape(x.shape)
        return torch.cat([permute_tokens(c, p, layout) for c, p in zip(x.chunk(groups), perm)])
    if layout == "NLC":
        return x[:, perm]
    if layout == "NHWC":  # as timm's PatchEmbed(output_fmt='NHWC') emits with dynamic_img_size
        B, H, W, C = x.shape
        return x.reshape(B, H * W, C)[:, perm].reshape(B, H, W, C).contiguous()
    B, C, H, W = x.shape  # NCHW: swin-v2-cr, pit, ...
    return x.reshape(B, C, H * W)[:, :, perm].reshape(B, C, H, W).contiguous()


def _num_tokens(x: torch.Tensor, layout: str) -> int:
    return x.shape[1] if layout == "NLC" else x.shape[1] * x.shape[2] if layout == "NHWC" else x.shape[2] * x.shape[3]


def _check_grid(n: int, module: nn.Module, model: nn.Module) -> None:
    """A permutation must cover exactly the grid's tokens (a static grid; dynamic sizes are not checked)."""
    grid = getattr(module, "grid_size", None)
    if grid is None or not getattr(module, "strict_img_size", False) or getattr(model, "dynamic_img_size", False):
        return  # models that accept other input sizes (pit, dynamic_img_size) have no one grid to check against
    expected = int(grid[0]) * int(grid[1])
    if n != expected:
        raise ValueError(
            f"{n} tokens found but the patch grid {tuple(grid)} has {expected}: the token layout was not understood"
        )


class TokenPermutationError(PosgeomError, RuntimeError):
    """A forward pass of the model ran without the permutation being applied (a silent no-op), or with two
    permutations applied at once (nested contexts: neither result would say what was applied)."""


class TokenPermutationUnsupported(PosgeomError, TypeError):
    """A model without a patch embedding to permute the tokens of (CNNs, multi-branch models)."""


# The token_permutation contexts open on each patch-embedding module (weakly held: a model deleted inside a
# context leaves nothing behind). Two contexts on one module would compose (slot i holds p1[p2[i]]) while each
# handle, and any result built from it, reports only its own permutation: nesting is refused.
_ACTIVE: weakref.WeakKeyDictionary[nn.Module, list[TokenPermutation]] = weakref.WeakKeyDictionary()


def active_permutations(model: nn.Module) -> list[TokenPermutation]:
    """The :func:`token_permutation` contexts open on ``model`` (outermost first); empty for a model without a
    patch embedding or with none open."""
    try:
        target = find_embed_module(model)
    except TokenPermutationUnsupported:
        return []
    return list(_ACTIVE.get(target, ()))


def check_unpermuted(model: nn.Module, what: str) -> None:
    """Refuse to run ``what`` (a measurement that reports whether tokens were permuted) while a
    ``token_permutation(mode="inference")`` context is open on ``model``: its tokens would be permuted by a
    permutation the result does not report. A ``mode="training"`` context does not permute in eval mode."""
    active = [h for h in active_permutations(model) if h.mode == "inference"]
    if active:
        raise TokenPermutationError(
            f"{what} ran inside token_permutation(seed={active[-1].seed}) on {type(model).__name__}: its tokens would "
            "be permuted by a permutation the result does not report; leave that context and ask the measurement "
            "for the permutation itself (rpi=True, seed=...)"
        )


@dataclass
class TokenPermutation:
    """Handle yielded by :func:`token_permutation`.

    ``permutation`` is the LongTensor p of the last forward pass: token slot i holds the content of
    patch p[i] (row-major patch order), so for a model without PE every block output under
    permutation equals the unpermuted output indexed ``[:, p]``. None before the first forward. With
    ``per="given"`` it is what :meth:`give` set: (N,) or (G, N), one permutation per chunk of the batch.
    ``num_calls`` counts the forward passes that were permuted.
    """

    seed: int | None
    per: str
    mode: str
    permutation: torch.Tensor | None = None
    num_calls: int = 0
    given: torch.Tensor | Callable[[int], torch.Tensor] | None = field(default=None, repr=False)
    _generator: torch.Generator | None = field(default=None, repr=False)

    def give(self, permutations: torch.Tensor | Callable[[int], torch.Tensor]) -> None:
        """``per="given"``: the permutation(s) of the next forward passes: (N,) for every image, or (G, N),
        ``permutations[g]`` for the g-th of G equal chunks of the batch (the caller stacks G copies of its
        images, or gives one permutation per image); or a function of the token count N that returns them
        (for models whose token count is known only in the forward pass)."""
        if self.per != "given":
            raise TokenPermutationError(f"give() is for token_permutation(per='given'), not per={self.per!r}")
        if isinstance(permutations, torch.Tensor) and permutations.ndim not in (1, 2):
            raise ValueError(f"permutations must be (N,) or (G, N), got shape {tuple(permutations.shape)}")
        self.given = permutations

    def _draw(self, n: int, device: torch.device) -> torch.Tensor:
        if self.per == "given":
            if self.given is None:
                raise TokenPermutationError(
                    "token_permutation(per='given'): a forward pass ran before give() set its permutation"
                )
            given = self.given if isinstance(self.given, torch.Tensor) else self.given(n)
            if given.ndim not in (1, 2) or given.shape[-1] != n:
                raise ValueError(
                    f"the given permutations have shape {tuple(given.shape)} but the patch embedding emitted {n} tokens"
                )
            return given.long().to(device)
        if self.per == "call" and self.permutation is not None:
            if self.permutation.numel() != n:
                raise ValueError(
                    f"the token count changed inside one token_permutation(per='call') context "
                    f"({self.permutation.numel()} -> {n}); use per='batch' for inputs of several sizes"
                )
            return self.permutation.to(device)
        if self._generator is None:
            return torch.randperm(n, device=device)  # global RNG: reproducible under accelerate/torch seeding
        return torch.randperm(n, generator=self._generator).to(device)


@contextlib.contextmanager
def token_permutation(
    model: nn.Module,
    seed: int | None = None,
    mode: str = "inference",
    per: str | None = None,
) -> Iterator[TokenPermutation]:
    """Permute patch-token contents after the patch embedding and before any PE, on any timm ViT.

    A forward hook on ``patch_embed`` (``embeds.norm`` for naflexvit) replaces its output x by
    ``x[:, p]``: positional encodings stay bound to token indices while contents move. Handles
    (B, N, C), NHWC (B, H, W, C; kept contiguous) and tuple outputs (first element permuted).

    Args:
        model: a timm ViT.
        seed: seeds a private CPU generator (reproducible, leaves the global RNG alone); None draws
            from torch's global RNG.
        mode: ``inference`` (RPI: every forward inside the context is permuted) or ``training``
            (RPT for a third-party model: only forwards in training mode are permuted).
        per: ``call`` (one permutation for the whole context, shared by every batch: the paper's
            RPI when the context wraps one evaluation), ``batch`` (a fresh permutation every
            forward) or ``given`` (the caller sets each forward's permutations with
            :meth:`TokenPermutation.give`: one for the batch, or one per equal chunk of it, e.g. per image;
            the probes' K-permutation protocol, :mod:`.draws`). Default: ``call`` for inference, ``batch``
            for training.

    Yields:
        A :class:`TokenPermutation` handle; ``handle.permutation`` is the permutation last applied.
        The hook is removed on exit, exceptions included.
    """
    per = _check_mode(mode, per)
    target = find_embed_module(model)
    _refuse_nesting(model, target, seed, mode)
    generator = None if seed is None else torch.Generator().manual_seed(int(seed))
    handle = TokenPermutation(seed=seed, per=per, mode=mode, _generator=generator)
    removables = [
        target.register_forward_hook(_permuting_hook(model, target, handle)),
        *_register_call_check(model, target, handle),
    ]
    _ACTIVE.setdefault(target, []).append(handle)
    try:
        yield handle
    finally:
        for removable in removables:
            removable.remove()
        opened = [h for h in _ACTIVE.get(target, ()) if h is not handle]  # by identity (handles hold tensors)
        if opened:
            _ACTIVE[target] = opened
        else:
            _ACTIVE.pop(target, None)


def _check_mode(mode: str, per: str | None) -> str:
    """``per`` for ``mode`` (its default when None); ValueError for an unknown mode or per."""
    if mode not in ("inference", "training"):
        raise SettingError(f"mode must be 'inference' or 'training', got {mode!r}")
    per = per or ("call" if mode == "inference" else "batch")
    if per not in ("call", "batch", "given"):
        raise SettingError(f"per must be 'call', 'batch' or 'given', got {per!r}")
    return per


def _refuse_nesting(model: nn.Module, target: nn.Module, seed: int | None, mode: str) -> None:
    """TokenPermutationError when a context of the same ``mode`` is already open on ``target``."""
    clash = [h for h in _ACTIVE.get(target, ()) if h.mode == mode]
    if clash:
        raise TokenPermutationError(
            f"token_permutation(seed={seed}) inside another token_permutation(seed={clash[-1].seed}, mode={mode!r}) "
            f"on the same {type(model).__name__}: both permutations would apply (slot i holding p1[p2[i]]) while each "
            "reports only its own; use one context (a probe's rpi=True draws its own permutation: do not wrap it "
            "in token_permutation)"
        )


def _permuting_hook(model: nn.Module, target: nn.Module, handle: TokenPermutation) -> Callable:
    """The forward hook on ``target`` (the patch embedding) that permutes its output for ``handle``: (B, N, C),
    NHWC or NCHW tokens, or the first element of a tuple; a training-mode context permutes training-mode
    forwards only."""
    mode, seed = handle.mode, handle.seed

    def hook(module: nn.Module, args, output):
        if mode == "training" and not model.training:
            return output
        others = [h for h in _ACTIVE.get(target, ()) if h is not handle and (h.mode == "inference" or model.training)]
        if others:  # an inference context inside a training one (or the reverse), in a training-mode forward
            raise TokenPermutationError(
                f"two token permutations (seeds {others[0].seed} and {seed}) would both apply to this forward pass "
                f"of {type(model).__name__}: nested token_permutation contexts are refused"
            )
        x = output[0] if isinstance(output, tuple) else output
        layout = _token_layout(x, module)
        n = _num_tokens(x, layout)
        _check_grid(n, module, model)
        perm = handle._draw(n, x.device)
        handle.permutation = perm
        handle.num_calls += 1
        x = permute_tokens(x, perm, layout)
        return (x, *output[1:]) if isinstance(output, tuple) else x

    return hook


def _register_call_check(model: nn.Module, target: nn.Module, handle: TokenPermutation) -> list[RemovableHandle]:
    """Hooks on ``model`` that raise TokenPermutationError after a forward that should have been permuted but
    never called ``target``, where the permutation is applied (its outputs would silently not be permuted)."""
    mode = handle.mode
    calls_before = []

    def before(module, args):
        calls_before.append(handle.num_calls)

    def after(module, args, output):
        if calls_before.pop() == handle.num_calls and (mode == "inference" or model.training):
            raise TokenPermutationError(
                f"a forward pass of {type(model).__name__} ran without calling "
                f"{type(target).__name__}, where the permutation is applied: its outputs "
                "would not be permuted"
            )

    return [model.register_forward_pre_hook(before), model.register_forward_hook(after)]
