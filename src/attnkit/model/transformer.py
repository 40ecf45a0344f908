"""Embeddings, the encoder and decoder stacks, and the encoder-decoder Transformer (§3.1, §3.4, Figure 1)."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.model.attention import KVCache
from attnkit.model.layers import DecoderAttention, DecoderLayer, DecoderLayerCache, EncoderLayer
from attnkit.model.masking import causal_mask, decoder_self_mask, padding_mask
from attnkit.model.positional import LearnedPositionalEmbedding, SinusoidalPositionalEncoding, scale_for


class Embeddings(nn.Module):
    """Token embedding * sqrt(d_model) + positional encoding, then dropout (§3.4, §3.5, §5.4).

    The BERT family adds token-type embeddings and a LayerNorm after the sum; both are options here
    (``n_token_types``, ``embedding_norm``) so that a pretrained BERT encoder loads into this same module.
    """

    def __init__(
        self,
        *,
        vocab_size: int,
        d_model: int,
        max_len: int,
        positional: str = "sinusoidal",
        scale_embeddings: bool = True,
        dropout: float = 0.1,
        n_token_types: int = 0,
        embedding_norm: bool = False,
        layer_norm_eps: float = 1e-5,
    ):
        super().__init__()
        if positional not in ("sinusoidal", "learned"):
            raise ValueError(f"positional={positional!r}; expected 'sinusoidal' or 'learned'")
        self.token = nn.Embedding(vocab_size, d_model)
        # With the sqrt(d_model) scale the embedded tokens have unit variance, like the sinusoids they are added to.
        nn.init.normal_(self.token.weight, std=d_model**-0.5 if scale_embeddings else 1.0)
        if positional == "sinusoidal":
            self.position = SinusoidalPositionalEncoding(max_len=max_len, d_model=d_model)
        else:
            self.position = LearnedPositionalEmbedding(max_len=max_len, d_model=d_model)
        self.token_type = nn.Embedding(n_token_types, d_model) if n_token_types else None
        self.norm = nn.LayerNorm(d_model, eps=layer_norm_eps) if embedding_norm else None
        self.dropout = nn.Dropout(dropout)
        self.scale = scale_for(d_model, scale_embeddings)

    def forward(self, ids: Tensor, offset: int = 0) -> Tensor:
        """(B, L) token ids at positions ``offset ..`` -> (B, L, D)."""
        x = self.token(ids) * self.scale + self.position(ids.size(1), offset)  # (B, L, D)
        if self.token_type is not None:
            x = x + self.token_type.weight[0]  # single-segment input: token type 0 everywhere
        if self.norm is not None:
            x = self.norm(x)
        return self.dropout(x)  # (B, L, D)


class Encoder(nn.Module):
    """A stack of N encoder layers; pre-LN stacks end with a LayerNorm (post-LN ones already end normalised)."""

    def __init__(self, *, n_layers: int, d_model: int, norm: str = "post", layer_norm_eps: float = 1e-5, **layer_kwargs):
        super().__init__()
        self.layers = nn.ModuleList(
            EncoderLayer(d_model=d_model, norm=norm, layer_norm_eps=layer_norm_eps, **layer_kwargs) for _ in range(n_layers)
        )
        self.final_norm = nn.LayerNorm(d_model, eps=layer_norm_eps) if norm == "pre" else None

    def forward(self, x: Tensor, mask: Tensor | None, attn_layers: tuple[int, ...] = ()) -> tuple[Tensor, dict[int, Tensor]]:
        """x (B, S, D), mask True = may attend (B, 1, 1, S).

        Returns the encoder output (B, S, D) and the self-attention weights (B, H, S, S) of the layers listed in
        ``attn_layers``; the other layers stay on the fused attention path.
        """
        attn_weights: dict[int, Tensor] = {}
        for i, layer in enumerate(self.layers):
            x, weights = layer(x, mask, need_weights=i in attn_layers)  # (B, S, D)
            if weights is not None:
                attn_weights[i] = weights
        if self.final_norm is not None:
            x = self.final_norm(x)
        return x, attn_weights


class Decoder(nn.Module):
    """A stack of N decoder layers, with a final LayerNorm for pre-LN stacks."""

    def __init__(self, *, n_layers: int, d_model: int, norm: str = "post", layer_norm_eps: float = 1e-5, **layer_kwargs):
        super().__init__()
        self.layers = nn.ModuleList(
            DecoderLayer(d_model=d_model, norm=norm, layer_norm_eps=layer_norm_eps, **layer_kwargs) for _ in range(n_layers)
        )
        self.final_norm = nn.LayerNorm(d_model, eps=layer_norm_eps) if norm == "pre" else None

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        self_mask: Tensor | None,
        cross_mask: Tensor | None,
        *,
        cache: list[DecoderLayerCache] | None = None,
        attn_layers: tuple[int, ...] = (),
    ) -> tuple[Tensor, dict[int, DecoderAttention], list[DecoderLayerCache] | None]:
        """x (B, T, D) embedded target, memory (B, S, D). Returns (B, T, D), requested maps, updated cache."""
        attn_weights: dict[int, DecoderAttention] = {}
        new_cache = [] if cache is not None else None
        for i, layer in enumerate(self.layers):
            layer_cache = cache[i] if cache is not None else None
            x, weights, layer_cache = layer(
                x, memory, self_mask, cross_mask, cache=layer_cache, need_weights=i in attn_layers
            )  # (B, T, D)
            if i in attn_layers:
                attn_weights[i] = weights
            if new_cache is not None:
                new_cache.append(layer_cache)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return x, attn_weights, new_cache


class Transformer(nn.Module):
    """The encoder-decoder of Figure 1 with a shared source/target vocabulary.

    §3.4: "we share the same weight matrix between the two embedding layers and the pre-softmax linear
    transformation". The output projection is ``F.linear(x, embeddings.token.weight)`` when tied, so the tied
    matrix exists once and is counted once.
    """

    def __init__(
        self,
        *,
        vocab_size: int,
        d_model: int,
        n_heads: int,
        d_ff: int,
        n_layers: int,
        max_len: int,
        d_head: int | None = None,
        dropout: float = 0.1,
        attention_dropout: float = 0.0,
        activation: str = "relu",
        norm: str = "post",
        positional: str = "sinusoidal",
        scale_embeddings: bool = True,
        tie_embeddings: bool = True,
        pad_id: int = 0,
        layer_norm_eps: float = 1e-5,
    ):
        super().__init__()
        self.pad_id = pad_id
        self.embeddings = Embeddings(
            vocab_size=vocab_size, d_model=d_model, max_len=max_len, positional=positional,
            scale_embeddings=scale_embeddings, dropout=dropout, layer_norm_eps=layer_norm_eps,
        )
        layer_kwargs = dict(n_heads=n_heads, d_ff=d_ff, d_head=d_head, dropout=dropout, attention_dropout=attention_dropout,
                            activation=activation)
        self.encoder = Encoder(n_layers=n_layers, d_model=d_model, norm=norm, layer_norm_eps=layer_norm_eps, **layer_kwargs)
        self.decoder = Decoder(n_layers=n_layers, d_model=d_model, norm=norm, layer_norm_eps=layer_norm_eps, **layer_kwargs)
        # Untied: a separate pre-softmax projection without bias, so that tied and untied differ only in sharing.
        self.output_proj = None if tie_embeddings else nn.Linear(d_model, vocab_size, bias=False)

    def encode(self, src: Tensor, attn_layers: tuple[int, ...] = ()) -> tuple[Tensor, Tensor, dict[int, Tensor]]:
        """src (B, S) ids -> memory (B, S, D), source mask (B, 1, 1, S) True = real token, requested maps."""
        src_mask = padding_mask(src, self.pad_id)  # (B, 1, 1, S)
        memory, attn_weights = self.encoder(self.embeddings(src), src_mask, attn_layers)  # (B, S, D)
        return memory, src_mask, attn_weights

    def logits(self, x: Tensor) -> Tensor:
        """Pre-softmax projection: (B, T, D) -> (B, T, V)."""
        weight = self.embeddings.token.weight if self.output_proj is None else self.output_proj.weight
        return F.linear(x, weight)  # (B, T, V)

    def decode(
        self,
        tgt_in: Tensor,
        memory: Tensor,
        src_mask: Tensor,
        *,
        cache: list[DecoderLayerCache] | None = None,
        offset: int = 0,
        attn_layers: tuple[int, ...] = (),
    ) -> tuple[Tensor, dict[int, DecoderAttention], list[DecoderLayerCache] | None]:
        """Next-token logits for every position of ``tgt_in``.

        Without a cache, ``tgt_in`` (B, T) is the whole shifted target (BOS y_1 .. y_{T-1}) and a causal mask keeps
        each position from seeing the ones after it. With a cache, ``tgt_in`` holds only the new positions, starting
        at ``offset``, and attends to everything cached plus the new positions up to itself.
        Returns logits (B, T, V), the requested attention maps, and the updated cache.
        """
        x = self.embeddings(tgt_in, offset)  # (B, T, D)
        if cache is None:
            self_mask = decoder_self_mask(tgt_in, self.pad_id)  # (B, 1, T, T)
        elif tgt_in.size(1) == 1:
            self_mask = None  # one new position: everything cached comes before it
        else:
            self_mask = causal_mask(tgt_in.size(1), tgt_in.device, offset)  # (1, 1, T, offset + T)
        x, attn_weights, cache = self.decoder(x, memory, self_mask, src_mask, cache=cache, attn_layers=attn_layers)
        return self.logits(x), attn_weights, cache  # (B, T, V)

    def start_cache(self, memory: Tensor, capacity: int = 0) -> list[DecoderLayerCache]:
        """An empty cache for decoding against ``memory`` (B, S, D): cross-attention keys and values, once, and
        self-attention buffers with room for ``capacity`` steps (0: allocated at the first step, grown as needed)."""
        caches = []
        for layer in self.decoder.layers:
            attn = layer.self_attn
            self_kv = None if not capacity else KVCache.empty(memory.size(0), attn.n_heads, attn.d_head, capacity, memory)
            caches.append(DecoderLayerCache(self_kv, layer.cross_attn.project_kv(memory)))
        return caches

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """Teacher-forced training pass: src (B, S), tgt_in (B, T) -> logits (B, T, V)."""
        memory, src_mask, _ = self.encode(src)
        logits, _, _ = self.decode(tgt_in, memory, src_mask)
        return logits  # (B, T, V)
