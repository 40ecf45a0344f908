"""The position-wise feed-forward network (§3.3) and the encoder and decoder layers (§3.1).

Each sub-layer is wrapped in a residual connection and layer normalisation (``Residual``). Dropout is applied
where §5.4 specifies it: to the output of each sub-layer, before the residual sum (and, in ``transformer``, to the
sums of the embeddings and positional encodings). Attention dropout (on the attention
weights, as BERT does) is a separate option of ``MultiHeadAttention``, off by default.

The layers receive their sub-modules already built (``build`` does the wiring); they only say how data flows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.model.attention import KVCache, MultiHeadAttention
from attnkit.model.masking import Unpadded

# gelu = the exact erf form, as in BERT
ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {"relu": F.relu, "gelu": F.gelu}


class PositionwiseFeedForward(nn.Module):
    """FFN(x) = max(0, x W_1 + b_1) W_2 + b_2 (eq. 2), applied to each position separately; GELU optional."""

    def __init__(self, *, d_model: int, d_ff: int, activation: str = "relu"):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation={activation!r}; expected one of {sorted(ACTIVATIONS)}")
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.activation = activation

    def forward(self, x: Tensor) -> Tensor:
        """(B, L, D) -> (B, L, D)."""
        return self.linear2(ACTIVATIONS[self.activation](self.linear1(x)))  # (B, L, F) -> (B, L, D)


NORMS = ("post", "pre")


class Residual(nn.Module):
    """The residual connection around one sub-layer (§3.1), in either order:

        post-LN (the paper):  x = LayerNorm(x + Dropout(Sublayer(x)))
        pre-LN:               x = x + Dropout(Sublayer(LayerNorm(x)))

    "The output of each sub-layer is LayerNorm(x + Sublayer(x)), where Sublayer(x) is the function implemented by
    the sub-layer itself" (§3.1); §5.4 adds the dropout: "We apply dropout to the output of each sub-layer, before
    it is added to the sub-layer input and normalized". Pre-LN, which later work found easier to train deep, moves
    the LayerNorm onto the sub-layer's input and leaves the residual path untouched.

    A sub-layer is applied as ``x = residual(x, norm, sublayer(residual.sublayer_input(x, norm)))``. The LayerNorm
    is passed in rather than owned, so that it stays where checkpoints name it (the layer's ``norm1``, ``norm2``,
    ``norm3``); this module holds only the dropout and the order.
    """

    def __init__(self, *, dropout: float, norm: str = "post"):
        super().__init__()
        if norm not in NORMS:
            raise ValueError(f"norm={norm!r}; expected 'post' or 'pre'")
        self.dropout = nn.Dropout(dropout)
        self.pre_norm = norm == "pre"

    def sublayer_input(self, x: Tensor, norm: nn.LayerNorm) -> Tensor:
        """What the sub-layer sees: LayerNorm(x) for pre-LN, x itself for post-LN. (B, L, D) -> (B, L, D)."""
        return norm(x) if self.pre_norm else x

    def forward(self, x: Tensor, norm: nn.LayerNorm, sublayer_out: Tensor) -> Tensor:
        """x (B, L, D) the sub-layer input, sublayer_out (B, L, D) its output -> (B, L, D)."""
        if self.pre_norm:
            return x + self.dropout(sublayer_out)
        return norm(x + self.dropout(sublayer_out))


class EncoderLayer(nn.Module):
    """Self-attention, then the FFN, each inside a ``Residual`` (§3.1, left half of Figure 1)."""

    def __init__(
        self,
        *,
        self_attn: MultiHeadAttention,
        ffn: PositionwiseFeedForward,
        norm1: nn.LayerNorm,
        norm2: nn.LayerNorm,
        residual: Residual,
    ):
        super().__init__()
        self.self_attn = self_attn
        self.ffn = ffn
        self.norm1 = norm1
        self.norm2 = norm2
        self.residual = residual

    def forward(
        self, x: Tensor, mask: Tensor | None = None, *, need_weights: bool = False, unpadded: Unpadded | None = None
    ) -> tuple[Tensor, Tensor | None]:
        """x (B, S, D), mask True = may attend, broadcastable to (B, H, S, S).

        Returns the layer output (B, S, D) and, if asked, the self-attention weights (B, H, S, S). With
        ``unpadded``, x is the batch's real tokens packed (N, D) and so is the output (see ``Unpadded``).
        """
        h = self.residual.sublayer_input(x, self.norm1)
        attn_weights = None
        if unpadded is not None:
            attn_out = self.self_attn.forward_unpadded(h, unpadded)  # (N, D)
        else:
            attn_out, attn_weights, _ = self.self_attn(h, mask=mask, need_weights=need_weights)  # (B, S, D)
        x = self.residual(x, self.norm1, attn_out)  # (B, S, D) or (N, D)

        x = self.residual(x, self.norm2, self.ffn(self.residual.sublayer_input(x, self.norm2)))  # (B, S, D) or (N, D)
        return x, attn_weights  # (B, S, D) or (N, D), (B, H, S, S) or None


@dataclass
class DecoderLayerCache:
    """What one decoder layer keeps between decoding steps: its self-attention keys and values, written in place at
    each step, and the cross-attention keys and values of the encoder output (computed once per sentence)."""

    self_kv: KVCache  # (B, H, L, Dh) each
    cross_kv: KVCache  # (B, H, S, Dh) each


class DecoderLayer(nn.Module):
    """Masked self-attention, encoder-decoder attention, then the FFN, each inside a ``Residual`` (§3.1, right half
    of Figure 1)."""

    def __init__(
        self,
        *,
        self_attn: MultiHeadAttention,
        cross_attn: MultiHeadAttention,
        ffn: PositionwiseFeedForward,
        norm1: nn.LayerNorm,
        norm2: nn.LayerNorm,
        norm3: nn.LayerNorm,
        residual: Residual,
    ):
        super().__init__()
        self.self_attn = self_attn
        self.cross_attn = cross_attn
        self.ffn = ffn
        self.norm1 = norm1
        self.norm2 = norm2
        self.norm3 = norm3
        self.residual = residual

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None,
        self_mask: Tensor | None,
        cross_mask: Tensor | None,
        *,
        cache: DecoderLayerCache | None = None,
        positions: Tensor | None = None,
        need_weights: bool = False,
        causal: bool = False,
    ) -> tuple[Tensor, tuple[Tensor | None, Tensor | None], DecoderLayerCache | None]:
        """x (B, T, D) target side, memory (B, S, D) encoder output (None with a cache: its cross_kv replaces it).

        Args:
            self_mask: True = may attend, broadcastable to (B, H, T, T), or (B, H, T, L) over a cache of L positions.
            causal: instead of ``self_mask``, position t attends to positions 0 .. t (the whole target at once).
            cross_mask: True = may attend, broadcastable to (B, H, T, S).
            cache, positions: keys and values from earlier steps; ``x`` holds the new positions ``positions`` (T,).
        Returns:
            output (B, T, D); the self- and cross-attention weights, (B, H, T, T or L) and (B, H, T, S), if asked for
            (else None, None); and ``cache``, written in place.
        """
        h = self.residual.sublayer_input(x, self.norm1)
        self_kv = cache.self_kv if cache is not None else None
        attn_out, self_w, _ = self.self_attn(
            h, mask=self_mask, need_weights=need_weights, cache=self_kv, positions=positions, causal=causal
        )  # (B, T, D)
        x = self.residual(x, self.norm1, attn_out)  # (B, T, D)

        h = self.residual.sublayer_input(x, self.norm2)
        key_value = cache.cross_kv if cache is not None else memory
        attn_out, cross_w, _ = self.cross_attn(h, key_value, mask=cross_mask, need_weights=need_weights)
        x = self.residual(x, self.norm2, attn_out)  # (B, T, D)

        x = self.residual(x, self.norm3, self.ffn(self.residual.sublayer_input(x, self.norm3)))  # (B, T, D)
        return x, (self_w, cross_w), cache  # (B, T, D)
