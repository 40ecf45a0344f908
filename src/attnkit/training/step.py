"""``train_step``, the one optimizer step of the training loop (``loop.fit``), the same for every device, precision
and process count: the loss of the step's batches, their gradients summed across the batches and the processes and
clipped (``_gradients``), the non-finite guard, then the update: eager, under float16's gradient scaler, or replayed
from CUDA graphs (``graphs.py``). The step reads the device once, at its end (``read_step``).

Each batch's dropout is seeded from (seed, step, index) (``_dropout_seed``); how a step's batches are accumulated
and shared among processes (fairseq's way) is in loop.py's docstring.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from attnkit.config import TrainConfig
from attnkit.training.distributed import sum_across, sum_gradients, sum_on_device
from attnkit.training.graphs import GraphedStep, stepped
from attnkit.training.guards import check_step
from attnkit.training.precision import autocast
from attnkit.training.prefetch import to_device
from attnkit.training.task import Batch, BatchLoss, StepTask, TrainContext


@dataclass
class StepOutcome:
    """What one optimizer step gives the loop's log (``run.record_step``): its summed loss and statistics, or why it
    did not step."""

    loss_sum: float  # summed over the step's units
    size: int
    sums: dict[str, float]
    problem: str | None  # a non-finite loss or gradient, described; the optimizer did not step


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    task: StepTask,
    batches: Sequence[tuple[int, Batch]],
    cfg: TrainConfig,
    context: TrainContext,
    scaler: torch.amp.GradScaler | None = None,
    *,
    step: int,
    loss: Callable[[nn.Module, Batch], BatchLoss] | None = None,
    graphs: GraphedStep | None = None,
) -> StepOutcome:
    """One optimizer step over this process's batches of the step: (index i in the step's group, the batch on the
    host), those with i % world_size == rank. ``loss`` is ``task.loss`` or its compiled form. With ``scaler``
    (fp16), the loss is scaled for the backward pass and the gradients unscaled before clipping.

    Nothing in the step waits for the device but one read at its end: the loss and the statistics are summed where
    they are computed, the normaliser is the batches' own count of units (known when they were built), and the
    step's sums and gradient norm come back to the host together, once, for the log line and the non-finite guard.
    With ``graphs`` (``training.graphs.use_graphs``) the same step is replayed from CUDA graphs.
    """
    loss = loss or task.loss
    device = context.device
    if graphs is not None:
        i, batch = stepped(batches)
        values, to_sum, recorded = graphs.gradients(batch, _dropout_seed(cfg.seed, step, i))
        mine, n_units = [(i, recorded)], float(batch.size)  # (the batch as the graph read it, for the diagnosis)
        loss_total, *stat_totals, norm = read_step(values)  # (1 + K + 1,)
        loss_total *= to_sum
    else:
        mine = [(i, to_device(batch, device)) for i, batch in batches]  # the one device move
        (n_units,) = sum_across([float(sum(batch.size for _, batch in mine))], context)  # the step's normaliser
        loss_total, stat_totals, norm = _gradients(
            model, optimizer, task, mine, n_units, cfg, context, scaler, step, loss
        )

    def replay() -> None:  # the same forward passes, with the same dropout masks, for the diagnosis
        with autocast(cfg.precision, device):
            for i, batch in mine:
                torch.manual_seed(_dropout_seed(cfg.seed, step, i))
                task.loss(model, batch)

    # A finite loss whose scaled gradients overflowed float16 is the scaler's to handle: its step() skips the update
    # and its update() lowers the scale. Only a non-finite loss (or any non-finite value without a scaler) is a
    # problem of the run. Every rank holds the same summed values here, so every rank decides alike.
    scaler_overflow = scaler is not None and math.isfinite(loss_total) and not math.isfinite(norm)
    problem = None if scaler_overflow else check_step(model, loss_total, norm, step=step, replay=replay)
    if problem is not None:
        if graphs is None:  # (a graph's gradients stay where it reads them; it zeroes them itself)
            optimizer.zero_grad(set_to_none=True)
        if scaler is not None:
            scaler.update()  # closes the step it unscaled (and lowers the scale: the gradients were not finite)
        return StepOutcome(0.0, int(n_units), {}, problem)
    if graphs is not None:
        graphs.update()
    elif scaler is not None:
        scaler.step(optimizer)  # skipped when the unscaled gradients held an inf or NaN
        scaler.update()
    else:
        optimizer.step()
    return StepOutcome(loss_total, int(n_units), dict(zip(task.stats, stat_totals)), None)


def _gradients(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    task: StepTask,
    mine: list[tuple[int, Batch]],
    n_units: float,
    cfg: TrainConfig,
    context: TrainContext,
    scaler: torch.amp.GradScaler | None,
    step: int,
    loss: Callable[[nn.Module, Batch], BatchLoss],
) -> tuple[float, list[float], float]:
    """The step's gradients, summed over its batches and processes and clipped, left in the parameters; returns
    the summed loss, the summed statistics and the gradient norm, read together (the step's one read)."""
    device = context.device
    optimizer.zero_grad(set_to_none=True)
    # float64: exact for a mean times its size (MPS has no float64)
    sums = torch.zeros(
        1 + len(task.stats), dtype=torch.float32 if device.type == "mps" else torch.float64, device=device
    )
    for i, batch in mine:
        torch.manual_seed(_dropout_seed(cfg.seed, step, i))  # the same masks whichever process computes batch i
        with autocast(cfg.precision, device):
            out = loss(model, batch)
        # sum_b loss_b / n_units; a mean loss is weighted by its share of the units, which is exactly 1.0 (and so
        # bitwise the plain mean) when one batch makes the step.
        weighted = out.value * (batch.size / n_units) if out.mean else out.value / n_units
        (scaler.scale(weighted) if scaler is not None else weighted).backward()
        value = out.value.detach().to(sums.dtype)
        sums[0] += value * batch.size if out.mean else value
        for key, stat in out.sums.items():
            sums[1 + task.stats.index(key)] += stat
    sum_gradients(model, context)
    sum_on_device(sums, context)
    if scaler is not None:
        scaler.unscale_(optimizer)  # clip (and check) the true gradients, not the scaled ones
    grad_norm = nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_norm or float("inf"))
    loss_total, *stat_totals, norm = read_step(torch.cat([sums, grad_norm.reshape(1).to(sums.dtype)]))  # (1 + K + 1,)
    return loss_total, stat_totals, norm


def read_step(values: torch.Tensor) -> list[float]:
    """The step's one read from the device: its summed loss, statistics and gradient norm, (K,) -> K floats. On a
    GPU this waits for the step's queued kernels (a synchronisation); it is the only one a step makes."""
    return values.tolist()


def _dropout_seed(seed: int, step: int, index: int) -> int:
    """The torch seed of batch ``index`` of optimizer step ``step``: its dropout masks depend on nothing else (not on
    the process that computes it, nor on where a resumed run restarted)."""
    digest = hashlib.blake2b(f"{seed}:{step}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)
