"""The one training loop of every task, read top to bottom in ``fit``.

A task (``Task``) supplies what differs: the batches of an epoch, the loss of a batch with its normaliser
(sentences or target tokens), an evaluation, and the metric that decides "better". The loop owns the rest: steps,
gradient accumulation, the learning-rate schedule sized to the budgets, the budgets themselves (epochs, steps,
minutes), the non-finite guard, checkpoints (the best weights and/or the last K steps) and bit-exact resume.

Gradient accumulation follows fairseq: the batches of one optimizer step are consecutive in the epoch's order, and
the step's loss is the sum of their summed losses divided by the sum of their normalisers, so a step over two
batches equals a step over one batch holding both. A distributed version only has to all-reduce that normaliser
(the global token count) and the gradients; ``TrainContext`` is where its device and process group will come in.

The library never prints: progress is a stream of typed events (``Event``) that the CLI renders.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import torch
from torch import Tensor, nn

from attnkit.config import TrainConfigBase
from attnkit.errors import InputError
from attnkit.training import checkpoint
from attnkit.training.classify import set_learning_rate
from attnkit.training.guards import NonFiniteError, check_step
from attnkit.training.losses import autocast
from attnkit.training.schedules import learning_rate
from attnkit.training.state import STATE, FitState, load_fit_state, save_fit_state

CHECKPOINTS = "checkpoints"  # RUN/checkpoints/step_N.safetensors: the last K step checkpoints (for averaging)
NOAM_WARMUP = 4000  # §5.3: "We used warmup_steps = 4000"
TIME_PROBE_STEPS = 20  # steps timed before judging whether a warmup fits inside max_minutes


# ---------------------------------------------------------------------------------------------------------------
# What a task supplies


@dataclass(frozen=True)
class Batch:
    """One batch as the task's loss reads it. ``size`` is its normaliser: sentences or target tokens."""

    tensors: tuple[Tensor, ...]
    size: int


@dataclass
class BatchLoss:
    """The loss of one batch: ``value`` is summed over the batch's ``size`` units, or their mean if ``mean``.

    ``sums`` are statistics summed over the units (e.g. ``{"accuracy": correct}``); the loop reports each divided by
    the units it covers.
    """

    value: Tensor
    mean: bool = False
    sums: dict[str, float] = field(default_factory=dict)


class Task(Protocol):
    """What differs between tasks. Attributes, then the four calls the loop makes."""

    metric: str  # the evaluation metric that decides "better" (a key of ``evaluate``'s result)
    higher_is_better: bool  # for ``metric``; ties are broken by the lower validation "loss"
    unit: str  # what ``Batch.size`` counts ("sentences", "tokens"), for the log
    d_model: int  # model width, for the schedule of eq. 3 ("noam")
    fingerprint: str  # of the training data: a resume on other data is refused

    def epoch_batches(self, generator: torch.Generator | None) -> list[list[int]]:
        """The example indices of each batch of one epoch, in training order, drawn from ``generator`` (None: a
        deterministic order, used to count the batches)."""
        ...

    def collate(self, indices: list[int]) -> Batch:
        """The padded tensors of one batch (on the CPU: the loop moves them)."""
        ...

    def loss(self, model: nn.Module, batch: Batch) -> BatchLoss:
        """Forward pass and loss of one batch (the model is in training mode; the loop runs it under autocast)."""
        ...

    def evaluate(self, model: nn.Module, device: torch.device) -> dict[str, float] | None:
        """Validation metrics including "loss" and ``metric``, or None without validation data (the model is in eval
        mode, gradients off)."""
        ...


@dataclass(frozen=True)
class TrainContext:
    """Where training runs. One process on one device today; a process group joins it for distributed training."""

    device: torch.device = field(default_factory=lambda: torch.device("cpu"))


# ---------------------------------------------------------------------------------------------------------------
# What the loop reports (events) and returns


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


Event = Prepared | Planned | Resumed | Step | Evaluated | Checkpointed | Skipped | Warned


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


# ---------------------------------------------------------------------------------------------------------------
# The schedule, sized to the budgets


