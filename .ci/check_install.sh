#!/usr/bin/env bash
# What a user gets. Build the sdist and the wheel from it; install the wheel alone into a fresh venv (a plain
# `pip install`, dependencies resolved as for a user) and, from a directory outside the repository, probe a timm
# ViT with the core library, none of the application's dependencies installed; then add the [app] extra to the
# same venv and, side by side, run what a new user runs first, the main job (`posgeom study` on the embedded
# demo) and the sdist's smoke tests against that install.
#
#   bash .ci/check_install.sh                   (both phases; needs `build` here: pip install build)
#   bash .ci/check_install.sh prepare WORK      (build, and the fresh venv with the wheel alone, into WORK)
#   bash .ci/check_install.sh check WORK        (then everything else, on what `prepare` left in WORK)
#
# .ci/run makes `prepare` (disk and network bound: the wheel's torch) in the background while the suite runs.
# IMAGENETTE (default: ../shared/data/imagenette beside the checkout) is the real-image data set; SKIP_DEMO=1
# leaves out the main job, FULL_DEMO=1 runs it at the README's size instead of CI's (before a release).
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
IMAGENETTE="${IMAGENETTE:-$(cd "$REPO/.." && pwd)/shared/data/imagenette}"
PHASE="${1:-all}"
if [ "$PHASE" = all ]; then
  WORK="$(mktemp -d)"
  trap 'rm -rf "$WORK"' EXIT
else
  WORK="${2:?usage: check_install.sh [prepare|check] WORK}"
  mkdir -p "$WORK"
fi
. "$REPO/.ci/torch_cpu.sh"
step() { printf '\n== %s (%ss)\n' "$1" "$SECONDS"; }

if [ "$PHASE" != check ]; then
step "build the sdist, and the wheel from it"
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
meta = zipfile.ZipFile(sys.argv[1]).read(next(n for n in wheel if n.endswith(".dist-info/METADATA"))).decode()
core = [l.split(":", 1)[1].strip() for l in meta.splitlines() if l.startswith("Requires-Dist:") and "extra ==" not in l]
app = [l for l in meta.splitlines() if l.startswith("Requires-Dist:") and "extra == \"app\"" in l]
heavy = [d for d in core if d.split(">")[0].split("<")[0].split("=")[0] in
         ("datasets", "pyarrow", "accelerate", "matplotlib", "jinja2", "markdown", "pyyaml")]
assert not heavy and len(app) >= 6, (heavy, app)
sdist = {n.split("/", 1)[1] for n in tarfile.open(sys.argv[2]).getnames() if "/" in n}
need = {"tests/conftest.py", "tests/test_package.py", "recipes/imagenette_cpu_ape.yaml", "hub_cards/model_card.md",
        "scripts/run_timm_model_tests.py", "docs/method.md", "pyproject.toml"}
missing = need - sdist
assert not missing, f"sdist lacks {sorted(missing)}"
print(f"wheel: {len(wheel)} files, {len(core)} core dependencies, {len(app)} more with [app]; sdist: {len(sdist)} files")
EOF

step "the core: a fresh venv with the wheel alone, from the sdist's wheel"
python3 -m venv "$WORK/venv"
torch_cpu "$WORK/venv/bin/pip"
"$WORK/venv/bin/pip" install -q "$WHEEL" >"$WORK/pip.log" 2>&1 || { tail -30 "$WORK/pip.log"; exit 1; }
fi
[ "$PHASE" = prepare ] && exit 0
WHEEL="$(ls "$WORK"/dist/*.whl)"
SDIST="$(ls "$WORK"/dist/*.tar.gz)"
export PATH="$WORK/venv/bin:$PATH"
step "the core: a timm ViT probed with the wheel alone"
mkdir "$WORK/user" && cd "$WORK/user"   # outside the repository: nothing of the checkout is importable
python - "$REPO" <<'EOF'
"""A timm ViT probed with the core library alone: SSDC on an ImageFolder tree and on a tensor batch, under RPI
and PE scaling, and fragility under JPEG; what needs the [app] extra says so in one line."""
import importlib.util, math, sys
from pathlib import Path

# (jinja2 and pyyaml are declared by [app] too, but torch and timm bring them to the core install anyway)
app = [m for m in ("datasets", "pyarrow", "accelerate", "matplotlib", "markdown") if importlib.util.find_spec(m)]
assert not app, f"the core install brought {app}"
import timm
import torch
from PIL import Image

import timm_posgeom
from timm_posgeom.errors import MissingDependencyError

assert sys.argv[1] not in timm_posgeom.__file__, timm_posgeom.__file__
print(timm_posgeom.__file__)
root = Path("folder")
for i in range(8):  # a two-class ImageFolder tree: left-bright and right-bright images
    folder = root / "val" / ("left" if i % 2 else "right")
    folder.mkdir(parents=True, exist_ok=True)
    img = Image.new("RGB", (64, 64), (20, 20, 20))
    img.paste((200 + i, 180, 160), (0 if i % 2 else 32, 0, 32 if i % 2 else 64, 64))
    img.save(folder / f"{i}.png")
