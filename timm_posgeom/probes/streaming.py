"""What the streaming probes share: batches from any data, a process's shard of them, where the model runs,
and the one setup of a stream (:func:`open_stream`) that :func:`~timm_posgeom.probes.probe_ssdc` and
:func:`~timm_posgeom.probes.run_measures` both use.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence, Sized
from typing import Any, cast

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, RandomSampler

from ..errors import DataError, SettingError
from ..measuring import distributed as _dist
from ..measuring.settings import MeasureSettings

# Under RPI, the permutations of one batch are stacked into forwards of up to this many images (at least one
# batch): the images are read once, and bigger forwards use the hardware better (benchmarks/bench_rpi.py).
FORWARD_IMAGES = 512


class StopForward(Exception):
    """Raised by the last probed hook: the rest of the forward pass is not needed."""


def image_batches(data: Any, batch_size: int | None) -> Iterator[torch.Tensor]:
    """Image batches (B, C, H, W) from a tensor, or an iterable of tensors / (images, ...) / dicts."""
    if isinstance(data, torch.Tensor):
        images = data[None] if data.ndim == 3 else data
        step = batch_size or max(len(images), 1)
        for start in range(0, len(images), step):
            yield check_image_batch(images[start : start + step])
        return
    if isinstance(data, dict):
        yield check_image_batch(images_of(data))
        return
    if not isinstance(data, Iterable):
        raise TypeError(f"data must be a tensor or an iterable of batches, got {type(data).__name__}")
    for batch in data:
        yield check_image_batch(images_of(batch))


class Shard:
    """This process's batches when ``world`` processes share ``data`` (see ``distributed`` in
    :func:`probe_ssdc`): global batch k goes to process k mod ``world``, cut at the global ``max_images``.

    ``seen`` counts the images of every process's batches (None for a pre-sharded ``data``): after
    the iteration, the same on every process, and the sum of the processes' images.
    """

    def __init__(
        self, data: Any, batch_size: int | None, world: int, rank: int, max_images: int | None, presharded: bool
    ) -> None:
        self.data, self.batch_size, self.world, self.rank = data, batch_size, world, rank
        self.max_images, self.presharded = max_images, presharded
        self.seen: int | None = None
        if (
            not presharded
            and isinstance(data, DataLoader)
            and isinstance(data.sampler, RandomSampler)
            and data.sampler.generator is None
            and data.generator is None
        ):
            raise SettingError(
                "a shuffling DataLoader without a seeded generator cannot be shared by batch across "
                "processes (each would draw its own order): pass an unshuffled one, or shard it "
                "yourself and pass distributed='presharded'"
            )

    def __iter__(self) -> Iterator[tuple[int, torch.Tensor]]:
        """(global index of the batch's first image, images) for each of this process's batches (a
        pre-sharded ``data``: the index within this process's shard)."""
        data, world, rank, limit = self.data, self.world, self.rank, self.max_images
        if self.presharded:
            start = 0
            for images in image_batches(data, self.batch_size):
                yield start, images
                start += len(images)
            return
        if isinstance(data, torch.Tensor):
            images = data[None] if data.ndim == 3 else data
            images = images[:limit] if limit is not None else images
            step = self.batch_size or max(len(images), 1)
            self.seen = len(images)
            for start in range(rank * step, len(images), world * step):
                yield start, check_image_batch(images[start : start + step])
            return
        sharded = _dist.shard_dataloader(data, limit, world, rank)
        if sharded is not None:  # each process loads only its own batches
            loader, self.seen = sharded
            sampler = cast(_dist.IndexBatches, loader.batch_sampler)  # shard_dataloader's own
            starts = [rows[0] for rows in sampler.batches if len(rows)]
            yield from zip(starts, image_batches(loader, None))
            return
        self.seen = 0  # any other iterable: every process reads it all, and forwards its own batches
        for k, images in enumerate(image_batches(data, self.batch_size)):
            if limit is not None:
                images = images[: limit - self.seen]
            if len(images):
                start = self.seen
                self.seen += len(images)
                if k % world == rank:
                    yield start, images
            if limit is not None and self.seen >= limit:
                break


class SamePasses:
    """``data`` (an iterable of batches) for a measure that reads it more than once, each pass checked against
    the first: CKA reads it once per model, the alpha sweep once per alpha, and each compares what the passes
    measured as if they had read the same images.

    Every image's fingerprint is kept from the first pass, in order: its sum and its sum weighted by position
    (a flipped, shifted or other image differs). A later pass that reads another image at a place (a shuffling
    ``DataLoader``, random transforms), or ends before the first did (a one-shot iterator), is refused with a
    ValueError (one line, naming ``what``) at the first batch that differs, before its numbers exist. Images past
    where the first pass stopped reading (its consumer's ``max_images``) are not compared.
    """

    def __init__(self, data: Any, what: str) -> None:
        self.data, self.what = data, what
        self.prints: list[torch.Tensor] = []  # the first pass's (B, 2) float64 fingerprints, batch by batch
        self.first_ended: bool | None = None  # None: no pass yet; whether the first read the data to its end
        self.passes = 0

    def __iter__(self) -> Iterator[Any]:
        self.passes += 1
        first, seen = self.passes == 1, 0
        known = torch.cat(self.prints) if self.prints else torch.empty(0, 2, dtype=torch.float64)
        self.first_ended = False if first else self.first_ended
        for batch in self.data:
            prints = _fingerprints(images_of(batch))
            if first:
                self.prints.append(prints)
            else:
                self._compare(prints, known[seen : seen + len(prints)], seen)
            seen += len(prints)
            yield batch
        if first:
            self.first_ended = True
        elif seen < len(known):
            self._refuse(f"it gave {seen} images where the first gave {len(known)}")

    def _compare(self, prints: torch.Tensor, known: torch.Tensor, seen: int) -> None:
        if len(known) < len(prints) and self.first_ended:
            self._refuse(
                f"it gave more images than the first ({seen + len(prints)} and more, against {seen + len(known)})"
            )
        same = torch.isclose(prints[: len(known)], known, rtol=1e-9, atol=1e-9).all(1)
        if not bool(same.all()):
            self._refuse(f"image {seen + int((~same).nonzero()[0])} is another image")

    def _refuse(self, why: str) -> None:
        raise DataError(
            f"{self.what} reads the data once per pass and compares the passes, but pass {self.passes} read other "
            f"images than the first ({why}): give data that yields the same images in the same order every time "
            "(a DataLoader without shuffle, no random transforms, not a one-shot iterator), e.g. eval_loader(...)"
        )


def _fingerprints(images: torch.Tensor) -> torch.Tensor:
    """(B, 2) float64 on the CPU: each image's sum, and its sum weighted by its entries' positions."""
    flat = images.detach().reshape(len(images), -1).to("cpu", torch.float64)
    ramp = torch.linspace(0.0, 1.0, flat.shape[1], dtype=torch.float64)
    return torch.stack([flat.sum(1), flat @ ramp], dim=1)


def same_passes(data: Any, what: str) -> Any:
    """``data`` wrapped in :class:`SamePasses`, unless it reads the same every time by its nature (a tensor, one
    dict batch)."""
    return data if isinstance(data, (torch.Tensor, dict)) else SamePasses(data, what)


def _numbered(batches: Iterable[torch.Tensor]) -> Iterator[tuple[int, torch.Tensor]]:
    """(index of the batch's first image, images) for each batch of one process reading all the data."""
    start = 0
    for images in batches:
        yield start, images
        start += len(images)


def data_signature(data: Any) -> Any:
    """What every process must agree on about ``data`` before sharing it (its length where known)."""
    if isinstance(data, torch.Tensor):
        return ("tensor", tuple(data.shape))
    if isinstance(data, DataLoader):
        try:
            size = len(data.dataset) if isinstance(data.dataset, Sized) else None
        except TypeError:
            size = None
        return ("DataLoader", size, data.batch_size)
    try:
        return (type(data).__name__, len(data))
    except TypeError:
        return (type(data).__name__, None)


def images_of(batch: Any) -> torch.Tensor:
    if isinstance(batch, torch.Tensor):
        return batch[None] if batch.ndim == 3 else batch
    if isinstance(batch, (tuple, list)) and batch and isinstance(batch[0], torch.Tensor):
        return images_of(batch[0])
    if isinstance(batch, dict):
        for key in ("image", "pixel_values", "images"):
            if isinstance(batch.get(key), torch.Tensor):
                return images_of(batch[key])
        raise TypeError(f"a dict batch needs an 'image' or 'pixel_values' tensor, got keys {sorted(batch)}")
    raise TypeError(
        "each batch must be an image tensor (B, C, H, W), an (images, labels, ...) tuple or a dict "
        f"with 'image'/'pixel_values'; got {type(batch).__name__}"
    )


def check_image_batch(images: torch.Tensor) -> torch.Tensor:
    if images.ndim != 4:
        raise ValueError(f"expected an image batch (B, C, H, W), got shape {tuple(images.shape)}")
    return images


def resolve_layers(layers: Sequence[int] | None, depth: int) -> list[int]:
    if layers is None:
        return list(range(depth))
    out = []
    for layer in layers:
        k = int(layer)
        if not -depth <= k < depth:
            raise SettingError(f"layer {layer} is out of range for a model with {depth} blocks")
        out.append(k % depth)
    if not out:
        raise SettingError("layers is empty")
    return sorted(set(out))


def placement(model: nn.Module, device: str | torch.device | None) -> tuple[torch.device, torch.device, torch.dtype]:
    """(where the model's weights are, where to run it: ``device`` or there, the dtype of its inputs)."""
    param = next((p for p in model.parameters() if p.is_floating_point()), None)
    home = param.device if param is not None else torch.device("cpu")
    return (
        home,
        torch.device(device) if device is not None else home,
        param.dtype if param is not None else torch.float32,
    )


def model_name(model: nn.Module) -> str:
    cfg = getattr(model, "pretrained_cfg", None) or getattr(model, "default_cfg", None) or {}
    return str(cfg.get("architecture") or type(model).__name__)


class Stream:
    """This process's images of a streamed measurement, set up once by :func:`open_stream`.

    ``batches``: this process's batches (its shard when several processes share the data); ``shard``:
    that shard, or None alone; ``seed``: the seed every process uses (shared under RPI); ``limit``: the
    images this process cuts at (None when sharded: the shard is cut at the global ``max_images``);
    ``home`` / ``device`` / ``dtype``: where the model's weights are, where it runs, its input dtype;
    ``n_images``: the images :meth:`images` has handed out and counted; ``image_size``: the (H, W) of
    its first batch (None before one).
    """

    def __init__(
        self,
        batches: Iterable[tuple[int, torch.Tensor]],
        shard: Shard | None,
        seed: int | None,
        limit: int | None,
        placement: tuple[torch.device, torch.device, torch.dtype],
        bar: Any,
    ) -> None:
        self.batches, self.shard, self.seed, self.limit, self.bar = batches, shard, seed, limit, bar
        self.home, self.device, self.dtype = placement
        self.n_images = 0
        self.image_size: tuple[int, int] | None = None

    def together(self) -> contextlib.AbstractContextManager:
        """Sharded: an error in one process raised in every one (not a wait in a collective)."""
        return _dist.fail_together() if self.shard is not None else contextlib.nullcontext()

    @contextlib.contextmanager
    def placed(self, model: nn.Module) -> Iterator[None]:
        """The model on ``device`` for the block, moved back home after it; the bar closed."""
        try:
            if self.device != self.home:
                model.to(self.device)
            yield
        finally:
            self.bar.close()
            if self.device != self.home:
                model.to(self.home)

    def images(self) -> Iterator[tuple[torch.Tensor, tuple[int, int], int]]:
        """(images on ``device`` in the model's dtype (B, C, H, W), (H, W), the index in the data of the first
        image) per batch, cut at ``limit``; a batch is counted (``n_images``, the bar) once its consumer asks
        for the next one. The index is global when several processes share the data (within this process's
        shard for a pre-sharded ``data``): per-image choices (RPI permutations, jackknife groups) made from it
        do not depend on batching or on the number of processes."""
        for offset, images in self.batches:
            if self.limit is not None:
                images = images[: self.limit - self.n_images]
            if len(images) == 0:
                continue
            hw = (int(images.shape[-2]), int(images.shape[-1]))
            self.image_size = self.image_size or hw
            yield images.to(device=self.device, dtype=self.dtype, non_blocking=True), hw, offset
            self.n_images += len(images)
            self.bar.update(len(images))
            if self.limit is not None and self.n_images >= self.limit:
                break


def open_stream(model: nn.Module, data: Any, settings: MeasureSettings, rpi: bool, agreed: tuple, what: str) -> Stream:
    """The setup :func:`~timm_posgeom.probes.probe_ssdc` and :func:`~timm_posgeom.probes.run_measures` share.

    ``settings``: the call's :class:`~timm_posgeom.measuring.MeasureSettings`. Launched as several processes
    (``distributed`` not ``off``), every process must pass the same ``agreed`` values (the call's own
    settings), the same settings and the same data (checked: an error on every process, not a wait); under
    RPI the seed is shared; the data is cut into this process's :class:`Shard`. Then the model's placement
    and the progress bar (``what``; on the main process only when sharded)."""
    max_images, batch_size, distributed = settings.max_images, settings.batch_size, settings.distributed
    world = _dist.setup() if distributed != "off" else 1
    shard, seed = None, settings.seed
    if world > 1:
        _dist.check_same(
            (
                *agreed,
                seed,
                max_images,
                batch_size,
                distributed,
                None if distributed == "presharded" else data_signature(data),
            ),
            f"{what} settings or data",
        )
        if distributed == "presharded" and max_images is not None:
            raise SettingError(
                "max_images cannot be applied to pre-sharded data (each process holds its own shard): "
                "cut the shards instead, or pass the whole data with distributed='auto'"
            )
        if rpi:
            seed = _dist.shared_seed(seed)
        shard = Shard(data, batch_size, world, _dist.rank(), max_images, distributed == "presharded")
    from tqdm.auto import tqdm

    total = max_images if max_images is not None else (len(data) if isinstance(data, torch.Tensor) else None)
    show = settings.progress and (shard is None or _dist.is_main())
    bar = tqdm(total=total if shard is None else None, unit="img", desc=what, disable=not show, leave=False)
    batches = shard if shard is not None else _numbered(image_batches(data, batch_size))
    return Stream(
        batches, shard, seed, None if shard is not None else max_images, placement(model, settings.device), bar
    )
