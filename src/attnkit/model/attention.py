"""Scaled dot-product attention and multi-head attention (§3.2).

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V                                   (eq. 1)
    MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O,  head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)

Two paths compute eq. 1. The explicit one below returns the attention weights; PyTorch's fused
``scaled_dot_product_attention`` is used whenever the weights are not asked for. Both give zeros for a query whose
keys are all masked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.model.masking import Unpadded, causal_mask


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


def fused_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, dropout_p: float, *, causal: bool = False
) -> Tensor:
    """Eq. 1 through PyTorch's fused kernel: q (B, H, T, Dh), k and v (B, H, S, Dh), mask True = may attend.
    Returns (B, H, T, Dh). ``causal`` (no ``mask`` then) is §3.2.3's mask of the decoder's own positions as the
    kernel's ``is_causal`` flag: no mask tensor is built or read, and FlashAttention, which takes no mask, can run.

    On a CPU, half-precision inputs run eq. 1 in float32 where PyTorch's half-precision kernel is the slower one
    (float32 is also the more accurate): training under autocast (the half-precision backward pass), and a decoding
    step of eight or more rows (one query per row). Measurements: docs/performance.md.
    """
    compiling = torch.compiler.is_compiling() and not torch.compiler.is_exporting()
    if compiling and q.device.type == "cpu" and q.size(2) == 1 and not (causal or dropout_p):
        # One query per row (a decoding step), compiled for a CPU: eq. 1 written out, which Inductor fuses into its
        # own loops, where PyTorch's kernel would stay a call of its own (docs/performance.md).
        return scaled_dot_product_attention(q, k, v, mask)[0]  # (B, H, 1, Dh)
    half = q.dtype in (torch.bfloat16, torch.float16)
    decoding_step = half and q.size(2) == 1 and q.size(0) >= 8  # one query for each of 8 rows or more
    if half and q.device.type == "cpu" and (decoding_step or (torch.is_grad_enabled() and q.requires_grad)):
        with torch.autocast("cpu", enabled=False):
            out = F.scaled_dot_product_attention(
                q.float(), k.float(), v.float(), attn_mask=mask, dropout_p=dropout_p, is_causal=causal
            )
        return out.to(q.dtype)  # (B, H, T, Dh)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=causal)


@dataclass
class KVCache:
    """Keys and values of one attention module during incremental decoding, in buffers of a fixed length.

    Self-attention: ``update`` writes the keys and values of a step's positions into the buffers, in place, and
    returns the whole buffers; the step's queries attend to the positions written so far through a mask
    (``masking.cached_causal_mask``). Every step therefore has the same shapes, which a compiled step or a CUDA graph
    needs (gpt-fast's static cache). The buffers start at zero: unwritten positions are masked out, and zero times
    a masked weight is zero, where uninitialised memory could hold NaN. Cross-attention: the keys and values of the
    encoder output, projected once per sentence (``MultiHeadAttention.project_kv``) and only read.
    """

    k: Tensor  # (B, H, L, Dh)
    v: Tensor  # (B, H, L, Dh)

    @classmethod
    def empty(cls, batch: int, n_heads: int, d_head: int, length: int, like: Tensor) -> KVCache:
        """Zeroed buffers for ``length`` positions, in the dtype and on the device of ``like``."""
        k = like.new_zeros((batch, n_heads, length, d_head))  # (B, H, L, Dh)
        return cls(k, torch.zeros_like(k))

    def update(self, positions: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write ``k``, ``v`` (B, H, T, Dh) at ``positions`` (T,) long; return the buffers (B, H, L, Dh)."""
        self.k.index_copy_(2, positions, k)
        self.v.index_copy_(2, positions, v)
        return self.k, self.v


@dataclass
class AttentionMaps:
    """Attention weights returned on request, as data (never stored on modules): layer index -> weights.

    Only the layers asked for (``attn_layers``) run the explicit path of eq. 1 and appear here; every other layer
    stays on the fused kernel. Each row of a map sums to 1 over the keys it may attend to.
    """

    encoder_self: dict[int, Tensor] = field(default_factory=dict)  # (B, H, S, S)
    decoder_self: dict[int, Tensor] = field(default_factory=dict)  # (B, H, T, T), causal
    cross: dict[int, Tensor] = field(default_factory=dict)  # (B, H, T, S): target queries, encoder-output keys


class MultiHeadAttention(nn.Module):
    """Multi-head attention (§3.2.2) with separate ``q_proj``, ``k_proj``, ``v_proj`` and ``out_proj``.

    §3.2.3 uses it three ways: encoder self-attention (keys masked where the source is padding), decoder
    self-attention (causal and padding mask), and encoder-decoder attention, whose queries come from the decoder
    while its keys and values come from the encoder output (``key_value``), masked where the source is padding.

    ``d_head`` defaults to d_model / n_heads as in the paper; Table 3 row (B) varies it independently, so the
    projections map D -> H * Dh and back. ``dropout`` drops attention weights in training (BERT does; the paper's
    §5.4 does not, and its default 0 keeps the fused kernel's fastest path).
    """

    def __init__(
        self, *, d_model: int, n_heads: int, d_head: int | None = None, bias: bool = True, dropout: float = 0.0
    ):
        super().__init__()
        if d_head is None:
            if d_model % n_heads != 0:
                raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
            d_head = d_model // n_heads
        self.n_heads = n_heads
        self.d_head = d_head
        self.dropout = dropout
        inner = n_heads * d_head
        self.q_proj = nn.Linear(d_model, inner, bias=bias)
        self.k_proj = nn.Linear(d_model, inner, bias=bias)
        self.v_proj = nn.Linear(d_model, inner, bias=bias)
        self.out_proj = nn.Linear(inner, d_model, bias=bias)

    def _split_heads(self, x: Tensor) -> Tensor:
        B, L, _ = x.shape
        return x.view(B, L, self.n_heads, self.d_head).transpose(1, 2)  # (B, H, L, Dh)

    def project_qkv(self, x: Tensor) -> Tensor:
        """Self-attention's Q, K and V side by side: (..., D) -> (..., 3 H Dh). Q, K and V come from the same input,
        so the three projections run as one matrix multiplication with their weights stacked (fewer, larger GEMMs;
        the parameters stay separate, and the stacking is redone at every call, so gradients reach all three)."""
        weight = torch.cat([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight])  # (3 H Dh, D)
        bias = None if self.q_proj.bias is None else torch.cat([self.q_proj.bias, self.k_proj.bias, self.v_proj.bias])
        return F.linear(x, weight, bias)  # (..., 3 H Dh)

    def forward_unpadded(self, x: Tensor, unpadded: Unpadded) -> Tensor:
        """Self-attention over the real tokens of a batch, packed: x (N, D) -> (N, D) (see ``Unpadded``). The
        projections run on the N tokens; eq. 1 runs on the (B, H, S, S) layout under the key mask, where a padded
        query (zeros) gives an output nothing reads."""
        qkv = unpadded.unpack(self.project_qkv(x))  # (N, 3 H Dh) -> (B, S, 3 H Dh)
        q, k, v = (self._split_heads(t) for t in qkv.chunk(3, dim=-1))  # 3 x (B, H, S, Dh)
        p = self.dropout if self.training else 0.0
        out = fused_attention(q, k, v, unpadded.mask, p)  # (B, H, S, Dh)
        out = unpadded.pack(out.transpose(1, 2))  # (B, S, H, Dh) -> (N, H, Dh)
        return self.out_proj(out.reshape(-1, self.n_heads * self.d_head))  # (N, D)

    def project_kv(self, memory: Tensor) -> KVCache:
        """Keys and values of ``memory`` (B, S, D), for cross-attention reused across decoding steps."""
        return KVCache(self._split_heads(self.k_proj(memory)), self._split_heads(self.v_proj(memory)))  # (B, H, S, Dh)

    def forward(
        self,
        query: Tensor,
        key_value: Tensor | KVCache | None = None,
        mask: Tensor | None = None,
        *,
        need_weights: bool = False,
        cache: KVCache | None = None,
        positions: Tensor | None = None,
        causal: bool = False,
    ) -> tuple[Tensor, Tensor | None, KVCache | None]:
        """Attend from ``query`` (B, T, D) to ``key_value``; self-attention when ``key_value`` is None.

        Args:
            key_value: the encoder output (B, S, D), or its keys and values already projected (``project_kv``).
            mask: boolean, True = may attend, broadcastable to (B, H, T, S) (S = L, the cache's length, with one).
            causal: query t attends to keys 0 .. t alone (§3.2.3), instead of a ``mask``, on the kernel's fast path.
            need_weights: return the (B, H, T, S) attention weights (explicit path) instead of None (fused path).
            cache, positions: self-attention during incremental decoding: this call's keys and values are written
                into ``cache`` at ``positions`` (T,), and the queries attend to the whole cache under ``mask``.
        Returns:
            output (B, T, D), the attention weights or None, and ``cache`` (written in place).
        """
        B, T, _ = query.shape
        if key_value is None:
            qkv = self.project_qkv(query)  # (B, T, 3 H Dh)
            q, k, v = (self._split_heads(t) for t in qkv.chunk(3, dim=-1))  # 3 x (B, H, T, Dh)
            if cache is not None:
                assert positions is not None, "a self-attention cache is written at given positions"
                k, v = cache.update(positions, k, v)  # (B, H, L, Dh)
        else:
            q = self._split_heads(self.q_proj(query))  # (B, H, T, Dh)
            kv = key_value if isinstance(key_value, KVCache) else self.project_kv(key_value)
            k, v = kv.k, kv.v  # (B, H, S, Dh)
        p = self.dropout if self.training else 0.0
        if need_weights:
            if causal:
                mask = causal_mask(T, query.device)  # (1, 1, T, T)
            out, attn_weights = scaled_dot_product_attention(q, k, v, mask)  # (B, H, T, Dh), (B, H, T, S)
            if p:  # the weights are returned as computed; the output uses dropped-out ones
                out = F.dropout(attn_weights, p) @ v  # (B, H, T, Dh)
        else:
            out = fused_attention(q, k, v, mask, p, causal=causal)  # (B, H, T, Dh)
            attn_weights = None
        out = out.transpose(1, 2).reshape(B, T, self.n_heads * self.d_head)  # (B, T, H * Dh)
        return self.out_proj(out), attn_weights, cache  # (B, T, D)
