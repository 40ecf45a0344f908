"""The train suite's inputs: batches of one fixed shape (``make_batch``), token-budget batches of varied shapes as
``translate train`` cuts them (``token_budget_cycles``), and sentence pairs of text for a whole ``translate train``
run (``reversal_pairs``).

Token ids are random ordinary tokens (``token_ids``): speed does not depend on which words a batch holds. A target
is ``tgt_in`` = BOS y_1 .. y_{n-1} against ``tgt_out`` = y_1 .. y_{n-1} EOS, padded with PAD_ID where a batch pads.
"""

from __future__ import annotations

import random

import torch
from torch import Tensor

from attnkit.bench.token_ids import BOS_ID, EOS_ID, FIRST_ORDINARY_ID, PAD_ID
from attnkit.config import TranslatorConfig
from attnkit.data.batching import token_budget_batches
from attnkit.data.readers.parallel import Pair


def reversal_pairs(n: int, *, vocab: int = 300, seed: int = 0) -> list[Pair]:
    """``n`` sentence pairs of 4-20 words drawn from ``vocab`` word types, each target its source reversed: text for a
    whole ``translate train`` run (tokenizer, token-budget batches, steps) where real data is not needed."""
    r = random.Random(seed)
    words = [f"w{i}" for i in range(vocab)]
    pairs = []
    for line in range(n):
        s = r.choices(words, k=r.randint(4, 20))
        pairs.append(Pair(" ".join(s), " ".join(reversed(s)), line + 2))
    return pairs


def make_batch(cfg: TranslatorConfig, length: int, tokens_per_batch: int, seed: int) -> tuple[Tensor, Tensor, Tensor]:
    """``src`` (B, L), ``tgt_in`` (B, L) = BOS y_1 .. y_{L-1}, ``tgt_out`` (B, L) = y_1 .. y_{L-1} EOS."""
    if length > cfg.max_len:
        raise ValueError(f"length={length} is past the model's max_len={cfg.max_len}")
    B = max(1, tokens_per_batch // (2 * length))
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(FIRST_ORDINARY_ID, cfg.vocab_size, (B, length), generator=gen)  # (B, L)
    words = torch.randint(FIRST_ORDINARY_ID, cfg.vocab_size, (B, length - 1), generator=gen)  # (B, L - 1)
    tgt_in = torch.cat([torch.full((B, 1), BOS_ID), words], dim=1)  # (B, L)
    tgt_out = torch.cat([words, torch.full((B, 1), EOS_ID)], dim=1)  # (B, L)
    return src, tgt_in, tgt_out


CYCLE = 8  # steps per timed call of the token-budget variant


def token_budget_cycles(
    cfg: TranslatorConfig, length: int, tokens_per_batch: int, cycles: int, seed: int
) -> list[list[tuple[Tensor, Tensor, Tensor]]]:
    """``cycles`` lists of ``CYCLE`` batches as ``translate train`` cuts them: sentence pairs of lengths drawn
    uniformly from L/4 .. L (the target within 3 tokens of its source), cut into batches of at most
    ``tokens_per_batch`` source + target tokens, padding included (``data.batching.token_budget_batches``), each
    batch padded to its longest; the shapes vary from batch to batch."""
    gen = torch.Generator().manual_seed(seed)
    n = cycles * CYCLE * max(1, tokens_per_batch // length) * 2  # more pairs than the batches need
    src_len = torch.randint(max(2, length // 4), length + 1, (n,), generator=gen)  # (n,)
    tgt_len = (src_len + torch.randint(-3, 4, (n,), generator=gen)).clamp(2, length)  # (n,) counting BOS / EOS
    batches = []
    for indices in token_budget_batches(src_len.numpy(), tgt_len.numpy(), tokens_per_batch, gen)[: cycles * CYCLE]:
        s_len, t_len = src_len[indices], tgt_len[indices]  # (B,), (B,)
        B, S, T = len(indices), int(s_len.max()), int(t_len.max())
        src = torch.randint(FIRST_ORDINARY_ID, cfg.vocab_size, (B, S), generator=gen)  # (B, S)
        words = torch.randint(FIRST_ORDINARY_ID, cfg.vocab_size, (B, T), generator=gen)  # (B, T)
        tgt_in = torch.cat([torch.full((B, 1), BOS_ID), words[:, : T - 1]], dim=1)  # (B, T) BOS y_1 .. y_{n-1}
        tgt_out = words.scatter(1, (t_len - 1)[:, None], EOS_ID)  # (B, T) y_1 .. y_{n-1} EOS
        src = src.masked_fill(torch.arange(S) >= s_len[:, None], PAD_ID)
        tgt_pad = torch.arange(T) >= t_len[:, None]  # (B, T)
        batches.append((src, tgt_in.masked_fill(tgt_pad, PAD_ID), tgt_out.masked_fill(tgt_pad, PAD_ID)))
    return [batches[i : i + CYCLE] for i in range(0, len(batches), CYCLE)]
