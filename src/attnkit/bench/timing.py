"""Timing: the median of repeated calls, the implementations of a table timed in turns, a fixed number of threads.

``measure`` calls a function ``warmup`` times untimed (first-call allocation, oneDNN kernel selection, lazy
initialisation in the peers), then ``reps`` times timed with ``time.perf_counter``, and reports the median: the
median is robust to the occasional slow repetition on a shared machine. Every implementation in a suite is timed on
the same inputs, with the same number of threads (``fixed_threads``), in this process, except engines with a thread
pool of their own, which run in a child process that times its own calls (``attnkit.bench.isolated``, ``Elapsed``).
The implementations compared in one table are timed in turns (``measure_interleaved``): A B C, B C A, C A B, ... A
slow minute of a shared machine then costs every implementation alike; measured one after another, whichever ran
during it looked slower (the first release of these suites timed attnkit first and reported small/32 training at
0.76x torch.nn, while A/B runs in turns gave 1.2-1.4x).
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from attnkit.bench.isolated import Elapsed


@dataclass(frozen=True)
class Timing:
    median_s: float
    times_s: tuple[float, ...]


def measure(
    fn: Callable[[], object],
    *,
    warmup: int,
    reps: int,
    budget_s: float | None = None,
    sync: Callable[[], None] | None = None,
) -> Timing:
    """Call ``fn`` ``warmup`` times untimed, then time ``reps`` calls and return their median.

    ``budget_s`` caps slow measurements: if the last warm-up call shows that ``reps`` calls would take longer, fewer
    are timed, never fewer than 2 (each result reports how many). ``sync`` waits for the device (a GPU's queued
    kernels, ``gpu.synchronizer``) before each clock reading.
    """
    gc.collect()
    elapsed = None
    for _ in range(warmup):
        elapsed = timed_call(fn, sync)
    if budget_s is not None and elapsed is not None and elapsed * reps > budget_s:
        reps = max(2, min(reps, int(budget_s / elapsed)))
    times = [timed_call(fn, sync) for _ in range(reps)]
    return Timing(statistics.median(times), tuple(times))


def measure_interleaved(
    fns: Sequence[Callable[[], object]],
    *,
    warmup: int,
    reps: int,
    budget_s: float | None = None,
    settle_s: float = 0.0,
    sync: Callable[[], None] | None = None,
) -> list[Timing]:
    """``measure`` for several implementations at once, timed in turns: round r times every function once, starting
    from a different one each round, so that a slow phase of a shared, noisy machine (another job, a frequency
    change) falls on all of them alike instead of on whichever was measured during it.

    ``budget_s`` caps the rounds (never fewer than 2) by the slowest warm-up: ``reps`` rounds of all functions
    take at most about ``budget_s`` times their number.

    A function may run elsewhere (an engine in a child process, ``attnkit.bench.isolated``) and return the
    ``Elapsed`` seconds it measured there; those are its times. ``settle_s`` sleeps before each timed call, so that
    the threads of the engine called before it (in this process or another) have stopped spinning and left the
    cores idle (OpenMP pools spin for a while after a call before they sleep).
    """
    gc.collect()
    slowest = 0.0
    for fn in fns:
        for _ in range(warmup):
            slowest = max(slowest, timed_call(fn, sync))
    if budget_s is not None and warmup and slowest * reps > budget_s:
        reps = max(2, min(reps, int(budget_s / slowest)))
    times: list[list[float]] = [[] for _ in fns]
    for r in range(reps):
        for k in range(len(fns)):
            i = (r + k) % len(fns)
            if settle_s:
                time.sleep(settle_s)
            times[i].append(timed_call(fns[i], sync))
    return [Timing(statistics.median(t), tuple(t)) for t in times]


def timed_call(fn: Callable[[], object], sync: Callable[[], None] | None = None) -> float:
    """Seconds of one call: the call's own figure where it timed itself (``Elapsed``, a child process), else the
    parent's clock around it (after waiting for the device, where ``sync`` is given, at both ends)."""
    if sync is not None:
        sync()
    start = time.perf_counter()
    out = fn()
    if sync is not None:
        sync()
    elapsed = time.perf_counter() - start
    return out.seconds if isinstance(out, Elapsed) else elapsed


@contextmanager
def fixed_threads(n: int):
    """Run the block with ``torch.set_num_threads(n)`` (intra-op threads), then restore the previous number."""
    if n < 1:
        raise ValueError(f"threads={n} must be >= 1")
    previous = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
