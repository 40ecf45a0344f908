"""The position-wise feed-forward network (§3.3) and the encoder and decoder layers (§3.1).

Each sub-layer is wrapped in a residual connection and layer normalisation. The paper's order (post-LN) is

    x = LayerNorm(x + Dropout(Sublayer(x)))                              (§3.1, §5.4)

and the pre-LN order that later work found easier to train deep is

    x = x + Dropout(Sublayer(LayerNorm(x)))

Dropout is applied where §5.4 puts it: to the output of each sub-layer before the residual sum (and, in
``transformer``, to the sums of embeddings and positional encodings). Nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.model.attention import KVCache, MultiHeadAttention

ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu}  # gelu = the exact erf form, as in BERT


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


class EncoderLayer(nn.Module):
    """Self-attention, then the FFN, each with residual + LayerNorm (§3.1, left half of Figure 1)."""

    def __init__(
        self,
        *,
        d_model: int,
        n_heads: int,
        d_ff: int,
        d_head: int | None = None,
        dropout: float = 0.1,
        attention_dropout: float = 0.0,
        activation: str = "relu",
        norm: str = "post",
        layer_norm_eps: float = 1e-5,
    ):
        super().__init__()
        if norm not in ("post", "pre"):
            raise ValueError(f"norm={norm!r}; expected 'post' or 'pre'")
        self.self_attn = MultiHeadAttention(d_model=d_model, n_heads=n_heads, d_head=d_head, dropout=attention_dropout)
        self.ffn = PositionwiseFeedForward(d_model=d_model, d_ff=d_ff, activation=activation)
        self.norm1 = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.norm2 = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.dropout = nn.Dropout(dropout)
        self.pre_norm = norm == "pre"

    def forward(self, x: Tensor, mask: Tensor | None = None, *, need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        """x (B, S, D), mask True = may attend, broadcastable to (B, H, S, S).

        Returns the layer output (B, S, D) and, if asked, the self-attention weights (B, H, S, S).
        """
        h = self.norm1(x) if self.pre_norm else x
        attn_out, attn_weights, _ = self.self_attn(h, mask=mask, need_weights=need_weights)
        x = x + self.dropout(attn_out) if self.pre_norm else self.norm1(x + self.dropout(attn_out))

        h = self.norm2(x) if self.pre_norm else x
        ffn_out = self.ffn(h)
        x = x + self.dropout(ffn_out) if self.pre_norm else self.norm2(x + self.dropout(ffn_out))
        return x, attn_weights  # (B, S, D), (B, H, S, S) or None


@dataclass
class DecoderLayerCache:
    """What one decoder layer keeps between decoding steps: its self-attention keys and values so far (None before
    the first step) and the cross-attention keys and values of the encoder output (computed once per sentence)."""

    self_kv: KVCache | None
    cross_kv: KVCache

    def select(self, index: Tensor) -> "DecoderLayerCache":
        """Keep batch rows ``index`` (reorder beams, drop finished sentences)."""
        self_kv = None if self.self_kv is None else self.self_kv.select(index)
        return DecoderLayerCache(self_kv, self.cross_kv.select(index))


@dataclass
class DecoderAttention:
    """Attention weights of one decoder layer, when asked for."""

    self_attn: Tensor | None  # (B, H, T, T)
    cross_attn: Tensor | None  # (B, H, T, S)


class DecoderLayer(nn.Module):
    """Masked self-attention, encoder-decoder attention, then the FFN (§3.1, right half of Figure 1)."""

    def __init__(
        self,
        *,
        d_model: int,
        n_heads: int,
        d_ff: int,
        d_head: int | None = None,
        dropout: float = 0.1,
        attention_dropout: float = 0.0,
        activation: str = "relu",
        norm: str = "post",
        layer_norm_eps: float = 1e-5,
    ):
        super().__init__()
        if norm not in ("post", "pre"):
            raise ValueError(f"norm={norm!r}; expected 'post' or 'pre'")
        self.self_attn = MultiHeadAttention(d_model=d_model, n_heads=n_heads, d_head=d_head, dropout=attention_dropout)
        self.cross_attn = MultiHeadAttention(d_model=d_model, n_heads=n_heads, d_head=d_head, dropout=attention_dropout)
        self.ffn = PositionwiseFeedForward(d_model=d_model, d_ff=d_ff, activation=activation)
        self.norm1 = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.norm2 = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.norm3 = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.dropout = nn.Dropout(dropout)
        self.pre_norm = norm == "pre"

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        self_mask: Tensor | None,
        cross_mask: Tensor | None,
        *,
        cache: DecoderLayerCache | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, DecoderAttention, DecoderLayerCache | None]:
        """x (B, T, D) target side, memory (B, S, D) encoder output.

        Args:
            self_mask: True = may attend, broadcastable to (B, H, T, L) where L counts cached positions too.
            cross_mask: True = may attend, broadcastable to (B, H, T, S).
            cache: keys and values from earlier steps; when given, ``x`` holds only the new positions.
        Returns:
            output (B, T, D), the attention weights if asked for, and the updated cache.
        """
        self_kv = cache.self_kv if cache is not None else None
        if cache is not None and self_kv is None:
            # First step without a preallocated cache: start one empty; appending grows it as needed.
            self_kv = KVCache.empty(x.size(0), self.self_attn.n_heads, self.self_attn.d_head, x.size(1), like=x)
        cross_kv = cache.cross_kv if cache is not None else None

        h = self.norm1(x) if self.pre_norm else x
        attn_out, self_w, self_kv = self.self_attn(h, mask=self_mask, need_weights=need_weights, cache=self_kv)
        x = x + self.dropout(attn_out) if self.pre_norm else self.norm1(x + self.dropout(attn_out))

        h = self.norm2(x) if self.pre_norm else x
        attn_out, cross_w, _ = self.cross_attn(h, memory, mask=cross_mask, need_weights=need_weights, cache=cross_kv)
        x = x + self.dropout(attn_out) if self.pre_norm else self.norm2(x + self.dropout(attn_out))

        h = self.norm3(x) if self.pre_norm else x
        ffn_out = self.ffn(h)
        x = x + self.dropout(ffn_out) if self.pre_norm else self.norm3(x + self.dropout(ffn_out))

        new_cache = DecoderLayerCache(self_kv, cross_kv) if cache is not None else None
        return x, DecoderAttention(self_w, cross_w), new_cache  # (B, T, D)
