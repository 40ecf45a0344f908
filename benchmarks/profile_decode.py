"""Where decoding time goes: a PyTorch profile of the decode suite's attnkit call, greedy or beam 4.

    python benchmarks/profile_decode.py [--search greedy|beam4] [--threads 2] [--rows 12]

The decode suite's setting (the ``small`` translator, 32 sources of 32 tokens, exactly 32 output tokens), one
warm-up call, then one profiled call; prints the operators sorted by their own CPU time. docs/performance.md quotes
it.
"""

from __future__ import annotations

import argparse
import sys

import torch
from torch.profiler import profile

from attnkit.bench.common import PAD_ID, fixed_threads
from attnkit.bench.decode import CONFIGS, SEARCHES, _attnkit, make_sources
from attnkit.model.build import build_translator, prepare_for_inference


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--search", choices=tuple(SEARCHES), default="beam4")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", type=int, default=12)
    args = parser.parse_args()
    cfg = CONFIGS["small"]
    with fixed_threads(args.threads):
        torch.manual_seed(0)
        model = prepare_for_inference(build_translator(cfg, pad_id=PAD_ID))
        call = _attnkit(model, make_sources(cfg, 32, 32, seed=0), SEARCHES[args.search], 32, cfg.max_len)
        call()
        with profile() as prof:
            call()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
