"""The machine's matrix-multiplication ceiling (``ceiling_results``), the GFLOP/s that MFU is relative to: the
fastest matmul measured on a CPU; on a GPU, the data sheet's dense peak of each arithmetic (``gpu``) beside the
measured one. The model FLOPs divided by it are counted in ``flops``.
"""

from __future__ import annotations

import torch

from attnkit.bench.flops import gflops
from attnkit.bench.gpu import datasheet_tflops as gpu_datasheet_tflops
from attnkit.bench.gpu import synchronizer
from attnkit.bench.results import Result
from attnkit.bench.timing import Timing, measure
from attnkit.training.precision import native_bf16, set_tf32


def matmul_ceiling(
    dtype: torch.dtype,
    *,
    n: int = 2048,
    warmup: int = 2,
    reps: int = 5,
    device: torch.device | None = None,
    tf32: bool = False,
) -> Timing:
    """Time ``C = A B`` for square (n, n) matrices of ``dtype`` on ``device`` (default the CPU), float32 products on
    TF32 tensor cores where ``tf32`` (CUDA); GFLOP/s = 2 n^3 / median / 1e9 (``gflops``)."""
    device = device or torch.device("cpu")
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    c = torch.empty(n, n, dtype=dtype, device=device)
    restore = set_tf32(tf32, device)
    try:
        return measure(lambda: torch.mm(a, b, out=c), warmup=warmup, reps=reps, sync=synchronizer(device))
    finally:
        restore()


def ceiling_results(
    suite: str, *, threads: int, quick: bool, device: torch.device | None = None
) -> tuple[list[Result], dict[str, float]]:
    """The matrix-multiplication ceilings as results, and the GFLOP/s that MFU is relative to for each arithmetic a
    row computes in ("float32", "tf32", "bfloat16").

    A ceiling is the fastest of square matrix multiplications of a few sizes: which size a BLAS runs fastest
    differs between CPUs (on an AVX2 EPYC, 1024 ran at ~158 GFLOP/s and 2048 at ~107, which made a model's
    training step look faster than "the ceiling"). On the CPU, MFU is relative to the measured float32 ceiling for
    every row, and the bfloat16 one is measured only where the CPU has native bfloat16 (``native_bf16``: emulated, it
    takes minutes and means nothing). On a GPU (``attnkit.bench.gpu``) TF32 is measured too, and MFU is relative to
    the data sheet's dense peak of the row's arithmetic (rows of their own, impl "data sheet"), or to the measured
    ceiling of that arithmetic for a GPU the table does not know.
    """
    device = device or torch.device("cpu")
    on_gpu = device.type == "cuda"
    if on_gpu:
        sizes = (2048, 4096) if quick else (2048, 4096, 8192)
    else:
        sizes = (512, 1024) if quick else (512, 1024, 2048)
    with_bf16 = torch.cuda.is_bf16_supported() if on_gpu else native_bf16()
    results: list[Result] = []
    rates: dict[str, float] = {}  # arithmetic -> the best measured GFLOP/s
    kinds = [("float32", torch.float32, False)] + ([("tf32", torch.float32, True)] if on_gpu else [])
    kinds += [("bfloat16", torch.bfloat16, False)] if with_bf16 else []
    for name, dtype, tf32 in kinds:
        per_size: list[tuple[float, Result]] = []
        for n in sizes:
            timing = matmul_ceiling(
                dtype, n=n, warmup=1 if quick else 3, reps=3 if quick else 10, device=device, tf32=tf32
            )
            rate = gflops(2 * n**3, timing.median_s)
            result = Result(
                suite=suite,
                impl="matmul",
                config=f"{n}x{n}",
                seq_len=None,
                search=None,
                dtype=name,
                ms=timing.median_s * 1e3,
                gflop_per_s=rate,
                threads=threads,
                reps=len(timing.times_s),
            )
            per_size.append((rate, result))
        rate, best = max(per_size, key=lambda pair: pair[0])
        results.append(best)
        rates[name] = rate
    if not on_gpu:
        return results, dict.fromkeys(rates, rates["float32"])
    gpu_name = torch.cuda.get_device_name(device)
    if gpu_datasheet_tflops(gpu_name, "bfloat16") is None:
        for result in results:
            result.settings = f"MFU reference ({gpu_name} is not in attnkit.bench.gpu's data-sheet table)"
        return results, rates
    references: dict[str, float] = {}
    for name in rates:
        peak = gpu_datasheet_tflops(gpu_name, name)
        assert peak is not None  # a GPU in the table has every figure
        references[name] = peak * 1e3
        results.append(
            Result(
                suite=suite,
                impl="data sheet",
                config=gpu_name,
                seq_len=None,
                search=None,
                dtype=name,
                gflop_per_s=peak * 1e3,
                settings="dense peak; the MFU reference of the rows in this arithmetic",
            )
        )
    return results, references
