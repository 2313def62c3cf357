"""Move the positions an encoding gives the tokens and leave the tokens where they are
(docs/method.md#pe-shuffle-and-pe-shift).

* :func:`pe_shuffle`: a permutation of the encoding. Patch token k (row-major) is given the encoding of
  position ``q[k]``: an absolute or sincos table's patch rows ``P[q]``, RoPE's coordinates (the rows of its
  sin / cos table), a relative position bias's indices (``index[q][:, q]``).
* :func:`pe_shift`: a translation. Patch token (r, c) is given the encoding of position (r + dy, c + dx), in
  patches, fractions included: a learned table is read between its rows by bilinear interpolation (beyond its
  edge: the edge row, ``edge="clamp"``, or the rows wrapped around, ``edge="wrap"``); a formula (our sincos
  table, timm's axial RoPE) is evaluated at the moved positions.

Under RPI the token contents move and every encoding stays on its index; here the encoding moves and the
contents stay. For a model whose only positional information is an encoding of the token positions (any of
the kinds above, with global attention), shuffling every encoding by ``q`` is RPI by the inverse permutation
with its outputs put back in place, whatever the kind: a permutation relabels positions, which RoPE and a
relative bias see as well as an additive table. They part where something else knows positions (a second
encoding left in place: ``components``; windows, convolutions), and a shift parts the kinds themselves: a
relative encoding (RoPE between patch tokens, a relative bias) sees only offsets, which a translation keeps.

Both are context managers that restore every tensor and method exactly on exit, exceptions included, as
:func:`~timm_posgeom.interventions.pe_scale` does.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from ..defaults import PE_COMPONENTS
from ..errors import PosgeomError, SettingError
from .pe_scalers import Undo, run_undo, shadow
from .pe_search import PEEntry, find_pes

__all__ = ["pe_shuffle", "pe_shift", "pe_moves", "PEMoveError", "EDGES", "read_table"]

EDGES = ("clamp", "wrap")
"""What a shifted learned table reads beyond its edge: the edge row (``clamp``) or the rows wrapped around."""


class PEMoveError(PosgeomError, TypeError):
    """Raised by :func:`pe_shuffle` and :func:`pe_shift` for a model whose encoding they cannot move (or only
    part of it, unless ``strict=False``)."""


@dataclass(frozen=True)
class _Move:
    """What one context does to positions: a permutation (N,) of the grid's tokens, or a shift (dy, dx)."""

    grid: tuple[int, int]
    permutation: torch.Tensor | None = None
    shift: tuple[float, float] = (0.0, 0.0)
    edge: str = "clamp"

    def positions(self) -> torch.Tensor:
        """(N, 2) float64 (row, col): the position whose encoding each patch token is given."""
        rows, cols = torch.meshgrid(
            torch.arange(self.grid[0], dtype=torch.float64),
            torch.arange(self.grid[1], dtype=torch.float64),
            indexing="ij",
        )
        base = torch.stack([rows.flatten(), cols.flatten()], dim=1)
        if self.permutation is not None:
            return base[self.permutation]
        return base + torch.tensor(self.shift, dtype=torch.float64)


_Mover = Callable[[_Move, Undo], None]  # moves one encoding in place and appends its restore callbacks


