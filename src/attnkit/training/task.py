"""What a task gives the one training loop (``attnkit.training.loop.fit``): its batches, the loss of a batch with
its normaliser, its evaluation, and the metric that decides "better"; and where training runs (``TrainContext``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import Tensor, nn

from attnkit.devices import check_device


@dataclass(frozen=True)
class Batch:
    """One batch as the task's loss reads it. ``size`` is its normaliser: sentences or target tokens."""

    tensors: tuple[Tensor, ...]
    size: int


@dataclass
class BatchLoss:
    """The loss of one batch: ``value`` is summed over the batch's ``size`` units, or their mean if ``mean``.

    ``sums`` are statistics summed over the units (e.g. ``{"accuracy": correct}``); the loop reports each divided by
    the units it covers. Tensors stay where they were computed: the loop reads a step's sums once, with its loss.
    """

    value: Tensor
    mean: bool = False
    sums: dict[str, Tensor | float] = field(default_factory=dict)


class StepTask(Protocol):
    """The part of a ``Task`` that one optimizer step reads (``attnkit.training.step.train_step``): its batches come
    collated."""

    stats: tuple[str, ...]  # the keys of every ``BatchLoss.sums`` (summed across processes in a fixed order)

    def loss(self, model: nn.Module, batch: Batch) -> BatchLoss:
        """Forward pass and loss of one batch (the model is in training mode; the loop runs it under autocast)."""
        ...


class Task(StepTask, Protocol):
    """What differs between tasks. Attributes, then the four calls the loop makes (``loss`` is ``StepTask``'s)."""

    metric: str  # the evaluation metric that decides "better" (a key of ``evaluate``'s result)
    higher_is_better: bool  # for ``metric``; ties are broken by the lower validation "loss"
    unit: str  # what ``Batch.size`` counts ("sentences", "tokens"), for the log
    d_model: int  # model width, for the schedule of eq. 3 ("noam")
    fingerprint: str  # of the training data: a resume on other data is refused

    def collate(self, indices: list[int]) -> Batch:
        """The padded tensors of one batch, on the CPU (the loop moves them), with every index the loss needs made
        here, so that a step never reads the device: a thread may call this while the device computes."""
        ...

    def epoch_batches(self, generator: torch.Generator | None) -> Sequence[list[int]]:
        """The example indices of each batch of one epoch, in training order, drawn from ``generator`` (None: a
        deterministic order, used to count the batches). A list of lists, or ``data.batching.Batches``."""
        ...

    def evaluate(self, model: nn.Module, device: torch.device) -> dict[str, float] | None:
        """Validation metrics including "loss" and ``metric``, or None without validation data (the model is in eval
        mode, gradients off)."""
        ...


@dataclass(frozen=True)
class TrainContext:
    """Where training runs: the device, and this process's place among the ``world_size`` processes of a
    data-parallel run (``attnkit.training.distributed.context_from_environment`` makes one under torchrun).

    Rank 0 is the one that writes the run directory; every rank computes the same steps (see ``fit``).
    """

    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    rank: int = 0
    world_size: int = 1

    def __post_init__(self) -> None:  # a device's name ("cuda", "auto") is taken too
        if not isinstance(self.device, torch.device):
            object.__setattr__(self, "device", check_device(self.device))

    @property
    def is_main(self) -> bool:
        """Whether this process writes the run's files and reports progress (rank 0)."""
        return self.rank == 0
