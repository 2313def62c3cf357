"""Weights outside git (issue 53): the manifest, `posgeom weights list | restore | add`, the Hub cache they go to,
and `pretrained=True` / `hf-hub:` reading that cache offline.

Most tests build a small repository of their own (a run with an export and probe maps, committed, then removed
from the tree as the repository's own weights were), so they need no weights of the project. The project's own
manifest is checked against the records it sits beside, and one of its trained exports is restored and loaded by
its timm name.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import timm
import torch

from timm_posgeom.app import weights as weights_mod
from timm_posgeom.app.hub import export_for_hub
from timm_posgeom.app.records import RunEval
from timm_posgeom.app.weights import (
    MANIFEST,
    FolderSource,
    GitSource,
    Manifest,
    WeightsError,
    default_sources,
    file_sha256,
    restore,
)
from timm_posgeom.cli import main as cli_main
from timm_posgeom.models.pretrained import TRAINED_MICRO, hub_repo, pretrained_name, weights_sha1

ROOT = Path(__file__).resolve().parents[1]
NAME = "posgeom_vit_micro_patch8_64_ape.imagenette_8x8_paper_s0"  # a trained tag: its repo is the run's below
RUN = "experiments/scaling/8x8-paper/runs/ape_s0"


def git(repo: Path, *args: str) -> str:
    cmd = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.org", *args]
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    """A clone-like repository whose run's export and maps were committed, listed in its manifest, then removed
    from the tree (the history keeps them): what the project's own repository looks like."""
    root = tmp_path_factory.mktemp("repo")
    git(root, "init", "-q")
    torch.manual_seed(3)
    model = timm.create_model(NAME.split(".")[0], num_classes=10).eval()
    run = root / RUN
    export_for_hub(model, run / "export")
    (run / "maps.pt").write_bytes(os.urandom(50_000))
    (root / MANIFEST).write_text('{"schema": 1, "files": []}\n')
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "a run with its weights")
    assert cli_main(["weights", "add", str(run), "--manifest", str(root / MANIFEST)]) == 0
    git(root, "rm", "-q", f"{RUN}/export/model.safetensors", f"{RUN}/maps.pt")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "weights out of the tree")
    torch.save(model.state_dict(), root.parent / "state.pt")  # the original weights, to compare outputs
    return root


def _manifest(repo: Path) -> Manifest:
    return Manifest.read(repo / MANIFEST)


def test_add_records_each_file_with_its_hashes_commit_and_names(repo):
    entries = {e.kind: e for e in _manifest(repo).entries}
    export = entries["export"]
    assert export.path == f"{RUN}/export/model.safetensors" and export.hub_repo == hub_repo("8x8-paper", "ape", 0)
    assert export.timm_name == NAME and entries["maps"].timm_name is None and entries["maps"].hub_repo is None
    git(repo, "cat-file", "-e", f"{export.commit}:{export.path}")  # the commit recorded holds the file
    assert export.commit == git(repo, "rev-parse", "HEAD~1")
    assert not (repo / export.path).exists()  # and it left the tree


def test_restore_from_git_history_into_the_hub_cache_and_the_run(repo, tmp_path, capsys):
    cache = tmp_path / "hub"
    assert cli_main(["weights", "restore", "--cache-dir", str(cache), "--manifest", str(repo / MANIFEST)]) == 0
    assert "2 restored (2 from git history)" in capsys.readouterr().out
    entries = {e.kind: e for e in _manifest(repo).entries}
    export = entries["export"]
    repo_dir = cache / f"models--{export.hub_repo.replace('/', '--')}"
    revision = (repo_dir / "refs" / "main").read_text()
    snapshot = repo_dir / "snapshots" / revision
    assert file_sha256(snapshot / "model.safetensors") == export.sha256
    assert (snapshot / "model.safetensors").resolve() == (repo_dir / "blobs" / export.sha256).resolve()
    assert json.loads((snapshot / "config.json").read_text())["architecture"] == NAME.split(".")[0]
    assert (repo / export.path).is_symlink() and file_sha256(repo / export.path) == export.sha256
    assert file_sha256(repo / entries["maps"].path) == entries["maps"].sha256
    assert weights_sha1(repo / export.path) == export.sha1
    assert "ignored" not in git(repo, "status", "--short")  # nothing new for git: links and maps are ignored...
    # ...by the project's rules, which this repository lacks; a second restore copies nothing
    assert cli_main(["weights", "restore", "--cache-dir", str(cache), "--manifest", str(repo / MANIFEST)]) == 0
    assert "0 restored (none copied), 2 already in place" in capsys.readouterr().out


