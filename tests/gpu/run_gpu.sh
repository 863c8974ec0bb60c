#!/usr/bin/env bash
# The GPU work, one part per call on the GPU machine (each part fits in 10 minutes):
#
#   suite                 the whole GPU suite (SUITE_LIMIT seconds, 540 by default) -> gpu.json
#   suite-1, suite-2      one half of the suite each (one call cannot hold both)
#                                                     -> gpu-part1.json, gpu-part2.json; then
#                         python tests/gpu/run_suite.py --merge ... joins them into gpu.json
#   latency               import cost and stats() latency, alone     -> gpu-h200.json
#   search-tests          the two find_batch_size GPU tests          -> search-tests.json
#   search-torch          find_batch_size against Lightning's and accelerate's searches in torch,
#                         then unimem's search alone with its answer re-run
#                                                     -> batch_size-gpu-torch{,-confirm}.json
#   search-jax            unimem's JAX search, its answer and smallest failure re-run in fresh
#                         processes (the bracket of the largest size) -> batch_size-gpu-jax-bracket.json
#   search-jax-baselines  Lightning's and accelerate's searches in JAX, against an in-process
#                         reference and against the bracket (KNOWN_LARGEST=LOW:HIGH)
#                                  -> batch_size-gpu-jax{,-lightning-power,-accelerate}.json
#   oom-latency           how long one OOM takes per framework; whether XLA keeps a failed
#                         execution's outputs          -> oom_latency-gpu.json,
#                                                         jax_failed_execution_leak-gpu.json
#   jax-process-growth    NVML after every trial of the JAX search test's model
#                                                     -> jax_search_process_growth-gpu-*.json
#   monitor               the monitor's overhead, a timeline and a torch snapshot -> monitor/
#   precision             peak memory at bf16 and fp16 against fp32   -> precision.json, precision.log
#   sharing               `unimem run` caps an unmodified script; torch and JAX split one device
#                                                     -> sharing-gpu.json
#   compare               `unimem compare --size large --steps 3`; extra arguments go to it
#                         (-f/-w/-c split it over calls)             -> compare/
#   search-rows           every call of find_batch_size counted, on four models, against the
#                         other searches; MODELS=... picks models    -> search-gpu-h200.json
#   savers                GPT-2 small in torch and JAX under each memory saver; extra arguments
#                         go to bench_savers.py                      -> savers-gpu-h200.json
#   cupy-search           find_batch_size on a CuPy workload against fresh-process bisection
#                                                                    -> cupy_search-gpu-h200.json
#   jax-capacity          JAX with growth under 8 GiB: what compiling takes from the pool (autotuning
#                         on and off), predicted peaks and the largest step a fresh process runs;
#                         extra arguments go to the script
#                                                                    -> jax_growth_capacity-gpu.json
#   jax-compile-cost      what one compilation of the JAX transformer's step costs, one after
#                         another and several in threads at once     -> jax_compile_cost-gpu-h200.json
#
# Output files are named as in benchmarks/results/ (and evidence/gpu.json), so they are
# copied over as they are; docs/measurements.md quotes them. unimem is installed from this
# tree, not editable, so the import benchmark measures a real install. Each part writes into
# $OUT/PART as it goes, so a part stopped by a time limit still leaves what it wrote.
# Parts that run several searches side by side give each its own 2% cap: memory figures
# are per process, wall times only indicative.
#
#   usage: bash tests/gpu/run_gpu.sh PART [ARGS...]
set -uo pipefail
PART=${1:?usage: run_gpu.sh suite|suite-1|suite-2|latency|search-tests|search-torch|search-jax|search-jax-baselines|oom-latency|jax-process-growth|monitor|precision|sharing|compare|search-rows|savers|cupy-search|jax-capacity|jax-compile-cost}
shift
OUT=${OUT:-/tmp/unimem-out}
KNOWN_LARGEST=${KNOWN_LARGEST:-15617:16438}
MACHINE=${MACHINE:-nvidia-h200 (device tool)}
mkdir -p "$OUT"
WORK="$OUT/$PART"  # under $OUT, so what a part wrote comes back even if it is stopped
mkdir -p "$WORK"
export PYTHONUNBUFFERED=1
ROOT=$PWD
BENCH=$ROOT/benchmarks
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$WORK/machine.txt"
python3 -m pip list 2>/dev/null | grep -iE '^(torch|jax|jaxlib|jax-cuda13.*|nvidia-ml-py|pytest) ' >> "$WORK/machine.txt"
# SKIP_INSTALL=1: a part started beside another that installed it (reinstalling under running
# processes could break their imports).
[ -n "${SKIP_INSTALL:-}" ] || python3 -m pip install -q --no-deps --no-build-isolation . > "$WORK/install.log" 2>&1
# Benchmarks run from a neutral folder, so they import the installed unimem, not this tree.
cd /tmp || exit 1

suite() {  # $1: seconds; the rest: pytest arguments
  local limit=$1 out=$2
  shift 2
  (cd "$ROOT" && timeout "$limit" python3 tests/gpu/run_suite.py --out "$WORK/$out" --machine "$MACHINE" -- "$@")
}
batch() {  # $1: seconds; $2: output name; the rest: bench_batch_size.py arguments
  local limit=$1 name=$2
  shift 2
  timeout "$limit" python3 "$BENCH/bench_batch_size.py" --out "$WORK/$name.json" --machine "$MACHINE" "$@" \
    > "$WORK/$name.log" 2>&1
}

