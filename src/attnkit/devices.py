"""Where tensors live: ``--device auto|cpu|cuda|cuda:N|mps`` resolved to a ``torch.device`` that exists, the device a
model is on, the random-number state of a device (dropout on a GPU draws from the GPU's generator, so a bit-exact
resume saves that one too), and the memory a device has left.

Run directories never depend on the device: weights are saved from CPU copies and loaded straight onto whichever
device the reading command names, so a run trained on a GPU predicts on a CPU and back.
"""

from __future__ import annotations

import re

import torch
from torch import nn

from attnkit.errors import InputError

DEVICE_CHOICES = "auto, cpu, cuda, cuda:N or mps"
_SPEC = re.compile(r"(auto|cpu|mps|cuda)(?::(\d+))?")


def resolve_device(spec: str, *, what: str = "--device") -> torch.device:
    """``auto`` (CUDA when torch sees a GPU, then Apple's MPS, else the CPU), ``cpu``, ``cuda``, ``cuda:N`` or
    ``mps``; a device this machine does not have is an ``InputError`` saying what torch sees and what to use."""
    match = _SPEC.fullmatch(str(spec).strip().lower())
    if match is None or (match.group(2) is not None and match.group(1) != "cuda"):
        raise InputError(f"{what} {spec}: expected {DEVICE_CHOICES}")
    kind, index = match.group(1), match.group(2)
    if kind == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("mps", 0) if _mps_available() else torch.device("cpu")
    if kind == "cpu":
        return torch.device("cpu")
    if kind == "mps":
        if not _mps_available():
            raise InputError(
                f"{what} {spec}: no Apple MPS device is visible to torch (torch.backends.mps.is_available() is "
                f"False); use {what} cpu or auto"
            )
        return torch.device("mps", 0)
    if not torch.cuda.is_available():
        built = "without CUDA" if torch.version.cuda is None else f"for CUDA {torch.version.cuda}"
        raise InputError(
            f"{what} {spec}: no CUDA device is visible to torch (torch.cuda.is_available() is False; torch "
            f"{torch.__version__} was built {built}); use {what} cpu or auto"
        )
    count = torch.cuda.device_count()
    number = torch.cuda.current_device() if index is None else int(index)
    if number >= count:
        raise InputError(
            f"{what} {spec}: torch sees {count} CUDA device{'s' if count != 1 else ''} (cuda:0"
            f"{f' .. cuda:{count - 1}' if count > 1 else ''}); CUDA_VISIBLE_DEVICES may hide the others"
        )
    return torch.device("cuda", number)


def check_device(device: torch.device | str, *, what: str = "device") -> torch.device:
    """``device`` as the Python API takes it (a ``torch.device`` or its name, ``"auto"`` as ``--device auto``), as
    a ``torch.device``; a name torch does not know, or a CUDA or MPS device this machine does not have, is an
    ``InputError`` (``resolve_device``'s) rather than torch's RuntimeError or AssertionError. Other kinds (``meta``,
    ...) are torch's to judge."""
    if isinstance(device, str) and device.strip().lower() == "auto":
        return resolve_device("auto", what=what)
    try:
        checked = torch.device(device)
    except (RuntimeError, TypeError):
        raise InputError(f"{what} {device}: not a device torch knows; expected {DEVICE_CHOICES}") from None
    if checked.type in ("cuda", "mps"):
        resolve_device(str(checked), what=what)
    return checked


def _mps_available() -> bool:
    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())


def model_device(model: nn.Module) -> torch.device:
    """The device of ``model``'s parameters (the CPU for a model without any): where its inputs must go."""
    for param in model.parameters():
        return param.device
    return torch.device("cpu")


def rng_state(device: torch.device) -> dict[str, torch.Tensor]:
    """The random-number state that dropout on ``device`` draws from: the CPU generator's, and the device's own
    generator's on a GPU."""
    state = {"torch": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    elif device.type == "mps":
        state["mps"] = torch.mps.get_rng_state()
    return state


def set_rng_state(state: dict[str, torch.Tensor], device: torch.device) -> None:
    """Restore what ``rng_state`` returned. The state of another device type than ``device`` is ignored: a run
    resumed on another kind of device continues, but only a resume on the same kind is bit-exact."""
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)
    elif device.type == "mps" and "mps" in state:
        torch.mps.set_rng_state(state["mps"])


def available_memory(device: torch.device) -> int | None:
    """Bytes that ``device`` can still give: a GPU's free memory (CUDA), the memory the kernel reports as available
    (Linux's MemAvailable, which counts reclaimable caches); None where neither can be read."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    if device.type != "cpu":
        return None
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024  # reported in kB
    except (OSError, ValueError, IndexError):
        pass
    return None