LOGITS = """
import sys, timm, torch, timm_posgeom
import huggingface_hub, huggingface_hub.file_download as fd
def asked(*a, **k): raise AssertionError("the network was asked")
fd.hf_hub_download = huggingface_hub.hf_hub_download = asked  # a cached copy is read without asking the Hub
for i, name in enumerate(sys.argv[2:]):
    m = timm_posgeom.create_model(name, pretrained=True).eval()
    torch.manual_seed(0)
    torch.save(m(torch.randn(2, 3, 64, 64)), f"{sys.argv[1]}/{i}.pt")
"""


@pytest.mark.slow
def test_restored_weights_load_offline_with_no_setting(repo, tmp_path):
    """``pretrained=True`` on the trained tag and ``hf-hub:`` read the restored copy with no setting but the
    cache's place (``HF_HUB_CACHE``, as a user's ``HF_HOME``) and without the network: the original model's
    logits, bit for bit."""
    cache = tmp_path / "hub"
    restore(_manifest(repo).entries, repo, [GitSource(repo)], cache, progress=False)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_HUB_OFFLINE")}
    env["HF_HUB_CACHE"] = str(cache)
    names = [NAME, f"hf-hub:{hub_repo('8x8-paper', 'ape', 0)}"]
    done = subprocess.run(
        [sys.executable, "-c", LOGITS, str(tmp_path), *names], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    model = timm.create_model(NAME.split(".")[0], num_classes=10).eval()
    model.load_state_dict(torch.load(repo.parent / "state.pt"))
    torch.manual_seed(0)
    expected = model(torch.randn(2, 3, 64, 64))
    for i in range(len(names)):
        assert torch.equal(torch.load(tmp_path / f"{i}.pt"), expected), names[i]


def test_pretrained_without_the_weights_says_how_to_get_them(tmp_path, monkeypatch):
    from huggingface_hub import constants

    from timm_posgeom.models.pretrained import WeightsNotFoundError

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty"))
    with pytest.raises(WeightsNotFoundError) as e:
        timm.create_model(NAME, pretrained=True)
    text = str(e.value)
    assert f"posgeom weights restore {NAME}" in text and "not in the Hugging Face Hub cache" in text
    assert "\n" not in text


def test_a_folder_of_copies_by_path_or_by_sha256(repo, tmp_path):
    manifest = _manifest(repo)
    export = next(e for e in manifest.entries if e.kind == "export")
    blob = git(repo, "rev-parse", f"{export.commit}:{export.path}")
    folder = tmp_path / "copies"
    folder.mkdir()
    data = subprocess.run(["git", "-C", str(repo), "cat-file", "blob", blob], capture_output=True, check=True).stdout
    (folder / export.sha256).write_bytes(data)  # named by its SHA-256
    report = restore([export], repo, [FolderSource(folder)], tmp_path / "hub", link=False, progress=False)
    assert [source for _, source in report.restored] == [str(folder)]
    with pytest.raises(WeightsError, match="no such folder"):
        FolderSource(tmp_path / "nowhere")


def _no_leftovers(*folders: Path) -> list[Path]:
    return [p for f in folders if f.exists() for p in f.rglob("*") if p.is_file() or p.is_symlink()]


def test_a_damaged_copy_is_refused_and_leaves_nothing(repo, tmp_path):
    export = next(e for e in _manifest(repo).entries if e.kind == "export")
    folder = tmp_path / "copies"
    (folder / export.path).parent.mkdir(parents=True)
    (folder / export.path).write_bytes(b"\0" * export.size)  # the right size, other bytes
    with pytest.raises(WeightsError, match=r"model.safetensors from .* is damaged \(SHA-256"):
        restore([export], repo, [FolderSource(folder)], tmp_path / "hub", progress=False)
    assert _no_leftovers(tmp_path / "hub") == []


def test_no_source_names_each_reason(repo, tmp_path):
    manifest = _manifest(repo)
    from dataclasses import replace

    gone = replace(manifest.entries[0], commit="f" * 40)
    with pytest.raises(WeightsError) as e:
        restore([gone], repo, default_sources(repo, tmp_path / "hub")[:2], tmp_path / "hub", progress=False)
    text = str(e.value)
    assert text.startswith(f"no source has {gone.path}") and "lacks commit ffffffffffff" in text
    assert "\n" not in text


def test_a_full_disk_midway_leaves_nothing_half_written(repo, tmp_path, monkeypatch):
    export = next(e for e in _manifest(repo).entries if e.kind == "export")
    real_fdopen = os.fdopen

    class Full:
        def __init__(self, f):
            self.f, self.written = f, 0

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, chunk):
            self.written += len(chunk)
            if self.written > export.size // 2:
                raise OSError(errno.ENOSPC, "No space left on device")
            return self.f.write(chunk)

    monkeypatch.setattr(weights_mod.os, "fdopen", lambda fd, mode: Full(real_fdopen(fd, mode)))
    with pytest.raises(WeightsError, match="no room left in .* nothing half-written was left"):
        restore([export], repo, [GitSource(repo)], tmp_path / "hub", progress=False)
    assert _no_leftovers(tmp_path / "hub") == []


