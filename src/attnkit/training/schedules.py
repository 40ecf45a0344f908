"""Learning-rate schedules, each a pure function of the step (1-based), so that resuming needs only the step; and
the plan that sizes a schedule to a run's budgets."""

from __future__ import annotations

from dataclasses import dataclass

from attnkit.config import TrainConfig

NOAM_WARMUP = 4000  # §5.3: "We used warmup_steps = 4000"


def noam(step: int, *, d_model: int, warmup: int, factor: float = 1.0) -> float:
    """Eq. 3 (§5.3): lrate = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), times ``factor``."""
    step = max(step, 1)
    return factor * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def linear_warmup_decay(step: int, *, peak: float, warmup: int, total: int) -> float:
    """Linear warmup from 0 to ``peak`` over ``warmup`` steps, then linear decay to 0 at step ``total``."""
    if warmup and step <= warmup:
        return peak * step / warmup
    return peak * max(0.0, (total - step) / max(1, total - warmup))


def constant_warmup(step: int, *, peak: float, warmup: int) -> float:
    """Linear warmup to ``peak``, then flat."""
    return peak * min(1.0, step / warmup) if warmup else peak


def learning_rate(
    step: int, *, schedule: str, peak: float, factor: float, warmup: int, total: int, d_model: int
) -> float:
    """The learning rate at ``step`` for the named schedule (see ``TrainConfig.schedule``)."""
    if schedule == "noam":
        return noam(step, d_model=d_model, warmup=warmup, factor=factor)
    if schedule == "linear":
        return linear_warmup_decay(step, peak=peak, warmup=warmup, total=total)
    return constant_warmup(step, peak=peak, warmup=warmup)


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
        return learning_rate(
            step,
            schedule=self.schedule,
            peak=self.peak,
            factor=self.factor,
            warmup=self.warmup,
            total=self.total_steps,
            d_model=self.d_model,
        )


def resolved_schedule(schedule: str, max_steps: int) -> str:
    """The schedule a run follows: ``auto`` is ``linear`` with a step budget and ``noam`` without one (``plan``)."""
    return schedule if schedule != "auto" else ("linear" if max_steps else "noam")


def plan(cfg: TrainConfig, steps_per_epoch: int, d_model: int) -> tuple[Plan, list[str]]:
    """The step budget and the schedule it sizes, and warnings for a warmup that cannot finish inside the budget.

    ``schedule=auto`` is the paper's noam schedule for an open-ended run, and linear warmup and decay over the
    budget when one is stated (``max_steps``): eq. 3 with 4,000 warmup steps was tuned for 100,000 steps (§5.2), and
    a 1,200-step run would stop while its learning rate is still rising.
    """
    by_epochs = steps_per_epoch * cfg.epochs
    total = min(cfg.max_steps, by_epochs) if cfg.max_steps else by_epochs
    schedule = resolved_schedule(cfg.schedule, cfg.max_steps)
    if cfg.warmup_steps:
        warmup = cfg.warmup_steps
    elif schedule == "noam":
        warmup = NOAM_WARMUP
    else:
        warmup = int(cfg.warmup_ratio * total)
    warnings = []
    if warmup >= total and (cfg.warmup_steps or schedule == "noam"):
        budget = (
            f"max_steps={cfg.max_steps}"
            if total == cfg.max_steps
            else f"{cfg.epochs} epochs of {steps_per_epoch} steps"
        )
        warnings.append(
            f"the learning-rate warmup ({warmup} steps) cannot finish inside the {total} planned steps "
            f"({budget}): the rate would still be rising when training stops; set warmup_steps below "
            f"{total} or leave schedule and warmup_steps unset with --max-steps"
        )
    return Plan(total, steps_per_epoch, schedule, warmup, cfg.lr, cfg.lr_factor, d_model), warnings
