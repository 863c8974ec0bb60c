#!/usr/bin/env bash
# The GPU work of issues #5 and #6 as device calls of under 10 minutes each (one part per call):
#   batch    find_batch_size benchmark, torch and JAX side by side, + JAX compare rows (session 2)
#   batch2   JAX reference in fresh processes (too heavy in parallel: timed out) + monitor (session 2)
#   suite    the whole GPU suite + JAX bracket check + torch search (session 2)
#   diag     the two search tests + torch search (session 2)
#   next     what session 2 left unverified: search tests, searches, a finer monitor run
#   observe  the whole suite, then the monitor benchmark
#   s3       session 3: search tests + searches (as next), JAX's baselines, OOM latency
#   s3b      after s3: the same with the leak accounting and torch's settle hook, the XLA
#            leak reproduced alone, OOM latency again (s3's cap was read too early), and
#            accelerate in JAX with its trials kept when it times out
#   s3c      the whole suite (evidence/gpu.json), beside NVML read after every trial of the
#            JAX search test's model, with its step's key constant and passed in
#   s4       what session 3 left unverified (about 4 minutes): the two search tests and the
#            JAX benchmark search with the peak bound and the saturation rule
#   s5       session 4 (runs 13 and 15): the whole suite (evidence/gpu.json), then the
#            import and stats() latency benchmarks alone on the machine (gpu-h200.json)
#   s6       run 14: stats() latency with MemoryStats' own __init__ (alone on the machine),
#            then the JAX search test with the at-the-cap note
# Every output is packed into $OUT/results.tar.gz, because a device call brings back at most
# 8 files. Unpack here with: tar -xzf <files_at>/results.tar.gz -C /tmp/gpu
set -uo pipefail
PART=${1:?usage: followup_run.sh batch|batch2|suite|diag|next|observe|s3|s3b|s3c|s4|s5|s6}
OUT=${OUT:-/tmp/unimem-out}
mkdir -p "$OUT"
WORK=$(mktemp -d)
export PYTHONUNBUFFERED=1
ROOT=$PWD
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$WORK/machine.txt"
python3 -m pip list 2>/dev/null | grep -iE '^(torch|jax|jaxlib|jax-cuda13.*|nvidia-ml-py|pytest) ' >> "$WORK/machine.txt"
python3 -m pip install -q --no-deps --no-build-isolation . > "$WORK/install.log" 2>&1
cd /tmp || exit 1
MACHINE="nvidia-h200 (device tool)"

# The two find_batch_size GPU tests (limit: $1 seconds), then torch's benchmark search alone.
search_tests_then_torch_search() {
  (cd "$ROOT" && timeout "$1" python3 tests/gpu/run_suite.py --out "$WORK/gpu-diag.json" -- -k find_batch_size) \
    > "$WORK/suite-diag.log" 2>&1
  timeout 60 python3 "$ROOT/benchmarks/bench_batch_size.py" --frameworks torch --budget 30 --methods unimem \
    --no-verify --out "$WORK/batch-torch" --machine "$MACHINE" > "$WORK/batch-torch.log" 2>&1
}
if [ "$PART" = batch ]; then
  # Issue 5. Each framework in its own processes under its own 2% cap (about 3 GB of 140 GB),
  # so the two run side by side without sharing memory; wall times are indicative only.
  # JAX's reference stops at 0.4% of the size: a failing JAX trial costs ~14 s.
  timeout 240 python3 "$ROOT/benchmarks/bench_batch_size.py" --frameworks torch --budget 200 \
    --out "$WORK/batch-torch" --machine "$MACHINE" > "$WORK/batch-torch.log" 2>&1 &
  timeout 450 python3 "$ROOT/benchmarks/bench_batch_size.py" --frameworks jax --budget 380 --resolution 0.004 \
    --out "$WORK/batch-jax" --machine "$MACHINE" > "$WORK/batch-jax.log" 2>&1 &
  wait
  # Issue 7: the two JAX transformer rows that ran out of time in the first session.
  timeout 100 python3 -m unimem compare --framework jax --workload transformer --config cap --config bf16 \
    --size large --steps 3 --out "$WORK/compare" > "$WORK/compare.log" 2>&1
