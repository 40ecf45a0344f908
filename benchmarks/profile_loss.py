"""The label-smoothed loss's two paths on this machine, timed in turns: forward + backward of
``training.losses.smoothed_cross_entropy`` over cache-sized blocks of rows (``_SmoothedCrossEntropy``) and in one
fused pass (``F.cross_entropy(logits.float(), ..., label_smoothing=...)``), at the row counts and vocabularies that
training meets, float32 and bfloat16 logits. ``losses.blocked_loss`` chooses between them from these figures.

    python benchmarks/profile_loss.py [--threads 2] [--reps 7] [--device cpu]

Prints one line per shape: the median milliseconds of each path and fused / blocked (above 1: the blocks pay).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from attnkit.bench.gpu import synchronizer
from attnkit.training.losses import _SmoothedCrossEntropy

SHAPES = ((2048, 8000), (16384, 8000), (2048, 16000), (2048, 37000))  # (target rows, vocabulary)
PAD, SMOOTHING = 0, 0.1


def blocked(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return _SmoothedCrossEntropy.apply(logits, targets, PAD, SMOOTHING)


def fused(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float(), targets, ignore_index=PAD, label_smoothing=SMOOTHING, reduction="sum")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    device = torch.device(a.device)
    sync = synchronizer(device) or (lambda: None)
    paths = {"blocked": blocked, "fused": fused}
    for rows, vocab in SHAPES:
        for dtype in (torch.float32, torch.bfloat16):
            gen = torch.Generator().manual_seed(0)
            logits = (torch.randn(rows, vocab, generator=gen) * 3).to(device, dtype).requires_grad_()
            targets = torch.randint(1, vocab, (rows,), generator=gen).to(device)
            times: dict[str, list[float]] = {name: [] for name in paths}
            for r in range(a.reps + 2):  # in turns, the first two rounds untimed
                for name in list(paths)[r % 2 :] + list(paths)[: r % 2]:
                    sync()
                    start = time.perf_counter()
                    paths[name](logits, targets).backward()
                    sync()
                    if r >= 2:
                        times[name].append(time.perf_counter() - start)
                    logits.grad = None
            ms = {name: statistics.median(t) * 1e3 for name, t in times.items()}
            print(
                f"{rows:6d} rows x V {vocab:6d} {str(dtype)[6:]:8s}: blocked {ms['blocked']:8.1f} ms, "
                f"fused {ms['fused']:8.1f} ms, fused / blocked {ms['fused'] / ms['blocked']:.2f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
