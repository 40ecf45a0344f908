"""How long an output may grow before decoding stops it.

§6.1: "We set the maximum output length during inference to input length + 50, but terminate early when
possible." The limit is per sentence, from that sentence's own length, so that padding it into a batch with longer
sentences does not change its output.
"""

from __future__ import annotations

import torch
from torch import Tensor


def output_limits(src: Tensor, *, pad_id: int, max_extra: int, max_positions: int, fixed_len: int | None) -> Tensor:
    """The maximum number of output tokens (EOS not counted) of each sentence: (B, S) ids -> (B,) long.

    Args:
        src: source ids, padded with ``pad_id``; the input length of a sentence is its number of non-pad tokens.
        max_extra: the paper's "+ 50".
        max_positions: the decoder's positional limit (``max_len`` of the model). Output token t (from 0) is
            predicted from the input at position t (BOS at 0), so N output tokens need positions 0 .. N - 1.
        fixed_len: if given, every sentence gets exactly this many tokens (the caller masks EOS out); for
            benchmarks that must decode the same number of steps whatever the weights.
    Raises:
        ValueError: naming the impossible value.
    """
    if src.dim() != 2:
        raise ValueError(f"src must be (B, S) token ids; got shape {tuple(src.shape)}")
    if max_positions < 1:
        raise ValueError(f"max_positions={max_positions} must be >= 1")
    if max_extra < 0:
        raise ValueError(f"max_extra={max_extra} must be >= 0")
    if fixed_len is not None:
        if not 1 <= fixed_len <= max_positions:
            raise ValueError(f"fixed_len={fixed_len} must be between 1 and max_positions={max_positions}")
        return torch.full((src.size(0),), fixed_len, dtype=torch.long, device=src.device)  # (B,)
    src_lengths = (src != pad_id).sum(dim=1)  # (B,)
    # At least one step, so that every sentence, even an empty one with max_extra = 0, gets a hypothesis.
    return (src_lengths + max_extra).clamp(min=1, max=max_positions)  # (B,)


def longest_output(src_length: int, *, max_extra: int, max_positions: int, fixed_len: int | None) -> int:
    """The most output tokens any sentence of a (B, ``src_length``) batch may get: every limit of ``output_limits``
    is at most this, and it is known on the host (the padded length bounds every sentence's)."""
    if fixed_len is not None:
        return fixed_len
    return max(1, min(src_length + max_extra, max_positions))
