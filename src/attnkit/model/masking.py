"""The one mask convention: boolean, True = may attend, broadcastable to (B, H, T, S).

Every mask in attnkit is built here. PyTorch's own modules use the opposite convention (True = masked out); the
converter for them lives at the boundary, in ``attnkit.interop.torch_nn``, never inside the model.
"""

from __future__ import annotations

import torch
from torch import Tensor


def padding_mask(ids: Tensor, pad_id: int) -> Tensor:
    """Keys that are real tokens: (B, S) ids -> (B, 1, 1, S) mask, True where ``ids != pad_id``."""
    return (ids != pad_id)[:, None, None, :]  # (B, 1, 1, S)


def causal_mask(length: int, device: torch.device | None = None, offset: int = 0) -> Tensor:
    """Position t may attend to positions <= t (§3.2.3, "masking out ... illegal connections").

    Returns a (1, 1, T, offset + T) mask for ``length`` = T queries at positions ``offset .. offset + T - 1``
    over keys at positions ``0 .. offset + T - 1`` (``offset`` > 0 when earlier keys are cached).
    """
    query_pos = torch.arange(offset, offset + length, device=device)  # (T,)
    key_pos = torch.arange(offset + length, device=device)  # (offset + T,)
    return (key_pos[None, :] <= query_pos[:, None])[None, None]  # (1, 1, T, offset + T)


def decoder_self_mask(tgt_ids: Tensor, pad_id: int) -> Tensor:
    """Causal and padding at once for decoder self-attention: (B, T) ids -> (B, 1, T, T)."""
    return padding_mask(tgt_ids, pad_id) & causal_mask(tgt_ids.size(1), tgt_ids.device)  # (B, 1, T, T)


def lengths_to_padding_mask(lengths: Tensor, max_len: int) -> Tensor:
    """(B,) lengths -> (B, 1, 1, S) mask with the first ``lengths[b]`` keys True."""
    positions = torch.arange(max_len, device=lengths.device)  # (S,)
    return (positions[None, :] < lengths[:, None])[:, None, None, :]  # (B, 1, 1, S)
