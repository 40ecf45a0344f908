"""Embeddings, the encoder and decoder stacks, and the encoder-decoder Transformer (§3.1, §3.4, Figure 1)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.model.attention import AttentionMaps, KVCache
from attnkit.model.layers import DecoderLayer, DecoderLayerCache, EncoderLayer
from attnkit.model.masking import Unpadded, cached_causal_mask, decoder_self_mask, padding_mask
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
        # With the sqrt(d_model) scale and init std d_model^-0.5 the scaled token embeddings have unit-variance
        # entries, comparable in scale to the sinusoids they are added to, which lie in [-1, 1] (a sinusoid over
        # whole periods has variance 1/2, so the positional encodings are not unit-variance).
        nn.init.normal_(self.token.weight, std=d_model**-0.5 if scale_embeddings else 1.0)
        self.position: SinusoidalPositionalEncoding | LearnedPositionalEmbedding
        if positional == "sinusoidal":
            self.position = SinusoidalPositionalEncoding(max_len=max_len, d_model=d_model)
        else:
            self.position = LearnedPositionalEmbedding(max_len=max_len, d_model=d_model)
        self.token_type = nn.Embedding(n_token_types, d_model) if n_token_types else None
        self.norm = nn.LayerNorm(d_model, eps=layer_norm_eps) if embedding_norm else None
        self.dropout = nn.Dropout(dropout)
        self.scale = scale_for(d_model, scale_embeddings)

    def forward(self, ids: Tensor, offset: int | Tensor = 0) -> Tensor:
        """(B, L) token ids at positions ``offset ..`` -> (B, L, D); a tensor ``offset`` (1,) stays on the device."""
        x = self.token(ids) * self.scale + self.position(ids.size(1), offset)  # (B, L, D)
        if self.token_type is not None:
            x = x + self.token_type.weight[0]  # single-segment input: token type 0 everywhere
        if self.norm is not None:
            x = self.norm(x)
        return self.dropout(x)  # (B, L, D)


class Encoder(nn.Module):
    """A stack of N encoder layers (§3.1); pre-LN stacks end with a LayerNorm (post-LN ones already end normalised)."""

    def __init__(self, *, layers: list[EncoderLayer], final_norm: nn.LayerNorm | None):
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.final_norm = final_norm

    def forward(
        self, x: Tensor, mask: Tensor | None, attn_layers: tuple[int, ...] = (), *, rows: Tensor | None = None
    ) -> tuple[Tensor, AttentionMaps]:
        """x (B, S, D), mask True = may attend (B, 1, 1, S); ``rows`` (N,) the flat positions b * S + s of the real
        tokens, where the caller made them with the batch (``data.batching.real_positions``).

        Returns the encoder output (B, S, D) and the self-attention weights (B, H, S, S) of the layers listed in
        ``attn_layers`` (``AttentionMaps.encoder_self``); the other layers stay on the fused attention path.
        """
        maps = AttentionMaps()
        # Where a batch has padding, the layers may run on its real tokens alone (``Unpadded``, see
        # ``skips_padding``). Maps are asked for one sentence at a time: those calls keep the padded layout. Either
        # way the output is zero at padded positions, so the two paths give the same tensor. A traced graph
        # (torch.compile, torch.export for ONNX) keeps the padded layout: the number of real tokens is data.
        key_mask = mask if mask is not None and mask.dim() == 4 and mask.size(2) == 1 else None  # (B, 1, 1, S)
        tracing = torch.compiler.is_compiling() or torch.jit.is_tracing()
        unpadded = None
        if key_mask is not None and not attn_layers and not tracing and skips_padding(x.device):
            if rows is not None:  # the host knows the real tokens: no read of the mask
                unpadded = Unpadded.from_rows(rows, key_mask) if rows.numel() < key_mask.numel() else None
            elif not bool(key_mask.all()):
                unpadded = Unpadded.of(key_mask)
        if unpadded is not None:
            x = unpadded.pack(x)  # (N, D)
        for i, layer in enumerate(self.layers):
            x, weights = layer(x, mask, need_weights=i in attn_layers, unpadded=unpadded)  # (B, S, D) or (N, D)
            if weights is not None:
                maps.encoder_self[i] = weights
        if self.final_norm is not None:
            x = self.final_norm(x)
        if unpadded is not None:
            x = unpadded.unpack(x)  # (B, S, D)
        elif key_mask is not None:
            x = x.masked_fill(~key_mask[:, 0, 0, :, None], 0.0)  # (B, S, D)
        return x, maps


def skips_padding(device: torch.device) -> bool:
    """Whether an encoder on ``device`` packs a padded batch's real tokens (``Unpadded``) rather than computing the
    padding under a key mask.

    On a CPU a padded position costs as much arithmetic as a real one, and packing skips it (about half the work on
    a batch of reviews padded to its longest). On a GPU the padding's arithmetic costs little, while packing costs a
    scatter and a gather of every layer's activations, their backward passes, and, without host-made rows, a read of
    the mask (a synchronisation): a GPU computes the padding.
    """
    return device.type == "cpu"


class Decoder(nn.Module):
    """A stack of N decoder layers (§3.1), with a final LayerNorm for pre-LN stacks."""

    def __init__(self, *, layers: list[DecoderLayer], final_norm: nn.LayerNorm | None):
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.final_norm = final_norm

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None,
        self_mask: Tensor | None,
        cross_mask: Tensor | None,
        *,
        cache: list[DecoderLayerCache] | None = None,
        positions: Tensor | None = None,
        attn_layers: tuple[int, ...] = (),
        causal: bool = False,
    ) -> tuple[Tensor, AttentionMaps]:
        """x (B, T, D) embedded target, memory (B, S, D) (None with a cache); ``positions`` (T,) with a cache.
        ``causal``: self-attention lets position t see positions 0 .. t (the kernel's flag; ``self_mask`` is then None).

        Returns (B, T, D) and the self- and cross-attention weights of the layers in ``attn_layers``
        (``AttentionMaps.decoder_self`` and ``.cross``); a cache is written in place.
        """
        maps = AttentionMaps()
        for i, layer in enumerate(self.layers):
            layer_cache = cache[i] if cache is not None else None
            x, (self_w, cross_w), _ = layer(
                x,
                memory,
                self_mask,
                cross_mask,
                cache=layer_cache,
                positions=positions,
                need_weights=i in attn_layers,
                causal=causal,
            )  # (B, T, D)
            if self_w is not None and cross_w is not None:
                maps.decoder_self[i], maps.cross[i] = self_w, cross_w
        if self.final_norm is not None:
            x = self.final_norm(x)
        return x, maps


class Transformer(nn.Module):
    """The encoder-decoder of Figure 1 with a shared source/target vocabulary.

    §3.4: "we share the same weight matrix between the two embedding layers and the pre-softmax linear
    transformation". With ``output_proj=None`` the output projection is ``F.linear(x, embeddings.token.weight)``,
    so the tied matrix exists once and is counted once. ``attnkit.model.build.build_translator`` wires one up.
    """

    def __init__(
        self, *, embeddings: Embeddings, encoder: Encoder, decoder: Decoder, output_proj: nn.Module | None, pad_id: int
    ):
        super().__init__()
        self.pad_id = pad_id
        self.embeddings = embeddings
        self.encoder = encoder
        self.decoder = decoder
        self.output_proj = output_proj

    def encode(self, src: Tensor, attn_layers: tuple[int, ...] = ()) -> tuple[Tensor, Tensor, AttentionMaps]:
        """src (B, S) ids -> memory (B, S, D), source mask (B, 1, 1, S) True = real token, requested maps."""
        src_mask = padding_mask(src, self.pad_id)  # (B, 1, 1, S)
        memory, maps = self.encoder(self.embeddings(src), src_mask, attn_layers)  # (B, S, D)
        return memory, src_mask, maps

    def logits(self, x: Tensor) -> Tensor:
        """Pre-softmax projection: (B, T, D) -> (B, T, V)."""
        if self.output_proj is None:
            return F.linear(x, self.embeddings.token.weight)  # (B, T, V), tied (§3.4)
        return self.output_proj(x)  # (B, T, V)

    def decode(
        self,
        tgt_in: Tensor,
        memory: Tensor | None,
        src_mask: Tensor | None,
        *,
        cache: list[DecoderLayerCache] | None = None,
        offset: int | Tensor = 0,
        attn_layers: tuple[int, ...] = (),
    ) -> tuple[Tensor, AttentionMaps, list[DecoderLayerCache] | None]:
        """Next-token logits for every position of ``tgt_in``.

        Without a cache, ``tgt_in`` (B, T) is the whole shifted target (BOS y_1 .. y_{T-1}) and a causal mask keeps
        each position from seeing the ones after it. With a cache (``start_cache``), ``tgt_in`` holds only the new
        positions, starting at ``offset`` (an int, or a (1,) tensor that a compiled step keeps on the device); they
        are written into the cache and attend to every position up to their own (``memory`` is not read: the
        cache holds its keys and values). ``src_mask`` None: no source position is padding.
        Returns logits (B, T, V), the attention maps of the decoder layers in ``attn_layers``, and the cache.
        """
        if cache is None:
            x = self.embeddings(tgt_in)  # (B, T, D)
            x, maps = self.decoder(x, memory, decoder_self_mask(tgt_in, self.pad_id), src_mask, attn_layers=attn_layers)
            return self.logits(x), maps, None  # (B, T, V)
        T, L = tgt_in.size(1), cache[0].self_kv.k.size(2)
        positions = offset + torch.arange(T, device=tgt_in.device)  # (T,)
        x = self.embeddings(tgt_in, offset)  # (B, T, D)
        # One query over a cache that ends at it may attend to every key: no mask (PyTorch's faster kernel path).
        unmasked = isinstance(offset, int) and T == 1 and offset + 1 == L
        self_mask = None if unmasked else cached_causal_mask(positions, L)  # (1, 1, T, L)
        x, maps = self.decoder(
            x, None, self_mask, src_mask, cache=cache, positions=positions, attn_layers=attn_layers
        )  # (B, T, D)
        return self.logits(x), maps, cache  # (B, T, V)

    def start_cache(self, memory: Tensor, length: int | None = None) -> list[DecoderLayerCache]:
        """An empty cache for decoding against ``memory`` (B, S, D): the cross-attention keys and values, once, and
        self-attention buffers for ``length`` positions (default: the positional limit, ``max_len``)."""
        length = self.embeddings.position.max_len if length is None else length
        caches = []
        for layer in self.decoder.layers:
            assert isinstance(layer, DecoderLayer)  # nn.ModuleList yields plain Modules to the type checker
            attn = layer.self_attn
            self_kv = KVCache.empty(memory.size(0), attn.n_heads, attn.d_head, length, like=memory)
            caches.append(DecoderLayerCache(self_kv, layer.cross_attn.project_kv(memory)))
        return caches

    def forward(
        self, src: Tensor, tgt_in: Tensor, positions: Tensor | None = None, *, src_rows: Tensor | None = None
    ) -> Tensor:
        """Teacher-forced training pass: src (B, S), tgt_in (B, T) -> logits (B, T, V).

        With ``positions``, only the positions a logit is wanted for (the real target tokens) go through the output
        projection and come back packed in row-major order: (N, V). The projection onto the vocabulary is the
        largest matrix product of a small translator, and the loss ignores the padded positions anyway.
        ``positions`` is a (B, T) boolean mask, or the (N,) flat positions b * T + t that a batch made on the host
        (``data.batching.real_positions``): selecting by a mask reads it, a synchronisation on a GPU.

        The packed pass is the one training takes, and it attends as fast as the kernels allow: decoder
        self-attention is causal by the kernel's flag, without a padding mask (targets are right-padded, so the
        keys 0 .. t of a real position t are all real; what padded positions compute, nothing reads). ``src_rows``
        (N_src,), the flat positions of the real source tokens made with the batch, tells the model without
        reading the device whether the source has padding at all: when it has none, no mask is built (without
        ``src_rows``, the mask is built from ``src``).
        """
        if positions is None:
            memory, src_mask, _ = self.encode(src)
            logits, _, _ = self.decode(tgt_in, memory, src_mask)
            return logits  # (B, T, V)
        padded = src_rows is None or src_rows.numel() < src.numel()
        key_mask = padding_mask(src, self.pad_id) if padded else None  # (B, 1, 1, S)
        memory, _ = self.encoder(self.embeddings(src), key_mask, rows=src_rows)  # (B, S, D)
        x = self.embeddings(tgt_in)  # (B, T, D)
        x, _ = self.decoder(x, memory, None, key_mask, causal=True)  # (B, T, D)
        if positions.dtype == torch.bool:
            x = x[positions]  # (N, D)
        else:
            x = x.flatten(0, 1).index_select(0, positions)  # (B T, D) -> (N, D)
        return self.logits(x)  # (N, V)
