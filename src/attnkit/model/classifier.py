"""A text classifier: embeddings + positions, the Transformer encoder, pooling, and a linear head."""

from __future__ import annotations

from torch import Tensor, nn

from attnkit.model.attention import AttentionMaps
from attnkit.model.masking import padding_mask
from attnkit.model.transformer import Embeddings, Encoder

POOLINGS = ("mean", "cls")


class TransformerClassifier(nn.Module):
    """Encoder + pooling + head.

    Pooling is the masked mean over real tokens (padding never counted) or the first position ([CLS]-style; the
    tokenizer then prepends a CLS token). The head is C-way (softmax over C logits) or, with ``n_classes=1``, a
    single logit for a binary task (sigmoid). ``attnkit.model.build.build_classifier`` wires one up.
    """

    def __init__(self, *, embeddings: Embeddings, encoder: Encoder, head: nn.Linear, pooling: str, pad_id: int):
        super().__init__()
        if pooling not in POOLINGS:
            raise ValueError(f"pooling={pooling!r}; expected one of {POOLINGS}")
        self.pad_id = pad_id
        self.pooling = pooling
        self.embeddings = embeddings
        self.encoder = encoder
        self.head = head  # (D -> C)

    def encode(
        self, ids: Tensor, attn_layers: tuple[int, ...] = (), *, rows: Tensor | None = None
    ) -> tuple[Tensor, Tensor, AttentionMaps]:
        """ids (B, S) -> hidden states (B, S, D), key mask (B, 1, 1, S) True = real token, and the self-attention
        weights of the encoder layers in ``attn_layers`` (``AttentionMaps.encoder_self``). ``rows`` (N,): the flat
        positions of the real tokens, where the batch was built with them (``Encoder``: no read of the mask)."""
        mask = padding_mask(ids, self.pad_id)  # (B, 1, 1, S)
        hidden, maps = self.encoder(self.embeddings(ids), mask, attn_layers, rows=rows)  # (B, S, D)
        return hidden, mask, maps

    def pool(self, hidden: Tensor, mask: Tensor, pooling: str | None = None) -> Tensor:
        """(B, S, D) hidden states and (B, 1, 1, S) mask -> (B, D) sentence vectors, pooled as the model does or as
        ``pooling`` ("mean" or "cls") says."""
        if (pooling or self.pooling) == "cls":
            return hidden[:, 0]  # (B, D)
        real = mask[:, 0, 0, :, None].to(hidden.dtype)  # (B, S, 1)
        return (hidden * real).sum(dim=1) / real.sum(dim=1).clamp(min=1.0)  # (B, D)

    def forward(self, ids: Tensor, *, rows: Tensor | None = None) -> Tensor:
        """ids (B, S) -> logits (B, C); ``rows`` as ``encode`` takes them."""
        hidden, mask, _ = self.encode(ids, rows=rows)
        return self.head(self.pool(hidden, mask))  # (B, C)

    def forward_with_attention(self, ids: Tensor, attn_layers: tuple[int, ...]) -> tuple[Tensor, AttentionMaps]:
        """Logits (B, C) and the (B, H, S, S) self-attention weights of the encoder layers in ``attn_layers``."""
        hidden, mask, maps = self.encode(ids, attn_layers)
        return self.head(self.pool(hidden, mask)), maps  # (B, C)
