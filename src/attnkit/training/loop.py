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

The file reads in three parts: ``fit``, the loop itself, on one screen like nanoGPT's train.py or a torchtune
recipe, with what it does at a run's start (``_open_run``), after each step (``_record_step``), at an evaluation
(``evaluate``) and at a save (``save``) as functions of the run; ``_train_step``, the one optimizer step every device,
precision and process count takes; and the small decisions the loop names rather than spells out. The task, the
events, the schedule's sizing, precision, the kernels, the input pipeline and the collectives are in task.py,
events.py, schedules.py, precision.py, kernels.py, prefetch.py and distributed.py.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable, Sequence
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from attnkit import runs
from attnkit.config import TrainConfig
from attnkit.errors import InputError
from attnkit.training.distributed import broadcast_from_main, share_of_step, sum_across, sum_gradients, sum_on_device
from attnkit.training.events import (
    Checkpointed,
    Evaluated,
    Event,
    FitResult,
    Planned,
    Resumed,
    Skipped,
    Step,
    Stopped,
    Warned,
)
from attnkit.training.graphs import GraphedStep, fixed_shape_collate, stepped, use_graphs
from attnkit.training.guards import NonFiniteError, check_step
from attnkit.training.kernels import compiled, training_kernels
from attnkit.training.optim import set_learning_rate
from attnkit.training.precision import autocast, check_precision, grad_scaler
from attnkit.training.prefetch import prefetched, to_device
from attnkit.training.schedules import Plan, plan
from attnkit.training.state import STATE, FitState, load_fit_state, save_fit_state
from attnkit.training.task import Batch, BatchLoss, StepTask, Task, TrainContext

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
    run = _open_run(model, optimizer, task, cfg, run_dir, resume, context or TrainContext(), on_event)
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
                outcome = _train_step(
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
                _record_step(run, outcome, lr, _epochs_done(state, len(batches)))

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


@dataclass
class _Run:
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


def _open_run(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    task: Task,
    cfg: TrainConfig,
    run_dir: Path,
    resume: bool,
    context: TrainContext,
    on_event: Callable[[Event], None],
) -> _Run:
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
    return _Run(
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


def _record_step(run: _Run, outcome: _StepOutcome, lr: float, progress: float) -> None:
    """A step's line in the metrics log and its event; a non-finite step stops the run unless it is to be skipped."""
    state = run.state
    if outcome.problem is not None:
        if not run.cfg.skip_nonfinite:
            raise NonFiniteError(
                f"{outcome.problem}. The last good checkpoint in {run.run_dir} is kept; "
                f"lower the learning rate or set skip_nonfinite=true to skip such batches"
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


def evaluate(run: _Run, epoch: float) -> bool:
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
    else:
        state.stale += 1
    run.log.write({**row, **{f"valid_{k}": v for k, v in metrics.items()}, "best": best})
    run.on_event(
        Evaluated(step=state.step, epoch=epoch, metrics=dict(metrics), train_loss=train_loss, train=train, best=best)
    )
    return bool(run.cfg.patience) and state.stale >= run.cfg.patience


def save(run: _Run, *, step_checkpoint: bool) -> None:
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


# ---------------------------------------------------------------------------------------------------------------
# One optimizer step


@dataclass
class _StepOutcome:
    loss_sum: float  # summed over the step's units
    size: int
    sums: dict[str, float]
    problem: str | None  # a non-finite loss or gradient, described; the optimizer did not step


def _train_step(
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
) -> _StepOutcome:
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
        return _StepOutcome(0.0, int(n_units), {}, problem)
    if graphs is not None:
        graphs.update()
    elif scaler is not None:
        scaler.step(optimizer)  # skipped when the unscaled gradients held an inf or NaN
        scaler.update()
    else:
        optimizer.step()
    return _StepOutcome(loss_total, int(n_units), dict(zip(task.stats, stat_totals)), None)


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


# ---------------------------------------------------------------------------------------------------------------
# The loop's small decisions


def _dropout_seed(seed: int, step: int, index: int) -> int:
    """The torch seed of batch ``index`` of optimizer step ``step``: its dropout masks depend on nothing else (not on
    the process that computes it, nor on where a resumed run restarted)."""
    digest = hashlib.blake2b(f"{seed}:{step}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


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


def _replanned(the_plan: Plan, state: FitState) -> str:
    """What changes when a resumed run has a new budget: the schedule, planned over the new number of steps."""
    return (
        f"the budget changed from {state.planned_steps} to {the_plan.total_steps} steps: the learning-rate schedule "
        f"({the_plan.schedule}, {the_plan.warmup} warmup steps) is planned again over {the_plan.total_steps} steps; "
        f"step {state.step + 1} trains at lr {the_plan.lr(state.step + 1):.3g}"
    )


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
    return (
        f"the learning-rate warmup ({the_plan.warmup} steps) cannot finish inside max_minutes={max_minutes:g}: "
        f"at {step / max(elapsed, 1e-9):.1f} steps/s about {reachable} steps fit; set warmup_steps below that, "
        f"or state the budget as --max-steps"
    )


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