def read_table(table: torch.Tensor, positions: torch.Tensor, edge: str = "clamp") -> torch.Tensor:
    """The rows of a (H, W, C) table at (N, 2) (row, col) positions -> (N, C), bilinear between grid points.

    At integer positions inside the grid this is the table's own rows, bit for bit (the other corners, of weight 0,
    are not read: a non-finite row stays where it is).
    Beyond the grid, ``edge="clamp"`` reads the nearest edge (positions clamped to [0, H - 1] x [0, W - 1]) and
    ``edge="wrap"`` wraps around (positions modulo H and W: a whole-patch shift is ``torch.roll``)."""
    if edge not in EDGES:
        raise SettingError(f"edge must be one of {', '.join(EDGES)}, got {edge!r}")
    h, w = table.shape[:2]
    pos = positions.to(torch.float64)
    if edge == "clamp":
        pos = torch.stack([pos[:, 0].clamp(0, h - 1), pos[:, 1].clamp(0, w - 1)], dim=1)
    else:
        pos = torch.remainder(pos, torch.tensor([h, w], dtype=torch.float64))
    low = pos.floor()
    frac = (pos - low).to(table.dtype)
    r0, c0 = low[:, 0].long(), low[:, 1].long()
    r1, c1 = (r0 + 1, c0 + 1) if edge == "wrap" else ((r0 + 1).clamp(max=h - 1), (c0 + 1).clamp(max=w - 1))
    r1, c1 = r1 % h, c1 % w
    fr, fc = frac[:, :1], frac[:, 1:]
    corners = (((1 - fr) * (1 - fc), r0, c0), ((1 - fr) * fc, r0, c1), (fr * (1 - fc), r1, c0), (fr * fc, r1, c1))
    # a corner of weight 0 adds nothing, not 0 * its row (a NaN or inf row would spread to its neighbours)
    terms = [torch.where(w > 0, w * table[r, c], torch.zeros((), dtype=table.dtype)) for w, r, c in corners]
    return terms[0] + terms[1] + terms[2] + terms[3]


# --- the movers, one per kind of encoding ------------------------------------------------------------
def _table_mover(table: torch.Tensor, first_row: int) -> _Mover:
    """An additive table (1, prefix + N, C) whose patch rows (from ``first_row``) lie on the move's grid."""

    def move(m: _Move, undo: Undo) -> None:
        saved = table.detach().clone()
        undo.append(lambda: table.copy_(saved))
        patch = saved[0, first_row:]
        grid_table = patch.reshape(m.grid[0], m.grid[1], -1)
        table[0, first_row:] = read_table(grid_table, m.positions(), m.edge).to(table.dtype)

    return move


def _sincos_mover(model: Any) -> _Mover:
    """Our sincos model's fixed table (1, N, C): rows permuted, or the formula at the shifted positions."""
    from ..pos.sincos import sincos_2d_at

    def move(m: _Move, undo: Undo) -> None:
        old = model.sincos_embed
        undo.append(lambda: setattr(model, "sincos_embed", old))
        if m.permutation is not None:
            model.sincos_embed = old[:, m.permutation.to(old.device)]
        else:
            model.sincos_embed = sincos_2d_at(m.positions(), old.shape[-1]).to(old)

    return move


def _rope_mover(module: Any) -> _Mover:
    """A timm RoPE module: its ``get_embed`` shadowed, the rows of what it returns permuted (every kind), or
    (axial RoPE) its sin / cos table computed at the shifted coordinates."""

    def move(m: _Move, undo: Undo) -> None:
        original = module.get_embed  # the class's, or an outer context's shadow

        def get_embed(*args: Any, **kwargs: Any) -> Any:
            out = original(*args, **kwargs)
            if m.permutation is not None:
                return _permute_rows(out, m.permutation)
            shape = kwargs.get("shape", args[0] if args else None) or module.feat_shape
            return _axial_rope_at(module, [int(s) for s in shape], m.shift, out)

        undo.append(shadow(module, "get_embed", get_embed))

    return move


def _permute_rows(out: Any, permutation: torch.Tensor) -> Any:
    """The token rows of a RoPE table permuted: (N, D), a (sin, cos) pair of them, or (..., N, D) (mixed RoPE)."""
    if isinstance(out, tuple):
        return tuple(_permute_rows(o, permutation) for o in out)
    n = out.shape[0] if out.ndim == 2 else out.shape[-2]
    if n != permutation.numel():
        raise ValueError(f"the RoPE table has {n} token rows but the permutation has {permutation.numel()}")
    index = permutation.to(out.device)
    return out[index] if out.ndim == 2 else out[..., index, :]