@dataclass(frozen=True)
class Plan:
    total_steps: int  # the step budget (max_steps, or epochs x steps per epoch, whichever is smaller)
    steps_per_epoch: int
    schedule: str  # "linear", "noam" or "constant" ("auto" resolved)
    warmup: int
    peak: float
    factor: float
    d_model: int

    def lr(self, step: int) -> float:
        return learning_rate(step, schedule=self.schedule, peak=self.peak, factor=self.factor, warmup=self.warmup,
                             total=self.total_steps, d_model=self.d_model)


def plan(cfg: TrainConfigBase, steps_per_epoch: int, d_model: int) -> tuple[Plan, list[str]]:
    """The step budget and the schedule it sizes, and warnings for a warmup that cannot finish inside the budget.

    ``schedule=auto`` is the paper's noam schedule for an open-ended run, and linear warmup and decay over the
    budget when one is stated (``max_steps``): eq. 3 with 4,000 warmup steps was tuned for 100,000 steps (§5.2), and
    a 1,200-step run would stop while its learning rate is still rising.
    """
    by_epochs = steps_per_epoch * cfg.epochs
    total = min(cfg.max_steps, by_epochs) if cfg.max_steps else by_epochs
    schedule = cfg.schedule if cfg.schedule != "auto" else ("linear" if cfg.max_steps else "noam")
    if cfg.warmup_steps:
        warmup = cfg.warmup_steps
    elif schedule == "noam":
        warmup = NOAM_WARMUP
    else:
        warmup = int(cfg.warmup_ratio * total)
    warnings = []
    if warmup >= total and (cfg.warmup_steps or schedule == "noam"):
        budget = (f"max_steps={cfg.max_steps}" if total == cfg.max_steps
                  else f"{cfg.epochs} epochs of {steps_per_epoch} steps")
        warnings.append(f"the learning-rate warmup ({warmup} steps) cannot finish inside the {total} planned steps "
                        f"({budget}): the rate would still be rising when training stops; set warmup_steps below "
                        f"{total} or leave schedule and warmup_steps unset with --max-steps")
    return Plan(total, steps_per_epoch, schedule, warmup, cfg.lr, cfg.lr_factor, d_model), warnings


# ---------------------------------------------------------------------------------------------------------------
# The loop