case "$PART" in
  suite)
    suite "${SUITE_LIMIT:-540}" gpu.json "$@" > "$WORK/suite.log" 2>&1
    ;;
  suite-1|suite-2)
    half=${PART#suite-}
    (cd "$ROOT" && timeout "${SUITE_LIMIT:-540}" python3 tests/gpu/run_suite.py --part "$half" \
      --out "$WORK/gpu-part$half.json" --machine "$MACHINE" -- "$@") > "$WORK/suite.log" 2>&1
    ;;
  latency)
    timeout 300 python3 "$BENCH/run_all.py" --out "$WORK/gpu-h200.json" --machine "$MACHINE" > "$WORK/latency.log" 2>&1
    ;;
  search-tests)
    suite 300 search-tests.json -k find_batch_size > "$WORK/search-tests.log" 2>&1
    ;;
  search-torch)
    batch 300 batch_size-gpu-torch --frameworks torch --budget 240
    batch 120 batch_size-gpu-torch-confirm --frameworks torch --budget 60 --methods unimem --no-verify
    ;;
  search-jax)
    batch 300 batch_size-gpu-jax-bracket --frameworks jax --bracket-reference
    ;;
  search-jax-baselines)
    batch 450 batch_size-gpu-jax --frameworks jax --budget 380 --resolution 0.004 \
      --methods unimem,lightning-binsearch &
    batch 450 batch_size-gpu-jax-lightning-power --frameworks jax --known-largest "$KNOWN_LARGEST" \
      --methods lightning-power --budget 380 &
    batch 450 batch_size-gpu-jax-accelerate --frameworks jax --known-largest "$KNOWN_LARGEST" \
      --methods accelerate-high --budget 400 &
    wait
    ;;
  oom-latency)
    timeout 200 python3 "$BENCH/bench_oom_latency.py" --frameworks torch,jax --out "$WORK/oom_latency-gpu.json" \
      --machine "$MACHINE" > "$WORK/oom_latency.log" 2>&1
    timeout 200 python3 "$BENCH/scripts/jax_failed_execution_leak.py" > "$WORK/jax_failed_execution_leak-gpu.json" \
      2> "$WORK/jax_failed_execution_leak.log"
    ;;
  jax-process-growth)
    for variant in constant-key key-argument; do
      timeout 300 python3 "$BENCH/scripts/jax_search_process_growth.py" --variant "$variant" \
        > "$WORK/jax_search_process_growth-gpu-$variant.json" 2> "$WORK/jax_search_process_growth-$variant.log" &
    done
    wait
    ;;
  monitor)
    timeout 400 python3 "$BENCH/bench_monitor.py" --out "$WORK/monitor" --repeats 13 --skip-jax \
      --machine "$MACHINE" > "$WORK/monitor.log" 2>&1
    ;;
  precision)
    timeout 540 python3 "$BENCH/bench_precision.py" --out "$WORK/precision.json" --machine "$MACHINE" \
      > "$WORK/precision.log" 2>&1
    ;;
  sharing)
    timeout 400 python3 "$BENCH/bench_sharing.py" --out "$WORK" > "$WORK/sharing.log" 2>&1
    ;;
  compare)
    timeout 540 python3 -m unimem compare --size large --steps 3 --out "$WORK/compare" "$@" > "$WORK/compare.log" 2>&1
    ;;
  search-rows)
    timeout 560 python3 "$BENCH/bench_search_rows.py" --out "$WORK/search-gpu-h200.json" --machine "$MACHINE" \
      --models "${MODELS:-torch-mlp,torch-transformer,jax-mlp,jax-transformer}" --budget 500 "$@" \
      > "$WORK/search-rows.log" 2>&1
    ;;
  savers)
    timeout 560 python3 "$BENCH/bench_savers.py" --out "$WORK/savers-gpu-h200.json" --machine "$MACHINE" \
      --budget 500 "$@" > "$WORK/savers.log" 2>&1
    ;;
  cupy-search)
    timeout 300 python3 "$BENCH/bench_cupy_search.py" --out "$WORK/cupy_search-gpu-h200.json" --machine "$MACHINE" \
      > "$WORK/cupy-search.log" 2>&1
    ;;
  jax-capacity)
    timeout 500 python3 "$BENCH/scripts/jax_growth_capacity.py" --out "$WORK/jax_growth_capacity-gpu.json" \
      --budget 420 "$@" > "$WORK/jax-capacity.log" 2>&1
    ;;
  jax-compile-cost)
    timeout 500 python3 "$BENCH/scripts/jax_compile_cost.py" --out "$WORK/jax_compile_cost-gpu-h200.json" \
      --timeout 460 "$@" > "$WORK/jax-compile-cost.log" 2>&1
    ;;
  *)
    echo "run_gpu.sh: unknown part '$PART'" >&2
    exit 2
    ;;
esac
echo "run_gpu.sh $PART: exit $?"
tail -n 16 "$WORK"/*.log
