"""What timing on a GPU adds to the suites: the device's clock, its bfloat16 ceiling, its memory, its record.

Clock. CUDA kernels run asynchronously: a call returns once its kernels are queued, not done. ``synchronizer``
gives the function that waits for the device (``torch.cuda.synchronize``); ``timing.measure`` calls it before
starting the clock and before stopping it, so each time covers the call's work and nothing queued before it. On the
CPU it is None and nothing waits.

Ceiling. On a CPU, MFU is relative to the float32 matrix multiplication the machine was measured to run
(``ceiling.ceiling_results``): a CPU has no published peak that its BLAS reaches. On a GPU the convention is the data
sheet's dense tensor-core peak of the arithmetic a row computes in (PaLM's MFU; torchtitan and Megatron report it
so): bfloat16 rows against the bfloat16 peak, TF32 rows (float32 with TF32 matrix products, training's default)
against the TF32 peak, IEEE float32 rows against the float32 peak. ``DATASHEET_TFLOPS`` holds them for the GPUs it
names (dense: NVIDIA prints the TF32 and bfloat16 figures with 2:4 sparsity, twice these). For a GPU not in the
table, MFU is relative to the fastest matrix multiplication measured on it in the same arithmetic, and the ceiling
rows say so.

Memory. ``PeakCUDA`` is ``memory.PeakRSS``'s counterpart: the peak of PyTorch's CUDA allocator during the block
above what was allocated just before it (activations, gradients, optimizer state; not the weights and inputs that
existed before).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

# Dense peaks, TFLOP/s, from NVIDIA's data sheets: IEEE float32, TF32 tensor cores, bfloat16 tensor cores. Keys are
# matched against torch.cuda.get_device_name in order, so the more specific names come first.
DATASHEET_TFLOPS: tuple[tuple[str, dict[str, float]], ...] = (
    ("H100 PCIe", {"float32": 51.0, "tf32": 378.0, "bfloat16": 756.0}),
    ("H100 NVL", {"float32": 60.0, "tf32": 417.5, "bfloat16": 835.0}),
    ("H100", {"float32": 67.0, "tf32": 494.5, "bfloat16": 989.0}),  # SXM5 ("NVIDIA H100 80GB HBM3")
    ("H200", {"float32": 67.0, "tf32": 494.5, "bfloat16": 989.0}),  # the H100's die, faster memory (GH200 too)
    ("A100", {"float32": 19.5, "tf32": 156.0, "bfloat16": 312.0}),
    ("L40S", {"float32": 91.6, "tf32": 183.0, "bfloat16": 362.0}),
    ("L4", {"float32": 30.3, "tf32": 60.0, "bfloat16": 121.0}),
)
DTYPES = ("float32", "tf32", "bfloat16")  # the arithmetic of a training row on a GPU


def synchronizer(device: torch.device) -> Callable[[], None] | None:
    """The function that waits until ``device`` has finished its queued work; None on the CPU."""
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return None


def datasheet_tflops(name: str, dtype: str) -> float | None:
    """The data sheet's dense peak in ``dtype`` ("float32", "tf32" or "bfloat16") of the GPU named ``name`` (as
    ``torch.cuda.get_device_name`` spells it), None for a GPU the table does not know."""
    for key, peaks in DATASHEET_TFLOPS:
        if key.lower() in name.lower():
            return peaks[dtype]
    return None


def datasheet_bf16_tflops(name: str) -> float | None:
    """The data sheet's dense bfloat16 peak of the GPU named ``name`` (``datasheet_tflops``)."""
    return datasheet_tflops(name, "bfloat16")


def gpu_info(device: torch.device) -> dict:
    """The record of the GPU a run timed on: name, compute capability, memory, CUDA and driver-visible count."""
    props = torch.cuda.get_device_properties(device)
    return {
        "name": props.name,
        "capability": f"{props.major}.{props.minor}",
        "memory_gib": round(props.total_memory / 2**30, 1),
        "multiprocessors": props.multi_processor_count,
        "cuda": torch.version.cuda,
        "bf16_datasheet_tflops": datasheet_bf16_tflops(props.name),
    }


class PeakCUDA:
    """Peak CUDA memory the block allocated above what was allocated on entry, in MiB (``peak_mib``)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.peak_mib: float | None = None
        self._base = 0

    def __enter__(self) -> PeakCUDA:
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        self._base = torch.cuda.memory_allocated(self.device)
        return self

    def __exit__(self, *exc) -> None:
        torch.cuda.synchronize(self.device)
        self.peak_mib = max(0, torch.cuda.max_memory_allocated(self.device) - self._base) / 2**20
