"""From token ids to padded batches: padding, length-bucketed and token-budget batches (the length policy lives in
``lengths`` and is re-exported here).

Bucketing groups sentences of similar length so that little compute is spent on padding; the order of batches
is still shuffled every epoch, from a seeded generator, so runs repeat exactly.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnkit.data.lengths import Truncation, apply_length_policy

__all__ = ["Truncation", "apply_length_policy", "bucketed_batches", "pad", "token_budget_batches"]


def pad(seqs: list[list[int]], pad_id: int) -> Tensor:
    """Right-pad to the longest sequence: list of B lists -> (B, L) long tensor."""
    width = max(len(s) for s in seqs)
    out = torch.full((len(seqs), width), pad_id, dtype=torch.long)  # (B, L)
    for row, s in enumerate(seqs):
        out[row, : len(s)] = torch.tensor(s, dtype=torch.long)
    return out


def bucketed_batches(
    lengths: list[int], batch_size: int, generator: torch.Generator | None, bucket_factor: int = 50
) -> list[list[int]]:
    """Indices grouped into batches of similar length.

    Shuffle (if a generator is given), cut into pools of ``bucket_factor * batch_size``, sort each pool by length,
    cut the pools into batches, shuffle the batches. Without a generator the order is deterministic (evaluation).
    """
    n = len(lengths)
    order = torch.randperm(n, generator=generator).tolist() if generator is not None else list(range(n))
    pool_size = batch_size * bucket_factor
    batches: list[list[int]] = []
    for start in range(0, len(order), pool_size):
        pool = sorted(order[start : start + pool_size], key=lambda i: lengths[i])
        batches.extend(pool[i : i + batch_size] for i in range(0, len(pool), batch_size))
    if generator is not None:
        batches = [batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()]
    return batches


def token_budget_batches(
    src_lengths: list[int], tgt_lengths: list[int], max_tokens: int, generator: torch.Generator | None
) -> list[list[int]]:
    """Batches whose padded source + target token count stays within ``max_tokens`` (§5.1: "each training batch
    contained a set of sentence pairs containing approximately 25000 source tokens and 25000 target tokens").

    Pairs are sorted by length (within shuffled pools, as in ``bucketed_batches``) so that padding is small.
    """
    n = len(src_lengths)
    order = torch.randperm(n, generator=generator).tolist() if generator is not None else list(range(n))
    pool_size = 10000
    batches: list[list[int]] = []
    for start in range(0, n, pool_size):
        pool = sorted(order[start : start + pool_size], key=lambda i: (tgt_lengths[i], src_lengths[i]))
        batch: list[int] = []
        max_src = max_tgt = 0
        for i in pool:
            new_src, new_tgt = max(max_src, src_lengths[i]), max(max_tgt, tgt_lengths[i])
            if batch and (len(batch) + 1) * (new_src + new_tgt) > max_tokens:
                batches.append(batch)
                batch, new_src, new_tgt = [], src_lengths[i], tgt_lengths[i]
            batch.append(i)
            max_src, max_tgt = new_src, new_tgt
        if batch:
            batches.append(batch)
    if generator is not None:
        batches = [batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()]
    return batches
