"""Data-parallel measuring: the few collective helpers :func:`~timm_posgeom.probes.probe_ssdc`,
:func:`~timm_posgeom.robustness.fragility` and :func:`~timm_posgeom.robustness.alpha_sweep` use when
several processes share one measurement (``accelerate launch``, ``torchrun``).

Nothing here forces a launcher on anyone: a process alone (no ``WORLD_SIZE`` above 1, no process
group) sees ``world_size() == 1`` and every helper is the identity. A process group already set up
(by accelerate's ``Accelerator`` / ``PartialState``, or ``torch.distributed.init_process_group``) is
used as it is; a multi-process launch without one is joined through accelerate's ``PartialState``,
imported only then (``import timm_posgeom`` never imports accelerate).

Sharding is by batch: with the data cut into global batches 0, 1, 2, ... (the ones one process would
read), process r of W takes batches r, r + W, r + 2W, ... So every batch is the very batch of a
single-process run (the last, partial one included) and the shards differ by at most one batch.

What the measurements reduce, and how (each docstring says it again):

* exact integer counts (images, correct predictions): summed;
* float64 running sums (summed similarity maps): :func:`all_reduce_sum`, equal to a single process's
  sum up to the order of float64 additions;
* streaming moments: gathered with :func:`all_gather_objects` and merged in process order with
  Chan's formula, as between batches;
* per-image arrays: :func:`gather_in_order` re-assembles them in data order, so anything computed
  from them (the bootstrap intervals of FS) is identical to one process's.

CPU processes: accelerate 1.x's ``launch --cpu --num_processes N`` starts *one* process (its simple
launcher spawns several only through MPI). Several CPU processes come from the torchrun-based launcher:
``ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes 2 ...`` or ``torchrun
--nproc_per_node 2 ...``; they talk over gloo.

Ports: the processes meet on ``MASTER_PORT``. Port 0 does not mean "any free port" to the workers:
torchrun's store listens on a free port but tells the workers 0, and they would try to reach port 0
until the rendezvous timeout (accelerate 1.1's ``launch --main_process_port 0`` passes the 0 through;
later accelerate releases pick a free port themselves). :func:`setup` refuses ``MASTER_PORT=0`` at once.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import math
import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, Sampler, SequentialSampler

from ..errors import SettingError, require

__all__ = [
    "launched_world_size",
    "check_port",
    "is_initialized",
    "setup",
    "world_size",
    "rank",
    "is_main",
    "default_device",
    "all_reduce_sum",
    "all_gather_objects",
    "broadcast_object",
    "gather_in_order",
    "check_same",
    "shared_seed",
    "fail_together",
    "main_process_first",
    "own_batches",
    "sequential_batches",
    "IndexBatches",
    "shard_dataloader",
]

_TRUE = ("1", "true", "yes", "on")


def launched_world_size() -> int:
    """The number of processes the launcher started (``WORLD_SIZE``; 1 when not launched)."""
    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError:
        return 1


def check_port() -> None:
    """Raise RuntimeError, before any waiting, when several processes were launched with ``MASTER_PORT=0``
    (see the module's notes on ports); nothing when not launched."""
    launched = launched_world_size()
    if launched > 1 and os.environ.get("MASTER_PORT", "").strip() == "0":
        raise RuntimeError(
            f"{launched} processes were launched with MASTER_PORT=0: they cannot meet on port 0 and "
            "would wait for one another until the rendezvous timeout (accelerate before 1.7 passes "
            "`--main_process_port 0` through unchanged): launch with a free port instead"
        )


def is_initialized() -> bool:
    """Whether a torch.distributed process group is up in this process."""
    return dist.is_available() and dist.is_initialized()


def _use_cpu() -> bool:
    """Collectives over gloo on CPU: asked for (``ACCELERATE_USE_CPU``), or no CUDA device to use."""
    return os.environ.get("ACCELERATE_USE_CPU", "").strip().lower() in _TRUE or not torch.cuda.is_available()


def setup() -> int:
    """Join the process group of a multi-process launch; return the number of processes (1 alone).

    A process group already up is used as is. Launched with ``WORLD_SIZE`` > 1 and no group yet: the
    group is made by accelerate's ``PartialState`` (gloo on CPU when ``ACCELERATE_USE_CPU`` is set or
    there is no CUDA device; NCCL otherwise, each process on its own GPU). Not launched: 1, nothing
    imported. Raises RuntimeError when the group does not hold the processes the launcher started, and
    before any waiting when ``MASTER_PORT`` is 0 (see the module's notes on ports).
    """
    if is_initialized():
        return dist.get_world_size()
    launched = launched_world_size()
    if launched <= 1:
        return 1
    if not dist.is_available():
        raise RuntimeError(f"{launched} processes were launched but this torch build has no torch.distributed")
    check_port()
    PartialState = require("accelerate", "measuring in several processes").PartialState

    PartialState(cpu=_use_cpu())
    if is_initialized():  # made here: destroyed before the interpreter exits (else a process may abort on exit)
        atexit.register(_destroy_at_exit)
    if not is_initialized() or dist.get_world_size() != launched:
        got = dist.get_world_size() if is_initialized() else 1
        raise RuntimeError(
            f"{launched} processes were launched but accelerate set up {got}: each process would "
            "measure alone (for CPU processes set ACCELERATE_USE_CPU=1; accelerate's state may have "
            "been created before the launch environment was set)"
        )
    return dist.get_world_size()


def _destroy_at_exit() -> None:
    with contextlib.suppress(Exception):
        if is_initialized():
            dist.destroy_process_group()


def world_size() -> int:
    """Processes in the group (1 alone); before :func:`setup`, the number the launcher started."""
    return dist.get_world_size() if is_initialized() else launched_world_size()


def rank() -> int:
    """This process's index in the group (0 alone); before :func:`setup`, the launcher's ``RANK``."""
    if is_initialized():
        return dist.get_rank()
    try:
        return int(os.environ.get("RANK", "0")) if launched_world_size() > 1 else 0
    except ValueError:
        return 0


def is_main() -> bool:
    """Whether this is the main process (rank 0): the one that writes files and shows progress."""
    return rank() == 0


def default_device() -> str | None:
    """The device this process computes on when none is asked for, in a multi-process run: ``cpu``
    for CPU processes (``ACCELERATE_USE_CPU`` or no CUDA), else its own GPU (``cuda:LOCAL_RANK``, as
    accelerate assigns them). None for a process alone (the caller's own default applies)."""
    if world_size() <= 1:
        return None
    if _use_cpu():
        return "cpu"
    try:
        local = int(os.environ.get("LOCAL_RANK", "0"))
    except ValueError:
        local = 0
    return f"cuda:{local % max(torch.cuda.device_count(), 1)}"


def _comm_device() -> torch.device:
    """Where tensors must be for the group's backend: CPU for gloo / MPI (and mixed groups), the
    process's own accelerator for NCCL and the like."""
    backend = str(dist.get_backend()).lower()
    if backend == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    if backend in ("gloo", "mpi", "undefined") or "cpu:" in backend:
        return torch.device("cpu")
    PartialState = require(
        "accelerate", "measuring in several processes"
    ).PartialState  # xccl, hccl, ...: accelerate knows the device

    return PartialState().device


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """The element-wise sum of ``tensor`` over every process (a new tensor, same dtype and device).

    Alone: ``tensor`` itself. Every process must call it with the same shape and dtype. float64 sums
    equal a single process's running sum up to the order of the additions; integer sums are exact.
    """
    if world_size() <= 1 or not is_initialized():
        return tensor
    buffer = tensor.detach().to(_comm_device(), copy=True).contiguous()
    dist.all_reduce(buffer, op=dist.ReduceOp.SUM)
    return buffer.to(tensor.device)


def all_gather_objects(obj: Any) -> list[Any]:
    """Every process's picklable ``obj``, in process order (alone: ``[obj]``). For small states:
    counts, moments, grids, per-image arrays of a few MB."""
    if world_size() <= 1 or not is_initialized():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Process ``src``'s picklable ``obj`` on every process (alone: ``obj``)."""
    if world_size() <= 1 or not is_initialized():
        return obj
    box = [obj if rank() == src else None]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def gather_in_order(values: np.ndarray, indices: np.ndarray | Sequence[int], n: int) -> np.ndarray:
    """Re-assemble per-item arrays in data order: each process holds ``values[i]`` of the items
    ``indices[i]`` (its shard); every process gets the (n, ...) array of all of them.

    Nothing is reduced: values are placed, so the result is exactly the array one process would have
    filled. Raises RuntimeError when the shards do not cover 0..n-1 exactly once.
    """
    values = np.asarray(values)
    indices = np.asarray(indices, dtype=np.int64)
    if len(values) != len(indices):
        raise ValueError(f"{len(values)} values for {len(indices)} indices")
    parts = all_gather_objects((values, indices))
    dtype = values.dtype if len(parts) == 1 else np.result_type(*(v.dtype for v, _ in parts))
    out = np.zeros((n, *values.shape[1:]), dtype=dtype)
    seen = np.zeros(n, dtype=np.int64)
    for part_values, part_indices in parts:
        if len(part_indices) and (part_indices.min() < 0 or part_indices.max() >= n):
            raise RuntimeError(f"an index out of range 0..{n - 1} in a process's shard")
        out[part_indices] = part_values
        np.add.at(seen, part_indices, 1)
    if not (seen == 1).all():
        missing, twice = int((seen == 0).sum()), int((seen > 1).sum())
        raise RuntimeError(
            f"the shards of {len(parts)} process(es) cover {n} items badly: {missing} missing, {twice} more than once"
        )
    return out


def check_same(value: Any, what: str) -> None:
    """Raise ValueError on every process unless ``value`` (picklable, comparable) is the same on all.

    Guards a collective measurement against processes called with different settings or data, which
    would otherwise reduce unrelated numbers or wait forever for one another."""
    values = all_gather_objects(value)
    if any(v != values[0] for v in values[1:]):
        shown = "; ".join(f"process {i}: {v!r}" for i, v in enumerate(values[:4]))
        raise ValueError(f"the processes differ in {what} ({shown}): every process must be called the same way")


def shared_seed(seed: int | None) -> int | None:
    """``seed`` itself, unless it is None with several processes: then one drawn on process 0 from
    torch's global RNG and broadcast, so that every process draws the same permutations."""
    if seed is not None or world_size() <= 1 or not is_initialized():
        return seed
    drawn = int(torch.randint(0, 2**62, ())) if is_main() else None
    return int(broadcast_object(drawn))


def _exchange_failure(error: BaseException | None) -> None:
    """Every process says whether its block failed; one that did not but sees another's failure raises
    an error of the same class (where it can be rebuilt from a message; else RuntimeError) whose message
    names the failed process, so that a user error reads the same on every process."""
    said = None if error is None else (type(error).__module__, type(error).__qualname__, str(error))
    failures = all_gather_objects(said)
    if error is not None:
        return
    for i, failure in enumerate(failures):
        if failure is None:
            continue
        module, name, message = failure
        text = f"{message} (on process {i} of {len(failures)})"
        try:
            cls = getattr(importlib.import_module(module), name)
            remote = cls(text) if isinstance(cls, type) and issubclass(cls, Exception) else None
        except Exception:
            remote = None
        raise (
            remote if remote is not None else RuntimeError(f"process {i} of {len(failures)} failed: {name}: {message}")
        )


@contextlib.contextmanager
def fail_together() -> Iterator[None]:
    """Run a block of local work on every process; if it raised on any process, raise on every one
    (its own error where it failed, a RuntimeError naming the failed process elsewhere), instead of
    leaving the others waiting in the next collective. Alone: just the block."""
    if world_size() <= 1 or not is_initialized():
        yield
        return
    try:
        yield
    except Exception as e:
        _exchange_failure(e)
        raise
    _exchange_failure(None)


@contextlib.contextmanager
def main_process_first() -> Iterator[None]:
    """The main process runs the block first (a download, a cache), then the others do; a failure on
    the main process is raised on every process. Alone: just the block."""
    if world_size() <= 1 or not is_initialized():
        yield
        return
    if is_main():
        with fail_together():
            yield
    else:
        _exchange_failure(None)
        yield


def own_batches(num_batches: int, world: int | None = None, rank_: int | None = None) -> range:
    """The global batch indices this process takes: r, r + W, r + 2W, ... below ``num_batches``."""
    world = world_size() if world is None else world
    rank_ = rank() if rank_ is None else rank_
    return range(rank_, num_batches, world)


class IndexBatches(Sampler):
    """A batch sampler yielding the given batches of dataset indices, in order."""

    def __init__(self, batches: Sequence[Sequence[int]]):
        self.batches = [list(b) for b in batches]

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


def sequential_batches(
    n: int, batch_size: int, world: int | None = None, rank_: int | None = None, drop_last: bool = False
) -> list[range]:
    """This process's share of the batches ``[kB, (k+1)B)`` of the first ``n`` items: global batch k
    for every k in :func:`own_batches` (the last one partial unless ``drop_last``)."""
    if batch_size < 1:
        raise SettingError(f"batch_size must be >= 1, got {batch_size}")
    end = (n // batch_size) * batch_size if drop_last else n
    count = math.ceil(end / batch_size)
    return [range(k * batch_size, min((k + 1) * batch_size, end)) for k in own_batches(count, world, rank_)]


def shard_dataloader(
    loader: Any, limit: int | None = None, world: int | None = None, rank_: int | None = None
) -> tuple[DataLoader, int] | None:
    """A DataLoader that loads only this process's batches of ``loader``, and the number of images
    of all processes' batches together; None when ``loader`` cannot be re-batched.

    Re-batched: a DataLoader over a map-style dataset read in order (a ``BatchSampler`` over a
    ``SequentialSampler``, as :func:`~timm_posgeom.data.eval_data.eval_loader` builds). Its global batch k
    (items ``[kB, (k+1)B)``) goes to process k mod W, so each process decodes only its own images;
    ``limit`` keeps the first ``limit`` items (the batch crossing it is cut), as a single process
    stopping at ``max_images`` would. Workers, collate function, pinning ... are those of ``loader``.
    """
    if not isinstance(loader, DataLoader) or isinstance(loader.dataset, IterableDataset):
        return None
    sampler = loader.batch_sampler
    if type(sampler) is not BatchSampler or type(sampler.sampler) is not SequentialSampler:
        return None
    n = len(sampler.sampler)
    batch = int(sampler.batch_size)
    end = (n // batch) * batch if sampler.drop_last else n
    if limit is not None:
        end = min(end, int(limit))
    batches = sequential_batches(end, batch, world, rank_)
    kwargs: dict[str, Any] = dict(
        batch_sampler=IndexBatches(batches),
        num_workers=loader.num_workers,
        collate_fn=loader.collate_fn,
        pin_memory=loader.pin_memory,
        timeout=loader.timeout,
        worker_init_fn=loader.worker_init_fn,
        multiprocessing_context=loader.multiprocessing_context,
        generator=loader.generator,
        persistent_workers=loader.persistent_workers and loader.num_workers > 0,
        pin_memory_device=getattr(loader, "pin_memory_device", ""),
    )
    if loader.num_workers > 0:
        kwargs["prefetch_factor"] = loader.prefetch_factor
    if hasattr(loader, "in_order"):
        kwargs["in_order"] = loader.in_order
    return DataLoader(loader.dataset, **kwargs), end
