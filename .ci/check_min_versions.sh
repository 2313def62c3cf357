#!/usr/bin/env bash
# The declared minimum versions are true: install every floor of pyproject.toml together
# (.ci/constraints-min.txt) into a fresh venv and run the core subset on it: every test not marked slow (the
# library's numerics, the model suite, data, internals, figures, reports: each floor's own code), and the exact
# kill-and-resume of a training run (the reason for accelerate's floor). The slow rest (studies, the zoo, launched
# processes, the README's example) runs once, on the newest versions (.ci/run).
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
VENV="$(mktemp -d)/venv-min"
trap 'rm -rf "$(dirname "$VENV")"' EXIT   # several GB (torch with its libraries): gone before the next stage
cd "$REPO"
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
export PYTEST_ADDOPTS="-n 2 --dist loadgroup -p no:cacheprovider"
MPLBACKEND=Agg "$VENV/bin/python" -m pytest -q -m "not slow" tests
MPLBACKEND=Agg "$VENV/bin/python" -m pytest -q tests/test_train.py::test_kill_and_resume_is_exact
