"""The interventions on positions, measured: top-1 and SSDC per layer, with 95% intervals, under

* :func:`measure_pe_shuffle`: the encoding permuted (:func:`~timm_posgeom.interventions.pe_shuffle`), beside the
  model as it is and RPI, for every encoding and, in a model with several, for each alone;
* :func:`measure_pe_shift`: the encoding translated by each shift, whole patches and fractions
  (:func:`~timm_posgeom.interventions.pe_shift`);
* :func:`measure_tile_shuffle`: the image cut into g x g tiles and the tiles permuted
  (:func:`~timm_posgeom.interventions.shuffle_tiles`), for each grid g.

Each is ``measure(model, data, ..., settings=MeasureSettings)`` -> :class:`~.intervention_result.InterventionResult`.
Permutations follow the RPI protocol: permutation k from the seed ``seed + k`` (K = ``rpi_permutations``), the
same for every image, and a condition under K permutations is their mean with a Student t interval over them.
top-1 comes from :func:`~timm_posgeom.robustness.fragility` (exact counts; Wilson intervals where one
arrangement is measured), SSDC from :func:`~timm_posgeom.probes.probe_ssdc` (the mean map; a jackknife over
images where one arrangement is measured). Definitions: docs/method.md#pe-shuffle-and-pe-shift and
docs/method.md#image-grid-shuffle.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import PIL.Image
import torch
import torch.nn as nn

from ..data.eval_data import check_split, eval_loader, first_items
from ..data.labels import match_labels
from ..data.shifts import Shift
from ..data.transforms import resolve_config
from ..defaults import probe_count, rpi_count
from ..errors import SettingError
from ..interventions import (
    check_tile_grid,
    draw_permutations,
    pe_moves,
    pe_shift,
    pe_shuffle,
    permutation_seeds,
    shuffle_tiles,
    tile_token_permutation,
)
from ..measuring.settings import MeasureSettings
from ..probes import find_sites, grid_positions, probe_ssdc, ssdc
from .fragility_eval import fragility
from .intervention_result import InterventionResult, InterventionRow
from .scores import FragilityResult

__all__ = [
    "measure_pe_shuffle",
    "measure_pe_shift",
    "measure_tile_shuffle",
    "TileShuffle",
    "DEFAULT_PE_SHIFTS",
    "SHIFT_DIRECTIONS",
    "default_tile_grids",
]

DEFAULT_PE_SHIFTS = (0.0, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0)
"""The shifts of :func:`measure_pe_shift`, in patches: whole patches and fractions (interpolated)."""

SHIFT_DIRECTIONS = {"x": (0.0, 1.0), "y": (1.0, 0.0), "xy": (1.0, 1.0)}
"""A shift s moves the encoding by s patches along columns (``x``), rows (``y``) or both (``xy``)."""

_TILE_GRIDS = (1, 2, 4, 8, 14, 16)


def default_tile_grids(size: tuple[int, int], tokens: tuple[int, int]) -> list[int]:
    """The tile grids of :func:`measure_tile_shuffle` for an input ``size`` (H, W) and a ``tokens`` patch grid:
    those of 1, 2, 4, 8, 14, 16 that divide both sides of the input into tiles of one patch or more (1, 2, 4, 8 at
    64 px with patch 8; 1, 2, 4, 8, 14 at 224 px with patch 16, Naseer et al.'s)."""
    return [g for g in _TILE_GRIDS if size[0] % g == 0 and size[1] % g == 0 and g <= min(tokens)]


class TileShuffle(Shift):
    """A tile shuffle as a :class:`~timm_posgeom.data.shifts.Shift`, so that :func:`~timm_posgeom.robustness.fragility`
    scores it beside the clean image: each image (at the model's input size) cut into ``grid`` x ``grid`` tiles,
    slot t holding tile ``permutation[t]`` (:func:`~timm_posgeom.interventions.shuffle_tiles`); ``spec`` names it
    in the result."""

    def __init__(self, grid: int, permutation: torch.Tensor, spec: str):
        super().__init__()
        self.grid, self.spec = int(grid), spec
        self.permutation = torch.as_tensor(permutation).long().cpu()
        shuffle_tiles(torch.zeros(1, 1, self.grid, self.grid), self.grid, self.permutation)  # checked once, here
        self._order = self.permutation.numpy()

    def transform(self, inpt: Any, params: dict[str, Any]) -> Any:
        if isinstance(inpt, PIL.Image.Image):  # the loader's images, one by one: numpy, not torch, per image
            pixels = np.asarray(inpt)
            h, w = pixels.shape[:2]
            g, th, tw = self.grid, *check_tile_grid((h, w), self.grid)
            tiles = pixels.reshape(g, th, g, tw, -1).swapaxes(1, 2).reshape(g * g, th, tw, -1)[self._order]
            moved = tiles.reshape(g, g, th, tw, -1).swapaxes(1, 2).reshape(pixels.shape)
            return PIL.Image.fromarray(np.ascontiguousarray(moved))
        if isinstance(inpt, torch.Tensor):
            flat = inpt.reshape(-1, *inpt.shape[-3:])
            return shuffle_tiles(flat, self.grid, self.permutation).reshape(inpt.shape)
        return inpt


@dataclass
class _Run:
    """One measure's model, data and settings, checked once: the top-1 images (labels matched), the probe's
    loader and image count, the seed, the K permutations and the patch grid."""

    model: nn.Module
    data: Any
    loader: Any
    n_probe: int
    seed: int
    k: int
    size: tuple[int, int]  # the model's input (H, W)
    grid: tuple[int, int]  # its patch grid
    site: str
    settings: MeasureSettings
    recorded: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def prepare(cls, model: nn.Module, data: Any, own: dict[str, Any], labels: str, settings: MeasureSettings) -> _Run:
        if settings.batch_size is None:
            raise SettingError("batch_size must be an integer >= 1 (images per step), got None")
        sites = find_sites(model)  # a flat ViT: every probed layer lies on the patch grid (else UnsupportedModelError)
        n_probe = probe_count(own["probe_images"], settings.max_images)
        bound = None if settings.max_images is None else max(settings.max_images, n_probe)
        data = match_labels(model, first_items(data, bound), labels)
        n_probe = check_split(data, n_probe)
        loader = eval_loader(
            model,
            data,
            max_images=n_probe,
            batch_size=settings.batch_size,
            resize=settings.resize,
            num_workers=settings.num_workers,
            img_size=settings.img_size,
        )
        size = tuple(int(v) for v in resolve_config(model, settings.img_size)["input_size"][1:])
        seed = settings.seed if settings.seed is not None else int(torch.randint(2**31, ()).item())
        quiet = settings.replace(progress=False, seed=seed)
        grid = sites.grid_size((size[0], size[1]))
        k = rpi_count(settings.rpi_permutations)
        return cls(model, data, loader, n_probe, seed, k, (size[0], size[1]), grid, own["site"], quiet)

    @property
    def n_tokens(self) -> int:
        return self.grid[0] * self.grid[1]

    def permutations(self, n: int) -> torch.Tensor:
        """(K, n): the RPI protocol's K permutations of n items (permutation k from the seed ``seed + k``)."""
        return draw_permutations(n, permutation_seeds(self.seed, self.k))

    def top1(self, shifts: Sequence[Shift] = (), rpi: bool = False) -> FragilityResult:
        return fragility(self.model, self.data, list(shifts), rpi=rpi, settings=self.settings, labels="as-is")

    def probe(self, loader: Any = None, rpi: bool = False) -> Any:
        settings = self.settings.replace(max_images=self.n_probe, rpi_permutations=self.k)
        return probe_ssdc(self.model, loader or self.loader, site=self.site, rpi=rpi, settings=settings)

    def against(self, probe: Any, permutation: torch.Tensor | None) -> list[float]:
        """SSDC of each layer's mean map against the positions ``grid_positions(grid)[permutation]`` (NaN per
        layer when ``permutation`` is None: no token's content comes from one patch)."""
        if permutation is None:
            return [float("nan")] * len(probe.layers)
        positions = grid_positions(self.grid)[permutation]
        return [
            float(v) for v in ssdc(probe.mean_maps, self.grid, distance=probe.settings["distance"], positions=positions)
        ]

    def result(self, measure: str, rows: list[InterventionRow], probe: Any, **own: Any) -> InterventionResult:
        settings = {
            "model": probe.settings.get("model"),
            "site": probe.settings.get("site"),
            "seed": self.seed,
            "permutations": self.k,
            "permutation_seeds": permutation_seeds(self.seed, self.k),
            "probe_images": self.n_probe,
            "num_images": check_split(self.data, self.settings.max_images),
            "grid_size": list(self.grid),
            "resize": self.settings.resize,
            **own,
        }
        return InterventionResult(measure, rows, list(probe.layers), settings)


_OWN = {"probe_images": None, "site": "auto"}


def measure_pe_shuffle(
    model: nn.Module,
    data: Any,
    *,
    components: Sequence[str] | None = None,
    labels: str = "check",
    settings: MeasureSettings | None = None,
    **options: Any,
) -> InterventionResult:
    """Top-1 and SSDC with the positional encoding permuted (docs/method.md#pe-shuffle-and-pe-shift).

    Rows: ``clean`` (the model as it is), ``rpi`` (the token contents permuted, the reference), ``pe shuffle``
    (the encodings of ``components``, default every one, permuted) and, when no components are named and the
    model has several encodings to move, ``pe shuffle: <component>`` for each alone. Under permutation k the
    encoding is permuted by the inverse of RPI's permutation k (``q = argsort(p)``), so a model whose positions
    come only from the encodings moved gives the RPI numbers, permutation by permutation (up to rounding);
    the two part where something else knows positions. SSDC against the content grid (the image's own
    layout) and against the encoding grid (position ``q[k]`` for token k; under RPI the index grid).

    Args:
        model: a flat timm ViT whose encoding :func:`~timm_posgeom.interventions.pe_shuffle` moves.
        data: a labelled split (as :func:`~timm_posgeom.robustness.fragility` reads it).
        components: the encodings to permute (e.g. ``["rope"]``); None: every one, then each alone.
        labels: how the data's labels meet the model's classes (:func:`~timm_posgeom.data.labels.match_labels`).
        settings: :class:`~timm_posgeom.measuring.MeasureSettings` (or its fields as keywords): ``max_images``
            (top-1), ``rpi_permutations`` (K), ``seed``, ``batch_size``, ``resize``, ``device``...

    Keyword Args:
        probe_images (int | None): images of each SSDC probe (default 1,000 or ``max_images`` if fewer).
        site (str): the probe site (default ``auto``: the input of each block's attention).
    """
    settings, own = MeasureSettings.resolve("measure_pe_shuffle", settings, options, _OWN)
    run = _Run.prepare(model, data, own, labels, settings)
    with pe_shuffle(model, torch.arange(run.n_tokens), components=components):  # refused here, before measuring
        pass
    selections: list[Any] = [components]
    if components is None:
        movable = list(dict.fromkeys(e.component for e, ok in pe_moves(model) if ok))
        selections += [[c] for c in movable] if len(movable) > 1 else []
    clean = run.probe()
    rows = [
        InterventionRow.from_measurements("clean", None, run.top1(), clean),
        InterventionRow.from_measurements("rpi", None, run.top1(rpi=True), run.probe(rpi=True)),
    ]
    inverse = torch.argsort(run.permutations(run.n_tokens), dim=1)
    for chosen in selections:
        top1, content, encoding = [], [], []
        for q in inverse:
            with pe_shuffle(model, q, components=chosen):
                top1.append(run.top1().clean_accuracy)
                probe = run.probe()
            content.append([float(v) for v in probe.per_layer])
            encoding.append(run.against(probe, q))
        name = "pe shuffle" if chosen is None else f"pe shuffle: {', '.join(chosen)}"
        rows.append(InterventionRow.from_replicates(name, None, top1, content, encoding))
    return run.result("pe_shuffle", rows, clean, components=components)


def measure_pe_shift(
    model: nn.Module,
    data: Any,
    shifts: Sequence[float] = DEFAULT_PE_SHIFTS,
    *,
    direction: str = "xy",
    edge: str = "clamp",
    components: Sequence[str] | None = None,
    labels: str = "check",
    settings: MeasureSettings | None = None,
    **options: Any,
) -> InterventionResult:
    """Top-1 and SSDC with the positional encoding translated by each of ``shifts`` patches
    (docs/method.md#pe-shuffle-and-pe-shift): one row per shift, ``shift s`` (``value`` s), under
    ``pe_shift(model, s * direction, components, edge)``; shift 0 is the model as it is. ``direction``: ``x``
    (columns), ``y`` (rows) or ``xy`` (both, the default). A translation keeps every distance, so SSDC is
    against the image's grid alone; its intervals are over images (one arrangement per shift). ``labels``,
    ``settings`` and the keywords as in :func:`measure_pe_shuffle`."""
    settings, own = MeasureSettings.resolve("measure_pe_shift", settings, options, _OWN)
    if direction not in SHIFT_DIRECTIONS:
        raise SettingError(f"direction must be one of {', '.join(SHIFT_DIRECTIONS)}, got {direction!r}")
    amounts = [float(s) for s in shifts]
    if not amounts:
        raise SettingError("shifts is empty")
    dy, dx = SHIFT_DIRECTIONS[direction]
    with pe_shift(model, (0.0, 0.0), components=components, edge=edge):  # refused here, before any data is read
        pass
    run = _Run.prepare(model, data, own, labels, settings)
    rows, probe = [], None
    for s in amounts:
        with pe_shift(model, (s * dy, s * dx), components=components, edge=edge):
            frag, probe = run.top1(), run.probe()
        rows.append(InterventionRow.from_measurements(f"shift {s:g}", s, frag, probe))
    axis = f"shift of the encoding (patches, direction {direction})"
    return run.result("pe_shift", rows, probe, direction=direction, edge=edge, components=components, axis=axis)


class _TiledBatches:
    """The probe's batches with every image's tiles shuffled (``grid``, ``permutation``): re-iterable."""

    def __init__(self, loader: Any, grid: int, permutation: torch.Tensor):
        self.loader, self.grid, self.permutation = loader, grid, permutation

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for images, labels in self.loader:
            yield shuffle_tiles(images, self.grid, self.permutation), labels


def measure_tile_shuffle(
    model: nn.Module,
    data: Any,
    grids: Sequence[int] | None = None,
    *,
    labels: str = "check",
    settings: MeasureSettings | None = None,
    **options: Any,
) -> InterventionResult:
    """Top-1 and SSDC with each image cut into g x g tiles and the tiles permuted, for each of ``grids``
    (default :func:`default_tile_grids`; docs/method.md#image-grid-shuffle). Row ``grid g`` (``value`` g): the
    mean over the K permutations of the g * g tiles (permutation k from the seed ``seed + k``, the same for every
    image) with its Student t interval; ``grid 1`` is the image as it is (intervals over images). SSDC against
    the encoding grid (the token slots: what a PE sees) and the content grid (where each token's content lies in
    the image; NaN for tiles smaller than a patch). With one tile per patch the model sees exactly what RPI
    gives it. ``labels``, ``settings`` and the keywords as in :func:`measure_pe_shuffle`."""
    settings, own = MeasureSettings.resolve("measure_tile_shuffle", settings, options, _OWN)
    run = _Run.prepare(model, data, own, labels, settings)
    grids = default_tile_grids(run.size, run.grid) if grids is None else [int(g) for g in grids]
    perms = {g: run.permutations(g * g) for g in grids if g > 1}
    shifts = [TileShuffle(g, p, f"tiles:{g}:{k}") for g, ps in perms.items() for k, p in enumerate(ps)]
    frag = run.top1(shifts)  # every grid and permutation scored in one pass, beside the clean image
    rows, clean = [], run.probe()
    for g in grids:
        if g == 1:
            rows.append(InterventionRow.from_measurements("grid 1", 1.0, frag, clean))
            continue
        top1 = [frag.accuracy[f"tiles:{g}:{k}"] for k in range(run.k)]
        content, encoding = [], []
        for perm in perms[g]:
            probe = run.probe(_TiledBatches(run.loader, g, perm))
            encoding.append([float(v) for v in probe.per_layer])
            content.append(run.against(probe, tile_token_permutation(run.grid, g, perm)))
        rows.append(InterventionRow.from_replicates(f"grid {g}", float(g), top1, content, encoding))
    return run.result("tile_shuffle", rows, clean, grids=list(grids), axis="tiles per side (g x g grid)")
