"""The one mask convention: boolean, True = may attend, broadcastable to (B, H, T, S).

Every mask in attnkit is built here. PyTorch's own modules use the opposite convention (True = masked out); the
converter for them lives at the boundary, in ``attnkit.interop.torch_nn``, never inside the model.
"""

from __future__ import annotations

from dataclasses import dataclass

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


def cached_causal_mask(positions: Tensor, length: int) -> Tensor:
    """Queries at ``positions`` (T,) over a key/value cache of ``length`` positions: each may attend to the cached
    positions up to its own (§3.2.3), and not to the ones not yet written. Returns (1, 1, T, L)."""
    key_pos = torch.arange(length, device=positions.device)  # (L,)
    return (key_pos[None, :] <= positions[:, None])[None, None]  # (1, 1, T, L)


def decoder_self_mask(tgt_ids: Tensor, pad_id: int) -> Tensor:
    """Causal and padding at once for decoder self-attention: (B, T) ids -> (B, 1, T, T)."""
    return padding_mask(tgt_ids, pad_id) & causal_mask(tgt_ids.size(1), tgt_ids.device)  # (B, 1, T, T)


def lengths_to_padding_mask(lengths: Tensor, max_len: int) -> Tensor:
    """(B,) lengths -> (B, 1, 1, S) mask with the first ``lengths[b]`` keys True."""
    positions = torch.arange(max_len, device=lengths.device)  # (S,)
    return (positions[None, :] < lengths[:, None])[:, None, None, :]  # (B, 1, 1, S)


@dataclass(frozen=True)
class Unpadded:
    """Where the real tokens of a padded (B, S) batch are, to compute on them alone ("remove padding", as the
    encoders of FasterTransformer and ByteTransformer do).

    Everything in an encoder layer except attention itself treats positions separately (the projections, the FFN of
    eq. 2, LayerNorm, dropout), so it can run on the N real tokens packed into (N, D) instead of (B, S, D); on a
    batch of reviews padded to its longest, that skips about half the arithmetic. Attention mixes positions: it
    unpacks to (B, S) around eq. 1 and uses the key mask as before. The padded positions of the output are zeros
    (the padded path leaves values there that nothing reads: pooling and cross-attention mask them out).
    """

    rows: Tensor  # (N,) flat positions b * S + s of the real tokens, in order
    batch: int
    length: int
    mask: Tensor  # (B, 1, 1, S) the key mask they came from, True = real token

    @classmethod
    def of(cls, mask: Tensor) -> Unpadded:
        """From a (B, 1, 1, S) key padding mask (``padding_mask``). Finding the rows reads the mask (``nonzero``):
        a synchronisation on a GPU; training passes the rows its batches were built with instead (``from_rows``)."""
        B, S = mask.size(0), mask.size(-1)
        return cls(mask.reshape(B * S).nonzero().squeeze(1), B, S, mask)  # rows (N,)

    @classmethod
    def from_rows(cls, rows: Tensor, mask: Tensor) -> Unpadded:
        """From the flat positions of the real tokens, made on the host when the batch was built
        (``data.batching.real_positions``), and the (B, 1, 1, S) key mask they agree with."""
        return cls(rows, mask.size(0), mask.size(-1), mask)

    def pack(self, x: Tensor) -> Tensor:
        """(B, S, ...) -> (N, ...): the real positions only."""
        return x.reshape(self.batch * self.length, *x.shape[2:]).index_select(0, self.rows)  # (N, ...)

    def unpack(self, x: Tensor) -> Tensor:
        """(N, ...) -> (B, S, ...), zeros at the padded positions."""
        out = x.new_zeros(self.batch * self.length, *x.shape[1:])  # (B * S, ...)
        return out.index_copy(0, self.rows, x).view(self.batch, self.length, *x.shape[1:])  # (B, S, ...)
