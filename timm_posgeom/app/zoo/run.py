"""The zoo: plan, shards and locks, one model after another, resumable (:func:`run_zoo`, :func:`merge_zoo`)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ...errors import SettingError
from ...measuring.distributed import broadcast_object
from ..records import ZooIndex, ZooModel
from ..rundir import RunDirError, RunLock, describe_changes, set_aside, settings_changes
from .config import (
    NO_MODELS,
    ZooConfig,
    ZooError,
    config_from_settings,
    is_main_process,
    record_path,
    safe_name,
    write_record,
)
from .figures import write_outputs
from .measure import measure_model, weights_key
from .table import write_csv


@dataclass
class ZooSummary:
    """What :func:`run_zoo` did: every record in the zoo's order, which were measured now, which failed."""

    records: list[ZooModel]
    measured: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # measured before with these settings (or by another shard)
    out: Path | None = None
    locked: list[str] = field(default_factory=list)  # held by another process's lock: not measured here

    @property
    def failed(self) -> list[ZooModel]:
        return [r for r in self.records if r.status != "ok"]


def _dedupe(names: Iterable[str]) -> list[str]:
    seen, out = set(), []
    for n in names:
        n = n.strip()
        if n and n not in seen:
            seen.add(n)
            out.append(n)
    return out


def parse_shard(text: str) -> tuple[int, int]:
    """``"K/N"`` -> ``(K, N)``: the shard that measures the zoo's models K, K + N, K + 2N, ... (0 <= K < N)."""
    try:
        k, n = (int(v) for v in text.split("/"))
    except ValueError:
        raise SettingError(f"--shard must be K/N (e.g. 0/4: models 0, 4, 8, ... of the zoo), got {text!r}") from None
    if not (n >= 1 and 0 <= k < n):
        raise SettingError(f"--shard K/N needs 0 <= K < N, got {text!r}")
    return k, n


@contextmanager
def _index_lock(out: Path, say: Callable[[str], None], wait_s: float = 120.0):
    """The zoo folder's lock, held briefly (reading and writing ``zoo.json`` and the combined outputs):
    processes of other shards wait for it (up to ``wait_s``) instead of being refused. The lock of a killed
    holder is free (:class:`RunLock`)."""
    lock = RunLock(out)
    lock.acquire(say=say, wait_s=wait_s)
    try:
        yield
    finally:
        lock.release()


def _model_lock(out: Path, name: str) -> tuple[RunLock | None, str]:
    """(the lock of one model's measurement, ``locks/<name>/.lock``, taken; or None and the refusal, naming its
    holder, when another process holds it: a live one, or one on another host, which cannot be told from a
    process that is gone: the refusal says how to clear it)."""
    folder = out / "locks" / safe_name(name)
    folder.mkdir(parents=True, exist_ok=True)
    lock = RunLock(folder)
    try:
        lock.acquire(say=lambda s: None)
    except RunDirError as e:
        return None, str(e)
    return lock, ""


def _still_to_measure(out: Path, name: str, settings: dict[str, Any]) -> bool:
    """Whether the model has no ok record with these settings and its current weights (another shard may
    have written one since the plan was made)."""
    path = record_path(out, name)
    if not path.is_file():
        return True
    record = ZooModel.read(path)
    return not (
        record.status == "ok"
        and not settings_changes("zoo", record.settings, settings)
        and record.weights_key == weights_key(name, record.weights)
    )


def _measured_now(zoo: _Zoo, name: str) -> set[str]:
    """{name} when the model has an ok record with the zoo's settings (another shard measured it), else {}."""
    return set() if _still_to_measure(zoo.out, name, zoo.settings) else {name}


def read_records(out: Path, names: Sequence[str]) -> tuple[list[ZooModel], list[str]]:
    """(the records in ``out/models`` of ``names``, in that order; the names that have none yet)."""
    records, missing = [], []
    for name in names:
        path = record_path(out, name)
        if path.is_file():
            records.append(ZooModel.read(path))
        else:
            missing.append(name)
    return records, missing


