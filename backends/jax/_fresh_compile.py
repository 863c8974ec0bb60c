"""Compiling a step in a fresh process, so that this process's pool takes nothing.

On a GPU XLA autotunes a compilation's kernels on real buffers; with growth on those buffers take
regions from the pool, and a pool grown on demand keeps every region for the life of the process
(docs/measurements.md). A compilation made in a fresh process costs this process nothing. Its
kernel choices are kept in XLA's per-fusion autotune directory (``AUTOTUNE_FLAG``), shared with
this process: when this process then compiles the same step it loads those choices instead of
autotuning, takes no region, and gets the program the fresh process sized, byte for byte.

A fresh process is started once and then serves every compilation asked of it (starting one with JAX
on a GPU costs seconds, about as much as compiling a small step): an idle one is reused, several
compile at once where several are asked at once, and each leaves after ``_IDLE_SECONDS`` without a
request or when this process ends. Its allocator is the platform's, so what its autotuning took is
given back at once and an idle one holds only its context.

Two ways in: a jitted function and its (abstract) arguments, exported with ``jax.export`` by their
leaves (any container crosses, an optimizer's named-tuple state included); or a ``Lowered`` step,
whose StableHLO text is compiled through JAX's own compile entry (internal to JAX: where that entry
is not there, the caller compiles here instead).
"""

from __future__ import annotations

import atexit
import json
import os
import select
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import IO, Any

__all__ = [
    "AUTOTUNE_FLAG",
    "FRESH_PLATFORMS",
    "FreshCompileError",
    "autotune_directory",
    "close_compilers",
    "compile_exported",
    "compile_lowered",
    "figures",
    "load_autotuned",
    "peak_of",
    "platform",
    "serve",
]

# Platforms whose compilations take regions from a pool grown on demand (XLA autotunes there).
FRESH_PLATFORMS = ("gpu", "cuda", "rocm", "tpu")
AUTOTUNE_FLAG = "--xla_gpu_per_fusion_autotune_cache_dir"
# Seconds a fresh process may take to import JAX and compile one step.
_FRESH_SECONDS = 900
# Seconds an idle compiling process waits for the next request before it leaves (and gives its
# context back): longer than a failed trial of a large step takes, so one search keeps its process.
_IDLE_SECONDS = 60.0
_MARK = "UNIMEM-COMPILED "

# Run by a fresh process: serve compilations until stdin closes or it is idle too long.
_SERVER = r"""
from unimem.backends.jax._fresh_compile import serve
serve()
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
    # The platform's allocator: the autotuning's buffers go back to the device at once, not to a pool.
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false", XLA_PYTHON_CLIENT_ALLOCATOR="platform")
    flags = [f for f in env.get("XLA_FLAGS", "").split() if not f.startswith(AUTOTUNE_FLAG + "=")]
    env["XLA_FLAGS"] = " ".join([*flags, f"{AUTOTUNE_FLAG}={directory}"])
    env["PYTHONPATH"] = os.pathsep.join(path for path in sys.path if path)
    return env


class _Compiler:
    """One fresh process that compiles what it is sent, one request at a time."""

    def __init__(self) -> None:
        # A file, not a pipe: XLA's logs never block it; open as long as the process lives (``close``).
        self.errors: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115
        self.process = subprocess.Popen(
            [sys.executable, "-c", _SERVER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.errors,
            env=_child_env(autotune_directory()),
        )

    def alive(self) -> bool:
        return self.process.poll() is None

    def ask(self, kind: str, donated: list[int], blob: bytes) -> dict[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        timer = threading.Timer(_FRESH_SECONDS, self.process.kill)  # a compilation that never ends
        timer.start()
        try:
            header = json.dumps({"kind": kind, "donated": donated, "length": len(blob)})
            self.process.stdin.write(header.encode() + b"\n" + blob)
            self.process.stdin.flush()
            for line in self.process.stdout:
                if line.startswith(_MARK.encode()):
                    answer: dict[str, Any] = json.loads(line[len(_MARK) :])
                    if "error" in answer:
                        raise FreshCompileError(answer["error"])
                    return dict(answer["figures"])
        except (BrokenPipeError, OSError, ValueError) as exc:
            raise FreshCompileError(f"{exc}\n{self.stderr_tail()}") from exc
        finally:
            timer.cancel()
        raise FreshCompileError(self.stderr_tail() or "the compiling process ended without an answer")

    def stderr_tail(self) -> str:
        self.errors.seek(0, os.SEEK_END)
        self.errors.seek(max(0, self.errors.tell() - 2000))
        return self.errors.read().decode(errors="replace")

    def close(self) -> None:
        if self.alive():
            try:
                assert self.process.stdin is not None
                self.process.stdin.close()  # it leaves at the end of its input
                self.process.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()
        self.errors.close()


_idle: list[_Compiler] = []  # processes that answered and wait for the next request
_lock = threading.Lock()


def _take() -> _Compiler:
    with _lock:
        while _idle:
            compiler = _idle.pop()
            if compiler.alive():
                return compiler
            compiler.close()  # it left (idle too long): its files closed
    return _Compiler()


def _run_child(kind: str, donated: list[int], blob: bytes) -> dict[str, Any]:
    compiler = _take()
    try:
        found = compiler.ask(kind, donated, blob)
    except FreshCompileError:
        compiler.close()
        raise
    with _lock:
        _idle.append(compiler)
    return found


@atexit.register
def close_compilers() -> None:
    """End every idle compiling process now (they also leave by themselves when idle)."""
    with _lock:
        compilers, _idle[:] = list(_idle), []
    for compiler in compilers:
        compiler.close()


def serve(idle: float = _IDLE_SECONDS) -> None:
    """In the fresh process: answer each request on stdin (a JSON header line, then its bytes) with a
    line of figures or of the error, until stdin closes or nothing comes for ``idle`` seconds."""
    import jax  # noqa: F401  (started once, for every request)

    source, out = sys.stdin.buffer, sys.stdout
    while True:
        ready, _, _ = select.select([source], [], [], idle)
        header = source.readline() if ready else b""
        if not header:
            return
        request = json.loads(header)
        blob = source.read(request["length"])
        try:
            answer: dict[str, Any] = {"figures": child_compile(request["kind"], request["donated"], blob)}
        except Exception as exc:  # the parent compiles in its own process instead
            answer = {"error": f"{type(exc).__name__}: {exc}"[-2000:]}
        out.write(_MARK + json.dumps(answer) + "\n")
        out.flush()


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
