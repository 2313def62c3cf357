#!/usr/bin/env bash
# Issue 50: resolution extrapolation of the committed 8 x 8 variants (8x8-paper: no PE, APE, sincos, RoPE, RPT;
# seeds 0-3), each at 32, 64, 128 and 224 px (0.5x to 3.5x its 64-px training size), on Imagenette's validation
# images: top-1 over the first 200 images, SSDC, delta SSDC under RPI (3 permutations) and the attention measures
# over the first 48 of them. Seed 0 in every mode of its encoding; seeds 1-3 in one mode per way of carrying it
# (APE: timm's bicubic with antialias). 83 minutes here, one torch thread on 2 cores shared with other work.
# Writes runs/<run>/extrapolate.{json,csv,md} (the per-run JSON records and figures stay local: .gitignore here),
# then summary.md and summary.csv here and the figure docs/figures/extrapolation.png (summarize.py).
# Resumable: a rerun measures only the rows that are missing.
# Run from the repository root with the package installed:  bash experiments/extrapolation/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
# a low priority (nice 5), so that tests and CI on the same cores are not slowed
renice -n 5 $$ >/dev/null || true
# one torch thread unless told otherwise: on 2 cores shared with other work, two threads spun against each other
# (a 128-px forward took 107 ms an image with two, 44 ms with one, at a load average of 9)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
base=experiments/extrapolation
# Imagenette's validation split from the local parquet copy beside the checkout (IMAGENETTE=PATH for another
# copy; a user's own copy is the folder the fastai archive unpacks to, imagenette2-320)
data=${IMAGENETTE:-../shared/data/imagenette}
# the committed runs' weights live outside git: from this clone's history into the Hugging Face cache (docs/guide.md)
posgeom weights restore 8x8-paper --no-progress
declare -A modes=(
  [nope]=none
  [ape]=ape-bicubic-aa
  [rpt]=ape-bicubic-aa
  [sincos]=sincos-rebuild,sincos-interp
  [rope]=rope-native,rope-interp
)
for seed in 0 1 2 3; do
  for cond in nope ape rpt sincos rope; do
    run=${cond}_s$seed
    mode=${modes[$cond]}
    [[ $cond == ape && $seed == 0 ]] && mode=ape-bilinear,ape-bicubic,ape-bilinear-aa,ape-bicubic-aa
    echo "== $(date -u +%FT%TZ) $run"
    posgeom extrapolate "local-dir:experiments/scaling/8x8-paper/runs/$run/export" --data "$data" \
      --sizes 32,64,128,224 --modes "$mode" --max-images 200 --probe-images 48 --rpi-permutations 3 \
      --num-workers 0 --no-progress --out "$base/runs/$run"
  done
done
python "$base/summarize.py"
