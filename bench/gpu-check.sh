#!/usr/bin/env bash
# The checks that need an NVIDIA GPU, for a machine that has one: the GPU test tier
# (every case against float64, GPU tensors, compute-sanitizer) and the GPU benchmark.
#
#   bench/gpu-check.sh [tier|bench|all] [LOGDIR]
#
# JOBS=N runs the tier in N pytest-xdist workers (default 1); the benchmark always runs
# alone on the GPU.
# Runs from the checkout with the python3 on PATH (no install: the repository goes on
# PYTHONPATH), after checking that it has what the checks import. Logs, the device's
# clocks and the benchmark's JSON go to LOGDIR (default bench/results/gpu-logs); the
# JSON also to bench/results/gpu.json. The exit status is the first failure's.
set -uo pipefail
cd "$(dirname "$0")/.."
what="${1:-all}"
logs="${2:-bench/results/gpu-logs}"
mkdir -p "$logs"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

python3 - <<'PY' || exit 2
import importlib.util, sys
need = ["lark", "interegular", "jinja2", "numpy", "ml_dtypes", "cupy", "torch", "pytest", "hypothesis"]
missing = [m for m in need if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"gpu-check: python3 lacks {', '.join(missing)}")
PY
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu \
    --format=csv | tee "$logs/device.csv"

status=0
if [ "$what" = tier ] || [ "$what" = all ]; then
    python3 -m pytest -q -p no:cacheprovider -n "${JOBS:-1}" -m gpu -rs tests 2>&1 \
        | tee "$logs/tier.log"
    status=${PIPESTATUS[0]}
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
    python3 bench/gpu.py --out "$logs/gpu.json" 2>&1 | tee "$logs/bench.log"
    bench=${PIPESTATUS[0]}
    [ "$bench" = 0 ] && cp "$logs/gpu.json" bench/results/gpu.json
    [ "$status" = 0 ] && status=$bench
fi
exit "$status"
