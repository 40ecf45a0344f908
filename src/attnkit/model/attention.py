"""Scaled dot-product attention and multi-head attention (§3.2).

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V                                   (eq. 1)
    MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O,  head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)

Two paths compute eq. 1. The explicit one below returns the attention weights; PyTorch's fused
``scaled_dot_product_attention`` is used whenever the weights are not asked for. Both give zeros for a query whose
keys are all masked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def scaled_dot_product_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Eq. 1, written out, returning ``(output, attn_weights)``.

    Args:
        q: (B, H, T, Dh) queries.  k, v: (B, H, S, Dh) keys and values.
        mask: boolean, True = may attend, broadcastable to (B, H, T, S).
    Returns:
        output (B, H, T, Dh) and attn_weights (B, H, T, S); each row of the weights sums to 1 over the keys it may
        attend to, or is all zeros if it may attend to none.
    """
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, H, T, S)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    attn_weights = scores.softmax(dim=-1)  # (B, H, T, S)
    if mask is not None:
        # A fully masked row is softmax(-inf, ..., -inf) = NaN; such a query attends to nothing.
        attn_weights = attn_weights.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)
    return attn_weights @ v, attn_weights  # (B, H, T, Dh), (B, H, T, S)


@dataclass
class KVCache:
    """Keys and values of one attention module during incremental decoding.

    For self-attention, ``append`` adds the new step's keys and values; for cross-attention they are computed once
    from the encoder output and reused at every step (``static``).
    """

    k: Tensor  # (B, H, L, Dh)
    v: Tensor  # (B, H, L, Dh)
    static: bool = False

    def select(self, index: Tensor) -> "KVCache":
        """Keep batch rows ``index`` (beam search reorders and prunes hypotheses)."""
        return KVCache(self.k.index_select(0, index), self.v.index_select(0, index), self.static)


class MultiHeadAttention(nn.Module):
    """Multi-head attention (§3.2.2) with separate ``q_proj``, ``k_proj``, ``v_proj`` and ``out_proj``.

    ``d_head`` defaults to d_model / n_heads as in the paper; Table 3 row (B) varies it independently, so the
    projections map D -> H * Dh and back.
    """

    def __init__(self, *, d_model: int, n_heads: int, d_head: int | None = None, bias: bool = True):
        super().__init__()
        if d_head is None:
            if d_model % n_heads != 0:
                raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
            d_head = d_model // n_heads
        self.n_heads = n_heads
        self.d_head = d_head
        inner = n_heads * d_head
        self.q_proj = nn.Linear(d_model, inner, bias=bias)
        self.k_proj = nn.Linear(d_model, inner, bias=bias)
        self.v_proj = nn.Linear(d_model, inner, bias=bias)
        self.out_proj = nn.Linear(inner, d_model, bias=bias)

    def _split_heads(self, x: Tensor) -> Tensor:
        B, L, _ = x.shape
        return x.view(B, L, self.n_heads, self.d_head).transpose(1, 2)  # (B, H, L, Dh)

    def _fused_qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q_proj(x), k_proj(x), v_proj(x) in one matrix multiplication: (B, L, D) -> 3 x (B, H, L, Dh)."""
        weight = torch.cat([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight])  # (3 H Dh, D)
        bias = None if self.q_proj.bias is None else torch.cat([self.q_proj.bias, self.k_proj.bias, self.v_proj.bias])
        qkv = F.linear(x, weight, bias)  # (B, L, 3 H Dh)
        return tuple(self._split_heads(t) for t in qkv.chunk(3, dim=-1))  # 3 x (B, H, L, Dh)

    def project_kv(self, memory: Tensor) -> KVCache:
        """Keys and values of ``memory`` (B, S, D), for cross-attention reused across decoding steps."""
        return KVCache(self._split_heads(self.k_proj(memory)), self._split_heads(self.v_proj(memory)), static=True)

    def forward(
        self,
        query: Tensor,
        key_value: Tensor | None = None,
        mask: Tensor | None = None,
        *,
        need_weights: bool = False,
        cache: KVCache | None = None,
    ) -> tuple[Tensor, Tensor | None, KVCache | None]:
        """Attend from ``query`` (B, T, D) to ``key_value`` (B, S, D); self-attention when ``key_value`` is None.

        Args:
            mask: boolean, True = may attend, broadcastable to (B, H, T, S).
            need_weights: return the (B, H, T, S) attention weights (explicit path) instead of None (fused path).
            cache: keys and values from earlier decoding steps. A static cache (cross-attention) replaces the
                projection of ``key_value``; a self-attention cache is extended with this step's keys and values.
        Returns:
            output (B, T, D), attention weights or None, and the updated cache (None if none was given).
        """
        B, T, _ = query.shape
        if key_value is None:
            # Self-attention: Q, K and V come from the same input, so the three projections run as one matrix
            # multiplication with their weights stacked (fewer, larger GEMMs; the parameters stay separate).
            q, k, v = self._fused_qkv(query)  # 3 x (B, H, T, Dh)
        else:
            q = self._split_heads(self.q_proj(query))  # (B, H, T, Dh)
            if cache is not None and cache.static:
                k, v = cache.k, cache.v  # (B, H, S, Dh)
            else:
                k = self._split_heads(self.k_proj(key_value))  # (B, H, S, Dh)
                v = self._split_heads(self.v_proj(key_value))  # (B, H, S, Dh)
        if cache is not None and not cache.static:
            k = torch.cat([cache.k, k], dim=2)  # (B, H, L + T, Dh)
            v = torch.cat([cache.v, v], dim=2)  # (B, H, L + T, Dh)
            cache = KVCache(k, v)
        if need_weights:
            out, attn_weights = scaled_dot_product_attention(q, k, v, mask)  # (B, H, T, Dh), (B, H, T, S)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, H, T, Dh)
            attn_weights = None
        out = out.transpose(1, 2).reshape(B, T, self.n_heads * self.d_head)  # (B, T, H * Dh)
        return self.out_proj(out), attn_weights, cache  # (B, T, D)
