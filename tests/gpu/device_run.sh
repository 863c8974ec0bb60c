#!/usr/bin/env bash
# One call on the GPU machine (the device tool): install unimem (not editable, so the
# import benchmark measures a real install), run the benchmarks, then the GPU suite.
# Everything it writes lands in $OUT; copy it into evidence/ and benchmarks/results/.
set -uo pipefail
OUT=${OUT:-/tmp/unimem-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/machine.txt"
python3 -m pip list 2>/dev/null | grep -iE '^(torch|jax|jaxlib|jax-cuda13|nvidia-ml-py|pytest) ' | tee -a "$OUT/machine.txt"
python3 -m pip install -q --no-deps --no-build-isolation . 2>&1 | tail -3
(cd /tmp && python3 -c "import unimem; print('unimem from', unimem.__file__)") 2>&1 | tee -a "$OUT/machine.txt"
cd benchmarks || exit 1
timeout 120 python3 run_all.py --machine "nvidia-h200 (device tool)" --out "$OUT/bench.json" 2>&1 | tee "$OUT/bench.log"
cd .. || exit 1
timeout "${SUITE_TIMEOUT:-420}" python3 tests/gpu/run_suite.py --out "$OUT/gpu.json" -- "$@" 2>&1 | tee "$OUT/suite.log"
if [ -n "${WITH_SHARING:-}" ]; then  # the lead's benchmarks/bench_sharing.py, from a neutral cwd
  ROOT=$PWD
  (cd /tmp && timeout 200 python3 "$ROOT/benchmarks/bench_sharing.py" --out "$OUT/sharing") > "$OUT/sharing.log" 2>&1
  echo "bench_sharing exit $?"
fi
echo "device_run: done"
