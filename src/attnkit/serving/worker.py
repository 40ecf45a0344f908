"""The inference worker in a process of its own (what ``attnkit serve`` runs by default).

Why a process and not a thread: the model's forward pass is Python between its torch kernels, and so is every
request the event loop parses and answers. In one process both need the GIL, and each waits for the other at every
hand-over: on 2 cores a model thread beside a busy Python thread ran at 55% of its own speed, and the event loop
stalled behind it (``benchmarks/serve_load.py``). With the model in a child process, the event loop has its
interpreter to itself, the model runs at full speed on its own core, and the batcher's thread only waits on a pipe
(which releases the GIL). text-embeddings-inference and Triton separate the HTTP front from the model the same way.

The child loads the same model (run directory or BERT folder, precision, device) and answers ``run_batch`` calls
over a ``multiprocessing`` pipe: (group, jobs) in, each job's outputs (or the error) out. The pipe pickles; it
carries only our own token ids, floats and ``Candidate``s between two processes of one server, nothing from a file
or a client. Started with ``spawn``: forking a process whose torch thread pools already run is unsafe.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import threading
from typing import Any

from attnkit.errors import InputError

# How long the child may take to load and warm up its model (MiniLM on a busy 2-core machine: a few seconds).
START_TIMEOUT_S = 300.0


class WorkerDied(RuntimeError):
    """The inference process ended unexpectedly (killed, out of memory): the server answers 503, not a result."""


class ProcessRunner:
    """``runner(group, jobs) -> results``, computed by ``run_batch`` in a child process. One call at a time (the
    batcher has one worker thread); ``start`` blocks until the child's model is loaded and warmed up."""

    def __init__(self, spec: str, precision: str = "fp32", device: str = "cpu", threads: int | None = None):
        self.spec, self.precision, self.device, self.threads = spec, precision, device, threads
        self.inference: dict = {}  # the child's ``ServedModel.inference()``, once started
        self._conn: multiprocessing.connection.Connection | None = None
        self._process: multiprocessing.process.BaseProcess | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        context = multiprocessing.get_context("spawn")
        ours, theirs = context.Pipe()
        self._process = context.Process(
            target=_serve_batches,
            args=(theirs, self.spec, self.precision, self.device, self.threads),
            name="attnkit-inference",
            daemon=True,  # never outlives the server
        )
        self._process.start()
        theirs.close()
        self._conn = ours
        if not ours.poll(START_TIMEOUT_S):
            self.close()
            raise WorkerDied(f"the inference process did not load the model within {START_TIMEOUT_S:g} s")
        kind, message = self._receive()
        if kind != "ready":
            self.close()
            raise _rebuild(kind, message)
        self.inference = message

    def __call__(self, group: tuple, jobs: list[list[list[int]]]) -> list[Any]:
        with self._lock:
            if self._conn is None:
                raise WorkerDied("the inference process is not running")
            try:
                self._conn.send((group, jobs))
            except OSError:  # the child is gone (its end of the pipe closed)
                raise self._died() from None
            kind, value = self._receive()
        if kind != "ok":
            raise _rebuild(kind, value)
        return value

    def _receive(self) -> tuple[str, Any]:
        assert self._conn is not None
        try:
            return self._conn.recv()  # blocks without the GIL while the child computes
        except (EOFError, OSError):
            raise self._died() from None

    def _died(self) -> WorkerDied:
        code = self._process.exitcode if self._process is not None else None
        return WorkerDied(f"the inference process ended (exit code {code})")

    def close(self, timeout_s: float = 10.0) -> None:
        """Ask the child to finish, then wait for it (bounded); kill it if it does not end."""
        if self._conn is not None:
            try:
                self._conn.send(None)
            except (OSError, ValueError):
                pass
            self._conn.close()
            self._conn = None
        if self._process is not None:
            self._process.join(timeout_s)
            if self._process.is_alive():
                self._process.kill()
                self._process.join(timeout_s)
            self._process = None


def _rebuild(kind: str, message: str) -> Exception:
    """The child's error as the parent raises it: a client's fault stays an ``InputError`` (the handler answers
    4xx), anything else is the server's (logged, 500)."""
    if kind == "input_error":
        return InputError(message)
    if kind == "value_error":
        return ValueError(message)
    return RuntimeError(f"inference failed in the worker process: {message}")


def _serve_batches(conn, spec: str, precision: str, device: str, threads: int | None) -> None:
    """The child's whole life: load, warm up, say ready, then answer one batch at a time until told to stop."""
    import signal

    import torch

    # Ctrl-C reaches the whole process group, and a service manager may send SIGTERM to every process of the
    # service: the server drains its requests through this process, so only the server ends it (None on the pipe,
    # or the pipe closing when the server is gone).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    from attnkit.allocator import tune_malloc
    from attnkit.serving.execute import run_batch, warm_up
    from attnkit.serving.models import load_model

    tune_malloc()  # a spawned process: the server's settings do not carry over
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        served = load_model(spec, precision, torch.device(device))
        warm_up(served)
    except Exception as err:
        conn.send(("input_error" if isinstance(err, InputError) else "error", str(err)))
        return
    conn.send(("ready", served.inference()))
    while True:  # bounded by the parent: None, or its end of the pipe closing, ends it
        try:
            message = conn.recv()
        except EOFError:
            return
        if message is None:
            return
        group, jobs = message
        try:
            conn.send(("ok", run_batch(served, group, jobs)))
        except InputError as err:
            conn.send(("input_error", str(err)))
        except ValueError as err:
            conn.send(("value_error", str(err)))
        except Exception as err:  # the parent logs it as a bug and answers 500
            conn.send(("error", f"{type(err).__name__}: {err}"))