def _axial_rope_at(module: Any, shape: list[int], shift: tuple[float, float], like: Any) -> Any:
    """timm's axial RoPE table (what ``get_embed`` returns, shaped like ``like``) at the coordinates of the
    ``shape`` grid moved by ``shift`` patches: the module's own coordinates (index, pixel or centred grid, any
    reference shape) are affine in the patch index, so one patch is the step between neighbouring grid points."""
    from timm.layers import build_fourier_pos_embed

    grid = build_fourier_pos_embed(
        shape,
        bands=module.bands,
        include_grid=True,
        in_pixels=module.in_pixels,
        ref_feat_shape=module.ref_feat_shape,
        grid_offset=module.grid_offset,
        grid_indexing=module.grid_indexing,
        grid_type=module.grid_type,
        normalize_coords=module.normalize_coords,
    )[0].squeeze(-1)  # (H, W, 2) in the module's coordinates
    for axis, amount in enumerate(shift):
        if amount == 0:
            continue
        if shape[axis] < 2:
            raise PEMoveError(f"cannot shift a RoPE grid of {shape[axis]} patch along axis {axis}: it has no step")
        step = (grid[1, 0] if axis == 0 else grid[0, 1]) - grid[0, 0]  # the coordinates of one patch along axis
        grid = grid + amount * step
    angles = grid.unsqueeze(-1) * module.bands  # (H, W, 2, bands)
    sin, cos = (f(angles).flatten(-2).flatten(0, -2) for f in (torch.sin, torch.cos))
    sin, cos = (torch.cat([t, t], -1) if module.rotate_half else t.repeat_interleave(2, -1) for t in (sin, cos))
    first = like[0] if isinstance(like, tuple) else like
    sin, cos = sin.to(first), cos.to(first)
    return (sin, cos) if isinstance(like, tuple) else torch.cat([sin, cos], -1)


def _relative_index_mover(owner: Any) -> _Mover:
    """A relative position bias read through ``owner.relative_position_index`` (T, T) over the patch grid (and
    prefix tokens first, beit's): the index of tokens (i, j) becomes that of (q[i], q[j])."""

    def move(m: _Move, undo: Undo) -> None:
        assert m.permutation is not None  # pe_shift never moves a relative bias (_mover_of)
        index = owner.relative_position_index
        prefix = index.shape[0] - m.permutation.numel()
        full = torch.cat([torch.arange(prefix), prefix + m.permutation]).to(index.device)
        undo.append(lambda: setattr(owner, "relative_position_index", index))
        owner.relative_position_index = index[full][:, full]

    return move


# --- what a model has to move --------------------------------------------------------------------------
def pe_moves(model: nn.Module, shift: bool = False) -> list[tuple[PEEntry, bool]]:
    """Every positional encoding of ``model`` (as :func:`~timm_posgeom.interventions.pe_inventory` finds it) and
    whether :func:`pe_shuffle` (``shift``: :func:`pe_shift`) can move it."""
    return [(entry, mover is not None) for entry, mover in _movers(model, shift)]


def _movers(model: Any, shift: bool) -> list[tuple[PEEntry, _Mover | None]]:
    """(entry, how to move it or None) for every PE of ``model``, in inventory order: for a shift (``shift``)
    or a permutation."""
    if hasattr(model, "set_alpha") and hasattr(model, "pe"):  # our PosGeomViT
        from .scaling import pe_inventory

        entries = pe_inventory(model)
        first = 0 if getattr(model, "no_embed_class", False) else int(model.num_prefix_tokens)
        mover = {"ape": lambda: _table_mover(model.pos_embed, first), "sincos": lambda: _sincos_mover(model)}
        mover["rope"] = lambda: _rope_mover(model.rope)
        return [(e, mover[model.pe]()) for e in entries]
    return [(pe.entry, _mover_of(model, pe.entry, shift)) for pe in find_pes(model, include_prefix=False)]


