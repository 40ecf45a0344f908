"""The only place where a config becomes modules.

The containers (``Encoder``, ``Decoder``, ``Transformer``, ``TransformerClassifier``) and the layers receive their
sub-modules built; only the functions below know every dimension. Modules are created in the order the
containers register them, so a fixed seed gives the same initial weights as long as this order is kept.
``attnkit.inference`` readies a built, loaded model for inference.
"""

from __future__ import annotations

from torch import nn

from attnkit.config import ClassifierConfig, MaskedLMConfig, TransformerConfig, TranslatorConfig
from attnkit.model.attention import MultiHeadAttention
from attnkit.model.classifier import TransformerClassifier
from attnkit.model.layers import DecoderLayer, EncoderLayer, PositionwiseFeedForward, Residual
from attnkit.model.masked_lm import MaskedLanguageModel, MaskedLMHead
from attnkit.model.transformer import Decoder, Embeddings, Encoder, Transformer


def _attention(cfg: TransformerConfig) -> MultiHeadAttention:
    return MultiHeadAttention(
        d_model=cfg.d_model, n_heads=cfg.n_heads, d_head=cfg.d_head, dropout=cfg.attention_dropout
    )


def _ffn(cfg: TransformerConfig) -> PositionwiseFeedForward:
    return PositionwiseFeedForward(d_model=cfg.d_model, d_ff=cfg.d_ff, activation=cfg.activation)


def _layer_norm(cfg: TransformerConfig) -> nn.LayerNorm:
    return nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)


def _final_norm(cfg: TransformerConfig) -> nn.LayerNorm | None:
    # A pre-LN stack leaves its residual path unnormalised and ends with a LayerNorm; a post-LN one already ends with
    # one (§3.1).
    return _layer_norm(cfg) if cfg.norm == "pre" else None


def encoder_layer(cfg: TransformerConfig) -> EncoderLayer:
    """Self-attention and the FFN (§3.1), each inside a residual sub-layer of ``cfg.norm`` order."""
    return EncoderLayer(
        self_attn=_attention(cfg),
        ffn=_ffn(cfg),
        norm1=_layer_norm(cfg),
        norm2=_layer_norm(cfg),
        residual=Residual(dropout=cfg.dropout, norm=cfg.norm),
    )


def decoder_layer(cfg: TransformerConfig) -> DecoderLayer:
    """Masked self-attention, encoder-decoder attention and the FFN (§3.1), each inside a residual sub-layer."""
    return DecoderLayer(
        self_attn=_attention(cfg),
        cross_attn=_attention(cfg),
        ffn=_ffn(cfg),
        norm1=_layer_norm(cfg),
        norm2=_layer_norm(cfg),
        norm3=_layer_norm(cfg),
        residual=Residual(dropout=cfg.dropout, norm=cfg.norm),
    )


def encoder(cfg: TransformerConfig) -> Encoder:
    """N = ``cfg.n_layers`` encoder layers (§3.1)."""
    return Encoder(layers=[encoder_layer(cfg) for _ in range(cfg.n_layers)], final_norm=_final_norm(cfg))


def decoder(cfg: TransformerConfig) -> Decoder:
    """N = ``cfg.n_layers`` decoder layers (§3.1)."""
    return Decoder(layers=[decoder_layer(cfg) for _ in range(cfg.n_layers)], final_norm=_final_norm(cfg))


def embeddings(cfg: TransformerConfig, *, n_token_types: int = 0, embedding_norm: bool = False) -> Embeddings:
    """Token embeddings and positional encodings (§3.4, §3.5); BERT's token types and LayerNorm on request."""
    return Embeddings(
        vocab_size=cfg.vocab_size,
        d_model=cfg.d_model,
        max_len=cfg.max_len,
        positional=cfg.positional,
        scale_embeddings=cfg.scale_embeddings,
        dropout=cfg.dropout,
        n_token_types=n_token_types,
        embedding_norm=embedding_norm,
        layer_norm_eps=cfg.layer_norm_eps,
    )


def _check_arguments(cfg: object, cls: type[TransformerConfig], pad_id: int) -> None:
    """A ``TypeError`` when a builder is given another model's config (or a dict, or ``load_config``'s pair) and a
    ``ValueError`` for a padding id outside the vocabulary, naming them, rather than an AttributeError or an
    IndexError from inside the modules."""
    if not isinstance(cfg, cls):
        raise TypeError(f"cfg is a {type(cfg).__name__}, not a {cls.__name__}")
    if isinstance(pad_id, bool) or not isinstance(pad_id, int) or not 0 <= pad_id < cfg.vocab_size:
        raise ValueError(f"pad_id={pad_id!r} must be a token id in [0, vocab_size={cfg.vocab_size})")


def build_classifier(cfg: ClassifierConfig, pad_id: int = 0) -> TransformerClassifier:
    """A classifier; ``n_classes=0`` (decided by the training labels) builds a 2-class head, for inspection."""
    _check_arguments(cfg, ClassifierConfig, pad_id)
    return TransformerClassifier(
        embeddings=embeddings(cfg, n_token_types=cfg.n_token_types, embedding_norm=cfg.embedding_norm),
        encoder=encoder(cfg),
        head=nn.Linear(cfg.d_model, cfg.n_classes or 2),  # D -> C
        pooling=cfg.pooling,
        pad_id=pad_id,
    )


def build_masked_lm(cfg: MaskedLMConfig, pad_id: int = 0) -> MaskedLanguageModel:
    """An encoder with BERT's masked-LM head (Devlin et al. 2019, §3.1; appendix A.1), its decoder tied to the token
    embeddings (§3.4). The token embeddings start at std d_model^-0.5, as the scaled ones do: tied to the decoder,
    the initial logits h E^T of a LayerNorm-ed h then have unit variance rather than d_model's."""
    _check_arguments(cfg, MaskedLMConfig, pad_id)
    emb = embeddings(cfg, n_token_types=cfg.n_token_types, embedding_norm=cfg.embedding_norm)
    nn.init.normal_(emb.token.weight, std=cfg.d_model**-0.5)
    return MaskedLanguageModel(
        embeddings=emb,
        encoder=encoder(cfg),
        head=MaskedLMHead(
            dense=nn.Linear(cfg.d_model, cfg.d_model),  # D -> D
            norm=_layer_norm(cfg),
            activation=cfg.activation,
            vocab_size=cfg.vocab_size,
        ),
        pad_id=pad_id,
    )


def build_translator(cfg: TranslatorConfig, pad_id: int = 0) -> Transformer:
    """The encoder-decoder of Figure 1; with ``tie_embeddings`` the pre-softmax projection reuses the token
    embedding matrix (§3.4), else it is a separate D -> V map without bias, so that tied and untied differ only
    in sharing."""
    _check_arguments(cfg, TranslatorConfig, pad_id)
    return Transformer(
        embeddings=embeddings(cfg),
        encoder=encoder(cfg),
        decoder=decoder(cfg),
        output_proj=None if cfg.tie_embeddings else nn.Linear(cfg.d_model, cfg.vocab_size, bias=False),  # D -> V
        pad_id=pad_id,
    )