elif [ "$PART" = batch2 ]; then
  # After the first batch run: in JAX the largest size that runs depends on the process's
  # history (after one OOM about half fits), so JAX's reference is re-found in fresh
  # processes (probed in parallel); torch's unimem search re-run to see its answer re-run
  # in the same process. Then the monitor overhead benchmark, alone on the machine.
  timeout 330 python3 "$ROOT/benchmarks/bench_batch_size.py" --frameworks jax --budget 290 --fresh-reference \
    --methods unimem,lightning-binsearch,accelerate-high --out "$WORK/batch-jax" --machine "$MACHINE" \
    > "$WORK/batch-jax.log" 2>&1 &
  timeout 200 python3 "$ROOT/benchmarks/bench_batch_size.py" --frameworks torch --budget 150 --methods unimem \
    --out "$WORK/batch-torch" --machine "$MACHINE" > "$WORK/batch-torch.log" 2>&1 &
  wait
  timeout 230 python3 "$ROOT/benchmarks/bench_monitor.py" --out "$WORK/monitor" --repeats 13 --skip-jax \
    --machine "$MACHINE" > "$WORK/monitor.log" 2>&1
elif [ "$PART" = suite ]; then
  # The whole suite, then the cheap check of unimem's JAX search (its answer and smallest
  # failure re-run in fresh processes: a lower bound of its share without the exhaustive
  # search, which JAX's ~14 s per failing trial makes too slow), then torch's search again.
  (cd "$ROOT" && timeout 320 python3 tests/gpu/run_suite.py --out "$WORK/gpu.json") > "$WORK/suite.log" 2>&1
  timeout 150 python3 "$ROOT/benchmarks/bench_batch_size.py" --frameworks jax --bracket-reference \
    --out "$WORK/batch-jax" --machine "$MACHINE" > "$WORK/batch-jax.log" 2>&1
  timeout 70 python3 "$ROOT/benchmarks/bench_batch_size.py" --frameworks torch --budget 40 --methods unimem \
    --out "$WORK/batch-torch" --machine "$MACHINE" > "$WORK/batch-torch.log" 2>&1
elif [ "$PART" = diag ]; then
  # After the suite part: the two find_batch_size GPU tests again (the answer now re-run
  # after the search), and torch's benchmark search with the memory taken before its re-run.
  search_tests_then_torch_search 150
elif [ "$PART" = next ]; then
  # What session 2 left unverified on the GPU (about 6 minutes): the two search tests with
  # confirm + settle, torch's and JAX's searches with the memory after them, and the monitor's
  # overhead with few configurations and many repeats (to resolve 1%, not the ±10% spread).
  search_tests_then_torch_search 150
  timeout 150 python3 "$ROOT/benchmarks/bench_batch_size.py" --frameworks jax --bracket-reference \
    --out "$WORK/batch-jax" --machine "$MACHINE" > "$WORK/batch-jax.log" 2>&1
  timeout 200 python3 "$ROOT/benchmarks/bench_monitor.py" --out "$WORK/monitor" --repeats 60 --steps 150 --skip-jax \
    --configs unimem_100hz,unimem_1khz,naive_memory_stats_1khz --machine "$MACHINE" > "$WORK/monitor.log" 2>&1
elif [ "$PART" = s3 ]; then
  # Three streams side by side, each framework's processes under their own 2% cap (wall
  # times indicative only): (a) the two search tests, then torch's search; (b) JAX's search
  # bracketed in fresh processes, then the cost of one OOM per framework; (c) JAX's two
  # missing baselines against the fresh-process bracket of session 2 (15617 ran, 16439 failed).
  search_tests_then_torch_search 170 &
  (
    timeout 170 python3 "$ROOT/benchmarks/bench_batch_size.py" --frameworks jax --bracket-reference \
      --out "$WORK/batch-jax" --machine "$MACHINE" > "$WORK/batch-jax.log" 2>&1
    timeout 200 python3 "$ROOT/benchmarks/bench_oom_latency.py" --frameworks torch,jax --out "$WORK/oom" \
      --machine "$MACHINE" > "$WORK/oom.log" 2>&1
  ) &
  timeout 400 python3 "$ROOT/benchmarks/bench_batch_size.py" --frameworks jax --known-largest 15617:16438 \
    --methods lightning-power,accelerate-high --budget 380 --out "$WORK/batch-jax-baselines" --machine "$MACHINE" \
    > "$WORK/batch-jax-baselines.log" 2>&1 &
  wait
