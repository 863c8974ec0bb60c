"""``unimem.estimate_memory`` for JAX: the peak of the program as training compiles it, from XLA's
memory analysis, nothing run.

``step(n)`` returns either ``(jitted, args)`` / ``(jitted, args, kwargs)`` (abstract arguments such as
``jax.ShapeDtypeStruct``), or what ``find_batch_size(..., lower=)`` takes (the step lowered, traced or
compiled). On a GPU a compilation autotunes its kernels on real buffers, and with growth on those take
regions from the pool that stay there; ``(jitted, args)`` is exported (``jax.export``) and compiled in
a fresh process instead, so this process's pool is left as it was. On the CPU, where there is no pool,
it is compiled here. XLA's CPU ``peak_memory_in_bytes`` leaves the temporaries out, so the peak is
computed from the analysis's fields there (``JaxSearch.predict_peak``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from unimem.backends.base import Estimate

from unimem.errors import ConfigError
from unimem.step_estimates import Measured, Plan

__all__ = ["FRESH_PLATFORMS", "JaxEstimate", "compile_in_fresh_process", "figures"]

# Platforms whose compilations take regions from a pool grown on demand (XLA autotunes there).
FRESH_PLATFORMS = ("gpu", "cuda", "rocm", "tpu")
# Seconds a fresh process may take to import JAX and compile one step.
_FRESH_SECONDS = 900
_MARK = "UNIMEM-ESTIMATE "

# Run by a fresh process: the exported step (stdin) compiled and sized, the figures printed.
_CHILD = r"""
import json, sys
import jax
from jax import export
from unimem.backends.jax.estimate import figures
exported = export.deserialize(bytearray(sys.stdin.buffer.read()))
donate = tuple(json.loads(sys.argv[1]))
compiled = jax.jit(exported.call, donate_argnums=donate).lower(*exported.in_avals).compile()
print("UNIMEM-ESTIMATE " + json.dumps(figures(compiled)), flush=True)
"""


def figures(compiled: Any) -> dict[str, Any]:
    """The peak of a compiled step and XLA's memory-analysis fields, as plain data."""
    from unimem import registry

    analysis = compiled.memory_analysis()
    fields = ("argument", "output", "alias", "temp", "generated_code")
    found: dict[str, Any] = {name: int(getattr(analysis, f"{name}_size_in_bytes", 0) or 0) for name in fields}
    found["peak"] = registry.get_backend("jax").search.predict_peak(compiled)
    found["platform"] = _platform(compiled)
    return found


def _platform(compiled: Any) -> str | None:
    import jax

    for sharding in jax.tree_util.tree_leaves((compiled.input_shardings, compiled.output_shardings)):
        for device in getattr(sharding, "device_set", ()):
            return str(device.platform)
    return None


def _flat_step(jitted: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, list[Any], list[int]]:
    """``jitted`` as a function of the leaves of ``(args, kwargs)`` returning the leaves of its result, with
    the leaves it donates. Exported so, the step's own containers (an optimizer's named-tuple state, a
    model's dataclass) need no registration for serialization: only arrays cross the process boundary."""
    import jax

    leaves, tree = jax.tree_util.tree_flatten((args, kwargs))
    info = jax.tree_util.tree_leaves(jitted.lower(*args, **kwargs).args_info)
    donated = [i for i, arg in enumerate(info) if arg.donated]

    def flat(*xs: Any) -> list[Any]:
        call_args, call_kwargs = jax.tree_util.tree_unflatten(tree, xs)
        return list(jax.tree_util.tree_leaves(jitted(*call_args, **call_kwargs)))

    return jax.jit(flat, donate_argnums=tuple(donated)), leaves, donated


