"""From token ids to padded batches: padding, length-bucketed and token-budget batches (the length policy lives in
``lengths`` and is re-exported here).

Bucketing groups sentences of similar length so that little compute is spent on padding; the order of batches
is still shuffled every epoch, from a seeded generator, so runs repeat exactly.

Batching reads only the lengths, as numpy arrays (a prepared corpus's ``sizes`` are a view of its memory-mapped
index), and sorts them with numpy, so that the batches of a corpus of millions of sentences are drawn in about a
second. The batches are exactly those of the plain Python definition (a stable sort by length inside each shuffled
pool, then a greedy cut), which ``tests/data/test_batching.py`` keeps as the reference.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import overload

import numpy as np
import torch
from torch import Tensor

from attnkit.data.lengths import Truncation, apply_length_policy

__all__ = [
    "Batches",
    "Truncation",
    "apply_length_policy",
    "bucketed_batches",
    "pad",
    "real_positions",
    "token_budget_batches",
]

TOKEN_BUDGET_POOL = 10000  # pairs sorted together before token-budget batches are cut from them


def pad(seqs: Sequence[Sequence[int] | np.ndarray], pad_id: int) -> Tensor:
    """Right-pad to the longest sequence: list of B lists -> (B, L) long tensor."""
    width = max(len(s) for s in seqs)
    out = np.full((len(seqs), width), pad_id, dtype=np.int64)  # (B, L)
    for row, s in enumerate(seqs):
        out[row, : len(s)] = s
    return torch.from_numpy(out)


def real_positions(lengths: Sequence[int] | np.ndarray, width: int) -> Tensor:
    """The flat positions ``b * width + i`` (i < lengths[b]) of the real tokens of a right-padded (B, width) batch, in
    row-major order: (N,) int64, N = sum(lengths). Made on the host with the batch, so that a model picks its real
    tokens with ``index_select``: a boolean mask would have to be read back from a GPU to be applied."""
    lengths = np.asarray(lengths, dtype=np.int64)  # (B,)
    starts = np.repeat(np.arange(len(lengths), dtype=np.int64) * width, lengths)  # (N,) b * width
    within = np.arange(int(lengths.sum()), dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths, lengths)  # (N,)
    return torch.from_numpy(starts + within)


def _lengths(lengths: Sequence[int] | np.ndarray) -> np.ndarray:
    """(N,) lengths as an integer array: a prepared corpus's int32 sizes as they are (no copy), a list converted."""
    array = np.asarray(lengths)
    return array if array.dtype.kind in "iu" else array.astype(np.int64)  # an empty list is float64 to numpy


def _order(n: int, generator: torch.Generator | None) -> np.ndarray:
    """A seeded permutation of ``range(n)`` (the identity without a generator): (n,) int64."""
    return torch.randperm(n, generator=generator).numpy() if generator is not None else np.arange(n)


