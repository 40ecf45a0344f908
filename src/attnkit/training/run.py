"""The training run in progress, as the one training loop (``loop.fit``) keeps it: what the loop does to it at its
start (``start_run``: the training state, new or resumed, the generator of the batch order, the metrics log, the
schedule planned on the budgets), after each step (``record_step``: the log line and the event, or the non-finite
step skipped), at an evaluation (``evaluate``: the best weights and the patience) and at a save (``save``: the step
checkpoints, the training state, the manifest). Rank 0 alone writes; every rank keeps the same state.

The run's directory is prepared before the loop, by the task, with ``run_setup.open_run`` (a fresh or a resumed
run, its configs and tokenizer); the format of its files is ``attnkit.runs``'s, the training state's ``state.py``'s.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from attnkit import runs
from attnkit.config import TrainConfig
from attnkit.errors import InputError
from attnkit.training.distributed import broadcast_from_main, share_of_step
from attnkit.training.events import Checkpointed, Evaluated, Event, Planned, Resumed, Skipped, Step, Warned
from attnkit.training.graphs import use_graphs
from attnkit.training.guards import NonFiniteError
from attnkit.training.precision import check_precision, grad_scaler
from attnkit.training.schedules import Plan, plan
from attnkit.training.state import STATE, FitState, load_fit_state, save_fit_state
from attnkit.training.step import StepOutcome
from attnkit.training.task import Task, TrainContext


@dataclass
class Run:
    """A run in progress: what ``fit`` opened, and what evaluating, saving and recording a step need of it."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    task: Task
    cfg: TrainConfig
    context: TrainContext
    run_dir: Path
    state: FitState
    generator: torch.Generator  # draws each epoch's batch order
    plan: Plan
    batches_per_epoch: int
    log: runs.MetricsLog | _NoLog
    scaler: torch.amp.GradScaler | None  # fp16 only
    on_event: Callable[[Event], None]
    graphed: bool  # steps replayed from CUDA graphs (``training.graphs.use_graphs``)
    last: dict[str, float] = field(default_factory=dict)  # metrics of the last evaluation


