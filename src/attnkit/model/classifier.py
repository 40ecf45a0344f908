"""A text classifier: embeddings + positions, the Transformer encoder, pooling, and a linear head."""

from __future__ import annotations

from torch import Tensor, nn

from attnkit.model.masking import padding_mask
from attnkit.model.transformer import Embeddings, Encoder

POOLINGS = ("mean", "cls")


class TransformerClassifier(nn.Module):
    """Encoder + pooling + head.

    Pooling is the masked mean over real tokens (padding never counted) or the first position ([CLS]-style; the
    tokenizer then prepends a CLS token). The head is C-way (softmax over C logits) or, with ``n_classes=1``, a
    single logit for a binary task (sigmoid).
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
        n_classes: int,
        pooling: str = "mean",
        d_head: int | None = None,
        dropout: float = 0.1,
        attention_dropout: float = 0.0,
        activation: str = "relu",
        norm: str = "post",
        positional: str = "sinusoidal",
        scale_embeddings: bool = True,
        pad_id: int = 0,
        layer_norm_eps: float = 1e-5,
        n_token_types: int = 0,
        embedding_norm: bool = False,
    ):
        super().__init__()
        if pooling not in POOLINGS:
            raise ValueError(f"pooling={pooling!r}; expected one of {POOLINGS}")
        self.pad_id = pad_id
        self.pooling = pooling
        self.embeddings = Embeddings(
            vocab_size=vocab_size, d_model=d_model, max_len=max_len, positional=positional,
            scale_embeddings=scale_embeddings, dropout=dropout, n_token_types=n_token_types,
            embedding_norm=embedding_norm, layer_norm_eps=layer_norm_eps,
        )
        self.encoder = Encoder(
            n_layers=n_layers, d_model=d_model, norm=norm, layer_norm_eps=layer_norm_eps,
            n_heads=n_heads, d_ff=d_ff, d_head=d_head, dropout=dropout, attention_dropout=attention_dropout,
            activation=activation,
        )
        self.head = nn.Linear(d_model, n_classes)

    def encode(self, ids: Tensor, attn_layers: tuple[int, ...] = ()) -> tuple[Tensor, Tensor, dict[int, Tensor]]:
        """ids (B, S) -> hidden states (B, S, D), key mask (B, 1, 1, S) True = real token, requested maps."""
        mask = padding_mask(ids, self.pad_id)  # (B, 1, 1, S)
        hidden, attn_weights = self.encoder(self.embeddings(ids), mask, attn_layers)  # (B, S, D)
        return hidden, mask, attn_weights

    def pool(self, hidden: Tensor, mask: Tensor, pooling: str | None = None) -> Tensor:
        """(B, S, D) hidden states and (B, 1, 1, S) mask -> (B, D) sentence vectors, pooled as the model does or as
        ``pooling`` ("mean" or "cls") says."""
        if (pooling or self.pooling) == "cls":
            return hidden[:, 0]  # (B, D)
        real = mask[:, 0, 0, :, None].to(hidden.dtype)  # (B, S, 1)
        return (hidden * real).sum(dim=1) / real.sum(dim=1).clamp(min=1.0)  # (B, D)

    def forward(self, ids: Tensor) -> Tensor:
        """ids (B, S) -> logits (B, C)."""
        hidden, mask, _ = self.encode(ids)
        return self.head(self.pool(hidden, mask))  # (B, C)

    def forward_with_attention(self, ids: Tensor, attn_layers: tuple[int, ...]) -> tuple[Tensor, dict[int, Tensor]]:
        """Logits (B, C) and the (B, H, S, S) self-attention weights of the encoder layers in ``attn_layers``."""
        hidden, mask, attn_weights = self.encode(ids, attn_layers)
        return self.head(self.pool(hidden, mask)), attn_weights
