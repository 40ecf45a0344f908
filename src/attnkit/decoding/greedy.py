"""Greedy decoding: feed the previous token, take the most probable next one, until EOS or the length limit.

The decoder is auto-regressive (§3: "consuming the previously generated symbols as additional input when generating
the next"), so each step needs only the newest position: the key/value cache holds the self-attention keys and
values of the positions before it, and the cross-attention keys and values of the source, computed once.

Decoding state, for A sentences still being decoded (sentences that emitted EOS or reached their limit are dropped,
so they stop costing compute), before step t:
    rows      (A,)                  original batch index of each working row
    limit     (A,)                  maximum number of output tokens of each (§6.1: input length + 50)
    last      (A, 1)                token fed at position t (BOS at t = 0)
    memory    (A, S, D)             encoder output; src_mask (A, 1, 1, S), True = real source token
    cache     n_layers x DecoderLayerCache with A rows: self-attention K/V of positions 0 .. t - 1,
              cross-attention K/V of the source
    out       (B, max limit)        tokens emitted so far, written at column t by original row
    lengths   (B,)                  output length of each sentence (its limit until it emits EOS)
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnkit.decoding.limits import output_limits
from attnkit.model.attention import KVCache
from attnkit.model.layers import DecoderLayerCache
from attnkit.model.transformer import Transformer


@torch.inference_mode()
def greedy_decode(
    model: Transformer,
    src: Tensor,
    *,
    bos_id: int,
    eos_id: int,
    max_positions: int,
    max_extra: int = 50,
    fixed_len: int | None = None,
) -> list[list[int]]:
    """Greedy decoding of a batch of sources with an encoder-decoder ``attnkit.model.transformer.Transformer``.

    Args:
        src: (B, S) source ids, padded with ``model.pad_id``.
        bos_id, eos_id: the target start and end tokens (from the tokenizer).
        max_positions: the decoder's positional limit (the model's ``max_len``); no output is longer.
        max_extra: maximum output length = input length + ``max_extra`` (§6.1: + 50).
        fixed_len: if given, decode exactly this many tokens per sentence, with EOS masked out (benchmarks).
    Returns:
        For each source, its output token ids without BOS and EOS (never ``model.pad_id``).
    """
    limits = output_limits(
        src, pad_id=model.pad_id, max_extra=max_extra, max_positions=max_positions, fixed_len=fixed_len
    )
    if src.size(0) == 0:
        return []
    was_training = model.training
    model.eval()  # no dropout (§5.4 applies it in training only)
    try:
        out, lengths = _greedy(model, src, limits, bos_id=bos_id, eos_id=eos_id, suppress_eos=fixed_len is not None)
    finally:
        model.train(was_training)
    return [row[:n] for row, n in zip(out.tolist(), lengths.tolist())]


def _greedy(
    model: Transformer, src: Tensor, limits: Tensor, *, bos_id: int, eos_id: int, suppress_eos: bool
) -> tuple[Tensor, Tensor]:
    """The decoding loop; returns the emitted tokens (B, max limit) and the output lengths (B,)."""
    B = src.size(0)
    memory, src_mask, _ = model.encode(src)  # (B, S, D), (B, 1, 1, S)
    cache = model.start_cache(memory, int(limits.max()))
    # Never emit padding (as fairseq): a pad token in the prefix would be masked out by a full decoder pass
    # (``decoder_self_mask``) but not by the cached one. Never emit EOS when the length is fixed.
    banned = torch.tensor([model.pad_id] + ([eos_id] if suppress_eos else []), device=src.device)
    rows = torch.arange(B, device=src.device)  # (A,)
    limit = limits  # (A,)
    last = src.new_full((B, 1), bos_id)  # (A, 1)
    steps = int(limits.max())
    out = src.new_full((B, steps), eos_id)  # (B, steps)
    lengths = limits.clone()  # (B,)

    for t in range(steps):
        logits, _, _ = model.decode(last, None, src_mask, cache=cache, offset=t)  # (A, 1, V)
        # (A, V) in float32 (also from a bfloat16 model: ties in argmax stay rare), a copy: the model's output is not
        # written to.
        logits = logits[:, -1].to(torch.float32, copy=True)
        # Indexed assignment touches only the A x len(banned) entries; index_fill's kernel took ~130 us per step
        # even at A = 1 (benchmarks/profile_decode.py --batch 1), where a step's matmuls take ~4 ms.
        logits[:, banned] = float("-inf")
        last = logits.argmax(dim=-1, keepdim=True)  # (A, 1)
        out[rows, t] = last[:, 0]
        ended = last[:, 0] == eos_id  # (A,)
        finished = ended | (limit <= t + 1)  # (A,)
        if not finished.any():
            continue
        lengths[rows[ended]] = t  # EOS was output token t: t tokens before it
        keep = (~finished).nonzero().squeeze(1)  # (A',)
        if keep.numel() == 0:
            break
        rows, limit, last = rows[keep], limit[keep], last[keep]  # (A',), (A',), (A', 1)
        src_mask = src_mask[keep]  # (A', 1, 1, S)
        cache = [select_rows(layer, keep) for layer in cache]
    return out, lengths


def select_rows(cache: DecoderLayerCache, index: Tensor) -> DecoderLayerCache:
    """Keep batch rows ``index`` of a layer's cache (copies)."""
    self_kv, cross_kv = cache.self_kv, cache.cross_kv
    return DecoderLayerCache(KVCache(self_kv.k[index], self_kv.v[index]), KVCache(cross_kv.k[index], cross_kv.v[index]))
