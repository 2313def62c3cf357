#!/usr/bin/env bash
# The declared minimum versions are true: install every floor of pyproject.toml together
# (.ci/constraints-min.txt) into a fresh venv and run the tests on it (all but the end-to-end study,
# which test_study.py runs in the main venv and which exercises no other dependency code).
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
VENV="$(mktemp -d)/venv-min"
trap 'rm -rf "$(dirname "$VENV")"' EXIT   # several GB (torch with its CUDA libraries): gone before the next stage
cd "$REPO"
python3 -m venv "$VENV"
PIP_NO_CACHE_DIR=1 "$VENV/bin/pip" install -q -c .ci/constraints-min.txt -e ".[dev]" >"$VENV.log" 2>&1 || { tail -30 "$VENV.log"; exit 1; }
"$VENV/bin/python" - <<'PY'
import importlib.metadata as md
pins = dict(line.split("==") for line in open(".ci/constraints-min.txt") if "==" in line and not line.startswith("#"))
got = {name: md.version(name) for name in pins}
wrong = {n: (pins[n].strip(), v) for n, v in got.items() if v != pins[n].strip()}
assert not wrong, f"not the floors: {wrong}"
print("floors installed:", ", ".join(f"{n} {v}" for n, v in got.items()))
PY
MPLBACKEND=Agg "$VENV/bin/python" -m pytest -q -p no:cacheprovider tests --ignore=tests/test_study.py