def _mover_of(model: nn.Module, entry: PEEntry, shift: bool) -> _Mover | None:
    """How to move one found PE of a timm model (for a shift, or a permutation), or None where it cannot be
    moved: a shift moves absolute tables and axial RoPE only (a relative bias sees offsets, which it keeps)."""
    from timm.layers import RotaryEmbedding, RotaryEmbeddingCat

    owner_name, _, leaf = entry.name.rpartition(".")
    if not entry.scalable or entry.component not in ("ape", "rope", "relative"):
        return None
    grid = _table_grid(model)
    if entry.component == "rope":
        module = model.get_submodule(entry.name)
        axial = isinstance(module, (RotaryEmbedding, RotaryEmbeddingCat))
        return _rope_mover(module) if callable(getattr(module, "get_embed", None)) and (axial or not shift) else None
    owner = model.get_submodule(owner_name)
    tensor = getattr(owner, leaf)
    if entry.component == "ape" and leaf == "pos_embed" and tensor.ndim == 3 and grid is not None:
        first = tensor.shape[1] - grid[0] * grid[1]
        return _table_mover(tensor, first) if first in (0, int(getattr(model, "num_prefix_tokens", 0) or 0)) else None
    index = getattr(owner, "relative_position_index", None)
    if leaf == "relative_position_bias_table" and isinstance(index, torch.Tensor) and grid is not None and not shift:
        extra = index.shape[0] - grid[0] * grid[1]
        return _relative_index_mover(owner) if index.ndim == 2 and extra in (0, 1) else None
    return None


def _table_grid(model: nn.Module) -> tuple[int, int] | None:
    """The patch grid of the model's own input size (its patch embedding's ``grid_size``), or None."""
    grid = getattr(getattr(model, "patch_embed", None), "grid_size", None)
    return None if grid is None else (int(grid[0]), int(grid[1]))


def _check_components(model: nn.Module, found: list[tuple[PEEntry, _Mover | None]], components: Any) -> list:
    """The entries of the named ``components`` (all when None); ValueError / PEMoveError for unknown names or
    components the model lacks."""
    if components is None:
        return found
    names = [components] if isinstance(components, str) else list(components)
    unknown = [c for c in names if c not in PE_COMPONENTS]
    if unknown or not names:
        raise SettingError(f"components must be among {', '.join(PE_COMPONENTS)}, got {names!r}")
    have = list(dict.fromkeys(e.component for e, _ in found))
    missing = [c for c in names if c not in have]
    if missing:
        raise PEMoveError(
            f"{type(model).__name__} has no {', '.join(repr(c) for c in missing)} positional encoding: its components "
            f"are {', '.join(have) or 'none'}"
        )
    return [(e, m) for e, m in found if e.component in names]


def _check_movable(model: nn.Module, chosen: list, strict: bool, what: str) -> list[_Mover]:
    """The movers of ``chosen``; PEMoveError when there is nothing to move, or (strict) something cannot be."""
    cls = type(model).__name__
    stuck = [e for e, m in chosen if m is None]
    movers = [m for _, m in chosen if m is not None]
    kinds = "; ".join(f"{e.kind} in {e.name or 'the model'}" for e in stuck)
    why = (
        " (a relative position bias depends only on the offset between two tokens, which a shift keeps)"
        if what == "pe_shift" and any(e.component == "relative" for e in stuck)
        else ""
    )
    if not movers:
        found = f": it has {kinds}{why}" if kinds else ""
        raise PEMoveError(f"{what} found no positional encoding it can move in {cls}{found}")
    if stuck and strict:
        raise PEMoveError(
            f"{what} would move only part of the positional encoding of {cls}: it cannot move {kinds}{why}. Pass "
            "strict=False to move the rest, or name the components to move"
        )
    return movers


@contextlib.contextmanager
def _moved(movers: list[_Mover], move: _Move) -> Iterator[None]:
    """Apply every mover for ``move`` (no gradient, ordinary tensors); restore all of them on exit."""
    undo: Undo = []
    with torch.inference_mode(False), torch.no_grad():
        try:
            for mover in movers:
                mover(move, undo)
        except BaseException:
            run_undo(undo)
            raise
    try:
        yield
    finally:
        with torch.inference_mode(False), torch.no_grad():
            run_undo(undo)


