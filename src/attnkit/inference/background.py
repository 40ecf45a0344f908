"""Compiling in a thread of its own, for a server: no call waits for the compiler.

With the compiled engine (``attnkit.inference.programs``) the first call of a new shape bucket compiles its
program: seconds with Inductor's cache warm, about a minute on a new machine, which a server's request cannot wait
(it would time out). An engine made with ``background=True`` runs such a call eagerly, on the same static state,
and hands the compilation to the one thread below; the calls after it run the program.

One lock keeps the compiler and the programs apart: the thread holds it while it compiles, and a call holds it while
it runs a compiled program. Dynamo's switch for skipping guards (``programs.running``) is global to the process, not
to a thread, so a program must not run while another is being compiled; a call that finds the lock taken runs
eagerly instead of waiting.

The compiler gives way to the calls. Compiling is Python (Dynamo's tracing, Inductor's passes) and holds the GIL;
an eager step releases it at each of its ~500 operators, and gets it back only when the compiler's thread lets go,
up to 5 ms later (``sys.getswitchinterval``): measured, a 0.4 s call took 2-40 s while a program compiled beside it
(docs/serving.md). So the compiler's thread pauses at its next Python call whenever a call is running, and goes on
when none is: it compiles in the server's idle time. What it is inside when a call starts, it finishes first (a C
function, such as Python's ``compile`` of the code Inductor writes, does not stop for a trace function), and its C++
builds run in processes of their own: served, a request beside it took ~2x its time (at most 3.5x), not 5-100x.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import sys
import threading
import time
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager

import torch

log = logging.getLogger(__name__)


class Compiler:
    """The process's compiling thread (started at the first submission) and what it has made."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # held while compiling, and while a compiled program runs
        self.known: set[Hashable] = set()  # programs compiled
        self.failed: set[Hashable] = set()  # programs whose compilation raised: their calls stay eager
        self._queued: set[Hashable] = set()
        self._jobs: queue.SimpleQueue[tuple[Hashable, Callable[[], None]]] = queue.SimpleQueue()
        self._idle = threading.Condition()
        self._thread: threading.Thread | None = None
        self._calls = 0  # calls inside ``program`` now: the compiler's thread waits while there are any
        self._no_calls = threading.Event()
        self._no_calls.set()
        self._counting = threading.Lock()
        self._slice_ends = 0.0  # the compiler runs on, calls or not, until then (``_give_way``)
        self._here = threading.local()  # ``compiling_here``

    @contextmanager
    def program(self, key: Hashable, compile: Callable[[], None]) -> Iterator[bool]:
        """Whether the call inside the block may run the compiled program ``key``: yes once it is compiled and
        while no other is being compiled (the block then holds the lock); no otherwise, and ``compile`` (which
        compiles it by running it once) is queued if it is neither made, queued nor failed. Inside
        ``compiling_here``, a program not made is compiled first, in the caller's thread."""
        if key not in self.known and getattr(self._here, "active", False):
            with self.lock:  # compiled in this thread, now: ``compiling_here``
                compile()
            with self._idle:
                self.known.add(key)
        with self._counting:
            self._calls += 1
            self._no_calls.clear()
        try:
            if key in self.known and self.lock.acquire(blocking=False):
                try:
                    yield True
                finally:
                    self.lock.release()
            else:
                self.submit(key, compile)
                yield False
        finally:
            with self._counting:
                self._calls -= 1
                if not self._calls:
                    self._no_calls.set()

    @contextmanager
    def compiling_here(self) -> Iterator[None]:
        """Inside the block, a call of this thread compiles the programs it needs itself and runs them (a server's
        warm-up, which no client waits for: without the pauses of the compiler's thread, which make compiling
        ~1.6x slower, measured)."""
        self._here.active = True
        try:
            yield
        finally:
            self._here.active = False

    def submit(self, key: Hashable, compile: Callable[[], None]) -> None:
        """Queue ``compile`` for the thread, to run in the caller's grad mode (Dynamo's programs are made for one)."""
        with self._idle:
            if key in self.known or key in self.failed or key in self._queued:
                return
            self._queued.add(key)
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name="attnkit-compile", daemon=True)
                self._thread.start()
        inference, grad = torch.is_inference_mode_enabled(), torch.is_grad_enabled()

        def job() -> None:
            with torch.inference_mode(inference), torch.set_grad_enabled(grad):
                compile()

        self._jobs.put((key, job))

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until every queued program is compiled (or failed); False if ``timeout_s`` passed first."""
        with self._idle:
            return self._idle.wait_for(lambda: not self._queued, timeout_s)

    def _work(self) -> None:
        while True:
            key, job = self._jobs.get()
            started = time.perf_counter()
            try:
                with self.lock:
                    sys.settrace(self._give_way)  # this thread's Python calls only, and only while it compiles
                    try:
                        job()
                    finally:
                        sys.settrace(None)
                made = True
                log.info("compiled a decoding program in the background in %.1f s", time.perf_counter() - started)
            except Exception:  # noqa: BLE001 - a program that cannot be compiled leaves its calls eager
                log.exception("compiling a decoding program failed; its calls stay eager")
                made = False
            with self._idle:
                (self.known if made else self.failed).add(key)
                self._queued.discard(key)
                self._idle.notify_all()

    def _give_way(self, frame: object, event: str, arg: object) -> None:  # returns None: no tracing of lines
        """The compiler's trace function: at a Python call, wait while calls run; after ``GIVE_WAY_S`` of calls without
        a pause, compile on for ``SLICE_S`` regardless, so that a server never idle still gets its programs (at
        ~5% of the compiler's speed) and a lock held by a paused compiler and wanted by a call stops neither."""
        if event == "call" and self._calls and time.monotonic() >= self._slice_ends:
            if not self._no_calls.wait(GIVE_WAY_S):
                self._slice_ends = time.monotonic() + SLICE_S


GIVE_WAY_S = 1.0
SLICE_S = 0.05
COMPILER = Compiler()


def compiling_here() -> contextlib.AbstractContextManager[None]:
    """The process's ``Compiler.compiling_here``: calls inside the block compile what they need in the caller's
    thread."""
    return COMPILER.compiling_here()