def run_zoo(
    models: Sequence[str],
    config: ZooConfig,
    out: str | os.PathLike,
    *,
    allow_changes: bool = False,
    progress: bool = True,
    log: Callable[[str], None] | None = None,
    shard: tuple[int, int] | None = None,
) -> ZooSummary:
    """Measure every model (those recorded in ``out`` before, then the new ones) and write the comparison.

    Models already measured with the same settings and the same weights (:func:`weights_key`) are skipped;
    failed ones are measured again. A settings change, or a model whose weights changed under its name (a
    new export in a ``local-dir:``, a new Hub revision), is refused (:class:`ZooError`, one line) unless
    ``allow_changes``: then each such model is measured again, its former record kept as ``.replaced-N``.

    ``shard=(K, N)`` measures the zoo's models K, K + N, ... only (model-parallel: a job array, or one job
    per node). Shards may run at once into one ``out``: each model is measured under its own lock
    (``locks/<name>``), so a model is measured once and a killed shard loses only the model it was
    measuring; ``zoo.json`` and the combined outputs are written under the folder's lock, held briefly.
    Each shard writes ``zoo.csv``, ``zoo.md`` and the figures from every record present when it ends, so
    the last one to end writes the whole zoo (:func:`merge_zoo` writes them again at any time).
    """
    from tqdm.auto import tqdm

    out = Path(out)
    if not _dedupe(models) and not (out / "zoo.json").is_file():
        raise ZooError(NO_MODELS)
    main = is_main_process()
    data, config = _load_data(config, progress and main)  # identified by content before any record is compared
    zoo = _Zoo(out=out, config=config, settings=config.settings(), main=main, progress=progress, say_now=log or print)
    zoo.names, zoo.records, done = _start(zoo, _dedupe(models), allow_changes)
    mine = zoo.names if shard is None else zoo.names[shard[0] :: shard[1]]
    data = _decoded(config, data, progress and main, decode=any(name not in done for name in mine))
    summary = ZooSummary(records=[], out=out)
    bar = tqdm(
        mine,
        desc="zoo" if shard is None else f"zoo shard {shard[0]}/{shard[1]}",
        unit="model",
        disable=not (progress and main),
    )
    say = log or (bar.write if main else (lambda s: None))
    for k, name in enumerate(bar, 1):
        bar.set_postfix_str(name[-40:])
        where = f"[{k}/{len(mine)}] {name}"
        if name in done:
            say(f"{where}: measured before, kept")
            summary.skipped.append(name)
        elif _measure_one(zoo, name, data, say, where) is None:  # locked by another process (said), or done since
            (summary.skipped if name in _measured_now(zoo, name) else summary.locked).append(name)
        else:
            summary.measured.append(name)
    bar.close()
    _finish(zoo, summary, say)
    return summary


@dataclass
class _Zoo:
    """What every step of :func:`run_zoo` shares: the folder, the settings, this process's role, the zoo's
    models (main's view) and their records so far."""

    out: Path
    config: ZooConfig
    settings: dict[str, Any]
    main: bool
    progress: bool
    say_now: Callable[[str], None]
    names: list[str] = field(default_factory=list)
    records: dict[str, ZooModel] = field(default_factory=dict)


def _start(zoo: _Zoo, asked: list[str], allow_changes: bool) -> tuple[list[str], dict[str, ZooModel], set[str]]:
    """Under the folder's lock: the plan (:func:`_plan`), the records to measure again set aside, ``zoo.json``."""
    if zoo.main:
        zoo.out.mkdir(parents=True, exist_ok=True)
        (zoo.out / "models").mkdir(exist_ok=True)
    with _index_lock(zoo.out, zoo.say_now) if zoo.main else nullcontext():
        names, records, done = _plan(zoo.out, asked, zoo.settings, allow_changes)
        if zoo.main:
            for name in names:
                if name in records and name not in done and records[name].status == "ok":
                    set_aside(record_path(zoo.out, name))
            ZooIndex(settings=zoo.settings, models=names).write(zoo.out / "zoo.json")
    return names, records, done


