"""Run timm's own model test-suite on the models this plugin registers.

Fetches ``tests/test_models.py`` from the source distribution of the *installed* timm version
(``pip download --no-binary :all: timm==<version>``), makes three documented edits, and runs it with
pytest on our models only:

1. ``import timm_posgeom`` right after ``import timm`` (the plugin registers its models on import);
2. our module ``vision_transformer_pe`` is added to ``FEAT_INTER_FILTERS``, the list of timm model
   modules that support ``forward_intermediates`` / ``features_only``, so those tests cover us too;
3. ``posgeom_vit_*`` is added to ``NON_STD_FILTERS``, the name patterns of models with token outputs
   (timm's own ``vit_*``, ``deit*``, ``eva_*``...): they take the suite's ViT variant of the config and
   feature-shape test, as our models did under their former ``vit_*`` names.

Nothing is excluded by hand: every test of the suite whose parametrisation includes our models runs
(for the selected sizes). Tests that are parametrised only over other timm models never select ours.

Our pretrained names (``<model>.<tag>``, the trained micro models) download their weights from the Hub in
``test_model_load_pretrained``. Until they are published, the suite runs offline (``HF_HUB_OFFLINE=1``) on a
Hub cache into which ``posgeom weights restore`` has put the repository's trained exports (from the working tree
or this clone's git history: ``timm_posgeom.app.weights``), each under its configuration's ``hf_hub_id``; a name
that no source has is deselected from that test (and the count printed).

Usage::

    python scripts/run_timm_model_tests.py                       # what CI runs (DEFAULT_MODELS)
    python scripts/run_timm_model_tests.py --models 'posgeom_vit_*_patch16_224_*' -- -x
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".timm_tests"
# Every PE at micro size (64 px, an 8 x 8 grid), and at tiny size (224 px, 14 x 14) the two whose position code is
# computed from the grid (sincos tables, RoPE frequencies). The tiny nope, ape and ape_rpt are the micro ones' code
# at another width, depth and table size: about 100 s of the 360 s of test time the suite took for 10 models, that
# checked nothing the micro ones do not. `--models 'posgeom_vit_tiny_patch16_224_*'` runs them.
DEFAULT_MODELS = (
    "posgeom_vit_micro_patch8_64_* or posgeom_vit_tiny_patch16_224_sincos or posgeom_vit_tiny_patch16_224_rope"
)


def fetch_test_models(version: str) -> Path:
    """Extract test_models.py of timm ``version`` into the cache folder and return its path."""
    out_dir = CACHE / f"timm-{version}"
    target = out_dir / "test_models.py"  # patched anew each run (the sdist is kept): never a stale edit
    out_dir.mkdir(parents=True, exist_ok=True)
    sdist = next(out_dir.glob("timm-*.tar.gz"), None)
    if sdist is None:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "--no-binary",
                ":all:",
                f"timm=={version}",
                "-d",
                str(out_dir),
            ],
            check=True,
        )
        sdist = next(out_dir.glob("timm-*.tar.gz"))
    with tarfile.open(sdist) as tar:
        member = tar.getmember(f"timm-{version}/tests/test_models.py")
        source = tar.extractfile(member).read().decode()
    target.write_text(patch_source(source))
    return target


def patch_source(source: str) -> str:
    """Apply the three documented edits; fail loudly if timm's file no longer has the anchors."""
    anchor_import = "\nimport timm\n"
    anchor_filters = "FEAT_INTER_FILTERS = [\n"
    anchor_non_std = "NON_STD_FILTERS = [\n"
    if any(anchor not in source for anchor in (anchor_import, anchor_filters, anchor_non_std)):
        raise RuntimeError("timm's test_models.py changed layout: update scripts/run_timm_model_tests.py")
    source = source.replace(
        anchor_import, "\nimport timm\nimport timm_posgeom  # noqa: F401  (registers our models)\n", 1
    )
    source = source.replace(anchor_non_std, anchor_non_std + "    'posgeom_vit_*',\n", 1)
    return source.replace(anchor_filters, anchor_filters + "    'vision_transformer_pe',\n", 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--models",
        default=DEFAULT_MODELS,
        help="which of our models, as `or`-joined name patterns (default: every micro PE, and the tiny ones whose "
        "position code depends on the grid)",
    )
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = parser.parse_args(argv)

    import timm

    import timm_posgeom

    ours = timm_posgeom.list_models()
    patterns = [p.strip() for p in args.models.split(" or ")]
    import fnmatch

    selected = sorted({m for m in ours for p in patterns if fnmatch.fnmatch(m, p)})
    if not selected:
        parser.error(f"no model of the plugin matches {args.models!r}")
    test_file = fetch_test_models(timm.__version__)
    # pytest -k on the parametrised id: "[<model_name>-..." or "[...-<model_name>]"
    keyword = " or ".join(selected)
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        str(test_file),
        "-q",
        "-p",
        "no:cacheprovider",
        "-W",
        "ignore::pytest.PytestUnknownMarkWarning",
        "-k",
        keyword,
        "--rootdir",
        str(test_file.parent),
        *args.pytest_args,
    ]
    print(f"timm {timm.__version__}: running its test_models.py on {len(selected)} models", flush=True)
    with tempfile.TemporaryDirectory() as cache:
        # the pretrained names that -k selects: it matches substrings, so `..._ape` selects `..._ape_rpt.<tag>` too
        named = [m for m in timm.list_pretrained() if m.split(".")[0] in ours and any(s in m for s in selected)]
        absent = hub_cache_of_exports(Path(cache), named)
        if absent:
            print(f"{len(absent)} pretrained names without a committed export: not download-tested", flush=True)
            cmd[cmd.index("-k") + 1] = f"({keyword}) and not (test_model_load_pretrained and ({' or '.join(absent)}))"
        env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_CACHE=cache)
        return subprocess.call(cmd, cwd=test_file.parent, env=env)


def hub_cache_of_exports(root: Path, names: list[str]) -> list[str]:
    """A Hugging Face Hub cache under ``root`` holding the trained export of each of ``names`` (``<model>.<tag>``),
    restored from the repository's manifest (``posgeom weights restore``: the working tree, then this clone's git
    history; never the network) as its ``hf_hub_id``'s ``model.safetensors``. Returns the names no source has."""
    from timm_posgeom.app.weights import MANIFEST, Manifest, WeightsError, default_sources, restore

    manifest = Manifest.read(ROOT / MANIFEST)
    by_name = {e.timm_name: e for e in manifest.entries if e.timm_name}
    sources = default_sources(manifest.root, root)[:2]
    absent = [name for name in names if name not in by_name]
    for name in names:
        if name in by_name:
            try:
                restore([by_name[name]], manifest.root, sources, root, link=False, progress=False)
            except WeightsError as e:
                print(f"{name}: {e}", flush=True)
                absent.append(name)
    return absent


if __name__ == "__main__":
    sys.exit(main())
