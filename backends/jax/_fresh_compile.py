"""Compiling a step in a fresh process, so that this process's pool takes nothing.

On a GPU XLA autotunes a compilation's kernels on real buffers; with growth on those buffers take
regions from the pool, and a pool grown on demand keeps every region for the life of the process
(docs/measurements.md). A compilation made in a fresh process costs this process nothing. Its
kernel choices are kept in XLA's per-fusion autotune directory (``AUTOTUNE_FLAG``), shared with
this process: when this process then compiles the same step it loads those choices instead of
autotuning, takes no region, and gets the program the fresh process sized, byte for byte.

Two ways in: a jitted function and its (abstract) arguments, exported with ``jax.export`` by their
leaves (any container crosses, an optimizer's named-tuple state included); or a ``Lowered`` step,
whose StableHLO text is compiled through JAX's own compile entry (internal to JAX: where that entry
is not there, the caller compiles here instead).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

__all__ = [
    "AUTOTUNE_FLAG",
    "FRESH_PLATFORMS",
    "FreshCompileError",
    "autotune_directory",
    "compile_exported",
    "compile_lowered",
    "figures",
    "load_autotuned",
    "peak_of",
    "platform",
]

# Platforms whose compilations take regions from a pool grown on demand (XLA autotunes there).
FRESH_PLATFORMS = ("gpu", "cuda", "rocm", "tpu")
AUTOTUNE_FLAG = "--xla_gpu_per_fusion_autotune_cache_dir"
# Seconds a fresh process may take to import JAX and compile one step.
_FRESH_SECONDS = 900
_MARK = "UNIMEM-COMPILED "

# Run by a fresh process: the step (stdin) compiled and sized, the figures printed.
_CHILD = r"""
import json, sys
import jax
from unimem.backends.jax._fresh_compile import child_compile
print("UNIMEM-COMPILED " + json.dumps(child_compile(sys.argv[1], json.loads(sys.argv[2]), sys.stdin.buffer.read())))
"""


class FreshCompileError(RuntimeError):
    """The fresh process could not compile the step (its error output is the message)."""


def figures(compiled: Any) -> dict[str, Any]:
    """The peak of a compiled step and XLA's memory-analysis fields, as plain data."""
    analysis = compiled.memory_analysis()
    fields = ("argument", "output", "alias", "temp", "generated_code")
    found: dict[str, Any] = {name: int(getattr(analysis, f"{name}_size_in_bytes", 0) or 0) for name in fields}
    found["platform"] = platform(compiled)
    found["peak"] = peak_of(analysis, found["platform"])
    return found


def platform(compiled: Any) -> str | None:
    """The platform (``"cpu"``, ``"gpu"``, ``"cuda"``, ``"tpu"``) a compiled program is for; None for
    what is not a compiled JAX stage."""
    import jax

    try:
        shardings = (compiled.input_shardings, compiled.output_shardings)
    except AttributeError:  # not a compiled JAX stage: no platform to read
        return None
    for sharding in jax.tree_util.tree_leaves(shardings):
        for device in getattr(sharding, "device_set", ()):
            return str(device.platform)
    return None


def peak_of(analysis: Any, on: str | None) -> int:
    """The peak bytes of a program from XLA's memory analysis, compiled for platform ``on``. On a GPU
    XLA's ``peak_memory_in_bytes`` is the peak of its buffer assignment; on the CPU that field counts
    arguments and outputs only, while the temporaries are allocated too: there the peak is arguments +
    outputs + temporaries - the bytes outputs alias from arguments."""
    held = (
        int(analysis.argument_size_in_bytes)
        + int(analysis.output_size_in_bytes)
        + int(analysis.temp_size_in_bytes)
        - int(analysis.alias_size_in_bytes)
    )
    peak = int(getattr(analysis, "peak_memory_in_bytes", 0) or 0)
    return held if on == "cpu" or peak <= 0 else peak


