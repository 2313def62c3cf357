#!/usr/bin/env bash
# The declared minimum versions are true: install every floor of pyproject.toml together
# (.ci/constraints-min.txt) into a fresh venv and run the core subset on it: the library's numerics (SSDC,
# probes, intervals, interventions, shifts, fragility, attention and CKA measures), the model suite (our models,
# the paper's init and layout, timm's and accelerate's internals we override, Hub export and loading), the data
# loaders (datasets' floor) and the figures (matplotlib's), each without its tests marked slow; and the exact
# kill-and-resume of a training run (the reason for accelerate's floor). The rest (commands, studies, the zoo, the
# fault suites, the docs' examples, the support matrix) runs once, on the newest versions (.ci/run).
#
#   bash .ci/check_min_versions.sh                  (both phases, in a venv of its own, removed at the end)
#   bash .ci/check_min_versions.sh install VENV     (the floors into a fresh VENV: network and disk bound)
#   bash .ci/check_min_versions.sh test VENV        (the subset on VENV; .ci/run makes `install` in the background)
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
PHASE="${1:-all}"
if [ "$PHASE" = all ]; then
  VENV="$(mktemp -d)/venv-min"
  trap 'rm -rf "$(dirname "$VENV")"' EXIT   # several GB (torch with its libraries): gone before the next stage
else
  VENV="${2:?usage: check_min_versions.sh [install|test] VENV}"
fi
cd "$REPO"
if [ "$PHASE" != test ]; then
  . .ci/torch_cpu.sh
  python3 -m venv "$VENV"
  torch_cpu "$VENV/bin/pip" -c .ci/constraints-min.txt
  "$VENV/bin/pip" install -q -c .ci/constraints-min.txt -e ".[dev]" >"$VENV.log" 2>&1 || { tail -30 "$VENV.log"; exit 1; }
  "$VENV/bin/python" - <<'PY'
import importlib.metadata as md
lines = (line.split("#")[0].strip() for line in open(".ci/constraints-min.txt"))
pins = dict(line.split("==") for line in lines if "==" in line)
got = {name: md.version(name) for name in pins}
wrong = {n: (pins[n].strip(), v) for n, v in got.items() if v.split("+")[0] != pins[n].strip()}
assert not wrong, f"not the floors: {wrong}"
print("floors installed:", ", ".join(f"{n} {v}" for n, v in got.items()))
PY
  echo "== floors installed (${SECONDS}s)"
fi
[ "$PHASE" = install ] && exit 0
export PYTEST_ADDOPTS="-n 2 --dist loadgroup -p no:cacheprovider"
NUMERICS=(test_ssdc test_probe test_intervals test_rpi_protocol test_interventions test_pe_scale_families test_shifts
  test_robustness test_attention test_position_cka test_output_intervals test_stages test_measure_settings)
MODELS=(test_models test_paper_init test_paper_parity test_internals test_hub)
DATA_AND_FIGURES=(test_data test_labels test_heldout test_figures)
# the kill-and-resume beside the subset (a third process on the 2 cores: it waits on its training subprocess a
# good part of its 27 s)
LOG="$(mktemp)"
PYTEST_ADDOPTS="-p no:cacheprovider" OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 MPLBACKEND=Agg "$VENV/bin/python" -m pytest \
  -q tests/test_train.py::test_kill_and_resume_is_exact >"$LOG" 2>&1 &
RESUME_PID=$!
subset=0
MPLBACKEND=Agg "$VENV/bin/python" -m pytest -q -m "not slow" \
  $(printf 'tests/%s.py ' "${NUMERICS[@]}" "${MODELS[@]}" "${DATA_AND_FIGURES[@]}") || subset=$?
resume=0
wait "$RESUME_PID" || resume=$?   # waited for either way: its log printed, nothing left running on the venv
cat "$LOG"
rm -f "$LOG"
[ "$subset" = 0 ] && [ "$resume" = 0 ] || { echo "the floors failed: subset exit $subset, kill-and-resume exit $resume"; exit 1; }
