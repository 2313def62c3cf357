#!/usr/bin/env bash
# The user's install: build the sdist and the wheel, install the wheel into a fresh venv (a plain
# `pip install`, dependencies resolved as for a user) and, from a directory outside the repository,
# run what a new user runs first. Then run the sdist's own test-suite against that install.
#
#   bash .ci/check_install.sh            (needs `build` in the current environment: pip install build)
#
# IMAGENETTE (default: ../shared/data/imagenette beside the checkout) is the real-image data set.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
IMAGENETTE="${IMAGENETTE:-$(cd "$REPO/.." && pwd)/shared/data/imagenette}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
step() { printf '\n== %s (%ss)\n' "$1" "$SECONDS"; }

step "build sdist and wheel"
python -m build --outdir "$WORK/dist" "$REPO" >"$WORK/build.log" 2>&1 || { tail -30 "$WORK/build.log"; exit 1; }
WHEEL="$(ls "$WORK"/dist/*.whl)"
SDIST="$(ls "$WORK"/dist/*.tar.gz)"
python - "$WHEEL" "$SDIST" <<'EOF'
import sys, tarfile, zipfile
wheel = set(zipfile.ZipFile(sys.argv[1]).namelist())
need = {"timm_posgeom/hub_cards/model_card.md", "timm_posgeom/recipes/imagenette_cpu_ape.yaml",
        "timm_posgeom/recipes/in100_paper_rpt.yaml", "timm_posgeom/recipes/accelerate/1gpu.yaml",
        "timm_posgeom/recipes/accelerate/2node_8gpu.yaml"}
missing = need - wheel
assert not missing, f"wheel lacks {sorted(missing)}"
assert not any(n.startswith(("tests/", "recipes/", "hub_cards/")) for n in wheel), "top-level data leaked into the wheel"
sdist = {n.split("/", 1)[1] for n in tarfile.open(sys.argv[2]).getnames() if "/" in n}
need = {"tests/conftest.py", "tests/test_package.py", "recipes/imagenette_cpu_ape.yaml", "hub_cards/model_card.md",
        "scripts/run_timm_model_tests.py", "docs/method.md", "pyproject.toml"}
missing = need - sdist
assert not missing, f"sdist lacks {sorted(missing)}"
print(f"wheel: {len(wheel)} files; sdist: {len(sdist)} files; recipes, accelerate configs and card template inside")
EOF

step "fresh venv + pip install of the wheel"
python3 -m venv "$WORK/venv"
"$WORK/venv/bin/pip" install -q "$WHEEL" >"$WORK/pip.log" 2>&1 || { tail -30 "$WORK/pip.log"; exit 1; }
export PATH="$WORK/venv/bin:$PATH"
mkdir "$WORK/user" && cd "$WORK/user"   # outside the repository: nothing of the checkout is importable
python -c "import timm_posgeom, sys; assert '$REPO' not in timm_posgeom.__file__, timm_posgeom.__file__; print(timm_posgeom.__file__)"

step "posgeom --version, recipes"
posgeom --version
posgeom recipes | head -3

step "posgeom study --dry-run, every preset"
posgeom study --preset demo --dry-run --out "$WORK/user/study-demo" | head -2
posgeom study --preset imagenette-cpu --data "$IMAGENETTE" --dry-run --out "$WORK/user/study-imagenette" | head -2
posgeom study --preset imagenette-cpu-14 --data "$IMAGENETTE" --dry-run --out "$WORK/user/study-imagenette-14" | head -2
posgeom study --preset in100 --dry-run --out "$WORK/user/study-in100" | head -2

step "3-step posgeom train with the shipped imagenette_cpu_ape recipe"
posgeom train --recipe imagenette_cpu_ape --out "$WORK/user/run" --data "$IMAGENETTE" --no-progress \
  --set max_steps=3 --set train_subset=384 --set val_subset=64 --set disk_cache=false --set rpi_ssdc_images=16
test -f "$WORK/user/run/export/model.safetensors"

step "posgeom card and push --dry-run on that run"
posgeom card "$WORK/user/run" --repo-id ORG/NAME --out "$WORK/user/card.md"
grep -q "posgeom_vit_micro_patch8_64_ape" "$WORK/user/card.md"
posgeom push "$WORK/user/run" --repo-id ORG/NAME --dry-run

if [ "${CHECK_DEMO:-0}" = 1 ]; then
  step "the main job: posgeom study (the embedded demo)"
  posgeom study --out "$WORK/user/study-demo"
  for f in report.md report.html results.json figures/ssdc_depth.png figures/fragility.png; do
    test -s "$WORK/user/study-demo/$f" || { echo "missing $f"; exit 1; }
  done
fi

step "the sdist's tests, against the installed wheel"
tar xzf "$SDIST" -C "$WORK"
SRC="$(ls -d "$WORK"/timm_posgeom-*/)"
rm -rf "$SRC/timm_posgeom"   # the tests must import the installed wheel, not the sdist's sources
"$WORK/venv/bin/pip" install -q pytest >"$WORK/pip.log" 2>&1 || { tail -30 "$WORK/pip.log"; exit 1; }
cd "$SRC"
POSGEOM_IMAGENETTE="$IMAGENETTE" MPLBACKEND=Agg "$WORK/venv/bin/python" -m pytest -q -p no:cacheprovider tests
step "done"