def autotune_directory() -> str:
    """The per-fusion autotune directory this process and its fresh compilers share: the one
    ``XLA_FLAGS`` names, else unimem's (``$XDG_CACHE_HOME/unimem/xla-autotune``), created."""
    for flag in os.environ.get("XLA_FLAGS", "").split():
        if flag.startswith(AUTOTUNE_FLAG + "="):
            return flag.split("=", 1)[1]
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    directory = base / "unimem" / "xla-autotune"
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError:  # a read-only home: a directory of its own for this process
        directory = Path(tempfile.mkdtemp(prefix="unimem-xla-autotune-"))
    return str(directory)


def _child_env(directory: str) -> dict[str, str]:
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
    flags = [f for f in env.get("XLA_FLAGS", "").split() if not f.startswith(AUTOTUNE_FLAG + "=")]
    env["XLA_FLAGS"] = " ".join([*flags, f"{AUTOTUNE_FLAG}={directory}"])
    env["PYTHONPATH"] = os.pathsep.join(path for path in sys.path if path)
    return env


def _run_child(kind: str, donated: list[int], blob: bytes) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, kind, json.dumps(donated)],
        input=blob,
        capture_output=True,
        env=_child_env(autotune_directory()),
        timeout=_FRESH_SECONDS,
        check=False,
    )
    lines = [line for line in done.stdout.decode(errors="replace").splitlines() if line.startswith(_MARK)]
    if done.returncode != 0 or not lines:
        raise FreshCompileError(done.stderr.decode(errors="replace")[-2000:])
    result: dict[str, Any] = json.loads(lines[-1][len(_MARK) :])
    return result


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


def compile_exported(jitted: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """``jitted(*args, **kwargs)`` exported here and compiled in a fresh process: its ``figures``."""
    from jax import export

    flat, leaves, donated = _flat_step(jitted, args, kwargs)
    return _run_child("export", donated, bytes(export.export(flat)(*leaves).serialize()))


def compile_lowered(lowered: Any) -> dict[str, Any]:
    """A single-device ``Lowered`` step compiled in a fresh process from its StableHLO text: its ``figures``.
    ``FreshCompileError`` where the fresh process cannot (a step over several devices, a JAX without the
    compile entry this uses)."""
    if len(getattr(lowered._lowering, "_device_list", None) or [None]) != 1:
        raise FreshCompileError("the step spans several devices: it is compiled in this process")
    return _run_child("module", [], lowered.as_text().encode())


def child_compile(kind: str, donated: list[int], blob: bytes) -> dict[str, Any]:
    """In the fresh process: compile what the parent sent and return its ``figures``."""
    import jax

    if kind == "export":
        from jax import export

        exported = export.deserialize(bytearray(blob))
        return figures(jax.jit(exported.call, donate_argnums=tuple(donated)).lower(*exported.in_avals).compile())
    from jax._src import compiler
    from jax._src.interpreters import mlir
    from jax._src.lib import xla_client
    from jax._src.lib.mlir import ir

    device = jax.devices()[0]
    with mlir.make_ir_context():
        module = ir.Module.parse(blob.decode())
        options = compiler.get_compile_options(num_replicas=1, num_partitions=1, device_assignment=((device,),))
        executable = compiler.backend_compile_and_load(
            device.client, module, xla_client.DeviceList((device,)), options, []
        )
    stats = executable.get_compiled_memory_stats()
    fields = ("argument", "output", "alias", "temp", "generated_code")
    found: dict[str, Any] = {name: int(getattr(stats, f"{name}_size_in_bytes", 0) or 0) for name in fields}
    found["peak"] = peak_of(stats, device.platform)
    found["platform"] = device.platform
    return found


def load_autotuned(lowered: Any) -> Any:
    """``lowered`` compiled here with the shared autotune directory: the kernels a fresh process chose
    are loaded (no autotuning, no region taken) and kept in XLA's in-memory results, which this
    process's own later compilation of the same step then uses."""
    return lowered.compile(compiler_options={AUTOTUNE_FLAG.lstrip("-"): autotune_directory()})