def _grid_of(model: nn.Module, what: str) -> tuple[int, int]:
    grid = _table_grid(model)
    if grid is None:
        raise PEMoveError(
            f"{what}: {type(model).__name__} has no patch embedding with a grid_size to move positions on"
        )
    return grid


@contextlib.contextmanager
def pe_shuffle(
    model: nn.Module,
    permutation: torch.Tensor | Sequence[int],
    components: str | Sequence[str] | None = None,
    strict: bool = True,
) -> Iterator[nn.Module]:
    """Permute the positional encoding of ``model``: patch token k is given the encoding of position
    ``permutation[k]`` (row-major on the model's patch grid), the token contents staying where they are.

    Args:
        model: our models (APE, sincos, RoPE) or a timm ViT with a ``pos_embed`` table on its patch grid, timm
            RoPE modules (axial, mixed, DINOv3) and beit's relative position bias (its index over the grid).
        permutation: (N,) a permutation of the N = H * W patch tokens.
        components: the encodings to move (:attr:`~timm_posgeom.interventions.PEEntry.component` names, e.g.
            ``"rope"`` or ``("ape",)``); None: every one.
        strict: refuse (:class:`PEMoveError`) when some chosen encoding cannot be moved; False moves the others.

    Yields ``model``; every table, buffer and method is restored exactly on exit. With ``p`` the permutation of
    :func:`~timm_posgeom.interventions.token_permutation` and ``q = argsort(p)``, a model whose positions come
    only from the encodings moved gives under ``pe_shuffle(model, q)`` the outputs of RPI by ``p`` with the patch
    tokens put back: ``rpi_out[:, argsort(p)]``.
    """
    grid = _grid_of(model, "pe_shuffle")
    perm = torch.as_tensor(permutation).long().cpu()
    n = grid[0] * grid[1]
    if perm.shape != (n,) or not torch.equal(perm.sort().values, torch.arange(n)):
        raise ValueError(f"permutation must be a permutation of the {n} patch tokens of the {grid} grid")
    chosen = _check_components(model, _movers(model, shift=False), components)
    with _moved(_check_movable(model, chosen, strict, "pe_shuffle"), _Move(grid, permutation=perm)):
        yield model


@contextlib.contextmanager
def pe_shift(
    model: nn.Module,
    shift: tuple[float, float],
    components: str | Sequence[str] | None = None,
    edge: str = "clamp",
    strict: bool = True,
) -> Iterator[nn.Module]:
    """Translate the positional encoding of ``model`` by ``shift = (dy, dx)`` patches: patch token (r, c) is given
    the encoding of position (r + dy, c + dx), fractions of a patch included.

    A learned table (APE) is read between its rows by bilinear interpolation (:func:`read_table`; ``edge``:
    ``clamp`` reads its edge beyond it, ``wrap`` wraps around); our sincos table and timm's axial RoPE are
    computed at the moved positions. A zero shift leaves every output bit for bit as it was. Relative biases
    are not moved (a translation keeps every offset) and mixed / DINOv3 RoPE is refused: with ``strict`` a
    model that has one raises :class:`PEMoveError` unless ``components`` leaves it out. ``components`` and
    ``strict`` as in :func:`pe_shuffle`. Yields ``model``; everything is restored exactly on exit.
    """
    grid = _grid_of(model, "pe_shift")
    dy, dx = (float(v) for v in shift)
    if not all(map(lambda v: v == v and abs(v) != float("inf"), (dy, dx))):
        raise SettingError(f"shift must be two finite numbers (dy, dx) of patches, got {shift!r}")
    if edge not in EDGES:
        raise SettingError(f"edge must be one of {', '.join(EDGES)}, got {edge!r}")
    chosen = _check_components(model, _movers(model, shift=True), components)
    with _moved(_check_movable(model, chosen, strict, "pe_shift"), _Move(grid, shift=(dy, dx), edge=edge)):
        yield model
