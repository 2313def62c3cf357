"""Trained weights kept outside git, restored on demand: the manifest, its sources, and the Hub cache they go to.

The repository's records (``results.json``, ``eval.json``, ``export/config.json``, reports) stay in git; the
weights they were measured on (each run's ``export/model.safetensors`` and its probe maps ``maps.pt``) do not. A
manifest (``experiments/weights.json``) names every such file: its path in the tree, its SHA-256 and size, the
SHA-1 the run's records name it by, the commit whose tree holds it (the history is never rewritten) and, for an
export, the Hugging Face Hub repository it is published as and its timm name where it has one.

:func:`restore` brings files back, bit for bit (each checked against its SHA-256 before it is renamed into place):

* an export goes into the Hugging Face Hub cache (``HF_HUB_CACHE`` / ``HF_HOME``) as a download from its repository
  would leave it (``blobs/<sha256>``, ``snapshots/<revision>/{model.safetensors,config.json}``, ``refs/main``
  written last), so ``timm.create_model("<model>.<tag>", pretrained=True)`` and ``hf-hub:<repo>`` load it offline;
  a link at its path in the tree makes ``local-dir:RUN/export`` and everything that reads a run folder work as
  before;
* probe maps go back to their run folder.

Sources, tried in this order unless one is named: the working tree (a copy already there), the git history of the
clone the manifest lies in (``git cat-file`` of the manifest's commit), the Hub (exports once published); or a
folder given by the user (files at their manifest paths, or named by their SHA-256). A missing source, a damaged
copy or a full disk stops with one line naming the file and what to do, and leaves nothing half-written.
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

from ..errors import PosgeomError
from ..models.pretrained import WEIGHTS_FILE

__all__ = [
    "MANIFEST",
    "KINDS",
    "WeightsError",
    "WeightsEntry",
    "Manifest",
    "Source",
    "TreeSource",
    "GitSource",
    "FolderSource",
    "HubSource",
    "default_sources",
    "parse_source",
    "file_sha256",
    "hub_cache_dir",
    "cache_repo_dir",
    "restore",
    "RestoreReport",
    "entry_state",
    "add_runs",
    "ensure_restored",
]

MANIFEST = Path("experiments") / "weights.json"  # relative to the repository's root
KINDS = ("export", "maps")  # a run's exported weights (Hub material); its probe maps (kept beside its records)
CHUNK = 1 << 20
MANIFEST_SCHEMA = 1


class WeightsError(PosgeomError, RuntimeError):
    """Weights that cannot be listed, found or restored (one line: which file, and what to do)."""


@dataclass(frozen=True)
class WeightsEntry:
    """One file kept outside git.

    Attributes:
        path: its path in the tree, relative to the repository's root (``experiments/scaling/<study>/runs/<run>/
            export/model.safetensors`` or ``.../<run>/maps.pt``).
        kind: ``"export"`` or ``"maps"``.
        size: bytes.
        sha256: what every restored copy is checked against (and an export's blob name in the Hub cache).
        sha1: the SHA-1 a run's records name the weights by (``eval.json``'s ``weights_sha1``).
        commit: the commit whose tree holds the file (None: never committed; restored from a folder or the Hub).
        hub_repo: the Hub repository an export is published as (None for maps).
        timm_name: the ``<model>.<tag>`` name ``pretrained=True`` loads it by, where it has one.
    """

    path: str
    kind: str
    size: int
    sha256: str
    sha1: str
    commit: str | None = None
    hub_repo: str | None = None
    timm_name: str | None = None

    def names(self) -> tuple[str, ...]:
        """Every name it answers to: its path, its run folder, its study, its Hub repository (with and without the
        organisation) and its timm name."""
        parts = Path(self.path).parts
        run = Path(*parts[: parts.index("runs") + 2]).as_posix() if "runs" in parts[:-1] else ""
        study = Path(*parts[: parts.index("runs")]).as_posix() if run else ""
        repo = self.hub_repo or ""
        names = (self.path, run, study, Path(study).name, repo, repo.split("/")[-1], self.timm_name or "")
        return tuple(n for n in names if n)


@dataclass
class Manifest:
    """The manifest: its entries, and the file it was read from (whose folder's repository the paths are in)."""

    entries: list[WeightsEntry] = field(default_factory=list)
    path: Path | None = None

    @property
    def root(self) -> Path:
        """The repository root the entries' paths are relative to (``experiments/weights.json``'s grandparent)."""
        if self.path is None:
            raise WeightsError("this manifest was not read from a file: its entries' root is unknown")
        return self.path.resolve().parent.parent

    @classmethod
    def read(cls, path: str | os.PathLike) -> Manifest:
        """Read ``path``; :class:`WeightsError` in one line for a missing, unreadable or malformed manifest."""
        path = Path(path)
        try:
            data = json.loads(path.read_text())
            if not isinstance(data, dict) or not isinstance(data.get("files"), list):
                raise ValueError("not a mapping with a 'files' list")
            entries = [WeightsEntry(**item) for item in data["files"]]
        except FileNotFoundError:
            raise WeightsError(
                f"{path}: no weights manifest here (run from a clone of timm-posgeom, or pass --manifest)"
            ) from None
        except (OSError, UnicodeDecodeError, ValueError, TypeError) as e:
            raise WeightsError(
                f"{path}: not a weights manifest ({type(e).__name__}: {e}); restore it with git"
            ) from None
        bad = [e.path for e in entries if e.kind not in KINDS or len(e.sha256) != 64]
        if bad:
            raise WeightsError(f"{path}: entries with an unknown kind or a malformed SHA-256: {', '.join(bad[:3])}")
        return cls(entries, path)

    def write(self, path: str | os.PathLike | None = None) -> Path:
        """Write the manifest (sorted by path, atomically) to ``path`` or where it was read from."""
        from ..results.jsonio import write_atomic

        target = Path(path or self.path or MANIFEST)
        data = {
            "schema": MANIFEST_SCHEMA,
            "about": "Weights kept outside git: `posgeom weights restore` brings them back (docs/guide.md).",
            "files": [asdict(e) for e in sorted(self.entries, key=lambda e: e.path)],
        }
        write_atomic(target, json.dumps(data, indent=1) + "\n")
        self.path = target
        return target

    def select(self, names: Iterable[str] = ()) -> list[WeightsEntry]:
        """The entries that ``names`` name (every entry when none): a path, a run folder, a study (its folder or
        its name), a Hub repository, a timm name, or a shell pattern over those. :class:`WeightsError` for a name
        that names nothing, with the closest names."""
        names = [n.rstrip("/") for n in names]
        if not names:
            return list(self.entries)
        chosen: list[WeightsEntry] = []
        for name in names:
            hits = [e for e in self.entries if any(fnmatch.fnmatchcase(n, name) for n in e.names())]
            if not hits:
                raise WeightsError(f"no weights named {name!r} in {self.path}: {_closest(name, self.entries)}")
            chosen += [e for e in hits if e not in chosen]
        return chosen


def _closest(name: str, entries: list[WeightsEntry]) -> str:
    import difflib

    every = sorted({n for e in entries for n in e.names()})
    close = difflib.get_close_matches(name, every, n=3, cutoff=0.5)
    return f"did you mean {', '.join(close)}? " if close else "`posgeom weights list` shows the names"


def file_sha256(path: str | os.PathLike) -> str:
    """SHA-256 of a file, read in 1-MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


# --- sources -------------------------------------------------------------------------------------------------------


class Source:
    """Where copies come from: :meth:`open` gives a readable binary stream of an entry's bytes, or None when this
    source does not have it; :meth:`why_not` says in a few words why it has none."""

    name = "source"

    def open(self, entry: WeightsEntry) -> contextlib.AbstractContextManager[IO[bytes] | None]:
        raise NotImplementedError

    def why_not(self, entry: WeightsEntry) -> str:
        return f"not in {self.name}"


class TreeSource(Source):
    """The working tree: a file still at its path (a tracked copy, not a link this module made)."""

    def __init__(self, root: Path):
        self.root = root
        self.name = "the working tree"

    @contextlib.contextmanager
    def open(self, entry: WeightsEntry) -> Iterator[IO[bytes] | None]:
        path = self.root / entry.path
        if path.is_symlink() or not path.is_file():
            yield None
            return
        with open(path, "rb") as f:
            yield f


class GitSource(Source):
    """The git history of a clone: ``git cat-file blob <commit>:<path>``, streamed."""

    def __init__(self, root: Path):
        self.root = root
        self.name = "git history"
        self._has: dict[str, bool] = {}

    def has_commit(self, commit: str) -> bool:
        if commit not in self._has:
            try:
                found = subprocess.run(
                    ["git", "-C", str(self.root), "cat-file", "-e", f"{commit}^{{commit}}"], capture_output=True
                )
                self._has[commit] = found.returncode == 0
            except OSError:  # no git
                self._has[commit] = False
        return self._has[commit]

    @contextlib.contextmanager
    def open(self, entry: WeightsEntry) -> Iterator[IO[bytes] | None]:
        if entry.commit is None or not self.has_commit(entry.commit):
            yield None
            return
        cmd = ["git", "-C", str(self.root), "cat-file", "blob", f"{entry.commit}:{entry.path}"]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        try:
            assert proc.stdout is not None
            yield proc.stdout
        finally:
            if proc.stdout is not None:
                proc.stdout.close()
            proc.kill() if proc.poll() is None else None
            proc.wait()

    def why_not(self, entry: WeightsEntry) -> str:
        if entry.commit is None:
            return "never committed"
        if not self.has_commit(entry.commit):
            return (
                f"this clone lacks commit {entry.commit[:12]} (a shallow clone? `git fetch --unshallow`, or "
                "--from a folder or the Hub)"
            )
        return f"not at {entry.commit[:12]}:{entry.path}"


class FolderSource(Source):
    """A folder of copies: each file at its manifest path below it, or named by its SHA-256 (anywhere below)."""

    def __init__(self, folder: Path):
        if not folder.is_dir():
            raise WeightsError(f"--from {folder}: no such folder (a folder of copies, 'git' or 'hub')")
        self.folder = folder
        self.name = str(folder)
        self._by_hash: dict[str, Path] | None = None

    def _find(self, entry: WeightsEntry) -> Path | None:
        direct = self.folder / entry.path
        if direct.is_file():
            return direct
        if self._by_hash is None:
            self._by_hash = {p.name: p for p in self.folder.rglob("*") if len(p.name) == 64 and p.is_file()}
        return self._by_hash.get(entry.sha256)

    @contextlib.contextmanager
    def open(self, entry: WeightsEntry) -> Iterator[IO[bytes] | None]:
        path = self._find(entry)
        if path is None:
            yield None
            return
        with open(path, "rb") as f:
            yield f


class HubSource(Source):
    """The published Hub repositories (exports only): ``hf_hub_download`` into the cache, then read."""

    def __init__(self, cache_dir: Path):
        self.cache_dir = cache_dir
        self.name = "the Hugging Face Hub"
        self._errors: dict[str, str] = {}

    @contextlib.contextmanager
    def open(self, entry: WeightsEntry) -> Iterator[IO[bytes] | None]:
        if entry.kind != "export" or not entry.hub_repo:
            yield None
            return
        from huggingface_hub import hf_hub_download

        try:
            path = hf_hub_download(entry.hub_repo, WEIGHTS_FILE, cache_dir=self.cache_dir)
        except Exception as e:  # noqa: BLE001  offline, not published, no access: this source has it not
            self._errors[entry.path] = f"{type(e).__name__} from {entry.hub_repo}"
            yield None
            return
        with open(path, "rb") as f:
            yield f

    def why_not(self, entry: WeightsEntry) -> str:
        if entry.kind != "export":
            return "probe maps are not published"
        return self._errors.get(entry.path, "not published")


def default_sources(root: Path, cache_dir: Path) -> list[Source]:
    """The working tree, then this clone's git history, then the Hub."""
    return [TreeSource(root), GitSource(root), HubSource(cache_dir)]


def parse_source(text: str, root: Path, cache_dir: Path) -> list[Source]:
    """``--from``: ``tree``, ``git``, ``hub``, or a folder of copies."""
    named: dict[str, Callable[[], Source]] = {
        "tree": lambda: TreeSource(root),
        "git": lambda: GitSource(root),
        "hub": lambda: HubSource(cache_dir),
    }
    return [named[text]() if text in named else FolderSource(Path(text).expanduser())]


# --- the Hub cache -------------------------------------------------------------------------------------------------


def hub_cache_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    """``cache_dir``, else the Hugging Face Hub cache (``HF_HUB_CACHE``, else ``HF_HOME/hub``), read now."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    from huggingface_hub import constants

    return Path(os.environ.get("HF_HUB_CACHE") or constants.HF_HUB_CACHE).expanduser()


def cache_repo_dir(cache_dir: Path, repo_id: str) -> Path:
    """A model repository's folder in the Hub cache (``models--ORG--NAME``)."""
    return cache_dir / f"models--{repo_id.replace('/', '--')}"


def _revision(entry: WeightsEntry) -> str:
    """The snapshot a restored export lies in: named after its content (40 hex digits, as a Hub commit is), so a
    restore never mixes two versions, and a later real download (another revision) sits beside it."""
    return entry.sha256[:40]


def _git_blob_sha1(data: bytes) -> str:
    """The name the Hub cache gives a small file's blob: its git blob id."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _relative_link(link: Path, target: Path) -> None:
    """``link`` -> ``target`` as a relative symbolic link (as the Hub cache makes them), replacing a link there."""
    tmp = link.with_name(f".{link.name}.{os.getpid()}.link")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    os.symlink(os.path.relpath(target, link.parent), tmp)
    os.replace(tmp, link)


# --- restoring -----------------------------------------------------------------------------------------------------


@dataclass
class RestoreReport:
    """What :func:`restore` did: the entries copied now (with the source each came from), those already in place,
    and the run-folder links it made."""

    restored: list[tuple[WeightsEntry, str]] = field(default_factory=list)
    present: list[WeightsEntry] = field(default_factory=list)
    linked: list[Path] = field(default_factory=list)
    not_linked: list[str] = field(default_factory=list)


def _destination(entry: WeightsEntry, root: Path, cache_dir: Path) -> Path:
    """Where an entry's bytes go: an export's blob in the Hub cache, probe maps at their path in the tree."""
    if entry.kind == "export":
        return cache_repo_dir(cache_dir, _repo(entry)) / "blobs" / entry.sha256
    return root / entry.path


def _repo(entry: WeightsEntry) -> str:
    if not entry.hub_repo:
        raise WeightsError(f"{entry.path}: the manifest names no Hub repository for this export")
    return entry.hub_repo


def _in_place(path: Path, entry: WeightsEntry) -> bool:
    """``path`` holds the entry's bytes (its size, then its SHA-256: a damaged copy is not in place)."""
    try:
        return path.is_file() and path.stat().st_size == entry.size and file_sha256(path) == entry.sha256
    except OSError:
        return False


def _room(path: Path) -> int:
    """Free bytes on the file system ``path`` would be written to (its nearest existing folder)."""
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return shutil.disk_usage(probe).free


def _check_room(todo: list[tuple[WeightsEntry, Path]]) -> None:
    """Refuse up front, in one line, when what is to be written does not fit where it goes (64 MiB kept free)."""
    needed: dict[int, tuple[int, Path]] = {}
    for entry, dest in todo:
        probe = dest
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        device = probe.stat().st_dev
        total, _ = needed.get(device, (0, dest.parent))
        needed[device] = (total + entry.size, dest.parent)
    for total, where in needed.values():
        free = _room(where)
        if total + (64 << 20) > free:
            raise WeightsError(
                f"restoring needs {total / 1e6:.1f} MB in {where}, which has {free / 1e6:.1f} MB free: free some "
                "space, or restore fewer (NAME ...) or into another cache (--cache-dir, HF_HOME)"
            )


def _copy_checked(
    stream: IO[bytes], dest: Path, entry: WeightsEntry, source: str, advance: Callable[[int], Any]
) -> None:
    """Copy ``stream`` to ``dest`` through a temporary file beside it, hashing on the way; rename it into place only
    when its SHA-256 is the manifest's. Nothing half-written stays behind, whatever stops it."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
    tmp = Path(tmp_name)
    try:
        digest, size = hashlib.sha256(), 0
        with os.fdopen(fd, "wb") as out:
            for chunk in iter(lambda: stream.read(CHUNK), b""):
                out.write(chunk)
                digest.update(chunk)
                size += len(chunk)
                advance(len(chunk))
        if digest.hexdigest() != entry.sha256:
            raise WeightsError(
                f"{entry.path} from {source} is damaged (SHA-256 {digest.hexdigest()[:12]}..., {size:,} bytes; the "
                f"manifest says {entry.sha256[:12]}..., {entry.size:,}): restore it from another source (--from)"
            )
        os.replace(tmp, dest)
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise WeightsError(
                f"no room left in {dest.parent} while writing {entry.path} ({entry.size / 1e6:.1f} MB); nothing "
                "half-written was left: free some space, or restore into another cache (--cache-dir, HF_HOME)"
            ) from None
        raise
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def _fetch(entry: WeightsEntry, dest: Path, sources: list[Source], advance: Callable[[int], Any]) -> str:
    """Copy the entry from the first source that has it; the source's name. One line when none has it."""
    for source in sources:
        with source.open(entry) as stream:
            if stream is not None:
                _copy_checked(stream, dest, entry, source.name, advance)
                return source.name
    reasons = "; ".join(f"{s.name}: {s.why_not(entry)}" for s in sources)
    raise WeightsError(f"no source has {entry.path} ({reasons})")


def _publish_snapshot(entry: WeightsEntry, root: Path, cache_dir: Path) -> None:
    """Make an export's blob the ``main`` revision of its repository in the Hub cache, as a download leaves it:
    ``snapshots/<revision>/model.safetensors`` and ``config.json`` (the run's export config from the tree), then
    ``refs/main``, written last. A repository whose ``main`` already gives these weights (a real download) is left
    as it is."""
    from ..models.pretrained import cached_hub_file

    repo = _repo(entry)
    current = cached_hub_file(repo, WEIGHTS_FILE, cache_dir=cache_dir)
    if current is not None and Path(current).resolve().name == entry.sha256:
        return
    repo_dir = cache_repo_dir(cache_dir, repo)
    snapshot = repo_dir / "snapshots" / _revision(entry)
    snapshot.mkdir(parents=True, exist_ok=True)
    _relative_link(snapshot / WEIGHTS_FILE, repo_dir / "blobs" / entry.sha256)
    config = root / Path(entry.path).parent / "config.json"
    if config.is_file():
        data = config.read_bytes()
        blob = repo_dir / "blobs" / _git_blob_sha1(data)
        if not blob.is_file():
            from ..results.jsonio import write_atomic

            write_atomic(blob, data)
        _relative_link(snapshot / "config.json", blob)
    (repo_dir / "refs").mkdir(exist_ok=True)
    from ..results.jsonio import write_atomic

    write_atomic(repo_dir / "refs" / "main", _revision(entry))


def _link_into_tree(entry: WeightsEntry, root: Path, cache_dir: Path, report: RestoreReport) -> None:
    """A link at the export's path in the tree to its blob (``local-dir:RUN/export`` and the run's readers work
    as before); a file already there is left alone (a tracked copy, or the user's)."""
    link = root / entry.path
    blob = (cache_repo_dir(cache_dir, _repo(entry)) / "blobs" / entry.sha256).resolve()
    if link.is_symlink() and link.resolve() == blob:
        return
    if link.exists() and not link.is_symlink():
        if not _in_place(link, entry):
            report.not_linked.append(f"{entry.path}: another file is there, left as it is")
        return
    link.parent.mkdir(parents=True, exist_ok=True)
    tmp = link.with_name(f".{link.name}.{os.getpid()}.link")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    os.symlink(blob, tmp)
    os.replace(tmp, link)
    report.linked.append(link)


def restore(
    entries: list[WeightsEntry],
    root: Path,
    sources: list[Source],
    cache_dir: Path,
    link: bool = True,
    progress: bool = True,
) -> RestoreReport:
    """Bring ``entries`` back: exports into the Hub cache ``cache_dir`` (and, with ``link``, a link at their path
    in the tree ``root``), probe maps to their path in ``root``; each copy is checked against its SHA-256 before it
    is renamed into place, and what is already in place (checked the same way) is not copied again.

    Raises:
        WeightsError: one line for a file no source has, a damaged copy, a disk too full (checked up front, and on
            a write that fails for room); nothing half-written is left behind.
    """
    from tqdm.auto import tqdm

    report = RestoreReport()
    todo = []
    for entry in entries:
        dest = _destination(entry, root, cache_dir)
        (report.present.append(entry) if _in_place(dest, entry) else todo.append((entry, dest)))
    _check_room(todo)
    total = sum(e.size for e, _ in todo)
    with tqdm(
        total=total, unit="B", unit_scale=True, desc="restoring weights", disable=not progress or not todo
    ) as bar:
        for entry, dest in todo:
            report.restored.append((entry, _fetch(entry, dest, sources, bar.update)))
    for entry in entries:
        if entry.kind == "export":
            _publish_snapshot(entry, root, cache_dir)
            if link:
                _link_into_tree(entry, root, cache_dir, report)
    return report


def entry_state(entry: WeightsEntry, root: Path, cache_dir: Path) -> str:
    """Where an entry is now, without hashing: ``in cache`` (and ``linked`` when its tree path links to it),
    ``in tree`` (a file at its path), or ``missing``."""
    tree = root / entry.path
    if entry.kind == "export":
        blob = cache_repo_dir(cache_dir, _repo(entry)) / "blobs" / entry.sha256
        if blob.is_file() and blob.stat().st_size == entry.size:
            return "in cache, linked" if tree.is_symlink() and tree.resolve() == blob.resolve() else "in cache"
    if tree.is_file() and not tree.is_symlink():
        return "in tree"
    return "missing"


# --- adding runs ---------------------------------------------------------------------------------------------------


def _head_commit(root: Path, path: str) -> str | None:
    """The last commit that changed ``path`` when the file is tracked as it is now, else None."""
    try:
        tracked = (
            subprocess.run(
                ["git", "-C", str(root), "ls-files", "--error-unmatch", "--", path], capture_output=True
            ).returncode
            == 0
        )
        dirty = subprocess.run(["git", "-C", str(root), "diff", "--quiet", "HEAD", "--", path]).returncode != 0
        if not tracked or dirty:
            return None
        out = subprocess.run(
            ["git", "-C", str(root), "log", "-1", "--format=%H", "--", path], capture_output=True, text=True
        ).stdout.strip()
        return out or None
    except OSError:
        return None


def add_runs(manifest: Manifest, runs: Iterable[Path], hub_repo: Callable[[Path], str]) -> list[WeightsEntry]:
    """Add (or refresh) the manifest entries of runs' weights (``RUN/export/model.safetensors``, ``RUN/maps.pt``):
    size, SHA-256, SHA-1, the commit that holds the file if git tracks it as it is, the Hub repository
    ``hub_repo(run)`` and the timm name of that repository where one has it. The manifest is not written here."""
    from ..models.pretrained import TRAINED_MICRO, pretrained_name, weights_sha1
    from ..models.pretrained import hub_repo as micro_repo

    timm_names = {
        micro_repo(study, condition, seed): pretrained_name(study, condition, seed)
        for study, (conditions, seeds) in TRAINED_MICRO.items()
        for condition in conditions
        for seed in range(seeds)
    }
    root = manifest.root
    added = []
    for run in runs:
        run = run.resolve()
        files = [(run / "export" / WEIGHTS_FILE, "export"), (run / "maps.pt", "maps")]
        if not files[0][0].is_file():
            raise WeightsError(f"{run}: no export/{WEIGHTS_FILE} to add (a finished run of `posgeom train`)")
        try:
            rel_run = run.relative_to(root)
        except ValueError:
            raise WeightsError(f"{run} is not inside the repository of {manifest.path}") from None
        for path, kind in files:
            if not path.is_file():
                continue
            rel = (rel_run / path.relative_to(run)).as_posix()
            repo = hub_repo(rel_run) if kind == "export" else None
            entry = WeightsEntry(
                path=rel,
                kind=kind,
                size=path.stat().st_size,
                sha256=file_sha256(path),
                sha1=weights_sha1(path),
                commit=_head_commit(root, rel),
                hub_repo=repo,
                timm_name=timm_names.get(repo or ""),
            )
            manifest.entries = [e for e in manifest.entries if e.path != rel] + [entry]
            added.append(entry)
    return added


def ensure_restored(names: Iterable[str], root: str | os.PathLike, progress: bool = False) -> RestoreReport:
    """Restore what ``names`` name from the manifest of the repository ``root`` (nothing copied where it is in
    place already): for scripts that read the committed runs' weights (``posgeom weights restore NAME ...``)."""
    manifest = Manifest.read(Path(root) / MANIFEST)
    cache = hub_cache_dir()
    return restore(
        manifest.select(names), manifest.root, default_sources(manifest.root, cache), cache, progress=progress
    )
