"""Translator data: pairs become source ids (+ EOS) and bare target ids, batched with the shift of §3.1; texts to
translate are encoded as the sources were in training."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from attnkit.data.batching import Truncation, apply_length_policy, pad, real_positions
from attnkit.data.readers.parallel import Pair
from attnkit.errors import InputError, check_texts
from attnkit.tokenization import Tokenizer
from attnkit.training.task import Batch


@dataclass
class ParallelData:
    """Encoded pairs: source ids end with EOS; target ids are bare (BOS / EOS are added when batching). Lists, or a
    prepared corpus's memory-mapped token files (``data.sequences.MappedSequences``), read a batch at a time."""

    src: Sequence[list[int]]
    tgt: Sequence[list[int]]
    truncation: Truncation


def bos_eos(tokenizer: Tokenizer) -> tuple[int, int]:
    """The BOS and EOS ids a translator's tokenizer always has (``train_tokenizer`` adds both)."""
    if tokenizer.bos_id is None or tokenizer.eos_id is None:
        raise InputError("the tokenizer has no BOS / EOS token; a translator needs both")
    return tokenizer.bos_id, tokenizer.eos_id


def encode_pairs(tokenizer: Tokenizer, pairs: list[Pair], max_len: int, policy: str) -> ParallelData:
    """Source = tokens + EOS (at most ``max_len``); target tokens at most ``max_len - 1`` (room for BOS / EOS)."""
    _, eos = bos_eos(tokenizer)
    src = [ids + [eos] for ids in tokenizer.encode_batch([p.source for p in pairs], max_len)]
    tgt = tokenizer.encode_batch([p.target for p in pairs], max_len)
    lines = [p.line for p in pairs]
    src, src_cut = apply_length_policy(src, max_len, policy, what="source sentence", keep_last=1, lines=lines)
    tgt, tgt_cut = apply_length_policy(tgt, max_len - 1, policy, what="target sentence", lines=lines)
    truncation = Truncation(  # of the sentences: a pair's source and target are two
        src_cut.n_truncated + tgt_cut.n_truncated, 2 * len(pairs), max(src_cut.longest, tgt_cut.longest + 1), max_len
    )
    return ParallelData(src, tgt, truncation)


def make_batch(
    data: ParallelData, indices: list[int], tokenizer: Tokenizer
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """src (B, S), tgt_in = BOS y_1 .. y_n (B, T), tgt_out = y_1 .. y_n EOS (B, T): the shift of §3.1 ("the output
    embeddings are offset by one position")."""
    bos, eos = bos_eos(tokenizer)
    src = pad([data.src[i] for i in indices], tokenizer.pad_id)  # (B, S)
    tgt = [data.tgt[i] for i in indices]  # each read once (from a memory map, when prepared)
    tgt_in = pad([[bos] + t for t in tgt], tokenizer.pad_id)  # (B, T)
    tgt_out = pad([t + [eos] for t in tgt], tokenizer.pad_id)  # (B, T)
    return src, tgt_in, tgt_out


def training_batch(data: ParallelData, indices: list[int], tokenizer: Tokenizer) -> Batch:
    """One training batch, every tensor made on the host, so that a step reads nothing back from the device (what
    the loss needs is known before the forward pass). Its tensors: src (B, S) and tgt_in (B, T) as ``make_batch``
    makes them; ``positions`` (N,), the flat positions b * T + t of the N real target tokens (each y_i and the EOS),
    and ``targets`` (N,), their ids; ``src_rows`` (N_src,), the flat positions of the real source tokens (N_src =
    B * S: no padding, so no mask). Its size is N, the tokens the loss is summed over."""
    bos, eos = bos_eos(tokenizer)
    src_ids = [data.src[i] for i in indices]
    tgt = [data.tgt[i] for i in indices]  # each read once (from a memory map, when prepared)
    src = pad(src_ids, tokenizer.pad_id)  # (B, S)
    tgt_in = pad([[bos] + t for t in tgt], tokenizer.pad_id)  # (B, T)
    targets = torch.tensor([token for t in tgt for token in (*t, eos)])  # (N,) y_1 .. y_n EOS of each pair
    positions = real_positions([len(t) + 1 for t in tgt], tgt_in.size(1))  # (N,)
    src_rows = real_positions([len(s) for s in src_ids], src.size(1))  # (N_src,)
    return Batch((src, tgt_in, positions, targets, src_rows), len(targets))


ROWS_MULTIPLE = 8  # a fixed-shape batch's rows: a multiple of this
LENGTH_MULTIPLE = 16  # its source and target lengths: multiples of this (within the positional limit)


def fixed_shape_batch(batch: Batch, pad_id: int, max_positions: int) -> Batch:
    """``batch`` (``training_batch``'s) padded to a bounded set of shapes, for a step recorded as a CUDA graph per
    shape (``training.graphs``): B rows to a multiple of ``ROWS_MULTIPLE``, S and T to multiples of
    ``LENGTH_MULTIPLE`` (at most ``max_positions``, or the batch's own length where that is longer). The rows added
    are copies of row 0 (a row with no real token would attend to nothing, and its softmax's NaN would reach the
    gradients); the loss reads every target position, the added ones and the padding with the padding id as their
    target, which the loss leaves out. Same loss and gradients as ``batch``, up to the order of float additions; the
    size is still the real target tokens.

    Its tensors: src (R, S'), tgt_in (R, T'), positions (R T',) = all of them, targets (R T',); no ``src_rows``
    (their number changes from batch to batch): the encoder masks the padding, as it does on a GPU anyway.
    """
    src, tgt_in, positions, targets, _ = batch.tensors  # (B, S), (B, T), (N,), (N,), (N_src,)
    (B, S), T = src.shape, tgt_in.size(1)
    R = -(-B // ROWS_MULTIPLE) * ROWS_MULTIPLE

    def length(n: int) -> int:
        return min(-(-n // LENGTH_MULTIPLE) * LENGTH_MULTIPLE, max(n, max_positions))

    S2, T2 = length(S), length(T)
    fixed_src = torch.full((R, S2), pad_id, dtype=src.dtype)  # (R, S')
    fixed_src[:B, :S], fixed_src[B:, :S] = src, src[:1]
    fixed_tgt_in = torch.full((R, T2), pad_id, dtype=tgt_in.dtype)  # (R, T')
    fixed_tgt_in[:B, :T], fixed_tgt_in[B:, :T] = tgt_in, tgt_in[:1]
    fixed_targets = torch.full((R * T2,), pad_id, dtype=targets.dtype)  # (R T',)
    fixed_targets[(positions // T) * T2 + positions % T] = targets  # b * T + t -> b * T' + t
    return Batch((fixed_src, fixed_tgt_in, torch.arange(R * T2), fixed_targets), batch.size)


def encode_sources(tokenizer: Tokenizer, texts: list[str], max_len: int, policy: str) -> tuple[list[list[int]], int]:
    """Source ids + EOS, as in training; over-long sources are truncated (keeping the EOS, and counted) or refused,
    as the run was configured. Returns the ids and how many were truncated."""
    texts = check_texts(texts, "source line {}")
    _, eos = bos_eos(tokenizer)
    ids = [s + [eos] for s in tokenizer.encode_batch(texts, max_len)]
    ids, cut = apply_length_policy(ids, max_len, policy, what="source sentence", keep_last=1)
    return ids, cut.n_truncated
