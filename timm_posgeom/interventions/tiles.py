"""Image-grid shuffle (docs/method.md#image-grid-shuffle): the image cut into a g x g grid of tiles and the tiles
permuted, before the model sees it (Naseer et al. 2021, arXiv 2105.10497, "Intriguing Properties of Vision
Transformers", Fig. 5; iBOT).

* :func:`shuffle_tiles`: (B, C, H, W) images -> the same with tile slot t holding image tile ``permutation[t]``
  (tiles in row-major order, the same permutation for every image).
* :func:`tile_token_permutation`: the permutation of the patch tokens that a tile shuffle makes when each tile
  holds whole patches: patch slot i then holds the content of patch ``p[i]``, as under RPI. With one tile per
  patch the two are the same permutation, and the model sees exactly what RPI gives it.

Pure functions of tensors: nothing here touches a model.
"""

from __future__ import annotations

import torch

from ..errors import SettingError

__all__ = ["check_tile_grid", "shuffle_tiles", "tile_token_permutation"]


def check_tile_grid(size: tuple[int, int], grid: int) -> tuple[int, int]:
    """The (height, width) of one tile of a ``grid`` x ``grid`` cut of an image of ``size`` (H, W); ValueError
    unless ``grid`` is an integer >= 1 that divides both sides."""
    if isinstance(grid, bool) or not isinstance(grid, int) or grid < 1:
        raise SettingError(f"a tile grid must be an integer >= 1, got {grid!r}")
    h, w = int(size[0]), int(size[1])
    if h % grid or w % grid:
        raise SettingError(f"a {grid} x {grid} tile grid does not divide a {h} x {w} image into equal tiles")
    return h // grid, w // grid


def _check_permutation(permutation: torch.Tensor, count: int) -> torch.Tensor:
    perm = torch.as_tensor(permutation).long()
    if perm.shape != (count,) or not torch.equal(perm.sort().values.cpu(), torch.arange(count)):
        raise ValueError(
            f"the tile permutation must be a permutation of the {count} tiles, got shape {tuple(perm.shape)}"
        )
    return perm


def shuffle_tiles(images: torch.Tensor, grid: int, permutation: torch.Tensor) -> torch.Tensor:
    """(B, C, H, W) -> (B, C, H, W): cut each image into ``grid`` x ``grid`` equal tiles (row-major) and put
    image tile ``permutation[t]`` in tile slot t. Any dtype (uint8 pixels or normalised floats: a per-channel
    normalisation commutes with moving pixels)."""
    th, tw = check_tile_grid((images.shape[-2], images.shape[-1]), grid)
    perm = _check_permutation(permutation, grid * grid).to(images.device)
    b, c = images.shape[:2]
    tiles = images.reshape(b, c, grid, th, grid, tw).permute(0, 2, 4, 1, 3, 5).reshape(b, grid * grid, c, th, tw)
    moved = tiles[:, perm].reshape(b, grid, grid, c, th, tw)
    return moved.permute(0, 3, 1, 4, 2, 5).reshape(images.shape).contiguous()


def tile_token_permutation(tokens: tuple[int, int], grid: int, permutation: torch.Tensor) -> torch.Tensor | None:
    """(N,) the patch permutation a tile shuffle makes on a ``tokens`` (h, w) patch grid: slot i holds the content
    of patch ``p[i]`` (row-major). None when a tile does not hold whole patches (``grid`` does not divide the
    patch grid): then no token's content comes from one patch."""
    h, w = int(tokens[0]), int(tokens[1])
    if h % grid or w % grid:
        return None
    perm = _check_permutation(permutation, grid * grid).cpu()
    index = torch.arange(h * w).reshape(1, 1, h, w)
    return shuffle_tiles(index, grid, perm).flatten()