def fit(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    task: Task,
    cfg: TrainConfigBase,
    run_dir: Path,
    *,
    resume: bool = False,
    on_event: Callable[[Event], None] = lambda event: None,
    context: TrainContext = TrainContext(),
) -> FitResult:
    """Train ``model`` (already on ``context.device``) on ``task`` into ``run_dir``, the run's other files (config,
    tokenizer) already written by the task.

    Writes ``model.safetensors`` (the best evaluated weights; the last ones without validation data),
    ``checkpoints/step_N.safetensors`` (the last ``keep_last``), the training state and the manifest (every
    ``checkpoint_every`` steps, at each evaluation and at the end), and the metrics log. With ``resume``, continues
    from the saved training state exactly as if the run had never stopped; a run that saved no state yet starts
    from the beginning. The caller seeds torch and builds the model the same way in both cases.
    """
    started = time.perf_counter()
    batches_per_epoch = len(task.epoch_batches(None))
    if not batches_per_epoch:
        raise InputError("no training data: the task made no batches")
    the_plan, warnings = plan(cfg, -(-batches_per_epoch // cfg.accum_steps), task.d_model)
    generator = torch.Generator().manual_seed(cfg.seed)
    state_path = run_dir / STATE
    if resume and state_path.is_file():
        state = load_fit_state(state_path, model=model, optimizer=optimizer, data_fingerprint=task.fingerprint)
        if state.epoch_generator_state is not None:
            generator.set_state(state.epoch_generator_state)
        log = _metrics_log(run_dir, cfg, keep_rows=state.log_rows)
        on_event(Resumed(state.step, state.epoch))
    else:
        _clear_run_outputs(run_dir)
        state = FitState()
        log = _metrics_log(run_dir, cfg, keep_rows=None)
    for message in warnings:
        on_event(Warned(message))
    on_event(Planned(the_plan.total_steps, the_plan.steps_per_epoch, batches_per_epoch, the_plan.schedule,
                     the_plan.warmup, state.step))

    last: dict[str, float] = {}

    def evaluate(epoch: float) -> bool:
        """Evaluate, keep the weights if they are the best so far; True when patience has run out."""
        model.eval()
        with torch.no_grad():
            metrics = task.evaluate(model, context.device)
        model.train()
        train_loss = state.train_loss_sum / max(1, state.train_size)
        train = {key: value / max(1, state.train_size) for key, value in state.train_sums.items()}
        state.last_eval_step = state.step
        state.train_loss_sum, state.train_size, state.train_sums = 0.0, 0, {}
        if metrics is None:  # no validation data: the last weights are the model (written at each save)
            log.write({"step": state.step, "epoch": epoch, "train_loss": train_loss,
                       **{f"train_{k}": v for k, v in train.items()}})
            on_event(Evaluated(state.step, epoch, {}, train_loss, train, best=False))
            return False
        last.clear()
        last.update(metrics)
        best = _improves(metrics, state, task)
        if best:
            state.best_score, state.best_loss = metrics[task.metric], metrics.get("loss")
            state.best_step, state.best_epoch, state.best_metrics, state.stale = state.step, epoch, dict(metrics), 0
            checkpoint.save_weights(run_dir, model)
        else:
            state.stale += 1
        log.write({"step": state.step, "epoch": epoch, "train_loss": train_loss,
                   **{f"train_{k}": v for k, v in train.items()}, **{f"valid_{k}": v for k, v in metrics.items()},
                   "best": best})
        on_event(Evaluated(state.step, epoch, dict(metrics), train_loss, train, best))
        return bool(cfg.patience) and state.stale >= cfg.patience

    def save(step_checkpoint: bool) -> None:
        """Step checkpoint (keeping the last K), the weights until an evaluation has chosen some (for good, without
        validation data), the training state, the manifest: a run killed after this resumes from here."""
        if step_checkpoint and cfg.keep_last:
            (run_dir / CHECKPOINTS).mkdir(exist_ok=True)
            name = f"step_{state.step}.safetensors"
            checkpoint.save_weights(run_dir / CHECKPOINTS, model, name)
            for old in checkpoint_paths(run_dir)[: -cfg.keep_last]:
                old.unlink()
            on_event(Checkpointed(state.step, run_dir / CHECKPOINTS / name))
        if state.best_score is None:
            checkpoint.save_weights(run_dir, model)
        state.log_rows = log.rows
        save_fit_state(state_path, model=model, optimizer=optimizer, state=state, data_fingerprint=task.fingerprint)
        checkpoint.write_manifest(run_dir)

    stopped_by = _finished(cfg, state)  # "" unless resuming a run that had already stopped
    warned_time = False
    model.train()
    try:
        while not stopped_by:
            if state.batch_index == 0:
                state.epoch_generator_state = generator.get_state()
            elif state.epoch_generator_state is not None:  # resuming inside an epoch: the same order again
                generator.set_state(state.epoch_generator_state)
            batches = task.epoch_batches(generator)
            while state.batch_index < len(batches):
                group = batches[state.batch_index : state.batch_index + cfg.accum_steps]
                state.step += 1
                state.batch_index += len(group)
                lr = the_plan.lr(state.step)
                set_learning_rate(optimizer, lr)
                outcome = _train_step(model, optimizer, task, [task.collate(b) for b in group], cfg, context,
                                      step=state.step)
                progress = _epochs_done(state, len(batches))
                if outcome.problem is not None:
                    if not cfg.skip_nonfinite:
                        raise NonFiniteError(f"{outcome.problem}. The last good checkpoint in {run_dir} is kept; "
                                             f"lower the learning rate or set skip_nonfinite=true to skip such batches")
                    state.skipped += 1
                    log.write({"step": state.step, "epoch": progress, "skipped": outcome.problem})
                    on_event(Skipped(state.step, outcome.problem))
                else:
                    state.train_loss_sum += outcome.loss_sum
                    state.train_size += outcome.size
                    for key, value in outcome.sums.items():
                        state.train_sums[key] = state.train_sums.get(key, 0.0) + value
                    stats = {key: value / outcome.size for key, value in outcome.sums.items()}
                    log.write({"step": state.step, "epoch": progress, "loss": outcome.loss_sum / outcome.size,
                               **stats, "lr": lr, task.unit: outcome.size})
                    on_event(Step(state.step, the_plan.total_steps, state.epoch, progress,
                                  outcome.loss_sum / outcome.size, lr, outcome.size, stats,
                                  state.train_loss_sum / max(1, state.train_size),
                                  {k: v / max(1, state.train_size) for k, v in state.train_sums.items()}))

                # Budgets, then the end of the epoch, then evaluation and saving, in that order.
                elapsed = time.perf_counter() - started
                if cfg.max_steps and state.step >= cfg.max_steps:
                    stopped_by = "max_steps"
                elif cfg.max_minutes and elapsed > 60 * cfg.max_minutes:
                    stopped_by = "max_minutes"
                if cfg.max_minutes and not warned_time and (state.step % TIME_PROBE_STEPS == 0 or elapsed > 30):
                    warned_time = True
                    note = _time_warning(the_plan, state.step, elapsed, cfg.max_minutes)
                    if note:
                        on_event(Warned(note))
                epoch_done = state.batch_index >= len(batches)
                if epoch_done:
                    state.epoch, state.batch_index = state.epoch + 1, 0
                    state.epoch_generator_state = generator.get_state()  # the next epoch's order is drawn from here
                    if state.epoch > cfg.epochs:
                        stopped_by = stopped_by or "epochs"
                evaluate_now = (state.step % cfg.eval_every == 0) if cfg.eval_every else epoch_done
                if (evaluate_now or stopped_by) and evaluate(_epochs_done(state, len(batches))):
                    stopped_by = stopped_by or "patience"
                at_checkpoint = state.step % cfg.checkpoint_every == 0
                if at_checkpoint or evaluate_now or stopped_by:
                    save(step_checkpoint=at_checkpoint or bool(stopped_by))
                if stopped_by or epoch_done:
                    break  # (the next epoch's order is drawn above)
    finally:
        log.close()
    checkpoint.write_manifest(run_dir)
    return FitResult(state.step, _epochs_done(state, batches_per_epoch), time.perf_counter() - started, stopped_by,
                     dict(state.best_metrics), state.best_step, state.best_epoch, dict(last), state.skipped)


@dataclass
class _StepOutcome:
    loss_sum: float  # summed over the step's units
    size: int
    sums: dict[str, float]
    problem: str | None  # a non-finite loss or gradient, described; the optimizer did not step


def _train_step(model: nn.Module, optimizer: torch.optim.Optimizer, task: Task, batches: list[Batch],
                cfg: TrainConfigBase, context: TrainContext, *, step: int) -> _StepOutcome:
    """One optimizer step over ``batches`` (accum_steps of them, fewer at the end of an epoch)."""
    batches = [Batch(tuple(t.to(context.device) for t in b.tensors), b.size) for b in batches]  # the one device move
    n_units = sum(b.size for b in batches)  # the step's normaliser (distributed: all-reduced over the processes)
    optimizer.zero_grad(set_to_none=True)
    rng_before = torch.get_rng_state()
    loss_sum = torch.zeros((), device=context.device)
    sums: dict[str, float] = {}
    for batch in batches:
        with autocast(cfg.precision):
            out = task.loss(model, batch)
        # sum_b loss_b / n_units; a mean loss is weighted by its share of the units, which is exactly 1.0 (and so
        # bitwise the plain mean) when one batch makes the step.
        (out.value * (batch.size / n_units) if out.mean else out.value / n_units).backward()
        loss_sum += out.value.detach() * batch.size if out.mean else out.value.detach()
        for key, value in out.sums.items():
            sums[key] = sums.get(key, 0.0) + value
    grad_norm = nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_norm or float("inf"))

    def replay() -> None:  # the same forward passes, with the dropout masks the step drew, for the diagnosis
        torch.set_rng_state(rng_before)
        with autocast(cfg.precision):
            for batch in batches:
                task.loss(model, batch)

    problem = check_step(model, loss_sum, grad_norm, step=step, replay=replay)
    if problem is not None:
        optimizer.zero_grad(set_to_none=True)
        return _StepOutcome(0.0, n_units, {}, problem)
    optimizer.step()
    return _StepOutcome(loss_sum.item(), n_units, sums, None)


def _finished(cfg: TrainConfigBase, state: FitState) -> str:
    """Why a (resumed) run has nothing left to do, or ""."""
    if state.epoch > cfg.epochs:
        return "epochs"
    if cfg.max_steps and state.step >= cfg.max_steps:
        return "max_steps"
    if cfg.patience and state.stale >= cfg.patience:
        return "patience"
    return ""


def _improves(metrics: dict[str, float], state: FitState, task: Task) -> bool:
    """Better by the task's metric; on a tie, lower validation loss (a first best is not kept for its own sake)."""
    score = metrics[task.metric]
    if math.isnan(score):
        return False
    if state.best_score is None:
        return True
    if score != state.best_score:
        return (score > state.best_score) == task.higher_is_better
    loss, best_loss = metrics.get("loss"), state.best_loss
    return loss is not None and best_loss is not None and loss < best_loss


def _epochs_done(state: FitState, batches_per_epoch: int) -> float:
    """Epochs completed, fractional (3 decimals); a whole number as an int."""
    done = round(state.epoch - 1 + state.batch_index / max(1, batches_per_epoch), 3)
    return int(done) if done == int(done) else done


def _time_warning(the_plan: Plan, step: int, elapsed: float, max_minutes: float) -> str | None:
    """A warmup longer than the steps max_minutes allows, at the speed of the first steps."""
    reachable = int(step / max(elapsed, 1e-9) * 60 * max_minutes)
    if the_plan.schedule == "constant" or the_plan.warmup < reachable:
        return None
    return (f"the learning-rate warmup ({the_plan.warmup} steps) cannot finish inside max_minutes={max_minutes:g}: "
            f"at {step / max(elapsed, 1e-9):.1f} steps/s about {reachable} steps fit; set warmup_steps below that, "
            f"or state the budget as --max-steps")


def checkpoint_paths(run_dir: Path) -> list[Path]:
    """Saved step checkpoints, oldest first."""
    return sorted((run_dir / CHECKPOINTS).glob("step_*.safetensors"), key=lambda p: int(p.stem.split("_")[1]))


def _clear_run_outputs(run_dir: Path) -> None:
    """A run started over an earlier one begins clean: no weights, state, manifest or step checkpoints of the old."""
    for name in (checkpoint.MANIFEST, STATE, checkpoint.WEIGHTS):
        (run_dir / name).unlink(missing_ok=True)
    for old in checkpoint_paths(run_dir):
        old.unlink()


class _CountingLog(checkpoint.MetricsLog):
    """The metrics log, counting its rows so that the training state can say how many a resume keeps."""

    rows = 0

    def write(self, row: dict) -> None:
        super().write(row)
        self.rows += 1


def _metrics_log(run_dir: Path, cfg: TrainConfigBase, keep_rows: int | None) -> _CountingLog:
    """A fresh log, or (resuming) the log cut back to the ``keep_rows`` rows written before the saved state."""
    if keep_rows is None:
        return _CountingLog(run_dir / checkpoint.METRICS, tensorboard=cfg.tensorboard)
    seen = iter(range(keep_rows + 1))  # MetricsLog asks about each row in order: keep the first keep_rows
    log = _CountingLog(run_dir / checkpoint.METRICS, keep=lambda row: next(seen, keep_rows) < keep_rows,
                       tensorboard=cfg.tensorboard)
    log.rows = keep_rows
    return log

