"""``LoadHandle``: a load started by ``load_async`` or ``load_into_async``, running while the
caller does other work.

Each load runs the blocking call's own code (``_api``'s) on a Python thread of its own, the
handle's. That thread spends the load inside the extension with the GIL released (the
extension waits for the pipeline's thread, or the job thread, in 50 ms steps without it), so
it holds the caller's thread back only for the Python before and after the pipeline (opening
the catalogue, load_into's plan, wrapping the tensors), as the blocking call does. A native
future would need that Python to run somewhere too, and the job thread must not run it for
a load on several ranks (it is the thread MPI is initialised on), so a thread of its own is
the simple, single copy of the pipeline.

Python runs signal handlers on the main thread only, so a load on the handle's thread cannot
see Ctrl-C by itself: ``wait()`` waits on the caller's thread in short steps, and a
KeyboardInterrupt there cancels the load (``_core.Cancel``, read by the extension every
50 ms) as the blocking call's Ctrl-C does.
"""

from __future__ import annotations

import atexit
import contextlib
import math
import numbers
import threading
import time
from typing import Any, Callable, Generic, TypeVar

from . import _progress
from . import _weightcast as _core
from ._errors import USAGE, Error

T = TypeVar("T")

# How long wait() sleeps between looks at the load and at Python's signal handlers, seconds:
# the blocking call's signal check runs as often.
_WAIT_STEP_S = 0.05

# Handles whose load still runs: exit cancels and waits for them (_end_at_exit); several
# ranks' loads among them run one at a time per process (LoadHandle._start).
_running: set[LoadHandle[Any]] = set()
_running_lock = threading.Lock()


class LoadHandle(Generic[T]):
    """A load running in the background, started by ``weightcast.load_async`` or
    ``weightcast.load_into_async``; ``wait()`` gives what the blocking call returns.

    The load runs on a thread of the handle's own with the GIL released, so the caller's
    thread runs other Python and torch work meanwhile. A handle dropped without ``wait()``
    lets its load run to its end (the result is then freed; an error is dropped); a load
    still running when the interpreter exits is cancelled and waited for at exit, before
    weightcast's MPI is finalised.
    """

    def __init__(self, what: str) -> None:
        """Made by ``load_async`` and ``load_into_async``, not by the caller. ``what``: the
        call's name, for messages."""
        self._what = what
        self._several_ranks = False
        self._cancel = _core.Cancel()
        self._progress: _progress.Progress | None = None
        self._finished = threading.Event()
        self._result: Any = None
        self._error: BaseException | None = None
        self._stream: Any = None  # the stream the load was ordered with (CUDA), else None
        self._relay_thread: int | None = None  # the thread progress updates come on
        self._device: tuple[str, int] = ("cpu", 0)

    def done(self) -> bool:
        """Whether the load has ended (loaded, failed or cancelled); never blocks. Once True,
        ``wait()`` returns or raises at once."""
        return self._finished.is_set()

    @property
    def progress(self) -> _progress.Progress | None:
        """The latest ``Progress`` of the load on this rank (the one a ``progress=`` callable
        would get last), None before the first; the last chunk's once a load has succeeded.
        Updated at most every 0.1 s, whatever ``progress=`` says."""
        return self._progress

    def cancel(self) -> None:
        """Requests that the load stop; returns at once. The load ends within moments and
        ``wait()`` then raises ``Error`` 130 ("cancelled"); on several ranks every rank's load
        ends with this rank's message. Nothing happens to a load that has already ended.
        Tensors ``load_into`` had written already hold what landed so far."""
        self._cancel.cancel()

    def wait(self, timeout: float | None = None) -> T:
        """Waits for the load to end and returns what the blocking call returns (``load``:
        the dict of tensors; ``load_into``: the ``LoadReport``); called again, returns the same
        object again (or raises the same error).

        Args:
            timeout: the longest to wait, seconds (an int or float, at least 0); None waits
                as long as the load runs.

        Returns:
            The blocking call's result. On CUDA the data is complete on the stream the load
            was ordered after (the caller's current stream when the load was started), and
            the caller's current stream now waits for it too.

        Raises:
            TimeoutError: ``timeout`` passed first; the load continues (wait again, or
                ``cancel()``).
            Error: the load's own, with its ``status`` and message, as the blocking call
                raises it (130 after ``cancel()``); 64 for a ``timeout`` that is not a
                number of seconds at least 0, or a ``wait()`` from this load's own
                ``progress=`` callable (it would wait for itself).
            KeyboardInterrupt: Ctrl-C while waiting: the load is cancelled, and the
                interrupt raised once it has stopped (as the blocking call's Ctrl-C); a
                later ``wait()`` raises ``Error`` 130.
        """
        deadline = None if timeout is None else time.monotonic() + _seconds(timeout)
        if not self.done() and threading.get_ident() == self._relay_thread:
            # The load ends only once its progress thread has returned: waiting here would
            # wait for itself.
            raise Error(f"wait: called from the progress callable of this same "
                        f"{self._what}_async load, which would wait for itself; wait() "
                        "elsewhere", USAGE)
        try:
            # Short steps: each lets Python run its signal handlers on this thread (a lock
            # wait is interrupted on POSIX anyway; the steps keep it so where it is not).
            while not self._finished.wait(_WAIT_STEP_S):
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError(f"weightcast.{self._what}: the load did not end within "
                                       f"{timeout} s; it continues (wait() again, or "
                                       "cancel())")
        except KeyboardInterrupt:
            # As the blocking call: Ctrl-C stops the load, and the interrupt comes once it
            # has stopped, so nothing is left writing into the caller's memory.
            self._cancel.cancel()
            self._finished.wait()
            raise
        if self._error is not None:
            raise self._error
        self._after_stream()
        return self._result

    def __repr__(self) -> str:
        state = ("done" if self._error is None else "failed") if self.done() else "running"
        p = self._progress
        where = f", {p.bytes_done}/{p.bytes_total} bytes" if p is not None else ""
        return f"<weightcast.LoadHandle {self._what} {state}{where}>"

    # ---- used by _api ----------------------------------------------------------------------

    def _record(self, p: _progress.Progress) -> None:
        """The load's progress hook (the relay's thread): keeps the latest update."""
        self._relay_thread = threading.get_ident()
        self._progress = p

    @property
    def _cancel_request(self) -> Any:
        """The extension's ``Cancel`` that ``cancel()`` sets, for the load to read."""
        return self._cancel

    def _start(self, work: Callable[[], T], device: tuple[str, int],
              several_ranks: bool) -> LoadHandle[T]:
        """Runs ``work`` (the blocking call's load, checked already) on the handle's thread,
        ordered after the caller's current CUDA stream on ``device`` as it is now.

        Raises:
            Error: 64 when ``several_ranks`` and another handle's load on several ranks is
                not done: such loads run one at a time per process (every rank must make
                the same calls in the same order), the rule the extension enforces for the
                blocking calls too; refused here rather than from ``wait()``.
        """
        self._device = device
        self._several_ranks = several_ranks
        with _running_lock:
            if several_ranks and any(h._several_ranks for h in _running):
                raise Error(f"{self._what}_async: another load on several ranks is in "
                            "progress in this process (a LoadHandle not yet done): loads on "
                            "several ranks run one at a time per process, since every rank "
                            "must make the same calls in the same order; wait() for it first",
                            USAGE)
            _running.add(self)
        try:
            self._stream, inference = _caller_context(device)
            thread = threading.Thread(target=self._run, args=(work, inference),
                                      name=f"weightcast {self._what}", daemon=True)
            thread.start()
        except BaseException:
            with _running_lock:
                _running.discard(self)
            raise
        return self

    def _run(self, work: Callable[[], T], inference: bool) -> None:
        try:
            with contextlib.ExitStack() as scope:
                if self._stream is not None:
                    import torch

                    # The stream the caller had current: the load's own code (caller_stream,
                    # load_into's staged copies) reads "the current stream" on this thread.
                    scope.enter_context(torch.cuda.stream(self._stream))
                if inference:
                    import torch

                    # Inference mode is per thread: load_into accepted inference tensors
                    # because the caller was in it, and their copy_ happens here.
                    scope.enter_context(torch.inference_mode())
                self._result = work()
        except BaseException as e:  # handed to wait(); nothing escapes the thread
            self._error = e
        finally:
            # Out of the running set first: once wait() returns, the next load on several
            # ranks may start at once.
            with _running_lock:
                _running.discard(self)
            self._finished.set()

    def _after_stream(self) -> None:
        """The caller's current stream now, where it is another than the load's, waits for
        the load (a no-op on the same stream or off CUDA)."""
        if self._stream is None:
            return
        import torch

        current = torch.cuda.current_stream(self._device[1])
        if current != self._stream:
            current.wait_stream(self._stream)


