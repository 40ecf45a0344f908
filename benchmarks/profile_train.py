"""Where a training step's time goes: the train suite's step (forward, backward, fused Adam) for attnkit and Hugging
Face Marian side by side, profiled by category.

    python benchmarks/profile_train.py [--config small|base] [--length 32] [--threads 2] [--precision fp32|bf16]
                                       [--tokens 4096] [--device cpu|cuda] [--compiled] [--trace DIR]

The train suite's setting (``attnkit bench train``: 4,096 tokens a batch, or ``--tokens``, source and target of
exactly ``--length`` tokens, dropout 0.1, label smoothing 0.1, fused Adam), two warm-up steps, then one profiled step
per implementation (also timed without the profiler, in turns, median of five). Prints each implementation's
operator time by category:
matrix multiplication (forward and backward), attention, LayerNorm, dropout, loss and softmax, the optimizer step,
other elementwise operators, other operators, and what no operator accounts for (Python, autograd, dispatch,
allocation: wall time minus the operators' self time, an upper bound since the profiler's overhead falls there).
docs/performance.md quotes it.

On a GPU (``--device cuda``; give ``--tokens 32768``, the suite's GPU batch) the table is the GPU's instead: kernel
time by category (matrix products, attention, Inductor's fused kernels, ...) and the time the GPU sat idle within
the step (wall time between two synchronisations minus kernel time: launches, host work, waits). ``--compiled``
adds attnkit's step compiled as ``--set compile=true`` trains it (row "attnkit compiled"; compiled before the
timing). ``--trace DIR`` writes each profiled step as a Chrome trace (``chrome://tracing``, Perfetto).
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from attnkit.allocator import setting, tune_malloc
from attnkit.bench.gpu import synchronizer
from attnkit.bench.timing import fixed_threads, measure_interleaved
from attnkit.bench.token_ids import PAD_ID
from attnkit.bench.train import COMPILE_BACKEND, CONFIGS
from attnkit.bench.train_inputs import make_batch
from attnkit.bench.train_steps import forward_fn, training_step
from attnkit.model.build import build_translator

# operator name -> category; the first category whose fragment occurs in the name wins
CATEGORIES = (
    ("optimizer step (fused Adam)", ("adam",)),
    ("attention", ("scaled_dot_product", "flash_attention", "_efficient_attention", "softmax_backward", "bmm")),
    ("matrix multiplication", ("addmm", "aten::mm", "matmul", "linear")),
    ("LayerNorm", ("layer_norm",)),
    ("dropout", ("dropout", "bernoulli")),
    ("loss, log-softmax", ("cross_entropy", "log_softmax", "nll_loss", "smoothed")),
    ("other elementwise", ("add", "mul", "div", "relu", "gelu", "threshold", "where", "masked_fill", "copy_", "sum")),
)


# a GPU kernel's name -> category (cuBLAS / CUTLASS products are named gemm, nvjet, xmma, sm90_...)
KERNEL_CATEGORIES = (
    ("optimizer step (fused Adam)", ("adam", "multi_tensor")),
    ("attention", ("flash", "fmha", "attention", "cudnn")),
    ("matrix multiplication", ("gemm", "nvjet", "xmma", "cutlass", "sm90_", "sm80_", "cublas")),
    ("Inductor's fused kernels (compiled)", ("triton_",)),
    ("LayerNorm", ("layer_norm", "layernorm")),
    ("dropout", ("dropout", "bernoulli", "philox")),
    ("loss, softmax", ("cross_entropy", "softmax", "nll_loss")),
    ("reductions", ("reduce",)),
    ("copies and fills", ("memcpy", "memset", "copy", "fill")),
    ("other elementwise", ("elementwise", "vectorized", "unrolled")),
)


def category(name: str, table=CATEGORIES, rest: str = "other operators") -> str:
    for label, fragments in table:
        if any(f in name.lower() for f in fragments):
            return label
    return rest


def kernel_totals(prof, wall_ms: float) -> dict[str, float]:
    """Milliseconds of GPU kernel time by category, and the GPU's idle time within the step (wall minus kernels)."""
    totals: dict[str, float] = {}
    for event in prof.key_averages():
        if event.device_type == DeviceType.CUDA:  # a kernel, a copy or a fill
            label = category(event.key, KERNEL_CATEGORIES, "other kernels")
            totals[label] = totals.get(label, 0.0) + event.self_device_time_total / 1e3
    totals["GPU idle (wall - kernels: launches, host work)"] = wall_ms - sum(totals.values())
    return totals


