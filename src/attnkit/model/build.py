"""The only place where a config becomes modules."""

from __future__ import annotations

from attnkit.config import ClassifierConfig, TransformerConfig, TranslatorConfig
from attnkit.model.classifier import TransformerClassifier
from attnkit.model.transformer import Transformer


def _common(cfg: TransformerConfig) -> dict:
    return dict(
        vocab_size=cfg.vocab_size, d_model=cfg.d_model, n_heads=cfg.n_heads, d_head=cfg.d_head, d_ff=cfg.d_ff,
        n_layers=cfg.n_layers, max_len=cfg.max_len, dropout=cfg.dropout, attention_dropout=cfg.attention_dropout,
        activation=cfg.activation, norm=cfg.norm,
        positional=cfg.positional, scale_embeddings=cfg.scale_embeddings, layer_norm_eps=cfg.layer_norm_eps,
    )


def build_classifier(cfg: ClassifierConfig, pad_id: int = 0) -> TransformerClassifier:
    """A classifier; ``n_classes=0`` (decided by the training labels) builds a 2-class head, for inspection."""
    return TransformerClassifier(
        **_common(cfg), n_classes=cfg.n_classes or 2, pooling=cfg.pooling, pad_id=pad_id,
        n_token_types=cfg.n_token_types, embedding_norm=cfg.embedding_norm,
    )


def build_translator(cfg: TranslatorConfig, pad_id: int = 0) -> Transformer:
    return Transformer(**_common(cfg), tie_embeddings=cfg.tie_embeddings, pad_id=pad_id)