def _seconds(timeout: object) -> float:
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise Error(f"wait: timeout={timeout!r} is not a number of seconds (or None)", USAGE)
    value = float(timeout)
    if math.isnan(value) or value < 0:
        raise Error(f"wait: timeout={timeout!r} is not a number of seconds at least 0", USAGE)
    return value


# CUDA's handle for the per-thread default stream (cudaStreamPerThread).
_PER_THREAD_STREAM = 2


def _caller_context(device: tuple[str, int]) -> tuple[Any, bool]:
    """(the stream the load is ordered after: the caller's current stream on ``device`` now,
    None off CUDA; whether the caller is in inference mode). The per-thread default stream
    names another stream on the handle's thread: a stream of torch's stands in for it,
    ordered after the work queued on it so far."""
    import sys

    torch = sys.modules.get("torch")
    if torch is None:
        return None, False
    inference = bool(torch.is_inference_mode_enabled())
    if device[0] != "cuda" or not torch.cuda.is_available():
        return None, inference
    current = torch.cuda.current_stream(device[1])
    if current.cuda_stream != _PER_THREAD_STREAM:
        return current, inference
    bridge = torch.cuda.Stream(device[1])
    bridge.wait_stream(current)
    return bridge, inference


def _end_at_exit() -> None:
    """At exit: cancels every load still running and waits for it, so none runs while the
    interpreter is torn down or MPI is finalised (registered after ``_weightcast.shutdown``,
    so it runs before it)."""
    with _running_lock:
        handles = list(_running)
    for h in handles:
        h.cancel()
    for h in handles:
        h._finished.wait()


atexit.register(_end_at_exit)