def compile_in_fresh_process(jitted: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """``jitted(*args, **kwargs)`` exported here and compiled in a fresh process (its allocator not
    preallocating): its figures, with nothing of this process's pool taken."""
    from jax import export

    flat, leaves, donated = _flat_step(jitted, args, kwargs)
    blob = export.export(flat)(*leaves).serialize()
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
    env["PYTHONPATH"] = os.pathsep.join(path for path in sys.path if path)
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(donated)],
        input=bytes(blob),
        capture_output=True,
        env=env,
        timeout=_FRESH_SECONDS,
        check=False,
    )
    lines = [line for line in done.stdout.decode(errors="replace").splitlines() if line.startswith(_MARK)]
    if done.returncode != 0 or not lines:
        tail = done.stderr.decode(errors="replace")[-2000:]
        raise RuntimeError(f"unimem.estimate_memory: compiling the exported step in a fresh process failed:\n{tail}")
    result: dict[str, Any] = json.loads(lines[-1][len(_MARK) :])
    return result


def _parts(found: dict[str, Any]) -> dict[str, int]:
    """The peak by part: the arguments, the outputs not aliased to them, and the rest (XLA's temporaries,
    activations kept for the backward pass among them)."""
    arguments, outputs = found["argument"], found["output"] - found["alias"]
    return {"arguments": arguments, "outputs": outputs, "temporaries": found["peak"] - arguments - outputs}


def _compiled(stage: Any) -> Any:
    if not hasattr(stage, "memory_analysis") and hasattr(stage, "lower") and not hasattr(stage, "compile"):
        stage = stage.lower()  # a Traced
    if not hasattr(stage, "memory_analysis") and hasattr(stage, "compile"):
        stage = stage.compile()  # a Lowered
    return stage


class JaxEstimate(Estimate):
    """JAX in ``unimem.estimate_memory`` (``EstimateTopic``): XLA's analysis of the compiled step."""

    def estimate_size(self, step: Any, size: int, plan: Plan) -> Measured:
        import jax

        for name in ("precision", "saver"):
            if getattr(plan, name) is not None:
                raise ConfigError(
                    name,
                    f"JAX: the step's own code sets its {name} (casts, unimem.remat around its blocks): leave "
                    f"{name}= out, and size the step as it is lowered",
                )
        if not callable(step):
            raise ConfigError("step", f"expected n -> (jitted, args) or n -> the step lowered; got {step!r}")
        platform = jax.default_backend()
        if plan.device is not None and plan.device not in (platform, "gpu" if platform == "cuda" else platform):
            raise ConfigError("device", f"JAX compiles for its {platform!r} devices here, not {plan.device!r}")
        made = step(size)
        notes: list[str] = []
        if isinstance(made, tuple) and made and callable(made[0]) and hasattr(made[0], "lower"):
            jitted, args = made[0], tuple(made[1]) if len(made) > 1 else ()
            kwargs = dict(made[2]) if len(made) > 2 else {}
            if platform in FRESH_PLATFORMS:
                found = compile_in_fresh_process(jitted, args, kwargs)
                notes.append("exported and compiled in a fresh process: this process's pool took nothing")
            else:
                found = figures(jitted.lower(*args, **kwargs).compile())
        elif hasattr(made, "memory_analysis") or hasattr(made, "compile") or hasattr(made, "lower"):
            found = figures(_compiled(made))
            if platform in FRESH_PLATFORMS:
                notes.append(
                    "compiled in this process: its autotuning may have taken pool regions (with growth on); return "
                    "(jitted, args) from step(n) to compile in a fresh process"
                )
        else:
            raise ConfigError("step", f"step({size}) returned {made!r}: return (jitted, args) or the step lowered")
        if found["peak"] is None:
            raise ConfigError("step", f"XLA gives no memory analysis for what step({size}) returned")
        notes.append(f"XLA's memory analysis of the compiled step ({found['platform'] or platform})")
        if found["generated_code"]:
            notes.append(f"the compiled code itself: {found['generated_code']} bytes, outside the peak")
        return Measured(
            size, str(found["platform"] or platform), peak=int(found["peak"]), parts=_parts(found),
            notes=tuple(notes), unseen=_unseen(platform),
        )  # fmt: skip


def _unseen(platform: str) -> tuple[str, ...]:
    if platform in FRESH_PLATFORMS:
        return (
            "the pool's layout: with growth on, the temporaries are one buffer cut from one region, which the room "
            "left under the cap may not hold (find_batch_size holds both against the pool)",
        )
    return ("XLA's CPU runtime and the process's own memory outside the step's buffers",)
