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

Three ways in: a jitted function and its (abstract) arguments, exported with ``jax.export`` by their
leaves (any container crosses, an optimizer's named-tuple state included); a ``Lowered`` step, whose
StableHLO text is compiled through JAX's own compile entry; or a ``Lowered`` step compiled here
through JAX's persistent compilation cache (``compile_through_cache``): the fresh process compiles
the very module and options this process would, under the key this process computes, and this
process loads the executable (no compilation here, no autotuning, no region), as does the step's own
call later. Each uses JAX internals: where they are not there, the caller compiles here instead.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import select
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from unimem.backends.base import CompiledProgram

__all__ = [
    "AUTOTUNE_FLAG",
    "FRESH_PLATFORMS",
    "REMAT",
    "FreshCompileError",
    "autotune_directory",
    "cannot_run",
    "close_compilers",
    "compile_exported",
    "compile_lowered",
    "compile_through_cache",
    "compiled_during_call",
    "figures",
    "fresh_compilations",
    "load_autotuned",
    "peak_of",
    "persistent_cache_directory",
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
# An instruction XLA's rematerialization pass made: a clone named ``<name>.remat`` (``.remat2`` when
# cloned again, ``gte.remat``/``bitcast.remat`` for its users, ``.remat_compressed``), defined on its line.
REMAT = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]*\.remat\w*(?:\.\d+)*\s+=", re.MULTILINE)
# JAX's settings of its persistent compilation cache that decide where an entry goes, whether it is
# written and under which key: a fresh process takes this process's values with each request.
_CACHE_SETTINGS = (
    "jax_compilation_cache_dir",
    "jax_compilation_cache_include_metadata_in_key",
    "jax_persistent_cache_min_entry_size_bytes",
    "jax_compilation_cache_max_size",
)
# The seconds of each compilation a fresh process made for this process (a load from the persistent
# cache is not one): what the user paid for there.
fresh_compilations: list[float] = []

# Run by a fresh process: serve compilations until stdin closes or it is idle too long.
_SERVER = r"""
from unimem.backends.jax._fresh_compile import serve
serve()
"""


class FreshCompileError(RuntimeError):
    """The fresh process could not compile the step (its error output is the message)."""


def figures(compiled: Any) -> dict[str, Any]:
    """The peak of a compiled step, XLA's memory-analysis fields and whether XLA rematerialized it, as
    plain data."""
    analysis = compiled.memory_analysis()
    fields = ("argument", "output", "alias", "temp", "generated_code")
    found: dict[str, Any] = {name: int(getattr(analysis, f"{name}_size_in_bytes", 0) or 0) for name in fields}
    found["platform"] = platform(compiled)
    found["peak"] = peak_of(analysis, found["platform"])
    try:
        text = compiled.as_text()
    except Exception:  # a stage without its compiled text (an older JAX): not known
        text = None
    found["rematerialized"] = REMAT.search(text) is not None if isinstance(text, str) and text else None
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


def _child_env() -> dict[str, str]:
    # The platform's allocator: the autotuning's buffers go back to the device at once, not to a pool.
    # XLA_FLAGS stay this process's: they are part of a persistent cache entry's key (the autotune
    # directory goes with each request instead).
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false", XLA_PYTHON_CLIENT_ALLOCATOR="platform")
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
            env=_child_env(),
        )

    def alive(self) -> bool:
        return self.process.poll() is None

    def ask(self, kind: str, donated: list[int], blob: bytes, extra: dict[str, Any]) -> dict[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        timer = threading.Timer(_FRESH_SECONDS, self.process.kill)  # a compilation that never ends
        timer.start()
        try:
            request = {**extra, "kind": kind, "donated": donated, "length": len(blob)}
            header = json.dumps({**request, "autotune": autotune_directory()})
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


def _run_child(kind: str, donated: list[int], blob: bytes, **extra: Any) -> dict[str, Any]:
    compiler = _take()
    try:
        found = compiler.ask(kind, donated, blob, extra)
    except FreshCompileError:
        compiler.close()
        raise
    seconds = found.pop("compile_seconds", None)
    with _lock:
        _idle.append(compiler)
        if seconds is not None:
            fresh_compilations.append(float(seconds))
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
            if request["kind"] == "cached":
                found = _compile_into_cache(request, blob)
            else:
                found = child_compile(request["kind"], request["donated"], blob, request.get("autotune"))
            answer: dict[str, Any] = {"figures": found}
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


def child_compile(kind: str, donated: list[int], blob: bytes, autotune: str | None = None) -> dict[str, Any]:
    """In the fresh process: compile what the parent sent, its kernel choices kept in ``autotune`` (the
    shared autotune directory), and return its ``figures`` and the seconds the compilation took."""
    import jax

    overrides: dict[str, str] = {} if autotune is None else {AUTOTUNE_FLAG.lstrip("-"): autotune}
    hits = _cache_hits()
    began = time.perf_counter()
    if kind == "export":
        from jax import export

        exported = export.deserialize(bytearray(blob))
        lowered = jax.jit(exported.call, donate_argnums=tuple(donated)).lower(*exported.in_avals)
        options: dict[str, str | bool] = {**overrides}
        found = figures(lowered.compile(compiler_options=options or None))
        return {**found, "compile_seconds": _seconds_if_compiled(began, hits)}
    from jax._src import compiler
    from jax._src.interpreters import mlir
    from jax._src.lib import xla_client
    from jax._src.lib.mlir import ir

    device = jax.devices()[0]
    with mlir.make_ir_context():
        module = ir.Module.parse(blob.decode())
        options = compiler.get_compile_options(
            num_replicas=1, num_partitions=1, device_assignment=((device,),), env_options_overrides=overrides
        )
        executable = compiler.backend_compile_and_load(
            device.client, module, xla_client.DeviceList((device,)), options, []
        )
    seconds = round(time.perf_counter() - began, 3)
    return {**_executable_figures(executable, device.platform), "compile_seconds": seconds}


def _executable_figures(executable: Any, on: str) -> dict[str, Any]:
    """A loaded executable's memory figures (``figures``' fields) and whether XLA rematerialized it."""
    stats = executable.get_compiled_memory_stats()
    fields = ("argument", "output", "alias", "temp", "generated_code")
    found: dict[str, Any] = {name: int(getattr(stats, f"{name}_size_in_bytes", 0) or 0) for name in fields}
    found["peak"] = peak_of(stats, on)
    found["platform"] = on
    try:
        text = "\n".join(module.to_string() for module in executable.hlo_modules())
    except Exception:  # an executable without its modules (an older jaxlib): not known
        found["rematerialized"] = None
    else:
        found["rematerialized"] = REMAT.search(text) is not None
    return found


_hits: list[int] = []  # persistent-cache hits this process saw, once counting (a fresh process counts its own)


def _count_hit(event: str, **_: Any) -> None:
    if event == "/jax/compilation_cache/cache_hits":
        _hits[0] += 1


def _cache_hits() -> int:
    """The persistent-cache hits seen so far, counted from JAX's own events (listening from the first ask)."""
    if not _hits:
        from jax import monitoring

        _hits.append(0)
        monitoring.register_event_listener(_count_hit)
    return _hits[0]


def _seconds_if_compiled(began: float, hits: int) -> float | None:
    """The seconds since ``began`` where what was asked compiled; None where it was loaded from the cache."""
    return None if _cache_hits() > hits else round(time.perf_counter() - began, 3)


def _compile_into_cache(request: dict[str, Any], blob: bytes) -> dict[str, Any]:
    """In the fresh process: compile the parent's module with the parent's options and devices, through
    JAX's persistent compilation cache set as the parent's (every entry written, whatever its seconds),
    so that the entry lands under the key the parent computes; its ``figures``, and the seconds of the
    compilation (None where the entry was there already)."""
    import jax
    import numpy as np
    from jax._src import compilation_cache, compiler
    from jax._src.interpreters import mlir
    from jax._src.lib import xla_client
    from jax._src.lib.mlir import ir

    settings = {**request["cache"], "jax_persistent_cache_min_compile_time_secs": 0.0}
    changed = False
    for name, value in settings.items():
        if getattr(jax.config, name) != value:
            jax.config.update(name, value)
            changed = True
    if changed:
        compilation_cache.reset_cache()  # the cache is looked up once per process: look again
    split = request["options_length"]
    options = xla_client.CompileOptions.ParseFromString(blob[:split])
    by_id = {device.id: device for device in jax.devices()}
    chosen = [by_id[i] for i in request["devices"]]
    devices: Any = np.empty(len(chosen), dtype=object)
    devices[:] = chosen
    hits, began = _cache_hits(), time.perf_counter()
    with mlir.make_ir_context():
        module = ir.Module.parse(blob[split:])
        executable = compiler.compile_or_get_cached(
            chosen[0].client,
            module,
            devices.reshape(request["shape"]),
            options,
            [],
            xla_client.DeviceList(tuple(chosen)),
        )
    return {**_executable_figures(executable, chosen[0].platform), "compile_seconds": _seconds_if_compiled(began, hits)}


def load_autotuned(lowered: Any) -> Any:
    """``lowered`` compiled here with the shared autotune directory: the kernels a fresh process chose
    are loaded (no autotuning, no region taken) and kept in XLA's in-memory results, which this
    process's own later compilation of the same step then uses."""
    return lowered.compile(compiler_options={AUTOTUNE_FLAG.lstrip("-"): autotune_directory()})


# --- compiled elsewhere, loaded here: JAX's persistent compilation cache -----------------------------

_local = threading.local()  # a thread's compilation to be made in a fresh process (``compile_through_cache``)
_original: list[Any] = []  # JAX's own ``compile_or_get_cached``, once it is wrapped


def persistent_cache_directory() -> str | None:
    """The persistent compilation cache this process and its fresh compilers share: the one JAX is set
    to, else unimem's (``$XDG_CACHE_HOME/unimem/jax-compilation-cache``), turned on here and left on so
    that training's first step at a size compiled for the search loads it. None where it cannot serve:
    the user turned the cache off, or JAX's XLA caches leave out the per-fusion autotune directory (a
    step this process compiles itself would then autotune here), or this JAX lacks what this uses."""
    import jax

    try:
        from jax._src import compilation_cache, compiler
        from jax._src import config as settings
    except ImportError:  # a JAX without these internals
        return None
    if not hasattr(compiler, "compile_or_get_cached") or not hasattr(compilation_cache, "reset_cache"):
        return None
    if not settings.enable_compilation_cache.value:
        return None
    caches = settings.persistent_cache_enable_xla_caches.value or ""
    if caches != "all" and "xla_gpu_per_fusion_autotune_cache_dir" not in caches:
        return None
    directory: str | None = settings.compilation_cache_dir.value
    if directory is None:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        path = base / "unimem" / "jax-compilation-cache"
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError:  # a read-only home: no cache to share
            return None
        directory = str(path)
        jax.config.update("jax_compilation_cache_dir", directory)
        compilation_cache.reset_cache()  # a process that compiled before looked for no cache, once
    return directory


def _wrapped_compile_or_get_cached(
    backend: Any, computation: Any, devices: Any, compile_options: Any, host_callbacks: Any, *rest: Any, **kw: Any
) -> Any:
    """JAX's ``compile_or_get_cached``; for a thread inside ``compile_through_cache`` or ``compiled_during_call``,
    the fresh process compiles first (what JAX then finds in the cache, it loads). Inside a call, a program the
    fresh process cannot compile is compiled here, as JAX does: the user's step goes on."""
    pending, recorded = getattr(_local, "pending", False), getattr(_local, "recorded", None)
    if pending or recorded is not None:
        _local.pending = False  # one module per step: a second in the same call compiles as JAX does
        try:
            found = _compile_elsewhere(computation, devices, compile_options, host_callbacks)
        except FreshCompileError:
            if pending:
                raise
        else:
            if recorded is not None:
                why = cannot_run(found, devices.flat[0])
                peak, arguments, remat = int(found["peak"]), int(found["argument"]), bool(found.get("rematerialized"))
                recorded.append(CompiledProgram(peak, arguments, remat, why is not None))
                if why is not None:
                    raise _refusal()(why)
    return _original[0](backend, computation, devices, compile_options, host_callbacks, *rest, **kw)


def cannot_run(found: dict[str, Any], device: Any) -> str | None:
    """Why a compiled program (its ``figures``) cannot run on ``device`` now, as an out-of-memory message;
    None where it may. Certain only: what its peak adds to the bytes in use (its arguments are in use
    already, or counted as if) passes the pool's limit, or its temporaries, one buffer, are larger than
    the largest free block and the room for a new region alike."""
    try:
        stats = device.memory_stats() or {}
    except Exception:  # a device without figures: nothing known against it
        return None
    limit, in_use = stats.get("bytes_limit"), stats.get("bytes_in_use")
    if not limit or in_use is None:
        return None
    need = int(found["peak"]) + max(0, int(in_use) - int(found["argument"]))
    block, pool = stats.get("largest_free_block_bytes"), stats.get("pool_bytes")
    room = None if block is None or pool is None else max(int(block), int(limit) - int(pool))
    if need <= limit and (room is None or int(found["temp"]) <= room):
        return None
    return (
        f"RESOURCE_EXHAUSTED: Out of memory while trying to allocate {int(found['temp'])} bytes (sized by unimem "
        f"before it ran: not run): the compiled program's peak with what is in use, {need} bytes, or its "
        f"temporaries against the largest buffer the pool can hand out ({room} bytes), pass the pool's limit of "
        f"{int(limit)} bytes"
    )


_refusals: list[type[BaseException]] = []


def _refusal() -> type[BaseException]:
    """JAX's own out-of-memory error class, for a program refused before it ran: every handler of JAX's
    errors (the batch search's, a user's) takes it as the out-of-memory error it would have been."""
    if not _refusals:
        import jax

        class SizedOutOfMemory(jax.errors.JaxRuntimeError):
            """A program that cannot fit, refused before it ran (nothing allocated, nothing kept)."""

        _refusals.append(SizedOutOfMemory)
    return _refusals[0]


def _compile_elsewhere(computation: Any, devices: Any, compile_options: Any, host_callbacks: Any) -> dict[str, Any]:
    """The fresh process compiles this module with these options and devices into the persistent cache; its
    figures. ``FreshCompileError`` for what it cannot compile so that this process loads it."""
    if host_callbacks:  # not written to the cache (they are pointers of this process)
        raise FreshCompileError("the step has host callbacks: it is compiled in this process")
    if getattr(devices, "size", 1) != 1:
        raise FreshCompileError("the step spans several devices: it is compiled in this process")
    import jax
    from jax._src.interpreters import mlir

    options = compile_options.SerializeAsString()
    module = mlir.module_to_bytecode(computation)
    return _run_child(
        "cached",
        [],
        options + module,
        options_length=len(options),
        devices=[int(device.id) for device in devices.flat],
        shape=list(devices.shape),
        cache={name: getattr(jax.config, name) for name in _CACHE_SETTINGS},
    )


def _wrap() -> None:
    """JAX's ``compile_or_get_cached`` wrapped, once and for good: a thread inside neither
    ``compile_through_cache`` nor ``compiled_during_call`` goes straight through."""
    from jax._src import compiler

    with _lock:
        if not _original:
            _original.append(compiler.compile_or_get_cached)
            compiler.compile_or_get_cached = _wrapped_compile_or_get_cached


@contextlib.contextmanager
def compiled_during_call() -> Iterator[tuple[list[CompiledProgram], str] | None]:
    """Every program this thread compiles inside is compiled in a fresh process into the persistent
    compilation cache and loaded here (no autotuning here, no region taken), as ``compile_through_cache``
    does for one step: a call of the user's step sized as it runs. A program that cannot fit
    (``cannot_run``) is refused with JAX's out-of-memory error before it runs: a failed execution would
    take seconds and keep its outputs for the life of the process. Yields the list it fills with each
    program (``CompiledProgram``), and the cache's directory;
    None where the cache cannot serve (then nothing changes)."""
    directory = persistent_cache_directory()
    if directory is None:
        yield None
        return
    _wrap()
    recorded: list[CompiledProgram] = []
    _local.recorded = recorded
    try:
        yield recorded, directory
    finally:
        _local.recorded = None


def compile_through_cache(lowered: Any) -> tuple[Any, str]:
    """``lowered`` compiled in a fresh process into the persistent compilation cache and loaded here
    (where JAX holds it in memory already, nothing is compiled anywhere): the ``Compiled`` step, and the
    cache's directory. ``FreshCompileError`` where the cache cannot serve (``persistent_cache_directory``),
    the step spans several devices, or the fresh process failed."""
    if len(getattr(lowered._lowering, "_device_list", None) or [None]) != 1:
        raise FreshCompileError("the step spans several devices: it is compiled in this process")
    directory = persistent_cache_directory()
    if directory is None:
        raise FreshCompileError("JAX's persistent compilation cache cannot serve here")
    _wrap()
    _local.pending = True
    try:
        compiled = lowered.compile()
    finally:
        _local.pending = False
    return compiled, directory
