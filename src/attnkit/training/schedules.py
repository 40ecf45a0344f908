"""Learning-rate schedules, each a pure function of the step (1-based), so that resuming needs only the step."""

from __future__ import annotations


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


def learning_rate(step: int, *, schedule: str, peak: float, factor: float, warmup: int, total: int, d_model: int) -> float:
    """The learning rate at ``step`` for the named schedule (see ``TrainConfig.schedule``)."""
    if schedule == "noam":
        return noam(step, d_model=d_model, warmup=warmup, factor=factor)
    if schedule == "linear":
        return linear_warmup_decay(step, peak=peak, warmup=warmup, total=total)
    return constant_warmup(step, peak=peak, warmup=warmup)
