"""Numeric guards: a non-finite loss or gradient stops the run (or skips the batch), naming the step and the first
module whose output went non-finite, so that the user learns where, not only that, training diverged."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from attnkit.errors import NonFiniteError

__all__ = ["NonFiniteError", "check_step", "first_nonfinite_gradient", "first_nonfinite_module"]


def first_nonfinite_module(model: nn.Module, forward: Callable[[], object]) -> str | None:
    """Run ``forward`` again with hooks on every module; return the name of the first module, in execution order,
    whose output holds a NaN or an infinity (None if every output is finite)."""
    names = {module: name for name, module in model.named_modules()}
    found: list[str] = []

    def hook(module: nn.Module, _inputs: object, output: object) -> None:
        if found:
            return
        tensors = output if isinstance(output, (tuple, list)) else (output,)
        if any(torch.is_tensor(t) and t.is_floating_point() and not torch.isfinite(t).all() for t in tensors):
            found.append(names[module] or "(the model itself)")

    handles = [module.register_forward_hook(hook) for module in model.modules()]
    try:
        with torch.no_grad():
            forward()
    finally:
        for handle in handles:
            handle.remove()
    return found[0] if found else None


def first_nonfinite_gradient(model: nn.Module) -> str | None:
    """The first parameter (in registration order) whose gradient holds a NaN or an infinity."""
    for name, param in model.named_parameters():
        if param.grad is not None and not torch.isfinite(param.grad).all():
            return name
    return None


def check_step(
    model: nn.Module, loss: float, grad_norm: float, *, step: int, replay: Callable[[], object]
) -> str | None:
    """None if the step is finite; otherwise a message naming the step and where the first non-finite value arose.

    ``loss`` and ``grad_norm`` are the step's, read from the device; ``replay`` re-runs the step's forward pass (with
    the RNG state the step used) for the diagnosis.
    """
    if math.isfinite(loss) and math.isfinite(grad_norm):
        return None
    what = "loss" if not math.isfinite(loss) else "gradient norm"
    module = first_nonfinite_module(model, replay)
    if module is not None:
        return f"step {step}: non-finite {what}; the first module whose output went non-finite is {module}"
    param = first_nonfinite_gradient(model)
    where = f"the gradient of {param}" if param else "the loss"
    return f"step {step}: non-finite {what}; every module output was finite, the first non-finite value is in {where}"
