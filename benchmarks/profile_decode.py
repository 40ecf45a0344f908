"""Where decoding time goes: a PyTorch profile of the decode suite's attnkit call, greedy or beam 4, by category.

    python benchmarks/profile_decode.py [--search greedy|beam4] [--batch 32] [--threads 2] [--rows 12]

The decode suite's setting (the ``small`` translator, ``--batch`` sources of 32 tokens, exactly 32 output tokens),
one warm-up call, then one profiled call. Prints the operators sorted by their own CPU time, then the call's time
by category: matrix multiplication, attention, cache writes and beam reordering, scoring (log-softmax, top-k,
arg max, banning tokens), LayerNorm and elementwise, other operators, and what no operator accounts for (Python,
dispatch, allocation: wall time of the call minus the operators' self time; the profiler's own overhead falls
there too, so the last figure is an upper bound). docs/performance.md quotes it.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
from torch.profiler import profile

from attnkit.bench.common import PAD_ID, fixed_threads
from attnkit.bench.decode import CONFIGS, SEARCHES, _attnkit, make_sources
from attnkit.model.build import build_translator, prepare_for_inference

# operator name -> category; the first category whose fragment occurs in the name wins
CATEGORIES = (
    ("matmul", ("addmm", "aten::mm", "bmm", "matmul", "linear")),
    ("attention", ("scaled_dot_product", "flash_attention", "_efficient_attention")),
    ("cache write / reorder", ("copy_", "index_select", "index_copy", "cat", "slice_scatter")),
    ("scoring", ("log_softmax", "topk", "argmax", "index_fill", "gather", "argsort", "sort", "max")),
    ("norm / elementwise", ("layer_norm", "relu", "gelu", "add", "mul", "div", "embedding")),
)


def category(name: str) -> str:
    for label, fragments in CATEGORIES:
        if any(f in name for f in fragments):
            return label
    return "other operators"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--search", choices=tuple(SEARCHES), default="beam4")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", type=int, default=12)
    args = parser.parse_args()
    cfg = CONFIGS["small"]
    with fixed_threads(args.threads):
        torch.manual_seed(0)
        model = prepare_for_inference(build_translator(cfg, pad_id=PAD_ID))
        call = _attnkit(model, make_sources(cfg, args.batch, 32, seed=0), SEARCHES[args.search], 32, cfg.max_len)
        call()
        start = time.perf_counter()
        call()
        plain_ms = (time.perf_counter() - start) * 1e3
        with profile() as prof:
            start = time.perf_counter()
            call()
            wall_ms = (time.perf_counter() - start) * 1e3
    events = prof.key_averages()
    print(events.table(sort_by="self_cpu_time_total", row_limit=args.rows))
    shares: dict[str, float] = {}
    for event in events:
        shares[category(event.key)] = shares.get(category(event.key), 0.0) + event.self_cpu_time_total / 1e3
    shares["Python, dispatch, allocation (wall - operators)"] = wall_ms - sum(shares.values())
    print(f"{args.search}, batch {args.batch}: {plain_ms:.1f} ms without the profiler, {wall_ms:.1f} ms with it")
    for label, ms in sorted(shares.items(), key=lambda kv: -kv[1]):
        print(f"  {label:50s} {ms:8.1f} ms  {ms / wall_ms:6.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