def test_too_little_room_is_refused_before_any_write(repo, tmp_path, monkeypatch):
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(weights_mod.shutil, "disk_usage", lambda path: usage(10**9, 10**9 - 10**6, 10**6))
    with pytest.raises(WeightsError, match=r"restoring needs \d+\.\d MB in .* which has 1\.0 MB free"):
        restore(_manifest(repo).entries, repo, [GitSource(repo)], tmp_path / "hub", progress=False)
    assert not (tmp_path / "hub").exists()


def test_an_interruption_leaves_nothing_and_a_rerun_finishes(repo, tmp_path):
    export = next(e for e in _manifest(repo).entries if e.kind == "export")

    class Stops(GitSource):
        def open(self, entry):
            opened = super().open(entry)

            class Reader:
                def __enter__(self_inner):
                    stream = opened.__enter__()
                    self_inner.stream, self_inner.read_bytes = stream, 0
                    return self_inner

                def __exit__(self_inner, *exc):
                    return opened.__exit__(*exc)

                def read(self_inner, n):
                    self_inner.read_bytes += n
                    if self_inner.read_bytes > n:  # the second chunk: Ctrl-C
                        raise KeyboardInterrupt
                    return self_inner.stream.read(n)

            return Reader()

    with pytest.raises(KeyboardInterrupt):
        restore([export], repo, [Stops(repo)], tmp_path / "hub", progress=False)
    assert _no_leftovers(tmp_path / "hub") == []
    report = restore([export], repo, [GitSource(repo)], tmp_path / "hub", progress=False)
    assert len(report.restored) == 1


def test_names_select_entries_and_an_unknown_name_is_one_line(repo, capsys):
    manifest = _manifest(repo)
    assert len(manifest.select([NAME])) == 1 and len(manifest.select(["8x8-paper"])) == 2
    assert len(manifest.select([RUN + "/"])) == 2 and len(manifest.select(["posgeom-8x8-paper-ape-s0"])) == 1
    assert len(manifest.select(["*_ape.*"])) == 1
    with pytest.raises(SystemExit) as e:
        cli_main(["weights", "restore", "8x8-papr", "--manifest", str(repo / MANIFEST)])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no weights named '8x8-papr'" in err and "did you mean" in err