elif [ "$PART" = s3b ]; then
  search_tests_then_torch_search 170 &
  (
    timeout 150 python3 "$ROOT/benchmarks/scripts/jax_failed_execution_leak.py" > "$WORK/jax-leak.json" \
      2> "$WORK/jax-leak.log"
    timeout 150 python3 "$ROOT/benchmarks/bench_oom_latency.py" --frameworks torch,jax --out "$WORK/oom" \
      --machine "$MACHINE" > "$WORK/oom.log" 2>&1
  ) &
  timeout 170 python3 "$ROOT/benchmarks/bench_batch_size.py" --frameworks jax --bracket-reference \
    --out "$WORK/batch-jax" --machine "$MACHINE" > "$WORK/batch-jax.log" 2>&1 &
  timeout 420 python3 "$ROOT/benchmarks/bench_batch_size.py" --frameworks jax --known-largest 15617:16438 \
    --methods accelerate-high --budget 400 --out "$WORK/batch-jax-accelerate" --machine "$MACHINE" \
    > "$WORK/batch-jax-accelerate.log" 2>&1 &
  wait
elif [ "$PART" = s3c ]; then
  [ "${NO_SUITE:-}" ] || (cd "$ROOT" && timeout 420 python3 tests/gpu/run_suite.py --out "$WORK/gpu.json") \
    > "$WORK/suite.log" 2>&1 &
  for variant in constant-key key-argument; do
    timeout 200 python3 "$ROOT/benchmarks/scripts/jax_search_process_growth.py" --variant "$variant" \
      > "$WORK/growth-$variant.json" 2> "$WORK/growth-$variant.log" &
  done
  wait
elif [ "$PART" = s4 ]; then
  search_tests_then_torch_search 200 &
  timeout 200 python3 "$ROOT/benchmarks/bench_batch_size.py" --frameworks jax --bracket-reference \
    --out "$WORK/batch-jax" --machine "$MACHINE" > "$WORK/batch-jax.log" 2>&1 &
  wait
elif [ "$PART" = s5 ]; then
  (cd "$ROOT" && timeout 400 python3 tests/gpu/run_suite.py --out "$WORK/gpu.json") > "$WORK/suite.log" 2>&1
  timeout 150 python3 "$ROOT/benchmarks/run_all.py" --out "$WORK/gpu-h200.json" --machine "$MACHINE" \
    > "$WORK/run_all.log" 2>&1
elif [ "$PART" = s6 ]; then
  timeout 150 python3 "$ROOT/benchmarks/run_all.py" --out "$WORK/gpu-h200.json" --machine "$MACHINE" \
    > "$WORK/run_all.log" 2>&1
  (cd "$ROOT" && timeout 200 python3 tests/gpu/run_suite.py --out "$WORK/gpu-diag.json" -- -k jax_find_batch_size) \
    > "$WORK/suite-diag.log" 2>&1
elif [ "$PART" = observe ]; then
  # The whole suite first, so that evidence/gpu.json reflects the current code.
  (cd "$ROOT" && timeout 330 python3 tests/gpu/run_suite.py --out "$WORK/gpu.json") > "$WORK/suite.log" 2>&1
  # Issue 6: overhead with enough repeats to resolve 1%, and the timeline redrawn.
  timeout 240 python3 "$ROOT/benchmarks/bench_monitor.py" --out "$WORK/monitor" --repeats 15 --skip-jax \
    --machine "$MACHINE" > "$WORK/monitor.log" 2>&1
fi
tar -czf "$OUT/results.tar.gz" -C "$WORK" .
tail -n 16 "$WORK"/*.log