def start_run(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    task: Task,
    cfg: TrainConfig,
    run_dir: Path,
    resume: bool,
    context: TrainContext,
    on_event: Callable[[Event], None],
) -> Run:
    """A new run, or the saved one resumed: the state, the batch generator, the metrics log, the schedule planned on
    the budgets (emitting ``Resumed``, warnings and ``Planned``); every rank starts from rank 0's weights."""
    check_precision(cfg.precision, context.device)
    graphed = use_graphs(cfg, task, context)  # (cuda_graphs=true that cannot be: an error, before any work)
    scaler = grad_scaler(cfg.precision, context.device)
    batches_per_epoch = len(task.epoch_batches(None))
    if not batches_per_epoch:
        raise InputError("no training data: the task made no batches")
    generator = torch.Generator().manual_seed(cfg.seed)
    state_path = run_dir / STATE
    notes: list[str] = []
    if resume and state_path.is_file():
        state = load_fit_state(
            state_path, model=model, optimizer=optimizer, data_fingerprint=task.fingerprint, scaler=scaler
        )
        if state.epoch_generator_state is not None:
            generator.set_state(state.epoch_generator_state)
        state.batches_per_step = state.batches_per_step or cfg.accum_steps  # saved by one process, before torchrun
        share = share_of_step(state.batches_per_step, context)  # another process count than the run's: their share
        if share != cfg.accum_steps:
            notes.append(
                f"the run takes {state.batches_per_step} batches per optimizer step: on {context.world_size} "
                f"process(es), each accumulates {share} (accum_steps={share} here, whatever the run started with)"
            )
        log = _metrics_log(run_dir, cfg, keep_rows=state.log_rows, context=context)
        on_event(Resumed(step=state.step, epoch=state.epoch))
    else:
        if context.is_main:
            _clear_run_outputs(run_dir)
        state = FitState(batches_per_step=cfg.accum_steps * context.world_size)
        log = _metrics_log(run_dir, cfg, keep_rows=None, context=context)
    broadcast_from_main(model, context)  # every rank starts from rank 0's weights, whatever each built or loaded
    the_plan, warnings = plan(cfg, -(-batches_per_epoch // state.batches_per_step), task.d_model)
    if state.planned_steps and state.planned_steps != the_plan.total_steps:  # a resumed run given a new budget
        notes.append(_replanned(the_plan, state))
    state.planned_steps = the_plan.total_steps
    for message in notes + warnings:
        on_event(Warned(message))
    on_event(
        Planned(
            total_steps=the_plan.total_steps,
            steps_per_epoch=the_plan.steps_per_epoch,
            batches_per_epoch=batches_per_epoch,
            schedule=the_plan.schedule,
            warmup=the_plan.warmup,
            start_step=state.step,
            graphed=graphed,
        )
    )
    return Run(
        model=model,
        optimizer=optimizer,
        task=task,
        cfg=cfg,
        context=context,
        run_dir=run_dir,
        state=state,
        generator=generator,
        plan=the_plan,
        batches_per_epoch=batches_per_epoch,
        log=log,
        scaler=scaler,
        on_event=on_event,
        graphed=graphed,
    )


def _replanned(the_plan: Plan, state: FitState) -> str:
    """What changes when a resumed run has a new budget: the schedule, planned over the new number of steps."""
    return (
        f"the budget changed from {state.planned_steps} to {the_plan.total_steps} steps: the learning-rate schedule "
        f"({the_plan.schedule}, {the_plan.warmup} warmup steps) is planned again over {the_plan.total_steps} steps; "
        f"step {state.step + 1} trains at lr {the_plan.lr(state.step + 1):.3g}"
    )


def record_step(run: Run, outcome: StepOutcome, lr: float, progress: float) -> None:
    """A step's line in the metrics log and its event; a non-finite step stops the run unless it is to be skipped."""
    state = run.state
    if outcome.problem is not None:
        if not run.cfg.skip_nonfinite:
            kept = (
                f"The last good checkpoint in {run.run_dir} is kept"
                if (run.run_dir / STATE).is_file()
                else f"Nothing was saved in {run.run_dir} yet (--resume starts it again)"
            )
            raise NonFiniteError(
                f"{outcome.problem}. {kept}; lower the learning rate or set skip_nonfinite=true to skip such batches"
            )
        state.skipped += 1
        run.log.write({"step": state.step, "epoch": progress, "skipped": outcome.problem})
        run.on_event(Skipped(step=state.step, message=outcome.problem))
        return
    state.train_loss_sum += outcome.loss_sum
    state.train_size += outcome.size
    for key, value in outcome.sums.items():
        state.train_sums[key] = state.train_sums.get(key, 0.0) + value
    stats = {key: value / outcome.size for key, value in outcome.sums.items()}
    loss = outcome.loss_sum / outcome.size
    run.log.write({"step": state.step, "epoch": progress, "loss": loss, **stats, "lr": lr, run.task.unit: outcome.size})
    run.on_event(
        Step(
            step=state.step,
            total_steps=run.plan.total_steps,
            epoch=state.epoch,
            epoch_progress=progress,
            loss=loss,
            lr=lr,
            size=outcome.size,
            stats=stats,
            running_loss=state.train_loss_sum / max(1, state.train_size),
            running={k: v / max(1, state.train_size) for k, v in state.train_sums.items()},
        )
    )


def evaluate(run: Run, epoch: float) -> bool:
    """Evaluate, keep the weights if they are the best so far, log both; True when patience has run out."""
    model, state, task = run.model, run.state, run.task
    model.eval()
    with torch.no_grad():
        metrics = task.evaluate(model, run.context.device)
    model.train()
    train_loss = state.train_loss_sum / max(1, state.train_size)
    train = {key: value / max(1, state.train_size) for key, value in state.train_sums.items()}
    state.last_eval_step = state.step
    state.train_loss_sum, state.train_size, state.train_sums = 0.0, 0, {}
    row = {"step": state.step, "epoch": epoch, "train_loss": train_loss, **{f"train_{k}": v for k, v in train.items()}}
    if metrics is None:  # no validation data: the last weights are the model (written at each save)
        run.log.write(row)
        run.on_event(
            Evaluated(step=state.step, epoch=epoch, metrics={}, train_loss=train_loss, train=train, best=False)
        )
        return False
    run.last.clear()
    run.last.update(metrics)
    best = _improves(metrics, state, task)
    if best:
        state.best_score, state.best_loss = metrics[task.metric], metrics.get("loss")
        state.best_step, state.best_epoch, state.best_metrics, state.stale = state.step, epoch, dict(metrics), 0
        if run.context.is_main:
            runs.save_weights(run.run_dir, model)
            runs.record_hash(run.run_dir, runs.WEIGHTS)  # a run killed before its next save still checks
    else:
        state.stale += 1
    run.log.write({**row, **{f"valid_{k}": v for k, v in metrics.items()}, "best": best})
    run.on_event(
        Evaluated(step=state.step, epoch=epoch, metrics=dict(metrics), train_loss=train_loss, train=train, best=best)
    )
    return bool(run.cfg.patience) and state.stale >= run.cfg.patience


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


def save(run: Run, *, step_checkpoint: bool) -> None:
    """Step checkpoint (keeping the last K), the weights until an evaluation has chosen some (for good, without
    validation data), the training state, the manifest: a run killed after this resumes from here. Rank 0's alone:
    every rank holds the same weights and state."""
    if not run.context.is_main:
        return
    cfg, state, run_dir = run.cfg, run.state, run.run_dir
    if step_checkpoint and cfg.keep_last:
        (run_dir / runs.CHECKPOINTS).mkdir(exist_ok=True)
        name = f"step_{state.step}.safetensors"
        runs.save_weights(run_dir / runs.CHECKPOINTS, run.model, name)
        for old in runs.checkpoint_paths(run_dir)[: -cfg.keep_last]:
            old.unlink()
        run.on_event(Checkpointed(step=state.step, path=run_dir / runs.CHECKPOINTS / name))
    if state.best_score is None:
        runs.save_weights(run_dir, run.model)
    state.log_rows = run.log.rows
    save_fit_state(
        run_dir / STATE,
        model=run.model,
        optimizer=run.optimizer,
        state=state,
        data_fingerprint=run.task.fingerprint,
        scaler=run.scaler,
    )
    runs.write_manifest(run_dir)


def _clear_run_outputs(run_dir: Path) -> None:
    """A run started over an earlier one begins clean: no weights, state, manifest or step checkpoints of the old."""
    for name in (runs.MANIFEST, STATE, runs.WEIGHTS):
        (run_dir / name).unlink(missing_ok=True)
    for old in runs.checkpoint_paths(run_dir):
        old.unlink()


def _metrics_log(
    run_dir: Path, cfg: TrainConfig, keep_rows: int | None, context: TrainContext
) -> runs.MetricsLog | _NoLog:
    """A fresh log, or (resuming) the log cut back to the ``keep_rows`` rows written before the saved state; nothing
    on the ranks other than 0."""
    if not context.is_main:
        return _NoLog()
    return runs.MetricsLog(run_dir / runs.METRICS, keep_rows=keep_rows, tensorboard=cfg.tensorboard)


class _NoLog:
    """The metrics log of a rank that writes nothing."""

    rows = 0

    def write(self, row: dict) -> None:
        pass

    def close(self) -> None:
        pass
