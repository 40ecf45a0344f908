"""Dynamic batching: one inference worker thread, fed by a bounded queue that the event loop fills.

The policy is text-embeddings-inference's: whenever the worker is free it takes the queued requests, oldest first,
up to a token budget counted as padded cost (longest input x number of inputs, what a padded batch computes) and
a count of inputs; it may first wait ``max_wait_s`` for more to arrive (Triton's and Ray Serve's "max queue delay";
0 by default, so a lone request never waits). Requests of different kinds, or translations with different decoding
parameters, never share a batch: the head of the queue picks the group, and the others keep their place.

Back-pressure: ``submit`` refuses at once (``QueueFull``) when ``max_queue`` requests are waiting, so a client
learns in microseconds that it should retry, and the queue (memory, latency) stays bounded. A request that is not
answered within ``timeout_s`` fails with ``asyncio.TimeoutError``, and one whose handler is cancelled (its client
went away: ``server.py``) with ``CancelledError``; either leaves the queue at once, so that it neither holds a place
of ``max_queue`` nor runs.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)


# A batch is split where its padding would exceed both this share of its real tokens and MIN_WASTE tokens: the
# requests queued at one moment have any lengths, and on a CPU every padded position costs as much as a real one
# (attention as the square); below MIN_WASTE another model call costs more than the padding.
MAX_PADDING = 0.25
MIN_WASTE = 128


def padding_bounded(sorted_seqs: list[list[int]]) -> list[list[list[int]]]:
    """Consecutive runs of length-sorted inputs whose padding (longest x count - real tokens) stays within
    MAX_PADDING x their real tokens or MIN_WASTE tokens. Outputs do not depend on the batch, so the split changes
    speed, never results."""
    parts: list[list[list[int]]] = []
    real = 0
    for seq in sorted_seqs:  # ascending: the newest input is the longest of its run
        waste = len(seq) * (len(parts[-1]) + 1) - (real + len(seq)) if parts else 0
        if parts and (waste <= MAX_PADDING * (real + len(seq)) or waste <= MIN_WASTE):
            parts[-1].append(seq)
            real += len(seq)
        else:
            parts.append([seq])
            real = len(seq)
    return parts


class QueueFull(Exception):
    """The bounded queue is full: answer 429 with Retry-After."""


class Draining(Exception):
    """The server is shutting down and takes no new work: answer 503."""


@dataclass(eq=False)  # compared by identity: the queue removes the one job that gave up
class Job:
    """One request: its inputs (token ids) and the future its handler awaits."""

    group: tuple  # requests batch together only with the same group (kind + decoding parameters)
    seqs: list[list[int]]
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    enqueued: float = field(default_factory=time.perf_counter)

    @property
    def longest(self) -> int:
        return max((len(s) for s in self.seqs), default=0)


@dataclass(frozen=True)
class BatchStats:
    """What the worker reports after each batch (for the metrics)."""

    n_requests: int
    n_inputs: int
    padded_tokens: int
    inference_s: float
    queue_s: list[float]


# Runs one batch: the group, the inputs of every job in it (in a list per job) -> one result per job.
Runner = Callable[[tuple, list[list[list[int]]]], list[object]]


class Batcher:
    def __init__(
        self,
        runner: Runner,
        *,
        max_queue: int = 64,
        max_batch_tokens: int = 8192,
        max_batch_inputs: int = 64,
        max_wait_s: float = 0.0,
        batching: bool = True,
        on_batch: Callable[[BatchStats], None] | None = None,
    ):
        """``batching=False`` runs one request at a time (the baseline the load benchmark compares with)."""
        self.runner, self.on_batch = runner, on_batch
        self.max_queue, self.max_batch_tokens, self.max_batch_inputs = max_queue, max_batch_tokens, max_batch_inputs
        self.max_wait_s, self.batching = max_wait_s, batching
        self._queue: deque[Job] = deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._draining = False
        self._busy = 0  # requests the worker is running now
        self._thread = threading.Thread(target=self._work, name="attnkit-inference", daemon=True)

    # -- event-loop side -------------------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def queue_size(self) -> int:
        return len(self._queue)

    def in_flight(self) -> int:
        return len(self._queue) + self._busy

    async def submit(self, group: tuple, seqs: list[list[int]], timeout_s: float) -> object:
        """Queue one request and wait for its result. Raises QueueFull, Draining, asyncio.TimeoutError, or what the
        runner raised for this batch."""
        loop = asyncio.get_running_loop()
        job = Job(group, seqs, loop.create_future(), loop)
        with self._cond:
            if self._draining or self._stopping:
                raise Draining()
            if len(self._queue) >= self.max_queue:
                raise QueueFull()
            self._queue.append(job)
            self._cond.notify()
        try:
            return await asyncio.wait_for(asyncio.shield(job.future), timeout_s)
        finally:
            if not job.future.done():  # timed out, or the client left: out of the queue (the worker may have it)
                with self._cond:  # with the worker's lock, so that the worker never takes a job that gave up
                    job.future.cancel()
                    if job in self._queue:
                        self._queue.remove(job)  # O(queue), at most max_queue

    def drain(self) -> None:
        """Refuse new work; what is queued still runs."""
        with self._cond:
            self._draining = True

    def stop(self, timeout_s: float = 30.0) -> None:
        """Finish the queued work, then end the worker (bounded wait)."""
        with self._cond:
            self._draining = self._stopping = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    # -- worker side -----------------------------------------------------------------------------------------------

    def _take(self) -> list[Job]:
        """The next batch: the oldest job, then later jobs of its group while the padded-token budget and the
        input count allow (always at least the oldest, however big)."""
        if not self._queue:
            return []
        head = self._queue.popleft()
        batch, longest, count = [head], head.longest, len(head.seqs)
        if not self.batching:
            return batch
        kept: deque[Job] = deque()
        while self._queue:
            job = self._queue.popleft()
            new_longest, new_count = max(longest, job.longest), count + len(job.seqs)
            if (
                job.group == head.group
                and new_count <= self.max_batch_inputs
                and new_longest * new_count <= self.max_batch_tokens
            ):
                batch.append(job)
                longest, count = new_longest, new_count
            else:
                kept.append(job)
        self._queue.extendleft(reversed(kept))  # the rest keep their order at the front
        return batch

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._stopping:
                    self._cond.wait(0.5)  # bounded: re-checks the stop flag
                if not self._queue and self._stopping:
                    return
            if self.max_wait_s > 0 and self.batching:
                time.sleep(self.max_wait_s)  # let more requests arrive (Triton's max_queue_delay)
            with self._cond:
                batch = self._take()
                self._busy = len(batch)
            if batch:
                self._run(batch)
            with self._cond:
                self._busy = 0

    def _run(self, batch: list[Job]) -> None:
        start = time.perf_counter()
        try:
            results = self.runner(batch[0].group, [job.seqs for job in batch])
        except Exception as err:  # the handler of each request turns it into its answer
            if not _is_input_error(err):
                log.exception("inference failed for a batch of %d requests", len(batch))
            _settle(batch, [None] * len(batch), err)
            return
        elapsed = time.perf_counter() - start
        if self.on_batch is not None:  # before the answers: a client that reads /metrics after its answer sees it
            n_inputs = sum(len(job.seqs) for job in batch)
            longest = max(job.longest for job in batch)
            self.on_batch(
                BatchStats(len(batch), n_inputs, longest * n_inputs, elapsed, [start - job.enqueued for job in batch])
            )
        _settle(batch, results, None)


def _is_input_error(err: Exception) -> bool:
    from attnkit.errors import InputError

    return isinstance(err, (InputError, ValueError))


def _settle(batch: list[Job], results: list[object], error: Exception | None) -> None:
    """Hand a batch's results (or its error) to the waiting handlers: one call into each event loop for the whole
    batch, not one per request (each call wakes the loop through its self-pipe, a system call). A server has one
    loop; in-process test clients may bring several."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[Job, object]]] = {}
    for job, result in zip(batch, results):
        by_loop.setdefault(job.loop, []).append((job, result))

    def settle(pairs: list[tuple[Job, object]]) -> None:
        for job, result in pairs:
            if job.future.done():  # timed out or the client left meanwhile
                continue
            if error is not None:
                job.future.set_exception(error)
            else:
                job.future.set_result(result)

    for loop, pairs in by_loop.items():
        try:
            loop.call_soon_threadsafe(settle, pairs)
        except RuntimeError:  # the event loop has closed (shutdown): nobody is waiting for these results
            pass
