"""Embeddings, the encoder and decoder stacks, and the encoder-decoder Transformer (§3.1, §3.4, Figure 1)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.model.attention import AttentionMaps, KVCache
from attnkit.model.layers import DecoderLayer, DecoderLayerCache, EncoderLayer
from attnkit.model.masking import Unpadded, causal_mask, decoder_self_mask, padding_mask
from attnkit.model.positional import LearnedPositionalEmbedding, SinusoidalPositionalEncoding, scale_for
from attnkit.model.quantize import Int8Embedding, Int8Linear, Int8Weight


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

    def forward(self, ids: Tensor, offset: int = 0) -> Tensor:
        """(B, L) token ids at positions ``offset ..`` -> (B, L, D)."""
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
        memory: Tensor,
        self_mask: Tensor | None,
        cross_mask: Tensor | None,
        *,
        cache: list[DecoderLayerCache] | None = None,
        attn_layers: tuple[int, ...] = (),
        causal: bool = False,
    ) -> tuple[Tensor, AttentionMaps, list[DecoderLayerCache] | None]:
        """x (B, T, D) embedded target, memory (B, S, D). ``causal``: self-attention lets position t see positions
        0 .. t (the kernel's flag; ``self_mask`` is then None).

        Returns (B, T, D), the self- and cross-attention weights of the layers in ``attn_layers``
        (``AttentionMaps.decoder_self`` and ``.cross``), and the updated cache.
        """
        maps = AttentionMaps()
        new_cache: list[DecoderLayerCache] | None = [] if cache is not None else None
        for i, layer in enumerate(self.layers):
            layer_cache = cache[i] if cache is not None else None
            x, (self_w, cross_w), layer_cache = layer(
                x, memory, self_mask, cross_mask, cache=layer_cache, need_weights=i in attn_layers, causal=causal
            )  # (B, T, D)
            if self_w is not None and cross_w is not None:
                maps.decoder_self[i], maps.cross[i] = self_w, cross_w
            if new_cache is not None:
                new_cache.append(layer_cache)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return x, maps, new_cache


class Transformer(nn.Module):
    """The encoder-decoder of Figure 1 with a shared source/target vocabulary.

    §3.4: "we share the same weight matrix between the two embedding layers and the pre-softmax linear
    transformation". With ``output_proj=None`` the output projection is ``F.linear(x, embeddings.token.weight)``,
    so the tied matrix exists once and is counted once. ``attnkit.model.build.build_translator`` wires one up.
    """

    def __init__(
        self, *, embeddings: Embeddings, encoder: Encoder, decoder: Decoder, output_proj: nn.Linear | None, pad_id: int
    ):
        super().__init__()
        self.pad_id = pad_id
        self.embeddings = embeddings
        self.encoder = encoder
        self.decoder = decoder
        self.output_proj = output_proj
        self._output_t: Tensor | Int8Weight | None = None  # output weight for inference (transpose_output)

    def encode(self, src: Tensor, attn_layers: tuple[int, ...] = ()) -> tuple[Tensor, Tensor, AttentionMaps]:
        """src (B, S) ids -> memory (B, S, D), source mask (B, 1, 1, S) True = real token, requested maps."""
        src_mask = padding_mask(src, self.pad_id)  # (B, 1, 1, S)
        memory, maps = self.encoder(self.embeddings(src), src_mask, attn_layers)  # (B, S, D)
        return memory, src_mask, maps

    def logits(self, x: Tensor) -> Tensor:
        """Pre-softmax projection: (B, T, D) -> (B, T, V)."""
        if self._output_t is not None:
            if not torch.is_grad_enabled():
                if isinstance(self._output_t, Int8Weight):
                    return self._output_t.linear(x)  # (B, T, V)
                return x @ self._output_t  # (B, T, V)
            self._output_t = None  # autograd on: the weights may be trained from here, so the copy would go stale
        weight = self.embeddings.token.weight if self.output_proj is None else self.output_proj.weight
        return F.linear(x, weight)  # (B, T, V)

    # The output projection is the largest matrix multiplication of a decoding step (D x V = 256 x 8,000 at small),
    # and F.linear multiplies by the (V, D) weight transposed: with the weight stored (D, V), contiguous, the same
    # product ran 1.2x faster for 32 rows, 1.6x for 128 (beam 4) and 1.9x for one row (benchmarks/profile_decode.py;
    # one thread, AMD EPYC). ``transpose_output`` makes that copy once for inference, kept under the same rules as
    # the stacked W^Q, W^K, W^V of ``MultiHeadAttention.fuse_qkv``: dropped by ``train()``, ``load_state_dict`` and
    # any forward pass with autograd on, moved and cast by ``.to()``, never saved. A weight rounded to int8
    # (``attnkit.model.quantize``) is kept as its ``Int8Weight`` instead, whose one-row kernel reads (V, D).

    def transpose_output(self) -> None:
        """Keep a (D, V) contiguous copy of the output weight (or its int8 form); later ``logits`` calls without
        autograd use it."""
        source = self.embeddings.token if self.output_proj is None else self.output_proj
        if isinstance(source, (Int8Embedding, Int8Linear)):
            self._output_t = source.int8  # (V, D) int8, and the same values in the floating-point type
            return
        with torch.no_grad():
            self._output_t = source.weight.t().contiguous()  # (D, V)

    def train(self, mode: bool = True) -> Transformer:
        if mode:
            self._output_t = None  # training changes the weights; never let it see a stale copy
        return super().train(mode)

    def _load_from_state_dict(self, *args, **kwargs) -> None:
        self._output_t = None  # new weights: the copy is stale
        super()._load_from_state_dict(*args, **kwargs)

    def _apply(self, fn, recurse: bool = True):
        super()._apply(fn, recurse)
        if isinstance(self._output_t, Int8Weight):  # the int8 module's own tensors, moved with it: no second copy
            self.transpose_output()
        elif self._output_t is not None:  # .to(device / dtype), .half(), ...: the copy follows the parameters
            self._output_t = fn(self._output_t)
        return self

    def decode(
        self,
        tgt_in: Tensor,
        memory: Tensor,
        src_mask: Tensor,
        *,
        cache: list[DecoderLayerCache] | None = None,
        offset: int = 0,
        attn_layers: tuple[int, ...] = (),
    ) -> tuple[Tensor, AttentionMaps, list[DecoderLayerCache] | None]:
        """Next-token logits for every position of ``tgt_in``.

        Without a cache, ``tgt_in`` (B, T) is the whole shifted target (BOS y_1 .. y_{T-1}) and a causal mask keeps
        each position from seeing the ones after it. With a cache, ``tgt_in`` holds only the new positions, starting
        at ``offset``, and attends to everything cached plus the new positions up to itself.
        Returns logits (B, T, V), the attention maps of the decoder layers in ``attn_layers``, and the updated cache.
        """
        x = self.embeddings(tgt_in, offset)  # (B, T, D)
        if cache is None:
            self_mask = decoder_self_mask(tgt_in, self.pad_id)  # (B, 1, T, T)
        elif tgt_in.size(1) == 1:
            self_mask = None  # one new position: everything cached comes before it
        else:
            self_mask = causal_mask(tgt_in.size(1), tgt_in.device, offset)  # (1, 1, T, offset + T)
        x, maps, cache = self.decoder(x, memory, self_mask, src_mask, cache=cache, attn_layers=attn_layers)
        return self.logits(x), maps, cache  # (B, T, V)

    def start_cache(self, memory: Tensor, capacity: int = 0) -> list[DecoderLayerCache]:
        """An empty cache for decoding against ``memory`` (B, S, D): cross-attention keys and values, once, and
        self-attention buffers with room for ``capacity`` steps (0: allocated at the first step, grown as needed)."""
        caches = []
        for layer in self.decoder.layers:
            assert isinstance(layer, DecoderLayer)  # nn.ModuleList yields plain Modules to the type checker
            attn = layer.self_attn
            self_kv = (
                None if not capacity else KVCache.empty(memory.size(0), attn.n_heads, attn.d_head, capacity, memory)
            )
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
        reading the device whether the source has padding at all: without, no mask is built.
        """
        if positions is None:
            memory, src_mask, _ = self.encode(src)
            logits, _, _ = self.decode(tgt_in, memory, src_mask)
            return logits  # (B, T, V)
        padded = src_rows is None or src_rows.numel() < src.numel()
        key_mask = padding_mask(src, self.pad_id) if padded else None  # (B, 1, 1, S)
        memory, _ = self.encoder(self.embeddings(src), key_mask, rows=src_rows)  # (B, S, D)
        x = self.embeddings(tgt_in)  # (B, T, D)
        x, _, _ = self.decoder(x, memory, None, key_mask, causal=True)  # (B, T, D)
        if positions.dtype == torch.bool:
            x = x[positions]  # (N, D)
        else:
            x = x.flatten(0, 1).index_select(0, positions)  # (B T, D) -> (N, D)
        return self.logits(x)  # (N, V)
