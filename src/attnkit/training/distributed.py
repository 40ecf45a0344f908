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
    world_size = _launch_number("WORLD_SIZE", "1", minimum=1)
    if world_size == 1:
        return TrainContext(device)
    # What torchrun sets beside WORLD_SIZE, and init_process_group reads: a WORLD_SIZE left in a shell without them
    # was a KeyError traceback (RANK) or torch's ValueError (MASTER_ADDR); a RANK past WORLD_SIZE waited in
    # init_process_group for a rendezvous that never comes.
    missing = [name for name in ("RANK", "MASTER_ADDR", "MASTER_PORT") if name not in os.environ]
    if missing:
        raise InputError(
            f"WORLD_SIZE={world_size} is set in the environment but {', '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not: start data-parallel training with torchrun "
            "(torchrun --nproc-per-node N -m attnkit ...), or unset WORLD_SIZE to train in one process"
        )
    rank, local_rank = _launch_number("RANK", "0", minimum=0), _launch_number("LOCAL_RANK", "0", minimum=0)
    if rank >= world_size:
        raise InputError(
            f"RANK={rank} in the environment is not one of WORLD_SIZE={world_size} ranks (0 .. {world_size - 1})"
        )
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


def _launch_number(name: str, default: str, *, minimum: int) -> int:
    """The whole number torchrun put in environment variable ``name``; anything else is an ``InputError`` naming it."""
    value = os.environ.get(name, default)
    try:
        number = int(value)
    except ValueError:
        number = minimum - 1
    if number < minimum:
        raise InputError(
            f"{name}={value!r} in the environment: expected a whole number of at least {minimum} (torchrun sets it; "
            "unset it to train in one process)"
        )
    return number


def end_process_group() -> None:
    """Leave the process group, if this process joined one (at the end of a training command)."""
    if dist.is_initialized():
        dist.destroy_process_group()


def wait_for_main(context: TrainContext) -> None:
    """On ranks other than 0: wait until rank 0 calls ``main_done`` (it has written files the others read). A rank 0
    that refused its input (a locked --out, an unknown dataset) and ended instead is one error line here, not gloo's
    "Connection closed by peer" traceback below rank 0's own error line."""
    if context.world_size > 1 and not context.is_main:
        try:
            dist.barrier()
        except RuntimeError:  # torch's DistBackendError: the peer's connection is gone
            raise InputError(
                f"rank {context.rank}: rank 0 ended (or stopped answering) before the other ranks could go on; its "
                "error says why"
            ) from None


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
