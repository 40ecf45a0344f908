"""Where a training step's time goes: the train suite's step (forward, backward, fused Adam) for attnkit and Hugging
Face Marian side by side, profiled by category.

    python benchmarks/profile_train.py [--config small|base] [--length 32] [--threads 2] [--precision fp32|bf16]
                                       [--tokens 4096]

The train suite's setting (``attnkit bench train``: 4,096 tokens a batch, or ``--tokens``, source and target of
exactly ``--length`` tokens, dropout 0.1, label smoothing 0.1, fused Adam), two warm-up steps, then one profiled step
per implementation (also timed without the profiler, in turns, median of five). Prints each implementation's
operator time by category:
matrix multiplication (forward and backward), attention, LayerNorm, dropout, loss and softmax, the optimizer step,
other elementwise operators, other operators, and what no operator accounts for (Python, autograd, dispatch,
allocation: wall time minus the operators' self time, an upper bound since the profiler's overhead falls there).
docs/performance.md quotes it.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
from torch.profiler import profile

from attnkit.allocator import setting, tune_malloc
from attnkit.bench.common import PAD_ID, fixed_threads, measure_interleaved
from attnkit.bench.train import CONFIGS, forward_fn, make_batch, training_step
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


def category(name: str) -> str:
    for label, fragments in CATEGORIES:
        if any(f in name.lower() for f in fragments):
            return label
    return "other operators"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", choices=tuple(CONFIGS), default="small")
    parser.add_argument("--length", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--tokens", type=int, default=4096, help="tokens a batch (the train suite's: 4,096)")
    args = parser.parse_args()
    tune_malloc()  # as the command line does (ATTNKIT_MALLOC=system leaves glibc's defaults)
    cfg = CONFIGS[args.config]
    impls = ("attnkit", "transformers")
    with fixed_threads(args.threads):
        src, tgt_in, tgt_out = make_batch(cfg, args.length, args.tokens, seed=0)
        torch.manual_seed(0)
        ours = build_translator(cfg, pad_id=PAD_ID)
        steps = {}
        for impl in impls:
            torch.manual_seed(0)
            steps[impl] = training_step(*forward_fn(impl, cfg, ours), src, tgt_in, tgt_out, args.precision)
        timings = measure_interleaved(list(steps.values()), warmup=2, reps=5)
        shares: dict[str, dict[str, float]] = {}
        walls = {}
        for impl, step in steps.items():
            with profile() as prof:
                start = time.perf_counter()
                step()
                walls[impl] = (time.perf_counter() - start) * 1e3
            totals: dict[str, float] = {}
            for event in prof.key_averages():
                totals[category(event.key)] = totals.get(category(event.key), 0.0) + event.self_cpu_time_total / 1e3
            totals["Python, autograd, dispatch (wall - operators)"] = walls[impl] - sum(totals.values())
            shares[impl] = totals
    plain = {impl: t.median_s * 1e3 for impl, t in zip(steps, timings)}
    shape = f"{args.config}, length {args.length}, {args.tokens} tokens"
    setting_line = f"{shape}, {args.precision}, {args.threads} threads"
    print(f"train step, {setting_line}")
    print(f"  malloc: {setting()}")
    print("  without the profiler (median of 5, in turns): " + ", ".join(f"{i} {ms:.1f} ms" for i, ms in plain.items()))
    print(f"  {'category (profiled step)':48s}" + "".join(f"{impl:>22s}" for impl in impls))
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
