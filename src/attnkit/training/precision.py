"""Numeric precision of the forward pass: float32, or mixed precision (Micikevicius et al., 2018) with bfloat16 or
float16 autocast; and TF32 matrix multiplications on GPUs that have them.

Under autocast the weights, the optimizer's moments and the loss stay in float32; matrix multiplications run in the
lower precision. float16's narrow exponent range makes small gradients underflow to zero, so an fp16 step scales
the loss up before the backward pass and the gradients back down before clipping (``torch.amp.GradScaler``); a
step whose scaled gradients overflowed is skipped and the scale halved, which is the scaler working, not the run
diverging. bfloat16 has float32's exponent range and needs no scaler.

    precision   where                                            what it needs
    fp32        everywhere
    bf16        CUDA (compute capability 8.0+ for speed), CPUs     on a CPU, AMX or AVX512-BF16 (``native_bf16``);
                with native bfloat16                              elsewhere it runs, ~100x slower (``SLOW_BF16_NOTE``)
    fp16        CUDA only                                         a gradient scaler (training)
    int8        decoding a translator on a CPU (inference only)   as bf16: its activations run in bfloat16
                                                                  (``attnkit.inference.quantize``)
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from attnkit.errors import InputError

PRECISIONS = ("fp32", "bf16", "fp16")
DECODING_PRECISIONS = (*PRECISIONS, "int8")  # a translator's inference adds int8 weights
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}

SLOW_BF16_NOTE = (
    "your CPU has no native bfloat16 arithmetic (AMX or AVX512-BF16): bf16 matrix multiplications "
    "are emulated on it and run about 100x slower than float32; use fp32"
)


def check_precision(
    precision: str, device: torch.device, *, what: str = "config key precision", allowed: tuple[str, ...] = PRECISIONS
) -> None:
    """An ``InputError`` naming ``what`` when ``precision`` is not one of ``allowed`` or cannot run on ``device``
    (fp16 off CUDA, bf16 on a GPU without bfloat16, int8 off a CPU), saying what to use instead."""
    if precision not in allowed:
        only = " (int8 is for decoding with a translator)" if precision == "int8" else ""
        raise InputError(f"{what}={precision!r}; expected one of {', '.join(allowed)}{only}")
    if precision == "int8" and device.type != "cpu":
        raise InputError(
            f"{what}=int8 runs on CPUs (int8 weights for decoding a few sentences at a time); on {device.type} use "
            "bf16 or fp16"
        )
    if precision == "fp16" and device.type != "cuda":
        raise InputError(
            f"{what}=fp16 runs on CUDA devices only; on {device.type} use bf16 (native on CPUs with AMX or "
            f"AVX512-BF16) or fp32"
        )
    if precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise InputError(f"{what}=bf16: {torch.cuda.get_device_name(device)} has no bfloat16; use fp16 or fp32")


def autocast(precision: str, device: torch.device | str = "cpu") -> torch.autocast:
    """The forward pass's numeric precision on ``device``: autocast to bfloat16 or float16, or nothing for fp32."""
    device_type = torch.device(device).type
    return torch.autocast(device_type, dtype=DTYPES.get(precision, torch.bfloat16), enabled=precision in DTYPES)


def grad_scaler(precision: str, device: torch.device) -> torch.amp.GradScaler | None:
    """The loss scaler an fp16 training step needs; None for fp32 and bf16."""
    if precision != "fp16":
        return None
    check_precision(precision, device)
    return torch.amp.GradScaler(device.type)


def set_tf32(enabled: bool, device: torch.device) -> Callable[[], None]:
    """On CUDA, let float32 matrix multiplications use TF32 tensor cores (10-bit mantissa, Ampere and newer; a no-op
    on older GPUs) or forbid it; returns the function that restores the previous setting. Nothing on other
    devices."""
    if device.type != "cuda":
        return lambda: None
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = enabled

    def restore() -> None:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before

    return restore


def native_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 matrices in hardware (AMX tiles or AVX512-BF16). Without either,
    oneDNN emulates bfloat16 and a matrix multiplication runs about 100x slower than in float32 (measured on an
    AVX2-only AMD EPYC: 0.9 against 158 GFLOP/s), so ``precision=bf16`` on a CPU is only worth it where this is
    True."""
    probes = ("_is_amx_tile_supported", "_is_avx512_bf16_supported")  # torch.cpu's (private) CPUID probes
    return any(getattr(torch.cpu, name, lambda: False)() for name in probes)


def slow_bf16(precision: str, device: torch.device) -> bool:
    """Whether ``precision`` computes in bfloat16 (bf16, and int8's activations) emulated on a CPU without native
    bfloat16 (worth a note to the user)."""
    return precision in ("bf16", "int8") and device.type == "cpu" and not native_bf16()
