"""The one training loop of every task, read top to bottom in ``fit``.

A task (``Task``) supplies what differs: the batches of an epoch, the loss of a batch with its normaliser
(sentences or target tokens), an evaluation, and the metric that decides "better". The loop owns the rest: steps,
gradient accumulation, the learning-rate schedule sized to the budgets, the budgets themselves (epochs, steps,
minutes), the non-finite guard, checkpoints (the best weights and/or the last K steps) and bit-exact resume.

Gradient accumulation follows fairseq: the batches of one optimizer step are consecutive in the epoch's order, and
the step's loss is the sum of their summed losses divided by the sum of their normalisers, so a step over two
batches equals a step over one batch holding both. Data-parallel training (torchrun, ``distributed.py``) shares a
step's batches among the processes by index, sums that normaliser and the gradients across them, and seeds each
batch's dropout from (seed, step, index): N processes with ``accum_steps`` batches each compute what one process
with N x ``accum_steps`` computes, and rank 0 writes the run.

The library never prints: progress is a stream of typed events (``Event``) that the CLI renders.

The loop reads in three files. This one: ``fit``, the loop itself, on one screen like nanoGPT's train.py or a
torchtune recipe, and the small decisions it names rather than spells out (``_budget_spent``, ``_finished``,
``_stopped_early``, ...). run.py: what the loop does to the run at its start (``start_run``), after each step
(``record_step``), at an evaluation (``evaluate``) and at a save (``save``). step.py: ``train_step``, the one optimizer
step every device, precision and process count takes. The task, the events, the schedule's sizing, precision, the
kernels, the input pipeline and the collectives are in task.py, events.py, schedules.py, precision.py, kernels.py,
prefetch.py and distributed.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import closing
from pathlib import Path

import torch
from torch import nn

from attnkit import runs
from attnkit.config import TrainConfig
from attnkit.training.events import Event, FitResult, Stopped, Warned
from attnkit.training.graphs import GraphedStep, fixed_shape_collate
from attnkit.training.kernels import compiled, training_kernels
from attnkit.training.optim import set_learning_rate
from attnkit.training.prefetch import prefetched
from attnkit.training.run import evaluate, record_step, save, start_run
from attnkit.training.schedules import Plan
from attnkit.training.state import FitState
from attnkit.training.step import train_step
from attnkit.training.task import Task, TrainContext

TIME_PROBE_STEPS = 20  # steps timed before judging whether a warmup fits inside max_minutes


# ---------------------------------------------------------------------------------------------------------------
# The loop


def fit(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    task: Task,
    cfg: TrainConfig,
    run_dir: Path,
    *,
    resume: bool = False,
    on_event: Callable[[Event], None] = lambda event: None,
    context: TrainContext | None = None,
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
    run = start_run(model, optimizer, task, cfg, run_dir, resume, context or TrainContext(), on_event)
    state, generator, the_plan = run.state, run.generator, run.plan
    loss_fn = compiled(task.loss) if cfg.compile else task.loss
    graphs = GraphedStep(model, optimizer, task, loss_fn, cfg) if run.graphed else None
    collate = fixed_shape_collate(task) if graphs is not None else task.collate  # graphs: a bounded set of shapes
    stopped_by = already = _finished(cfg, state)  # "" unless resuming a run that had already stopped
    if already:
        on_event(Warned(_nothing_left(already, cfg)))
    warned_time = False
    model.train()
    with training_kernels(tf32=cfg.tf32, device=run.context.device), closing(run.log):
        while not stopped_by:
            if state.batch_index == 0:
                state.epoch_generator_state = generator.get_state()
            elif state.epoch_generator_state is not None:  # resuming inside an epoch: the same order again
                generator.set_state(state.epoch_generator_state)
            batches = task.epoch_batches(generator)
            groups = [
                batches[i : i + state.batches_per_step]
                for i in range(state.batch_index, len(batches), state.batches_per_step)
            ]
            for group, mine in zip(groups, prefetched(groups, collate, run.context)):
                state.step += 1
                state.batch_index += len(group)
                lr = the_plan.lr(state.step)
                set_learning_rate(optimizer, lr)
                outcome = train_step(
                    model,
                    optimizer,
                    task,
                    mine,
                    cfg,
                    run.context,
                    run.scaler,
                    step=state.step,
                    loss=loss_fn,
                    graphs=graphs,
                )
                record_step(run, outcome, lr, _epochs_done(state, len(batches)))

                # Budgets, then the end of the epoch, then evaluation and saving, in that order.
                elapsed = time.perf_counter() - started
                stopped_by = _budget_spent(cfg, state, elapsed)
                if cfg.max_minutes and not warned_time and (state.step % TIME_PROBE_STEPS == 0 or elapsed > 30):
                    warned_time = True
                    if note := _time_warning(the_plan, state.step, elapsed, cfg.max_minutes):
                        run.on_event(Warned(note))
                epoch_done = state.batch_index >= len(batches)
                if epoch_done:
                    state.epoch, state.batch_index = state.epoch + 1, 0
                    state.epoch_generator_state = generator.get_state()  # the next epoch's order is drawn from here
                    if state.epoch > cfg.epochs:
                        stopped_by = stopped_by or "epochs"
                evaluate_now = (state.step % cfg.eval_every == 0) if cfg.eval_every else epoch_done
                if (evaluate_now or stopped_by) and evaluate(run, _epochs_done(state, len(batches))):
                    stopped_by = stopped_by or "patience"
                at_checkpoint = state.step % cfg.checkpoint_every == 0
                if at_checkpoint or evaluate_now or stopped_by:
                    save(run, step_checkpoint=at_checkpoint or bool(stopped_by))
                if stopped_by or epoch_done:
                    break  # (the next epoch's order is drawn above)
    if stopped_by in ("patience", "max_minutes") and not already:
        run.on_event(Stopped(state.step, stopped_by, _stopped_early(stopped_by, cfg, state, task.metric)))
    if run.context.is_main:
        runs.write_manifest(run_dir)
    epochs = _epochs_done(state, run.batches_per_epoch)
    kept_last = not state.best_metrics  # no validation data: the last weights are the model
    return FitResult(
        steps=state.step,
        epochs=epochs,
        seconds=time.perf_counter() - started,
        stopped_by=stopped_by,
        best=dict(state.best_metrics),
        best_step=state.step if kept_last else state.best_step,
        best_epoch=epochs if kept_last else state.best_epoch,
        last=dict(run.last),
        skipped=state.skipped,
    )


# ---------------------------------------------------------------------------------------------------------------
# The loop's small decisions


def _budget_spent(cfg: TrainConfig, state: FitState, elapsed: float) -> str:
    """The budget that ends the run after this step ("max_steps", "max_minutes"), or ""."""
    if cfg.max_steps and state.step >= cfg.max_steps:
        return "max_steps"
    if cfg.max_minutes and elapsed > 60 * cfg.max_minutes:
        return "max_minutes"
    return ""


def _finished(cfg: TrainConfig, state: FitState) -> str:
    """Why a (resumed) run has nothing left to do, or ""."""
    if state.epoch > cfg.epochs:
        return "epochs"
    if cfg.max_steps and state.step >= cfg.max_steps:
        return "max_steps"
    if cfg.patience and state.stale >= cfg.patience:
        return "patience"
    return ""


def _nothing_left(stopped_by: str, cfg: TrainConfig) -> str:
    if stopped_by == "patience":
        return f"the run had stopped early (patience={cfg.patience} evaluations without improvement): nothing to train"
    return (
        f"the run had already used its budget ({stopped_by}): nothing to train; resume with a larger --max-steps or "
        "--epochs to continue it"
    )


def _stopped_early(stopped_by: str, cfg: TrainConfig, state: FitState, metric: str) -> str:
    if stopped_by == "patience":
        return (
            f"stopped early at step {state.step}: valid {metric} has not improved in {cfg.patience} evaluations "
            f"(patience={cfg.patience}); the model is step {state.best_step}'s weights (epoch {state.best_epoch:g})"
        )
    return f"stopped at step {state.step}: max_minutes={cfg.max_minutes:g} spent"


def _epochs_done(state: FitState, batches_per_epoch: int) -> float:
    """Epochs completed, fractional (3 decimals); a whole number as an int."""
    done = round(state.epoch - 1 + state.batch_index / max(1, batches_per_epoch), 3)
    return int(done) if done == int(done) else done


def _time_warning(the_plan: Plan, step: int, elapsed: float, max_minutes: float) -> str | None:
    """A warmup longer than the steps max_minutes allows, at the speed of the first steps."""
    reachable = int(step / max(elapsed, 1e-9) * 60 * max_minutes)
    if the_plan.schedule == "constant" or the_plan.warmup < reachable:
        return None
    return (
        f"the learning-rate warmup ({the_plan.warmup} steps) cannot finish inside max_minutes={max_minutes:g}: "
        f"at {step / max(elapsed, 1e-9):.1f} steps/s about {reachable} steps fit; set warmup_steps below that, "
        f"or state the budget as --max-steps"
    )
