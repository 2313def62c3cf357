"""``posgeom weights list | restore [NAME ...] | add RUN ...``: trained weights kept outside git.

The repository's manifest (``experiments/weights.json``) names every export and probe-map file its studies
measured; ``restore`` brings them back from the working tree, this clone's git history, the Hub or a folder of
copies, into the Hugging Face Hub cache (exports: ``pretrained=True`` and ``hf-hub:`` load them offline) and the
run folders (docs/guide.md, "Trained weights").
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

NAME_HELP = (
    "what to restore: a timm name (posgeom_vit_micro_patch8_64_ape.imagenette_8x8_paper_s0), a Hub repository, "
    "a study (8x8-paper), a run or file path, or a shell pattern; default: everything"
)


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "weights", help="list and restore the trained weights kept outside git (into the Hugging Face cache)"
    )
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    listing = verbs.add_parser("list", help="every file of the manifest and where it is now")
    listing.add_argument("names", nargs="*", metavar="NAME", help=NAME_HELP.replace("restore", "list"))
    listing.add_argument("--json", action="store_true", help="print the entries as JSON lines")
    restore = verbs.add_parser("restore", help="bring weights back, each checked against its SHA-256")
    restore.add_argument("names", nargs="*", metavar="NAME", help=NAME_HELP)
    restore.add_argument(
        "--from",
        dest="source",
        default=None,
        metavar="SOURCE",
        help="tree, git (this clone's history), hub, or a folder of copies (at their paths, or named by their "
        "SHA-256); default: the tree, then git, then the Hub",
    )
    restore.add_argument(
        "--no-link", action="store_true", help="leave the run folders alone (exports go to the Hub cache only)"
    )
    restore.add_argument("--no-progress", action="store_true", help="no progress bar")
    add = verbs.add_parser("add", help="add runs' weights (export and probe maps) to the manifest")
    add.add_argument("runs", nargs="+", type=Path, metavar="RUN", help="a run folder (RUN/export/model.safetensors)")
    add.add_argument(
        "--repo-id",
        default=None,
        help="the Hub repository of the export (one run only); default: ORG/posgeom-<study>-<run>",
    )
    for sub in (listing, restore, add):
        sub.add_argument(
            "--manifest", type=Path, default=None, help="the manifest (default: experiments/weights.json of this clone)"
        )
        sub.add_argument("--cache-dir", type=Path, default=None, help="the Hub cache (default: HF_HUB_CACHE / HF_HOME)")


def _manifest_path(given: Path | None) -> Path:
    """``--manifest``, else ``experiments/weights.json`` of the repository around the current folder."""
    from ..app.weights import MANIFEST, WeightsError

    if given is not None:
        return given
    for folder in (Path.cwd(), *Path.cwd().parents):
        if (folder / MANIFEST).is_file():
            return folder / MANIFEST
    raise WeightsError(
        f"no {MANIFEST} in this folder or above it: run from a clone of timm-posgeom, or pass --manifest"
    )


def run(args: argparse.Namespace) -> int:
    from ..app.weights import Manifest, hub_cache_dir

    manifest = Manifest.read(_manifest_path(args.manifest))
    cache_dir = hub_cache_dir(args.cache_dir)
    if args.verb == "list":
        return _list(manifest, args, cache_dir)
    if args.verb == "add":
        return _add(manifest, args)
    return _restore(manifest, args, cache_dir)


def _list(manifest, args: argparse.Namespace, cache_dir: Path) -> int:
    import json
    from dataclasses import asdict

    from ..app.weights import entry_state

    entries = manifest.select(args.names)
    states = [entry_state(e, manifest.root, cache_dir) for e in entries]
    if args.json:
        for entry, state in zip(entries, states):
            print(json.dumps(dict(asdict(entry), state=state)))
        return 0
    width = max(len(_label(e)) for e in entries)
    for entry, state in zip(entries, states):
        print(f"{_label(entry):<{width}}  {entry.kind:<6}  {entry.size / 1e6:6.1f} MB  {state}")
    here = sum(s != "missing" for s in states)
    total = sum(e.size for e in entries) / 1e6
    print(f"{len(entries)} files, {total:.1f} MB; {here} here, {len(entries) - here} missing (Hub cache: {cache_dir})")
    return 0


def _label(entry) -> str:
    return entry.timm_name or entry.path


def _restore(manifest, args: argparse.Namespace, cache_dir: Path) -> int:
    from ..app.weights import default_sources, parse_source, restore

    entries = manifest.select(args.names)
    root = manifest.root
    sources = parse_source(args.source, root, cache_dir) if args.source else default_sources(root, cache_dir)
    try:
        report = restore(entries, root, sources, cache_dir, link=not args.no_link, progress=not args.no_progress)
    except KeyboardInterrupt:
        print(
            "posgeom weights: interrupted; nothing half-written was left: run the same command again", file=sys.stderr
        )
        return 130
    by_source: dict[str, int] = {}
    for _, source in report.restored:
        by_source[source] = by_source.get(source, 0) + 1
    came = ", ".join(f"{n} from {s}" for s, n in by_source.items()) or "none copied"
    print(
        f"{len(entries)} files: {len(report.restored)} restored ({came}), {len(report.present)} already in place; "
        f"{len(report.linked)} run-folder links made; Hub cache: {cache_dir}"
    )
    for line in report.not_linked:
        print(f"not linked: {line}")
    return 0


def _add(manifest, args: argparse.Namespace) -> int:
    from ..app.weights import WeightsError, add_runs
    from ..models.pretrained import HUB_ORG

    if args.repo_id and len(args.runs) > 1:
        raise WeightsError("--repo-id names one repository: give one RUN with it")

    def repo(rel_run: Path) -> str:
        if args.repo_id:
            return args.repo_id
        study, run_name = rel_run.parent.parent.name, rel_run.name
        condition, _, seed = run_name.rpartition("_s")
        return f"{HUB_ORG}/posgeom-{study}-{condition}-s{seed}" if condition else f"{HUB_ORG}/posgeom-{run_name}"

    added = add_runs(manifest, args.runs, repo)
    path = manifest.write()
    for entry in added:
        print(f"added {entry.path} ({entry.kind}, {entry.size / 1e6:.1f} MB, {entry.hub_repo or 'not published'})")
    print(f"wrote {path}: {len(manifest.entries)} files")
    return 0