def _load_data(config: ZooConfig, progress: bool) -> tuple[Any, ZooConfig]:
    """(the zoo's split, not decoded; ``config`` with its ``data_fingerprint``: what the split holds)."""
    from ...data import check_images, content_fingerprint, load_split

    data = load_split(
        config.data,
        config.split,
        subset=config.load_count(),
        config=config.data_config,
        revision=config.revision,
        streaming=config.streaming,
    )
    if config.bad_images == "skip":  # checked first: left out, listed
        data = check_images(data, "skip", progress=progress)
        if data.skipped:
            print(
                f"left out {len(data.skipped)} image(s) that cannot be decoded: {'; '.join(data.skipped[:5])}"
                f"{' ...' if len(data.skipped) > 5 else ''}",
                file=sys.stderr,
            )
    return data, replace(config, data_fingerprint=content_fingerprint(data, progress=progress))


def _decoded(config: ZooConfig, data: Any, progress: bool, decode: bool) -> Any:
    """The zoo's images, decoded once for every model (``shared_decode``) when a model is to be measured."""
    from ...data.eval_data import DecodedImages

    if config.shared_decode and decode:
        # decoded once here and resized once per input configuration, for every model: the same batches
        # bit for bit as decoding them for each model (tests/test_zoo.py; benchmarks/bench_zoo.py)
        data = DecodedImages(data, progress=progress)
    return data


def _measure_one(zoo: _Zoo, name: str, data: Any, say: Callable[[str], None], where: str) -> ZooModel | None:
    """Measure one model under its lock and write its record and the table so far; None when another shard
    measures it (or has since)."""
    lock, held = _model_lock(zoo.out, name) if zoo.main else (None, "")
    # every process of a launch measures the same models: main's lock decides for all
    taken = broadcast_object(lock is not None if zoo.main else None)
    if not taken and held:
        say(f"{where}: not measured here: {held}")
    if lock is not None and not _still_to_measure(zoo.out, name, zoo.settings):  # taken here, by main
        lock.release()
        taken = False
        say(f"{where}: measured by another shard since the plan, kept")
    taken = broadcast_object(taken)
    if not taken:
        return None
    try:
        say(f"{where}: measuring")
        record = measure_model(name, zoo.config, data, progress=zoo.progress and zoo.main)
        zoo.records[name] = record
        refused = _write_record(zoo, name, record) if zoo.main else None
        refused = broadcast_object(refused)  # every process of a launch stops with main
        if refused:
            raise ZooError(refused)
    finally:
        if lock is not None:
            lock.release()
    state = "done" if record.status == "ok" else f"FAILED ({record.error})"
    say(f"{where}: {state} in {record.elapsed_s:.1f} s")
    return record


def _write_record(zoo: _Zoo, name: str, record: ZooModel) -> str | None:
    """Under the folder's lock, the model's record and the table so far (every shard's records in it); None, or
    the refusal when the zoo's settings were changed by another process since this one read them (a shard started
    with --allow-changes and other settings): neither the record nor a table mixing two measurements is
    written then."""
    with _index_lock(zoo.out, zoo.say_now):
        index = ZooIndex.read(zoo.out / "zoo.json") if (zoo.out / "zoo.json").is_file() else None
        changes = settings_changes("zoo", index.settings, zoo.settings) if index is not None else {}
        if changes:
            return (
                f"{zoo.out}: another process changed this zoo's settings since this one started (the zoo's -> this "
                f"process's: {describe_changes(changes)}): {name} is not written, a table would mix two "
                "measurements; measure into another --out, or run again with the zoo's settings"
            )
        write_record(zoo.out, name, record)
        records = read_records(zoo.out, zoo.names)[0]
        try:
            check_records(zoo.out, records, zoo.settings)
        except ZooError as e:
            return str(e)
        write_csv(records, zoo.out / "zoo.csv", zoo.config)
    return None


def _finish(zoo: _Zoo, summary: ZooSummary, say: Callable[[str], None]) -> None:
    """The summary's records; on the main process the combined outputs from every record present."""
    if not zoo.main:
        summary.records = [zoo.records[n] for n in zoo.names if n in zoo.records]
        return
    with _index_lock(zoo.out, zoo.say_now):
        summary.records, missing = read_records(zoo.out, zoo.names)
        check_records(zoo.out, summary.records, zoo.settings)
        write_outputs(summary.records, zoo.out, zoo.config)
    if missing:
        say(
            f"{len(missing)} model(s) of the zoo not measured yet (other shards): {', '.join(missing[:5])}"
            f"{' ...' if len(missing) > 5 else ''}"
        )


