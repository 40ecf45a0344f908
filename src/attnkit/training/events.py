"""What the one training loop reports while it runs (typed events, rendered by the CLI) and what it returns."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Prepared:
    """Emitted by a task's setup, before ``fit``: the data the run trains on."""

    n_train: int
    n_valid: int
    valid_source: str  # "file", "held out from train", "the training set (...)", or "none"
    vocab_size: int
    truncated: int  # inputs cut to max_len
    max_len: int
    labels: list[str] | None  # a classifier's label names


@dataclass(frozen=True)
class Planned:
    """Emitted once, before the first step: the budgets and the learning-rate schedule they sized."""

    total_steps: int
    steps_per_epoch: int
    batches_per_epoch: int
    schedule: str
    warmup: int
    start_step: int  # > 0 when resuming
    graphed: bool = False  # each step replayed from CUDA graphs (``training.graphs``)


@dataclass(frozen=True)
class Resumed:
    step: int
    epoch: int


@dataclass(frozen=True)
class Step:
    step: int
    total_steps: int
    epoch: int  # the epoch in progress (1-based)
    epoch_progress: float  # epochs completed, fractional
    loss: float  # per unit (sentence or token) of this step
    lr: float
    size: int  # units in this step
    stats: dict[str, float]  # this step's statistics, per unit (e.g. accuracy)
    running_loss: float  # per unit since the last evaluation
    running: dict[str, float]  # the statistics since the last evaluation


@dataclass(frozen=True)
class Evaluated:
    step: int
    epoch: float  # epochs completed, fractional
    metrics: dict[str, float]  # validation metrics (keys as the task gives them: "loss", "accuracy", "bleu"...)
    train_loss: float  # per unit since the previous evaluation
    train: dict[str, float]  # training statistics since the previous evaluation
    best: bool  # these weights are now the run's model


@dataclass(frozen=True)
class Checkpointed:
    step: int
    path: Path


@dataclass(frozen=True)
class Skipped:
    step: int
    message: str


@dataclass(frozen=True)
class Warned:
    """Something the user should change, said once (the CLI prints it as one ``warning:`` line)."""

    message: str


@dataclass(frozen=True)
class Stopped:
    """Training ended before its plan: patience ran out, or ``max_minutes`` was spent (said once, at the end)."""

    step: int
    reason: str  # "patience" or "max_minutes"
    message: str


Event = Prepared | Planned | Resumed | Step | Evaluated | Checkpointed | Skipped | Warned | Stopped


def warn_only(event: Event) -> None:
    """The train functions' default ``on_event``: a ``Warned`` event becomes a Python warning (``UserWarning``), so
    that a caller of the Python API hears what the command line prints as ``warning:``; the rest are dropped."""
    if isinstance(event, Warned):
        warnings.warn(event.message, UserWarning, stacklevel=2)


@dataclass(frozen=True)
class FitResult:
    steps: int
    epochs: float  # epochs completed, fractional
    seconds: float
    stopped_by: str  # "epochs", "max_steps", "max_minutes" or "patience"
    best: dict[str, float]  # metrics of the evaluation whose weights are the model ({} without validation)
    best_step: int
    best_epoch: float
    last: dict[str, float]  # metrics of the last evaluation
    skipped: int