def operator_totals(prof, wall_ms: float) -> dict[str, float]:
    """Milliseconds of CPU operator self time by category, and what no operator accounts for."""
    totals: dict[str, float] = {}
    for event in prof.key_averages():
        totals[category(event.key)] = totals.get(category(event.key), 0.0) + event.self_cpu_time_total / 1e3
    totals["Python, autograd, dispatch (wall - operators)"] = wall_ms - sum(totals.values())
    return totals


GRAPHS = "attnkit compiled+graphs"  # the step compiled as torch.compile(mode="reduce-overhead") makes it
CPP = "attnkit compiled+cpp"  # the step compiled with Inductor's C++ wrapper
ADAM = "attnkit compiled+adam"  # the step compiled, and the optimizer's step compiled too
TUNED = "attnkit compiled+tuned"  # the step compiled, each fused kernel's block sizes tuned by timing (CUDA)
OPTIONS = {  # variant -> Inductor's options
    GRAPHS: {"triton.cudagraphs": True},
    CPP: {"cpp_wrapper": True},
    ADAM: {},
    TUNED: {"coordinate_descent_tuning": True},
}


def longest(prof, n: int, on_gpu: bool) -> list[str]:
    """The ``n`` kernels (GPU) or operators (CPU) of most self time in a profiled step: ms, calls, category, name."""
    rows = []
    for event in prof.key_averages():
        if on_gpu and event.device_type != DeviceType.CUDA:
            continue
        ms = (event.self_device_time_total if on_gpu else event.self_cpu_time_total) / 1e3
        rows.append((ms, event.count, event.key))
    table = KERNEL_CATEGORIES if on_gpu else CATEGORIES
    return [
        f"    {ms:8.2f} ms {count:6d}x  {category(name, table, 'other')[:24]:24s}  {name[:110]}"
        for ms, count, name in sorted(rows, reverse=True)[:n]
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", choices=tuple(CONFIGS), default="small")
    parser.add_argument("--length", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--tokens", type=int, default=4096, help="tokens a batch (the train suite's: 4,096)")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--compiled", action="store_true", help="also attnkit's step compiled (--set compile=true)")
    parser.add_argument(
        "--cpp-wrapper",
        action="store_true",
        help="also attnkit's step compiled with Inductor's C++ wrapper (cpp_wrapper: kernels launched from C++, not "
        "Python)",
    )
    parser.add_argument(
        "--compiled-adam",
        action="store_true",
        help="also attnkit's step compiled with its fused Adam step compiled too (the optimizer's Python walk over "
        "the parameters traced once)",
    )
    parser.add_argument(
        "--cuda-graphs",
        action="store_true",
        help="also attnkit's step compiled and replayed as CUDA graphs (Inductor's cudagraph trees, "
        'torch.compile(mode="reduce-overhead"); CUDA only)',
    )
    parser.add_argument(
        "--tuned",
        action="store_true",
        help="also attnkit's step compiled with Inductor's coordinate-descent tuning (each fused kernel's block "
        "sizes chosen by timing: what LayerNorm's fused backward, at a third of the memory's speed, might gain; CUDA "
        "only)",
    )
    parser.add_argument("--trace", type=Path, help="a folder for each profiled step's Chrome trace (gzipped)")
    parser.add_argument("--top", type=int, default=0, help="also list each implementation's N longest kernels")
    args = parser.parse_args()
    tune_malloc()  # as the command line does (ATTNKIT_MALLOC=system leaves glibc's defaults)
    cfg = CONFIGS[args.config]
    device = torch.device(args.device)
    on_gpu = device.type == "cuda"
    waits = synchronizer(device)
    sync = waits or (lambda: None)  # waits for the GPU's queue; nothing to wait for on a CPU
    if (args.cuda_graphs or args.tuned) and not on_gpu:
        parser.error("--cuda-graphs, --tuned: CUDA only")
    impls = ("attnkit", "transformers") + (("attnkit compiled",) if args.compiled else ())
    impls += ((GRAPHS,) if args.cuda_graphs else ()) + ((CPP,) if args.cpp_wrapper else ())
    impls += ((ADAM,) if args.compiled_adam else ()) + ((TUNED,) if args.tuned else ())
    with fixed_threads(args.threads):
        src, tgt_in, tgt_out = (t.to(device) for t in make_batch(cfg, args.length, args.tokens, seed=0))
        torch.manual_seed(0)
        ours = build_translator(cfg, pad_id=PAD_ID).to(device)
        steps = {}
        for impl in impls:
            torch.manual_seed(0)
            # Dynamo keeps its programs per code object and tells them apart by their guards: each variant of the
            # compiled step takes a copy of the model, so that it compiles a program of its own under its options
            # rather than reuse the plain one
            variant = impl in OPTIONS
            model, forward = forward_fn(impl.split(" ")[0], cfg, copy.deepcopy(ours) if variant else ours)
            backend = COMPILE_BACKEND if " compiled" in impl else None
            steps[impl] = training_step(
                model.to(device),
                forward,
                src,
                tgt_in,
                tgt_out,
                args.precision,
                compile_backend=backend,
                compile_optimizer=impl == ADAM,
            )
            if backend is not None:  # the compilation, before the timing (graphs: recorded by the third call)
                with torch._inductor.config.patch(OPTIONS.get(impl, {})):
                    for _ in range(3 if impl == GRAPHS else 1):
                        steps[impl]()
        timings = measure_interleaved(list(steps.values()), warmup=2, reps=5, sync=waits)
        shares: dict[str, dict[str, float]] = {}
        tops: dict[str, list[str]] = {}
        walls = {}
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
        for impl, step in steps.items():
            sync()
            with profile(activities=activities) as prof:
                start = time.perf_counter()
                step()
                sync()
                walls[impl] = (time.perf_counter() - start) * 1e3
            shares[impl] = kernel_totals(prof, walls[impl]) if on_gpu else operator_totals(prof, walls[impl])
            tops[impl] = longest(prof, args.top, on_gpu)
            if args.trace:
                args.trace.mkdir(parents=True, exist_ok=True)
                prof.export_chrome_trace(str(args.trace / f"{impl.replace(' ', '-').replace('+', '-')}.json.gz"))
    plain = {impl: t.median_s * 1e3 for impl, t in zip(steps, timings)}
    shape = f"{args.config}, length {args.length}, {args.tokens} tokens"
    setting_line = f"{shape}, {args.precision}, " + (
        torch.cuda.get_device_name(device) if on_gpu else f"{args.threads} threads"
    )
    print(f"train step, {setting_line}")
    print(f"  malloc: {setting()}")
    print("  without the profiler (median of 5, in turns): " + ", ".join(f"{i} {ms:.1f} ms" for i, ms in plain.items()))
    what = "GPU kernel time by category (profiled step)" if on_gpu else "category (profiled step)"
    print(f"  {what:48s}" + "".join(f"{impl:>22s}" for impl in impls))
    labels = sorted(
        {label for totals in shares.values() for label in totals}, key=lambda k: -shares["attnkit"].get(k, 0)
    )
    for label in labels:
        cells = "".join(
            f"{shares[impl].get(label, 0.0):9.1f} ms {shares[impl].get(label, 0.0) / walls[impl]:6.1%}   "
            for impl in impls
        )
        print(f"  {label:48s}{cells}")
    print(f"  {'wall (profiled)':48s}" + "".join(f"{walls[impl]:9.1f} ms {'':9s}" for impl in impls))
    for impl, lines in tops.items():
        if lines:
            print(f"  {impl}: the {len(lines)} longest {'kernels' if on_gpu else 'operators'} (self time, calls, name)")
            print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