def check_records(out: Path, records: Sequence[ZooModel], settings: dict[str, Any]) -> None:
    """ZooError (one line) when a measured record was made with other settings or other data than the zoo's
    ``settings``: one table would mix two measurements (a shard run on other images, a record copied in)."""
    other: dict[str, dict[str, tuple[Any, Any]]] = {}
    for record in records:
        if record.status == "ok":
            changes = settings_changes("zoo", settings, record.settings)
            if changes:
                other[record.model] = changes
    if other:
        first = next(iter(other.values()))
        raise ZooError(
            f"{out}: the record(s) of {len(other)} model(s) ({', '.join(list(other)[:5])}"
            f"{' ...' if len(other) > 5 else ''}) were measured with other settings or data than the zoo's "
            f"(the zoo's -> the record's: {describe_changes(first)}): one table would mix "
            "them; measure them again into this zoo (posgeom zoo --data D --out DIR --allow-changes), or "
            "keep them in another --out"
        )


def merge_zoo(out: str | os.PathLike, config: ZooConfig | None = None) -> tuple[ZooSummary, list[str]]:
    """Write ``zoo.csv``, ``zoo.md`` and the figures of ``out`` again from every record its shards wrote,
    measuring nothing; returns the summary and the models that have no record yet."""
    out = Path(out)
    if not (out / "zoo.json").is_file():
        raise ZooError(f"{out} holds no zoo (no zoo.json): run posgeom zoo into it first")
    index = ZooIndex.read(out / "zoo.json")
    config = config or config_from_settings(index.settings)
    with _index_lock(out, print):
        records, missing = read_records(out, index.models)
        check_records(out, records, index.settings)
        write_outputs(records, out, config)
    return ZooSummary(records=records, out=out), missing


def _plan(
    out: Path, asked: list[str], settings: dict[str, Any], allow_changes: bool
) -> tuple[list[str], dict[str, ZooModel], set[str]]:
    """(the zoo's models: those of ``zoo.json`` then the new ones, their records, the ones to keep).

    Raises ZooError for settings that differ from the recorded ones (unless ``allow_changes``). The
    models and the ones to keep are main's view, shared with every process."""
    index_path = out / "zoo.json"
    index = ZooIndex.read(index_path) if index_path.is_file() else None
    names = _dedupe([*(index.models if index else []), *asked])
    if not names:
        raise ZooError(NO_MODELS)
    records: dict[str, ZooModel] = {}
    changes: dict[str, tuple[Any, Any]] = {}
    if index is not None:
        changes.update(settings_changes("zoo", index.settings, settings))
    stale: set[str] = set()
    for name in names:
        path = record_path(out, name)
        if path.is_file():
            records[name] = record = ZooModel.read(path)
            if record.status == "ok":
                changes.update(settings_changes("zoo", record.settings, settings))
                now = weights_key(name, record.weights)
                if record.weights_key != now:  # the same name, other weights (a new export, a new revision)
                    stale.add(name)
                    changes[f"{name}'s weights"] = (record.weights_key or "not recorded", now or "unknown")
    if changes and not allow_changes:
        data = changes.pop("data_fingerprint", (None, None))  # said alone when no other setting explains it
        what = (
            f"other settings ({describe_changes(changes)})"
            if changes
            else f"other data: the images under --data are not the ones it measured (their content fingerprint "
            f"{data[0] or 'not recorded'} -> {data[1]})"
        )
        raise ZooError(
            f"{out} was measured with {what}; pass --allow-changes to measure its models again with these "
            "(former records are kept as .replaced-N), or choose another --out"
        )
    # main's view in every process: every process then measures the same models in the same order, even
    # when one read the records while main was writing one
    # a record made before a setting existed has that setting's former value (LEGACY_KEYS): it is kept
    kept = {n for n, r in records.items() if r.status == "ok" and not settings_changes("zoo", r.settings, settings)}
    names, done = broadcast_object((names, kept - stale))
    return names, records, done
