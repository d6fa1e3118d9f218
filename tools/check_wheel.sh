#!/usr/bin/env bash
# Build autopar's wheel, install it with --no-deps into a fresh venv that sees the current environment's packages
# (a .pth file; autopar itself only from the wheel), and run `autopar validate` and `autopar zoo` from an empty folder
# without PYTHONPATH: the zoo and the validation data must come from the wheel.
# Usage: tools/check_wheel.sh [python-with-hatchling]   (default: python)
set -euo pipefail
PY=${1:-python}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
"$PY" -m pip wheel --no-deps --no-build-isolation -q -w "$WORK/dist" "$ROOT"
WHEEL=$(ls "$WORK"/dist/autopar-*.whl)
unzip -l "$WHEEL" | grep -q "autopar/_zoo/data/published_runs.csv"
unzip -l "$WHEEL" | grep -q "autopar/_zoo/data/error_bars.yaml"
unzip -l "$WHEEL" | grep -q "autopar/_zoo/data/error_bars_runs.csv"
unzip -l "$WHEEL" | grep -q "autopar/_zoo/data/published_memory.csv"
unzip -l "$WHEEL" | grep -q "autopar/_zoo/stacks/torchtitan.yaml"
python3 -m venv "$WORK/venv"
SITE=$("$WORK/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
DEPS=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$DEPS" > "$SITE/deps.pth"
"$WORK/venv/bin/python" -m pip install -q --no-deps "$WHEEL"
mkdir "$WORK/empty" && cd "$WORK/empty"
env -u PYTHONPATH "$WORK/venv/bin/autopar" --version
env -u PYTHONPATH "$WORK/venv/bin/python" -c 'import autopar, sys; assert "site-packages" in autopar.__file__, autopar.__file__'
env -u PYTHONPATH "$WORK/venv/bin/autopar" validate --json > validate.json
env -u PYTHONPATH "$WORK/venv/bin/python" -c 'import json; d = json.load(open("validate.json")); print("validate from the wheel:", len(d["rows"]), "rows, mean abs error", round(100 * d["mape"], 2), "%")'
if env -u PYTHONPATH "$WORK/venv/bin/autopar" validate --fit --write 2> err.txt; then echo "--write without --out was accepted"; exit 1; fi
grep -q -- "--out" err.txt
echo "wheel check passed: $(basename "$WHEEL")"
