"""A monitor's link to its sampler process: the process, the two pipes to it, and the talk over them.

``Monitor`` (``unimem.observe.monitor``) holds one ``SamplerLink``. The link starts the sampler
(``unimem.observe.sampler``) with the arguments the monitor gives, waits for its ready line,
sends it lines (commands, and the records a streamed file gets from this process), reads its
replies, and ends it: its input closed, so it writes what it holds and exits, and killed only if
it does not.

- Timeouts: the sampler has ``START_TIMEOUT`` seconds to say it is ready and ``REPLY_TIMEOUT`` to
  answer a request; a line that cannot be sent within ``SEND_TIMEOUT`` (the sampler far behind)
  is dropped and counted, so the training loop never stalls on it.
- Kills lose nothing the sampler holds: a link never stopped (its monitor dropped, or this process
  exiting) closes the sampler's input and gives it ``RELEASE_TIMEOUT`` seconds to write it, then
  closes every descriptor it held: a dropped monitor keeps nothing open.
- Forks: the pipes are raw descriptors this process alone owns (no buffered file object whose
  lock a fork could copy held); a forked child calls ``forked()``, which makes the locks anew,
  closes its copies of the pipes and leaves the sampler to the parent. The sampler watches this
  process itself, so it ends when this process dies even while forked children live on.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable
from typing import IO, Any

from unimem.errors import UnimemError

__all__ = ["RELEASE_TIMEOUT", "REPLY_TIMEOUT", "SEND_TIMEOUT", "START_TIMEOUT", "SamplerLink"]

START_TIMEOUT = 60.0  # a cold interpreter on a loaded CI machine can take seconds
REPLY_TIMEOUT = 30.0
SEND_TIMEOUT = 1.0  # a sampler this far behind drops a record rather than stall the training loop
RELEASE_TIMEOUT = 2.0  # at exit, time the sampler has to write what it holds before it is killed
_FINISH_TIMEOUT = 5.0  # at stop, time the sampler has to write what it holds before it is killed


def _kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()


class _Pipe:
    """One end of a pipe to or from the sampler, and the lock every writer takes.

    Shared with the finalizer that closes it when a monitor is never stopped: a daemon thread
    still sending at exit then finds it closed, never a number the process reused.
    """

    def __init__(self, fd: int = -1) -> None:
        self.fd = fd
        self.lock = threading.Lock()

    def close(self) -> None:
        with self.lock:  # a line being written finishes first: the sampler never reads half of it
            if self.fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(self.fd)
            self.fd = -1


def _release(proc: subprocess.Popen[bytes], pipe: _Pipe, inlet: _Pipe, stderr: IO[bytes]) -> None:
    """A monitor never stopped (its process exits, or it was dropped): close the sampler's input
    so it writes what it holds and ends, kill it only if it does not, and close what was held open
    for it (the pipe from it, the file of its error output)."""
    pipe.close()
    try:
        proc.wait(timeout=RELEASE_TIMEOUT)
    except subprocess.TimeoutExpired:
        _kill(proc)
    inlet.close()
    stderr.close()


class SamplerLink:
    """The sampler process of one monitor and the pipes to it.

    Args:
        note: Called with a line for the recording's notes when the sampler is lost mid-run.

    Attributes:
        proc (subprocess.Popen[bytes] | None): The sampler process; None before ``start`` and
            in a forked child.
        dropped (int): Lines not sent because the sampler was too far behind.
    """

    def __init__(self, note: Callable[[str], None]) -> None:
        self._note = note
        self._conversation = threading.Lock()  # one request and its reply at a time
        self.proc: subprocess.Popen[bytes] | None = None
        self._pipe = _Pipe()  # to the sampler
        self._inlet = _Pipe()  # from it: the read end of its stdout
        self._inbox = bytearray()
        self._stderr: IO[bytes] | None = None
        self._finalizer: weakref.finalize | None = None
        self.dropped = 0

    def start(self, args: list[str]) -> dict[str, Any]:
        """Launch the sampler with ``args`` and wait for its ready line; returns that line's object.

        Raises:
            UnimemError: The sampler did not say it was ready within ``START_TIMEOUT`` seconds or
                exited (it is killed; the message quotes its error output).
        """
        # The child resolves imports exactly as this process does (editable installs, PYTHONPATH, a checkout).
        code = (
            "import json, sys; sys.path[:] = json.loads(sys.argv.pop(1)); "
            "from unimem.observe.sampler import main; sys.exit(main(sys.argv[1:]))"
        )
        # Kept open for the sampler's lifetime (read if it dies), closed in finish.
        self._stderr = stderr = tempfile.TemporaryFile()  # noqa: SIM115
        # Pipes made here, not by Popen: raw descriptors this process alone owns (no buffered file
        # object whose lock a fork could copy held), closed by a forked child at once.
        stdin_read, to_sampler = os.pipe()
        self._pipe = _Pipe(to_sampler)
        from_sampler, stdout_write = os.pipe()
        self._inlet = _Pipe(from_sampler)
        try:
            proc = subprocess.Popen(
                [sys.executable, "-c", code, json.dumps(sys.path), *args],
                stdin=stdin_read,
                stdout=stdout_write,
                stderr=self._stderr,
                close_fds=True,
            )
        except BaseException:
            self.close_pipes()
            raise
        finally:
            os.close(stdin_read)
            os.close(stdout_write)
        os.set_blocking(to_sampler, False)  # a stuck sampler must not stall the training loop
        self.proc = proc
        self._finalizer = weakref.finalize(self, _release, proc, self._pipe, self._inlet, stderr)
        try:
            ready: dict[str, Any] = json.loads(self.read_line(START_TIMEOUT))
        except (UnimemError, ValueError) as exc:
            self.finish(kill=True)
            raise UnimemError(f"monitor: the sampler process did not start ({exc}){self.stderr_tail()}") from None
        return ready

    def read_line(self, timeout: float) -> str:
        """The sampler's next reply line, within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self._inbox:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._inlet.fd], [], [], left)[0]:
                raise UnimemError(f"no answer from the sampler process in {timeout:g} s")
            chunk = os.read(self._inlet.fd, 1 << 16)
            if not chunk:
                raise UnimemError(
                    f"the sampler process exited (code {None if self.proc is None else self.proc.poll()})"
                )
            self._inbox += chunk
        line, _, rest = bytes(self._inbox).partition(b"\n")
        self._inbox = bytearray(rest)
        return line.decode()

    def send(self, line: bytes) -> bool:
        """One line down the sampler's pipe; False if it is gone, or so far behind that the line is dropped."""
        with self._pipe.lock:
            fd = self._pipe.fd
            if fd < 0:
                return False
            view, deadline = memoryview(line), time.monotonic() + SEND_TIMEOUT
            try:
                while view:
                    try:
                        view = view[os.write(fd, view) :]
                    except BlockingIOError:
                        left = deadline - time.monotonic()
                        if left <= 0 or not select.select([], [fd], [], left)[1]:
                            self.dropped += 1
                            return False
            except OSError:
                return False  # the sampler is gone; the monitor's stop() says so
            return True

    def stderr_tail(self) -> str:
        """The end of what the sampler wrote to its error output, as ``": ..."``; empty if nothing."""
        if self._stderr is None:
            return ""
        self._stderr.seek(0)
        text = self._stderr.read().decode(errors="replace").strip()
        return f": {text[-2000:]}" if text else ""

    def ask(self, command: str) -> dict[str, Any] | None:
        """One request to the sampler; None if it is gone (its data is then what was collected)."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return None
        with self._conversation:
            try:
                if not self.send(command.encode() + b"\n"):
                    raise UnimemError("its pipe is closed or full")
                reply: dict[str, Any] = json.loads(self.read_line(REPLY_TIMEOUT))
            except (OSError, ValueError, UnimemError) as exc:
                self._note(f"sampler process lost: {exc}{self.stderr_tail()}")
                return None
        return reply

    def close_pipes(self) -> None:
        self._pipe.close()
        self._inlet.close()

    def finish(self, kill: bool) -> None:
        """End the sampler: its input closed so it writes what it holds and exits (killed at once
        with ``kill``, else after ``_FINISH_TIMEOUT`` seconds), then the pipes closed.

        After a kill the error output stays readable (``stderr_tail``) until a later ``finish``.
        """
        proc = self.proc
        if proc is None:
            return
        self._pipe.close()  # its end of input: the sampler writes what it holds and ends
        if kill:
            _kill(proc)
        else:
            try:
                proc.wait(timeout=_FINISH_TIMEOUT)
            except subprocess.TimeoutExpired:
                _kill(proc)
        self.close_pipes()
        if self._finalizer is not None:
            self._finalizer.detach()
        if self._stderr is not None and not kill:
            self._stderr.close()
            self._stderr = None

    def forked(self) -> None:
        """In a forked child: locks made anew (a thread of the parent may have held one at the fork),
        the pipes closed, and the sampler left to the parent."""
        self._conversation = threading.Lock()
        self._pipe.lock = threading.Lock()
        self._inlet.lock = threading.Lock()
        self.close_pipes()
        if self._finalizer is not None:
            self._finalizer.detach()  # the sampler is the parent's to end
        self.proc = None