torch.manual_seed(0)
model = timm.create_model("vit_tiny_patch16_224", img_size=64, patch_size=8, num_classes=2).eval()
split = timm_posgeom.load_split(root, "validation")
loader = timm_posgeom.eval_loader(model, split, batch_size=4)
plain = timm_posgeom.probe_ssdc(model, loader, progress=False)
rpi = timm_posgeom.probe_ssdc(model, loader, rpi=True, progress=False)
with timm_posgeom.pe_scale(model, 0.0):
    scaled = timm_posgeom.probe_ssdc(model, [(torch.randn(4, 3, 64, 64), torch.zeros(4, dtype=torch.long))],
                                     progress=False)
assert len(plain.per_layer) == len(rpi.per_layer) == len(scaled.per_layer) == 12
assert all(math.isfinite(v) for v in plain.per_layer + rpi.per_layer + scaled.per_layer)
frag = timm_posgeom.fragility(model, split, shifts=("jpeg:5",), progress=False)
assert frag.num_images == 8 and "jpeg:5" in frag.fs
try:
    plain.plot("ssdc.png")
    raise SystemExit("plotting ran without matplotlib")
except MissingDependencyError as e:
    assert "[app] extra" in str(e) and "\n" not in str(e), e
print(f"core: SSDC per layer {plain.per_layer[0]:.3f} ... {plain.per_layer[-1]:.3f}, under RPI delta "
      f"{rpi.delta:.3f}; JPEG q5 FS {frag.fs['jpeg:5']:.3f}; without datasets, accelerate or matplotlib")
EOF
posgeom --version
posgeom models "*micro*" | head -2
set +e
posgeom study --dry-run 2>"$WORK/err"
status=$?
set -e
cat "$WORK/err"
if [ "$status" != 2 ] || [ "$(wc -l <"$WORK/err")" != 1 ] || ! grep -q "needs the \[app\] extra" "$WORK/err"; then
  echo "posgeom study without the [app] extra: expected one line naming the extra and exit 2, got exit $status"
  exit 1
fi

step "[app]: the extra added to the same venv"
pip install -q "$WHEEL[app]" >"$WORK/pip.log" 2>&1 || { tail -30 "$WORK/pip.log"; exit 1; }
posgeom recipes | head -3

# Three checks that need nothing of each other, at once (one torch thread each, their logs printed in this order
# when all have ended): the first commands, the main job, the sdist's smoke tests. One after the other they took
# 135 s of this stage's 165.
commands() {
  step "posgeom study --dry-run, every preset"
  posgeom study --preset demo --dry-run --out "$WORK/user/study-demo-plan" | head -2
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
}

main_job() {
  # at CI size through the command's own flags (the same code: 5 trainings, every measure, the report), about
  # a minute; FULL_DEMO=1 runs it as the README's user does (4-6 minutes on 2 cores: a third of CI's budget)
  local small=(--max-images 160 --probe-images 32 --rpi-permutations 2 --set epochs=1)
  [ "${FULL_DEMO:-0}" = 1 ] && small=()
  step "the main job: posgeom study (the embedded demo) ${small[*]}"
  posgeom study --out "$WORK/user/study-demo" "${small[@]}"
  for f in report.md report.html results.json figures/ssdc_depth.png figures/fragility.png; do
    test -s "$WORK/user/study-demo/$f" || { echo "missing $f"; return 1; }
  done
}

smoke_tests() {
  step "the sdist's smoke tests, against the installed wheel"
  tar xzf "$SDIST" -C "$WORK"
  local src
  src="$(ls -d "$WORK"/timm_posgeom-*/)"
  rm -rf "$src/timm_posgeom"   # the tests must import the installed wheel, not the sdist's sources
  cd "$src"
  # the package as a user gets it (version, resources, registration, light import), the core and the extra, the
  # front door (README, docs, citation), cards and push, and one model (RoPE) exported, loaded offline and
  # measured (the suite exported each PE from the sources; the wheel's one check is that its export works at all)
  POSGEOM_IMAGENETTE="$IMAGENETTE" MPLBACKEND=Agg python -m pytest -q -p no:cacheprovider tests/test_package.py \
    tests/test_extras.py tests/test_front_door.py tests/test_hub.py -k "not export_to_hub_cache or rope"
}

# the smoke tests' pytest, installed before the three start from this venv
pip install -q pytest >"$WORK/pip.log" 2>&1 || { tail -30 "$WORK/pip.log"; exit 1; }
CHECKS=(commands)
[ "${SKIP_DEMO:-0}" != 1 ] && CHECKS+=(main_job)
CHECKS+=(smoke_tests)
declare -A PIDS
for check in "${CHECKS[@]}"; do
  (set -euo pipefail; export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1; "$check") >"$WORK/$check.log" 2>&1 &
  PIDS[$check]=$!
done
failed=()
for check in "${CHECKS[@]}"; do
  wait "${PIDS[$check]}" || failed+=("$check")
  cat "$WORK/$check.log"
done
[ "${#failed[@]}" = 0 ] || { echo "failed: ${failed[*]}"; exit 1; }
step "done"
