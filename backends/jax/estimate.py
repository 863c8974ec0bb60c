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

from typing import Any

from unimem.backends.base import Estimate
from unimem.backends.jax._fresh_compile import FRESH_PLATFORMS, FreshCompileError, compile_exported, figures

from unimem.errors import ConfigError
from unimem.step_estimates import Measured, Plan

__all__ = ["JaxEstimate"]


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
                found = _exported(jitted, args, kwargs)
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


def _exported(jitted: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    try:
        return compile_exported(jitted, args, kwargs)
    except FreshCompileError as exc:
        raise RuntimeError(
            f"unimem.estimate_memory: compiling the exported step in a fresh process failed:\n{exc}"
        ) from None
