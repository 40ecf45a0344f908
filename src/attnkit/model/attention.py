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
from attnkit.model.quantize import Int8Linear, Int8Weight, linear


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

    On a CPU, half-precision inputs run eq. 1 in float32 in two cases where PyTorch's half-precision kernel is the
    slower one, and float32 is the more accurate of the two anyway:
    - training under bfloat16 or float16 autocast: the half-precision backward pass is 1.5 to 2.5 times slower than
      float32's including the casts (forward + backward, 4 and 8 heads of 64, lengths 32 and 128);
    - a decoding step of eight or more rows (one query per sentence or beam, T = 1, B >= 8): the bfloat16 kernel
      took 1.9-2.4x float32's time including the casts (4 heads of 64, 32 keys: 32 rows 290 against 119 us, 8 rows
      80 against 42; 2 threads, AMD EPYC with AVX512-BF16); at four rows or fewer the casts and their operator
      calls cost about what they save (4 rows: 44 against 39 us, one: 17 against 19). Whole sequences (the
      encoder, teacher forcing) keep the half-precision kernel, as fast as float32 there.
    """
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
    """Keys and values of one attention module during incremental decoding.

    Self-attention keys and values live in preallocated buffers of ``capacity`` positions, of which the first
    ``length`` are filled: ``append`` writes a step's keys and values in place (no copy of the earlier ones, which
    ``torch.cat`` would make at every step) and doubles the buffers if they are full. A cache is extended once: the
    buffers are shared with the cache it was appended to, so to branch (beam search) ``select`` first, which copies.
    Cross-attention keys and values are computed once from the encoder output and reused at every step (``static``).
    """

    k_buf: Tensor  # (B, H, capacity, Dh)
    v_buf: Tensor  # (B, H, capacity, Dh)
    length: int  # filled positions
    static: bool = False

    @classmethod
    def empty(cls, batch: int, n_heads: int, d_head: int, capacity: int, like: Tensor) -> KVCache:
        """An empty self-attention cache with room for ``capacity`` positions (dtype and device of ``like``)."""
        buf = like.new_empty((batch, n_heads, max(1, capacity), d_head))  # (B, H, capacity, Dh)
        return cls(buf, torch.empty_like(buf), 0)

    @property
    def k(self) -> Tensor:
        return self.k_buf[:, :, : self.length]  # (B, H, L, Dh)

    @property
    def v(self) -> Tensor:
        return self.v_buf[:, :, : self.length]  # (B, H, L, Dh)

    def append(self, k: Tensor, v: Tensor) -> KVCache:
        """The cache extended by ``k``, ``v`` (B, H, T, Dh), written into the buffers in place."""
        start, end = self.length, self.length + k.size(2)
        k_buf, v_buf = self.k_buf, self.v_buf
        if end > k_buf.size(2):  # full: move to buffers twice as large (amortised O(1) per position)
            B, H, capacity, Dh = k_buf.shape
            k_buf = k_buf.new_empty((B, H, max(2 * capacity, end), Dh))
            v_buf = torch.empty_like(k_buf)
            k_buf[:, :, :start], v_buf[:, :, :start] = self.k, self.v
        k_buf[:, :, start:end], v_buf[:, :, start:end] = k, v
        return KVCache(k_buf, v_buf, end)

    def select(self, index: Tensor) -> KVCache:
        """Keep batch rows ``index`` (beam search prunes hypotheses, searches drop finished sentences), copying only
        the filled positions into new buffers of the same capacity."""
        B, H, capacity, Dh = self.k_buf.shape
        k_buf = self.k_buf.new_empty((index.numel(), H, capacity, Dh))
        v_buf = torch.empty_like(k_buf)
        torch.index_select(self.k, 0, index, out=k_buf[:, :, : self.length])
        torch.index_select(self.v, 0, index, out=v_buf[:, :, : self.length])
        return KVCache(k_buf, v_buf, self.length, self.static)

    def move_rows_(self, rows: Tensor, sources: Tensor) -> KVCache:
        """In place, row ``rows[i]`` takes the keys and values of row ``sources[i]`` (beam search: a beam that
        continues another beam's hypothesis). The sources are read before any row is written, so rows may swap.
        Only the rows listed are copied: most beams extend their own hypothesis, and copying every row's cache
        at every step was 15% of a beam-4 call (benchmarks/profile_decode.py)."""
        for buf in (self.k_buf, self.v_buf):
            filled = buf[:, :, : self.length]  # (B, H, L, Dh)
            filled.index_copy_(0, rows, filled.index_select(0, sources))  # (n, H, L, Dh) moved
        return self


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
        self._fused: tuple[Tensor | Int8Weight, Tensor | None] | None = None  # stacked W^Q, W^K, W^V (fuse_qkv)

    def _split_heads(self, x: Tensor) -> Tensor:
        B, L, _ = x.shape
        return x.view(B, L, self.n_heads, self.d_head).transpose(1, 2)  # (B, H, L, Dh)

    def _qkv(self, x: Tensor) -> Tensor:
        """q_proj(x), k_proj(x), v_proj(x) side by side, in one matrix multiplication: (..., D) -> (..., 3 H Dh).
        Uses the stacked copy of ``fuse_qkv`` when there is one and autograd is off."""
        if self._fused is not None and torch.is_grad_enabled():
            self.unfuse_qkv()  # autograd on: the weights may be trained from here, so the snapshot would go stale
        weight, bias = self._fused if self._fused is not None else self._concat_qkv()  # (3 H Dh, D), (3 H Dh,)
        return linear(x, weight, bias)  # (..., 3 H Dh)

    def _project_qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q_proj(x), k_proj(x), v_proj(x) in one matrix multiplication: (B, L, D) -> 3 x (B, H, L, Dh)."""
        qkv = self._qkv(x)  # (B, L, 3 H Dh)
        q, k, v = (self._split_heads(t) for t in qkv.chunk(3, dim=-1))  # 3 x (B, H, L, Dh)
        return q, k, v

    def _concat_qkv(self) -> tuple[Tensor, Tensor | None]:
        """W^Q, W^K, W^V (and biases) stacked; a new tensor at every call, so gradients reach the three parameters."""
        weight = torch.cat([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight])  # (3 H Dh, D)
        bias = None if self.q_proj.bias is None else torch.cat([self.q_proj.bias, self.k_proj.bias, self.v_proj.bias])
        return weight, bias

    # Fusion for inference. Stacking W^Q, W^K, W^V costs a copy of 3 D x H Dh weights at every call, which
    # incremental decoding pays per step and layer; ``fuse_qkv`` makes the copy once. The copy is a snapshot of the
    # weights, so everything that may change them drops it: ``train()``, ``load_state_dict`` and any forward pass
    # with autograd on (the only kind whose gradients an optimizer can step with). It is not saved (no state-dict
    # key) and ``.to()`` moves or casts it with the parameters.

    def fuse_qkv(self) -> None:
        """Stack W^Q, W^K, W^V once for inference: later self-attention calls under ``torch.no_grad`` or
        ``torch.inference_mode`` use the stacked copy instead of concatenating the weights again. Projections
        rounded to int8 (``attnkit.model.quantize``) are stacked as int8."""
        with torch.no_grad():
            weight, bias = self._concat_qkv()
        int8 = [p for p in (self.q_proj, self.k_proj, self.v_proj) if isinstance(p, Int8Linear)]
        if len(int8) == 3:
            self._fused = (Int8Weight.cat([p.int8 for p in int8]), bias)
        else:
            self._fused = (weight, bias)

    def unfuse_qkv(self) -> None:
        """Drop the stacked copy (after changing the weights in place by hand, for example)."""
        self._fused = None

    @property
    def is_fused(self) -> bool:
        return self._fused is not None

    def train(self, mode: bool = True) -> MultiHeadAttention:
        if mode:
            self.unfuse_qkv()  # training changes the weights; never let it see a stale copy
        return super().train(mode)

    def _load_from_state_dict(self, *args, **kwargs) -> None:
        self.unfuse_qkv()  # new weights: the stacked copy is stale
        super()._load_from_state_dict(*args, **kwargs)

    def _apply(self, fn, recurse: bool = True):
        super()._apply(fn, recurse)
        if self._fused is not None:  # .to(device / dtype), .half(), ...: the copy follows the parameters
            weight, bias = self._fused
            weight = weight.apply(fn) if isinstance(weight, Int8Weight) else fn(weight)
            self._fused = (weight, None if bias is None else fn(bias))
        return self

    def forward_unpadded(self, x: Tensor, unpadded: Unpadded) -> Tensor:
        """Self-attention over the real tokens of a batch, packed: x (N, D) -> (N, D) (see ``Unpadded``). The
        projections run on the N tokens; eq. 1 runs on the (B, H, S, S) layout under the key mask, where a padded
        query (zeros) gives an output nothing reads."""
        qkv = unpadded.unpack(self._qkv(x))  # (N, 3 H Dh) -> (B, S, 3 H Dh)
        q, k, v = (self._split_heads(t) for t in qkv.chunk(3, dim=-1))  # 3 x (B, H, S, Dh)
        p = self.dropout if self.training else 0.0
        out = fused_attention(q, k, v, unpadded.mask, p)  # (B, H, S, Dh)
        out = unpadded.pack(out.transpose(1, 2))  # (B, S, H, Dh) -> (N, H, Dh)
        return self.out_proj(out.reshape(-1, self.n_heads * self.d_head))  # (N, D)

    def project_kv(self, memory: Tensor) -> KVCache:
        """Keys and values of ``memory`` (B, S, D), for cross-attention reused across decoding steps."""
        k, v = self._split_heads(self.k_proj(memory)), self._split_heads(self.v_proj(memory))  # (B, H, S, Dh)
        return KVCache(k, v, k.size(2), static=True)

    def forward(
        self,
        query: Tensor,
        key_value: Tensor | None = None,
        mask: Tensor | None = None,
        *,
        need_weights: bool = False,
        cache: KVCache | None = None,
        causal: bool = False,
    ) -> tuple[Tensor, Tensor | None, KVCache | None]:
        """Attend from ``query`` (B, T, D) to ``key_value`` (B, S, D); self-attention when ``key_value`` is None.

        Args:
            mask: boolean, True = may attend, broadcastable to (B, H, T, S).
            causal: query t attends to keys 0 .. t alone (§3.2.3), instead of a ``mask``, on the kernel's fast path.
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
            q, k, v = self._project_qkv(query)  # 3 x (B, H, T, Dh)
        else:
            q = self._split_heads(self.q_proj(query))  # (B, H, T, Dh)
            if cache is not None and cache.static:
                k, v = cache.k, cache.v  # (B, H, S, Dh)
            else:
                k = self._split_heads(self.k_proj(key_value))  # (B, H, S, Dh)
                v = self._split_heads(self.v_proj(key_value))  # (B, H, S, Dh)
        if cache is not None and not cache.static:
            cache = cache.append(k, v)
            k, v = cache.k, cache.v  # (B, H, L + T, Dh)
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
