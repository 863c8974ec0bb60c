"""``unimem.estimate_memory`` for TensorFlow: the peak of a ``tf.function(jit_compile=True)`` step from
the buffers XLA assigns to it, nothing run.

``step(n)`` returns ``(function, args)`` (or ``(function, args, kwargs)``): the step and its arguments at
batch size ``n``, ``tf.TensorSpec`` or tensors. ``function.experimental_get_compiler_ir(*args)`` compiles it
with XLA; its ``optimized_hlo_proto_serialized`` stage is the compiled module with its buffer assignment:
every buffer the program's run holds, by size and kind (an entry parameter, an output, a temporary, a
constant in the executable). The peak is the parameters (the batch, and every variable the step reads:
weights and optimizer slots), the outputs that are not parameters, and the temporaries. A step that XLA
does not compile (``jit_compile`` not set) runs on TensorFlow's executor, which has no such figures: it
is refused, naming what is missing.
"""

from __future__ import annotations

from typing import Any

from unimem.backends.base import Estimate

from unimem.errors import ConfigError, UnsupportedFeature
from unimem.step_estimates import Measured, Plan

__all__ = ["TensorFlowEstimate", "buffer_figures"]

_STAGE = "optimized_hlo_proto_serialized"


def _refuse(reason: str) -> UnsupportedFeature:
    return UnsupportedFeature("tensorflow", "estimate", reason)


def buffer_figures(serialized: bytes) -> dict[str, int]:
    """Bytes of a compiled module's buffers by kind, from its serialized ``HloProto``: ``arguments`` (entry
    parameters), ``outputs`` (live-out buffers that are not parameters), ``temporaries`` (the rest), and
    ``constants`` (in the executable, outside the peak)."""
    try:
        from tensorflow.compiler.xla.service import hlo_pb2
    except ImportError as exc:
        raise _refuse(
            "this TensorFlow ships no XLA HloProto reader (tensorflow.compiler.xla.service.hlo_pb2) to read the "
            "compiled step's buffer assignment; measure the step with unimem.track"
        ) from exc
    proto = hlo_pb2.HloProto()
    proto.ParseFromString(serialized)
    if not proto.HasField("buffer_assignment"):
        raise _refuse(
            f"XLA's {_STAGE!r} stage of this TensorFlow holds no buffer assignment; measure the step with unimem.track"
        )
    found = dict.fromkeys(("arguments", "outputs", "temporaries", "constants"), 0)
    for allocation in proto.buffer_assignment.buffer_allocations:
        if allocation.is_constant:
            kind = "constants"
        elif allocation.is_thread_local:
            continue  # a CPU thread's own scratch, on its stack
        elif allocation.is_entry_computation_parameter:
            kind = "arguments"
        elif allocation.maybe_live_out:
            kind = "outputs"
        else:
            kind = "temporaries"
        found[kind] += int(allocation.size)
    return found


def _unpack(made: Any, size: int) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    if not (isinstance(made, tuple) and made and hasattr(made[0], "experimental_get_compiler_ir")):
        raise ConfigError(
            "step", f"step({size}) returned {made!r}: return (function, args), a tf.function and its TensorSpecs"
        )
    args = tuple(made[1]) if len(made) > 1 else ()
    return made[0], args, dict(made[2]) if len(made) > 2 else {}


class TensorFlowEstimate(Estimate):
    """TensorFlow in ``unimem.estimate_memory`` (``EstimateTopic``): XLA's buffer assignment of the step."""

    def estimate_size(self, step: Any, size: int, plan: Plan) -> Measured:
        for name in ("precision", "saver"):
            if getattr(plan, name) is not None:
                raise ConfigError(
                    name, f"TensorFlow: the step's own code sets its {name}; leave {name}= out and size it as it is"
                )
        if not callable(step):
            raise ConfigError("step", f"expected n -> (function, args), got {step!r}")
        function, args, kwargs = _unpack(step(size), size)
        if getattr(function, "_jit_compile", None) is not True:
            raise _refuse(
                "the step is not compiled by XLA (tf.function(jit_compile=True) is not set): TensorFlow's own "
                "executor gives no memory figures before it runs; compile it with XLA, or measure it with unimem.track"
            )
        serialized = function.experimental_get_compiler_ir(*args, **kwargs)(stage=_STAGE)
        found = buffer_figures(serialized)
        parts = {name: found[name] for name in ("arguments", "outputs", "temporaries")}
        device = plan.device or "cpu"
        notes = (
            "XLA's buffer assignment of the compiled step (experimental_get_compiler_ir, optimized HLO)",
            f"constants in the executable: {found['constants']} bytes, outside the peak",
        )
        unseen = ("TensorFlow's allocator's own rounding and pool (its BFC allocator on a GPU)",)
        return Measured(size, device, peak=sum(parts.values()), parts=parts, notes=notes, unseen=unseen)
