"""Does XLA keep a failed execution's output buffers in use? JAX on a GPU, under a 2% cap.

A batch-size search in JAX can leave XLA's bytes in use higher after each failed trial,
by the size of the step's outputs (new parameters and optimizer state), with no more live
arrays: the outputs are allocated before the temporary buffer that fails, and the
executable's buffer set-up returns the error without freeing them. This measures it
in isolation: a jitted ``f(state, n)`` whose output is the size of ``state`` and whose
temporaries (a sort of ``n`` floats) fail past the cap. For several output sizes, twice
each: bytes in use before, after the failure, after ``gc.collect()`` + ``jax.clear_caches()``,
and the seconds the failing call took. Then the same with ``state`` donated (a fresh copy
each call), and whether that donated input survives the failed call: deleted, or still
readable and intact.

    python benchmarks/scripts/jax_failed_execution_leak.py > leak.json
"""

from __future__ import annotations

import functools
import gc
import json
import time

import unimem

unimem.configure(backend="jax", fraction=0.02)
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

device = jax.devices()[0]
MiB = 1 << 20


def in_use() -> int:
    return int(device.memory_stats()["bytes_in_use"])


limit = int(device.memory_stats()["bytes_limit"])
too_many = limit // 4  # floats: a sort of them needs about twice the pool


def attempt(f, state, n):  # type: ignore[no-untyped-def]
    started = time.perf_counter()
    try:
        out = f(state, n)
        jax.block_until_ready(out)
    except Exception as exc:
        return time.perf_counter() - started, unimem.is_oom(exc), str(exc).splitlines()[0][:160]
    return time.perf_counter() - started, None, None


rows = []
for donate in (False, True):
    for out_mib in (1, 64, 256):
        state = jnp.ones((out_mib * MiB // 4,), jnp.float32).block_until_ready()

        @functools.partial(jax.jit, static_argnums=1, donate_argnums=(0,) if donate else ())
        def f(s, n):  # type: ignore[no-untyped-def]
            t = jnp.sort(jax.random.uniform(jax.random.PRNGKey(0), (n,)))
            return s + t[0]

        ok_seconds, _, _ = attempt(f, state if not donate else state + 0, 1024)  # compile + run a small one
        for repeat in range(2):
            given = state + 0 if donate else state
            jax.block_until_ready(given)
            before = in_use()
            seconds, oom, message = attempt(f, given, too_many)
            after = in_use()
            # A donated input that the failed call consumed is lost to the caller: a training
            # step's parameters. Read it back, if it still exists, to see it is unchanged.
            deleted = given.is_deleted()
            intact = None if deleted else bool(jnp.all(given == 1.0))
            del given
            gc.collect()
            jax.clear_caches()
            gc.collect()
            after_clear = in_use()
            rows.append(
                {
                    "donate": donate,
                    "output_mib": out_mib,
                    "repeat": repeat,
                    "failing_call_seconds": seconds,
                    "passing_call_seconds": ok_seconds,
                    "oom": oom,
                    "message": message,
                    "in_use_before": before,
                    "kept_after_failure": after - before,
                    "kept_after_gc_and_clear_caches": after_clear - before,
                    "live_arrays": len(jax.live_arrays()),
                    "input_deleted_after_failure": deleted,
                    "input_intact_after_failure": intact,
                }
            )
        del state, f
        gc.collect()

print(json.dumps({"limit": limit, "jax": jax.__version__, "rows": rows}, indent=1))
