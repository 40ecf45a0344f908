"""The token sequences a task indexes: ``seqs[i]`` is one sequence's ids (a list of ints), ``sequence_lengths(seqs)``
all the lengths as an (N,) array, which is all batching reads.

Two kinds: a list of lists (text encoded at start-up, and every validation set) and ``MappedSequences`` (a prepared
corpus's memory-mapped token file, ``data/indexed.py``). A mapped sequence is read from the page cache when its
batch is collated and not before, so each process of a distributed run reads only its own micro-batches; its
lengths are the index's ``sizes``, a view of the mapped file, so nothing is read per sentence at start-up.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import overload

import numpy as np

from attnkit.data.indexed import IndexedTokens


class MappedSequences(Sequence[list[int]]):
    """A memory-mapped token file seen as a read-only list of lists of ids."""

    def __init__(self, tokens: IndexedTokens):
        self.tokens = tokens

    def __len__(self) -> int:
        return len(self.tokens)

    @overload
    def __getitem__(self, i: int) -> list[int]: ...

    @overload
    def __getitem__(self, i: slice) -> list[list[int]]: ...

    def __getitem__(self, i: int | slice) -> list[int] | list[list[int]]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return self.tokens[i].tolist()  # a copy of the mapped ids, as Python ints like a list's

    @property
    def sizes(self) -> np.ndarray:
        return self.tokens.sizes  # (N,) int32, a view of the mapped index


def sequence_lengths(seqs: Sequence[Sequence[int]]) -> np.ndarray:
    """(N,) lengths: a mapped file's index as it is (int32, no copy), a list's counted (int64)."""
    if isinstance(seqs, MappedSequences):
        return seqs.sizes
    return np.fromiter(map(len, seqs), dtype=np.int64, count=len(seqs))


__all__ = ["MappedSequences", "sequence_lengths"]