def _sorted_in_pools(order: np.ndarray, pool_size: int, *keys: np.ndarray) -> np.ndarray:
    """``order`` cut into consecutive pools of ``pool_size``, each sorted stably by ``keys`` (non-negative lengths,
    the first most significant), as Python's stable ``sorted`` with a tuple key sorts each pool: (n,) int64."""
    n = len(order)
    spans = [-(-n // pool_size), *(int(key.max(initial=0)) + 1 for key in keys)]
    if np.prod([float(span) for span in spans]) >= 2.0**62:
        pools = np.arange(n, dtype=np.int64) // pool_size
        return order[np.lexsort([*(key[order] for key in reversed(keys)), pools])]  # the last key is the primary
    # One integer key, mixed radix (pool, key1, key2, ...), built in place: a stable argsort of it is a stable sort
    # by the tuple, three to four times faster than np.lexsort (and faster still in 32 bits), in 8 bytes an item.
    combined = np.arange(n, dtype=np.int64)  # (n,)
    combined //= pool_size
    for key, span in zip(keys, spans[1:]):
        combined *= span
        combined += key[order]
    if np.prod([float(span) for span in spans]) < 2.0**32:
        combined = combined.astype(np.uint32)
    return order[np.argsort(combined, kind="stable")]


class Batches(Sequence[list[int]]):
    """The batches of one epoch: ``batches[i]`` is the list of example indices of the i-th batch in training order.

    Held as numpy arrays (the example indices batch after batch, where each batch starts, the order of the batches):
    8 bytes an example rather than a Python int in a list, so that the batches of millions of sentences are cheap to
    draw and to keep. Compares equal to a list of lists holding the same batches.
    """

    def __init__(self, indices: np.ndarray, starts: np.ndarray, order: np.ndarray | None = None):
        self._indices = indices  # (N,) example indices, batch after batch
        self._bounds = np.append(starts, len(indices))  # (B + 1,) batch j is indices[bounds[j]:bounds[j + 1]]
        self._order = order  # (B,) the training order of the batches; None: as stored

    def __len__(self) -> int:
        return len(self._bounds) - 1

    @overload
    def __getitem__(self, i: int) -> list[int]: ...

    @overload
    def __getitem__(self, i: slice) -> list[list[int]]: ...

    def __getitem__(self, i: int | slice) -> list[int] | list[list[int]]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        j = range(len(self))[i]  # IndexError past the end, as a list
        if self._order is not None:
            j = int(self._order[j])
        return self._indices[self._bounds[j] : self._bounds[j + 1]].tolist()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or len(other) != len(self):
            return False
        return all(mine == list(theirs) for mine, theirs in zip(self, other))

    __hash__ = None  # type: ignore[assignment]  # mutable-looking and compared by value, like a list

    def __repr__(self) -> str:
        return f"Batches({len(self)} batches of {len(self._indices)} examples)"


def _shuffled(indices: np.ndarray, starts: np.ndarray, generator: torch.Generator | None) -> Batches:
    """The batches in a seeded random order (as stored without a generator)."""
    order = torch.randperm(len(starts), generator=generator).numpy() if generator is not None else None
    return Batches(indices, starts, order)


def bucketed_batches(
    lengths: Sequence[int] | np.ndarray, batch_size: int, generator: torch.Generator | None, bucket_factor: int = 50
) -> Batches:
    """Indices grouped into batches of similar length.

    Shuffle (if a generator is given), cut into pools of ``bucket_factor * batch_size``, sort each pool by length,
    cut the pools into batches, shuffle the batches. Without a generator the order is deterministic (evaluation).
    """
    sizes = _lengths(lengths)  # (N,)
    ranked = _sorted_in_pools(_order(len(sizes), generator), batch_size * bucket_factor, sizes)
    # Every pool but the last holds a whole number of batches, so cutting the concatenated pools cuts each pool.
    return _shuffled(ranked, np.arange(0, len(ranked), batch_size), generator)


def token_budget_batches(
    src_lengths: Sequence[int] | np.ndarray,
    tgt_lengths: Sequence[int] | np.ndarray,
    max_tokens: int,
    generator: torch.Generator | None,
) -> Batches:
    """Batches whose padded source + target token count stays within ``max_tokens`` (§5.1: "each training batch
    contained a set of sentence pairs containing approximately 25000 source tokens and 25000 target tokens").

    Pairs are sorted by (target, source) length within shuffled pools of ``TOKEN_BUDGET_POOL`` pairs, so that
    padding is small; each pool is then cut greedily: a pair joins the batch unless the batch's padded size,
    (pairs + 1) * (longest source + longest target), would pass ``max_tokens`` (a pair alone always makes a batch).
    """
    src, tgt = _lengths(src_lengths), _lengths(tgt_lengths)  # (N,), (N,)
    ranked = _sorted_in_pools(_order(len(src), generator), TOKEN_BUDGET_POOL, tgt, src)
    return _shuffled(ranked, _greedy_starts(src[ranked], tgt[ranked], max_tokens, TOKEN_BUDGET_POOL), generator)


def _greedy_starts(src: np.ndarray, tgt: np.ndarray, max_tokens: int, pool_size: int) -> np.ndarray:
    """Where each token-budget batch starts in the pool-sorted pairs: (B,) positions, ascending.

    The greedy cut is sequential within a pool, but the pools are independent: every pool cuts its next batch at
    once, as rows of a (pools, window) array, so a corpus of millions of pairs takes a few hundred numpy steps.
    """
    n = len(src)
    cursor = np.arange(0, n, pool_size)  # (P,) where each pool's next batch starts
    pool_end = np.minimum(cursor + pool_size, n)  # (P,)
    found_starts = []
    while cursor.size:
        found_starts.append(cursor)
        # Padded widths only grow along a batch, so a batch holds at most max_tokens // (its first pair's width)
        # pairs: a window of one more finds its end (it doubles in the rare case it does not, e.g. empty pairs).
        first = src[cursor].astype(np.int64) + tgt[cursor]  # (P,)
        window = min(pool_size, int((max_tokens // np.maximum(1, first)).max()) + 2)
        while True:
            steps = np.arange(window)  # (W,)
            inside = cursor[:, None] + steps < pool_end[:, None]  # (P, W)
            pos = np.minimum(cursor[:, None] + steps, pool_end[:, None] - 1)  # (P, W)
            width = np.maximum.accumulate(src[pos], axis=1) + np.maximum.accumulate(tgt[pos], axis=1)  # (P, W)
            width = width.astype(np.int64)  # (P, W) times a count below: no overflow in a narrow dtype
            over = ((steps + 1) * width > max_tokens) & inside  # (P, W) the batch up to here would be too big
            over[:, 0] = False  # a pair alone is a batch, whatever its size
            found = over.any(axis=1)  # (P,)
            if (found | (cursor + window >= pool_end)).all() or window >= pool_size:
                break
            window *= 2
        end = np.where(found, cursor + over.argmax(axis=1), pool_end)  # (P,)
        more = end < pool_end
        cursor, pool_end = end[more], pool_end[more]
    return np.sort(np.concatenate(found_starts)) if found_starts else np.zeros(0, dtype=np.int64)
