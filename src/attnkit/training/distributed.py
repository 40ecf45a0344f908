"""Data-parallel training on ``torch.distributed``, launched by torchrun: the process group, and the sums the
one training loop (``fit``) takes across processes.

N processes compute what one process computes with N times the gradient accumulation. Each optimizer step's
micro-batches come from the same seeded batch list on every rank, rank r taking those with index i % N == r; each
micro-batch's dropout is seeded from (seed, step, i), not from the process; the step's loss is normalised by the
units (target tokens or sentences) of all its micro-batches, summed across ranks first (fairseq's rule: the mean of
per-rank means that ``loss.mean()`` under DistributedDataParallel gives weighs a token of a short batch more); and
the gradients are summed, not averaged, across ranks. Every rank then holds the same gradients, takes the same
optimizer step and keeps bitwise the same weights, so rank 0 alone writes the run, in the single-process format.

The gradients are summed in one flat buffer after the backward passes, as fairseq's ``legacy_ddp`` does, rather than
by ``DistributedDataParallel``'s hooks during them: a rank may have no micro-batch at the end of an epoch (DDP would
wait for its backward forever), and one collective per step costs nothing at the model sizes this toolkit trains.
FSDP is not used: below about a billion parameters the weights fit on every device, and its gloo path has an open
silent-correctness bug (pytorch#162338).

A failing rank ends the run: torchrun sees the process exit and stops the others (its ``--max-restarts`` is 0 unless
given), so nobody waits in a collective for a peer that is gone.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch import nn

from attnkit.errors import InputError
from attnkit.training.task import TrainContext


def context_from_environment(device: torch.device) -> TrainContext:
    """The training context of this process: a single process, or, started by torchrun (``WORLD_SIZE`` > 1 in the
    environment), one rank of a process group that this call joins: NCCL with one GPU per process (any ``cuda``
    device becomes ``cuda:LOCAL_RANK``), gloo on the CPU."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size == 1:
        return TrainContext(device)
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if device.type == "cuda":  # one GPU per process, torchrun's convention (choose them with CUDA_VISIBLE_DEVICES)
        if local_rank >= torch.cuda.device_count():
            raise InputError(
                f"torchrun started {os.environ.get('LOCAL_WORLD_SIZE', '?')} processes on this machine but torch "
                f"sees {torch.cuda.device_count()} CUDA device(s); give --nproc-per-node at most that"
            )
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    elif device.type != "cpu":
        raise InputError(f"--device {device}: data-parallel training runs on CUDA (NCCL) or on the CPU (gloo)")
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return TrainContext(device, rank=rank, world_size=world_size)


def end_process_group() -> None:
    """Leave the process group, if this process joined one (at the end of a training command)."""
    if dist.is_initialized():
        dist.destroy_process_group()


def wait_for_main(context: TrainContext) -> None:
    """On ranks other than 0: wait until rank 0 calls ``main_done`` (it has written files the others read)."""
    if context.world_size > 1 and not context.is_main:
        dist.barrier()


def main_done(context: TrainContext) -> None:
    """On rank 0: release the ranks waiting in ``wait_for_main``."""
    if context.world_size > 1 and context.is_main:
        dist.barrier()


def broadcast_from_main(model: nn.Module, context: TrainContext) -> None:
    """Every rank takes rank 0's weights and buffers (as DistributedDataParallel does when it wraps a model), so that
    all start equal whatever each built or loaded."""
    if context.world_size == 1:
        return
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            dist.broadcast(tensor.data, src=0)


def share_of_step(batches_per_step: int, context: TrainContext) -> int:
    """The batches each process computes of a step of ``batches_per_step``: a run resumes on any process count that
    divides its batches per step (each process then accumulates its share), and on no other."""
    if batches_per_step % context.world_size:
        raise InputError(
            f"this run takes {batches_per_step} batches per optimizer step, which {context.world_size} processes "
            f"cannot share evenly; resume it on a number of processes that divides {batches_per_step}"
        )
    return batches_per_step // context.world_size


def sum_across(values: list[float], context: TrainContext) -> list[float]:
    """Each value summed over the ranks (float64: counts of units and sums of losses stay exact)."""
    if context.world_size == 1:
        return values
    reduced = torch.tensor(values, dtype=torch.float64, device=context.device)
    dist.all_reduce(reduced)
    return reduced.tolist()


def sum_on_device(values: torch.Tensor, context: TrainContext) -> torch.Tensor:
    """``values`` summed over the ranks where they are, in place (nothing is read back to the host); returned."""
    if context.world_size > 1:
        dist.all_reduce(values)
    return values


def sum_gradients(model: nn.Module, context: TrainContext) -> None:
    """Replace every gradient by its sum over the ranks, in one collective over a flat buffer (a parameter that got
    no gradient on a rank, or a rank that had no micro-batch, adds zeros)."""
    if context.world_size == 1:
        return
    params = [p for p in model.parameters() if p.requires_grad]
    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])  # (P,)
    dist.all_reduce(flat)
    offset = 0
    for p in params:
        p.grad = flat[offset : offset + p.numel()].view_as(p)
        offset += p.numel()
