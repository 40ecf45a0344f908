"""From token ids to padded batches: length policy, padding, length-bucketed and token-budget batches.

Bucketing groups sentences of similar length so that little compute is spent on padding; the order of batches
is still shuffled every epoch, from a seeded generator, so runs repeat exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from attnkit.errors import InputError


@dataclass(frozen=True)
class Truncation:
    """How many inputs were cut to the length limit, and the longest seen (for the user's report)."""

    n_truncated: int
    n_total: int
    longest: int
    limit: int


def apply_length_policy(
    seqs: list[list[int]],
    limit: int,
    policy: str,
    *,
    what: str = "input",
    keep_last: int | None = None,
    lines: list[int] | None = None,
) -> tuple[list[list[int]], Truncation]:
    """Cut sequences longer than ``limit`` tokens (policy "truncate") or refuse them (policy "error").

    ``keep_last`` keeps that many final tokens (an EOS, a [SEP]) when cutting; ``lines`` are the sequences' line
    numbers in their file, for the error. Truncation is returned, never silent.
    """
    longest = max((len(s) for s in seqs), default=0)
    over = [i for i, s in enumerate(seqs) if len(s) > limit]
    if over and policy == "error":
        first = f"line {lines[over[0]]}" if lines else f"#{over[0] + 1}"
        plural = "s are" if len(over) > 1 else " is"
        raise InputError(
            f"{len(over)} {what}{plural} longer than max_len={limit} tokens (first: {first}, {len(seqs[over[0]])} "
            f"tokens); raise max_len or use max_len_policy=truncate"
        )
    if over:
        cut = (lambda s: s[: limit - keep_last] + s[-keep_last:]) if keep_last else (lambda s: s[:limit])
        seqs = [s if len(s) <= limit else cut(s) for s in seqs]
    return seqs, Truncation(len(over), len(seqs), longest, limit)


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