def test_list_says_where_each_file_is(repo, tmp_path, capsys):
    args = ["weights", "list", "--manifest", str(repo / MANIFEST), "--cache-dir", str(tmp_path / "hub")]
    assert cli_main(args) == 0
    assert "2 files" in capsys.readouterr().out.splitlines()[-1]
    assert cli_main([*args, "--json"]) == 0
    states = [json.loads(line)["state"] for line in capsys.readouterr().out.splitlines()]
    assert len(states) == 2 and set(states) <= {"missing", "in tree"}


def test_a_damaged_manifest_is_one_line(tmp_path, capsys):
    bad = tmp_path / "weights.json"
    bad.write_text("{not json")
    with pytest.raises(SystemExit) as e:
        cli_main(["weights", "list", "--manifest", str(bad)])
    assert e.value.code == 2 and "not a weights manifest" in capsys.readouterr().err


# --- the project's own manifest ----------------------------------------------------------------------------------


def _project_manifest() -> Manifest:
    return Manifest.read(ROOT / MANIFEST)


def test_the_project_manifest_names_each_run_by_its_records():
    """Every export's SHA-1 is the one its run's eval.json says was measured; every trained timm name has its
    export, under the Hub repository its pretrained config downloads; none of its files is tracked."""
    entries = _project_manifest().entries
    exports = [e for e in entries if e.kind == "export"]
    for entry in exports:
        run = ROOT / Path(entry.path).parent.parent
        assert RunEval.read(run / "eval.json").weights_sha1 == entry.sha1, entry.path
        assert (run / "export" / "config.json").is_file()
    named = {e.timm_name: e.hub_repo for e in exports if e.timm_name}
    expected = {
        pretrained_name(s, c, k): hub_repo(s, c, k)
        for s, (conditions, seeds) in TRAINED_MICRO.items()
        for c in conditions
        for k in range(seeds)
    }
    assert named == expected and all(timm.models.get_pretrained_cfg(n).hf_hub_id == r for n, r in named.items())
    tracked = subprocess.run(["git", "-C", str(ROOT), "ls-files"], capture_output=True, text=True).stdout.split()
    assert {e.path for e in entries}.isdisjoint(tracked)  # all of them left the tree (no other weights file is
    # tracked either: tests/test_large_files.py)


def test_a_trained_export_of_the_project_restores_and_loads_by_name(tmp_path):
    """One of the project's trained exports, from the first source that has it (a copy already restored into the
    tree, else this clone's history), restored into a fresh cache, loads by its timm name to the weights its records
    name."""
    manifest = _project_manifest()
    cache = tmp_path / "hub"
    sources = default_sources(manifest.root, cache)[:2]  # the tree, this clone's git history: never the network
    candidates = [e for e in manifest.entries if e.timm_name]
    usable = [
        e
        for e in candidates
        if (ROOT / e.path).is_file() and not (ROOT / e.path).is_symlink() or sources[1].has_commit(e.commit or "")
    ]
    assert usable, "neither the tree nor this clone's history holds the trained exports (a shallow clone?)"
    entry = usable[0]
    restore([entry], manifest.root, sources, cache, link=False, progress=False)
    from timm_posgeom.models.pretrained import cached_hub_file

    path = cached_hub_file(entry.hub_repo, cache_dir=cache)
    assert path is not None and weights_sha1(path) == entry.sha1
    model = timm.create_model(entry.timm_name, pretrained=True, cache_dir=cache)
    export_for_hub(model, tmp_path / "again")
    assert weights_sha1(tmp_path / "again" / "model.safetensors") == entry.sha1
