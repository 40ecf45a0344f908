"""The input pipeline of the one training loop: the batches of the next optimizer step are collated on the host
while the device computes this one, into pinned (page-locked) memory on a GPU, and copied without blocking.

A GPU's step is queued in a few milliseconds and computed asynchronously; collating its batches (reading, padding,
the positions of the real tokens) on the main thread between two steps would leave the GPU idle meanwhile, and a
copy from pageable memory is synchronous. So on CUDA one thread collates a step ahead. The order does not change:
step k's batches are collated from the same indices, whenever that happens, and handed out in order, so a run and
its resume see the same tensors. On a CPU the device is the host: the batches are collated when they are needed.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from attnkit.training.task import Batch, TrainContext


def steps_ahead(device: torch.device) -> int:
    """How many optimizer steps are collated ahead of the one computing: one on CUDA (see the module docstring),
    none elsewhere (on a CPU a collating thread would take a core from the arithmetic)."""
    return 1 if device.type == "cuda" else 0


def prefetched(
    groups: Iterable[Sequence[list[int]]], collate: Callable[[list[int]], Batch], context: TrainContext
) -> Iterator[list[tuple[int, Batch]]]:
    """For each group (the example indices of one step's batches, in order), this process's batches: (index in the
    group, collated batch) for the indices i with i % world_size == rank, on the host, pinned on CUDA."""
    pin = context.device.type == "cuda"

    def collate_mine(group: Sequence[list[int]]) -> list[tuple[int, Batch]]:
        mine = [(i, collate(indices)) for i, indices in enumerate(group) if i % context.world_size == context.rank]
        return [(i, pinned(batch)) for i, batch in mine] if pin else mine

    ahead = steps_ahead(context.device)
    if not ahead:
        yield from map(collate_mine, groups)
        return
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="attnkit-collate") as pool:
        pending: deque[Future[list[tuple[int, Batch]]]] = deque()
        try:
            for group in groups:
                pending.append(pool.submit(collate_mine, group))
                if len(pending) > ahead:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:  # the loop stopped early (a budget, an error): what was collated ahead is dropped
            for future in pending:
                future.cancel()


def pinned(batch: Batch) -> Batch:
    """The batch in page-locked host memory, from which a copy to a GPU runs asynchronously."""
    return Batch(tuple(t.pin_memory() for t in batch.tensors), batch.size)


def to_device(batch: Batch, device: torch.device) -> Batch:
    """The batch on ``device``; from pinned memory the copies do not wait for the device (``non_blocking``)."""
    return Batch(tuple(t.to(device, non_blocking=True) for t in batch.tensors), batch.size)
