"""Batching in numpy draws exactly the batches of its plain Python definition (kept here as the reference): the
same shuffled pools, the same stable sort by length, the same greedy token-budget cut, the same batch order, so
that training from a prepared corpus's lengths and from text makes the same batches."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnkit.data import batching
from attnkit.data.batching import Batches, bucketed_batches, pad, token_budget_batches


def reference_bucketed(lengths, batch_size, generator, bucket_factor):
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


def reference_token_budget(src_lengths, tgt_lengths, max_tokens, generator, pool_size):
    n = len(src_lengths)
    order = torch.randperm(n, generator=generator).tolist() if generator is not None else list(range(n))
    batches = []
    for start in range(0, n, pool_size):
        pool = sorted(order[start : start + pool_size], key=lambda i: (tgt_lengths[i], src_lengths[i]))
        batch: list[int] = []
        max_src, max_tgt = 0, 0
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


lengths_lists = st.lists(st.integers(0, 40), min_size=0, max_size=300)


@settings(max_examples=60, deadline=None)
@given(lengths_lists, st.integers(1, 9), st.integers(1, 5), st.integers(0, 3), st.booleans())
def test_bucketed_batches_equal_the_reference(lengths, batch_size, bucket_factor, seed, shuffled):
    generator = (lambda: torch.Generator().manual_seed(seed)) if shuffled else (lambda: None)
    expected = reference_bucketed(lengths, batch_size, generator(), bucket_factor)
    assert bucketed_batches(lengths, batch_size, generator(), bucket_factor) == expected
    assert list(bucketed_batches(np.array(lengths, dtype=np.int32), batch_size, generator(), bucket_factor)) == expected


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 30), st.integers(0, 30)), max_size=300),
    st.integers(1, 200),
    st.integers(1, 50),
    st.integers(0, 3),
    st.booleans(),
)
def test_token_budget_batches_equal_the_reference(pairs, max_tokens, pool_size, seed, shuffled):
    """Small pools (many of them, cut in parallel), empty sequences, pairs over the budget on their own."""
    src, tgt = [s for s, _ in pairs], [t for _, t in pairs]
    generator = (lambda: torch.Generator().manual_seed(seed)) if shuffled else (lambda: None)
    expected = reference_token_budget(src, tgt, max_tokens, generator(), pool_size)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(batching, "TOKEN_BUDGET_POOL", pool_size)
        got = token_budget_batches(np.array(src), np.array(tgt), max_tokens, generator())
    assert got == expected
    assert [len(batch) for batch in got] == [len(batch) for batch in expected]


def test_token_budget_batches_of_a_large_corpus_equal_the_reference_with_the_default_pool():
    rng = np.random.default_rng(0)
    src, tgt = rng.integers(2, 60, 25_000), rng.integers(2, 60, 25_000)
    expected = reference_token_budget(src.tolist(), tgt.tolist(), 4096, torch.Generator().manual_seed(1), 10_000)
    got = token_budget_batches(src, tgt, 4096, torch.Generator().manual_seed(1))
    assert got == expected and len(got) > 100


def test_batches_behave_as_a_list_of_lists():
    batches = Batches(np.array([4, 2, 0, 1, 3]), np.array([0, 2, 3]), order=np.array([2, 0, 1]))
    assert batches == [[1, 3], [4, 2], [0]] and len(batches) == 3
    assert batches[-1] == [0] and batches[1:] == [[4, 2], [0]] and list(batches) == [[1, 3], [4, 2], [0]]
    assert batches != [[1, 3], [4, 2]] and batches != [[1, 3], [4, 2], [1]]
    with pytest.raises(IndexError):
        batches[3]


def test_pad_right_pads_lists_and_arrays_alike():
    expected = torch.tensor([[5, 6, 7], [8, 0, 0]])
    assert torch.equal(pad([[5, 6, 7], [8]], 0), expected)
    assert torch.equal(pad([np.array([5, 6, 7], dtype=np.uint16), np.array([8], dtype=np.uint16)], 0), expected)
    assert pad([[5, 6, 7], [8]], 0).dtype == torch.long
