"""The model configs: what every attnkit model shares (``TransformerConfig``, the paper's hyperparameters, each
field citing its section), the classifier, the translator of Figure 1 and the masked-language-model encoder, and
the presets (Table 3's "base" and "big" among them).

Modules never see these objects: ``attnkit.model.build`` maps a config to module arguments, in one place.
"""

from __future__ import annotations

from dataclasses import dataclass

from attnkit.config.bounds import check_fields
from attnkit.errors import InputError


@dataclass(frozen=True)
class TransformerConfig:
    """What the encoder (and decoder) of every attnkit model share. Defaults are a small CPU-sized model."""

    vocab_size: int = 10000  # size of the (shared) vocabulary; for training, the tokenizer's maximum size
    d_model: int = 128  # width of every sub-layer output (§3.1)
    n_heads: int = 4  # h, parallel attention heads (§3.2.2)
    d_head: int | None = None  # d_k = d_v per head; None = d_model / n_heads, as in the paper
    d_ff: int = 512  # inner width of the feed-forward network (§3.3)
    n_layers: int = 2  # N, identical layers in the encoder (and in the decoder)
    max_len: int = 128  # longest sequence (in tokens) the positional encoding covers
    dropout: float = 0.1  # P_drop on sub-layer outputs and on embedding + position sums (§5.4)
    attention_dropout: float = 0.0  # dropout on attention weights: BERT-family fine-tuning; the paper uses none
    norm: str = "post"  # "post": LayerNorm(x + Sublayer(x)) as in the paper; "pre": x + Sublayer(LayerNorm(x))
    positional: str = "sinusoidal"  # "sinusoidal" (§3.5) or "learned" (Table 3, row E)
    activation: str = "relu"  # FFN non-linearity: "relu" (eq. 2) or "gelu"
    scale_embeddings: bool = True  # multiply embeddings by sqrt(d_model) (§3.4)
    layer_norm_eps: float = 1e-5  # LayerNorm epsilon (PyTorch's default; BERT uses 1e-12)

    def __post_init__(self) -> None:
        check_fields(self)
        if self.d_head is None and self.d_model % self.n_heads != 0:
            raise InputError(
                f"config: d_model={self.d_model} is not divisible by n_heads={self.n_heads} "
                "(set d_head to decouple them)"
            )


@dataclass(frozen=True)
class ClassifierConfig(TransformerConfig):
    """A text classifier. The defaults: d_model 128, 4 heads, d_ff 512, 2 layers (the ``vocab10k`` preset's shape)."""

    n_classes: int = 0  # C; 0 = one per label seen in training; 1 = a single logit for a binary task (sigmoid)
    pooling: str = "mean"  # "mean": masked mean over real tokens; "cls": the first token (a CLS token is prepended)
    n_token_types: int = 0  # BERT-family token-type (segment) embeddings; 0 = none, as in the paper
    embedding_norm: bool = False  # BERT-family LayerNorm after embeddings + positions


@dataclass(frozen=True)
class TranslatorConfig(TransformerConfig):
    """The encoder-decoder of Figure 1 with a shared vocabulary. The defaults are the CPU-sized ``small`` preset."""

    vocab_size: int = 8000
    d_model: int = 256
    n_heads: int = 4
    d_ff: int = 1024
    n_layers: int = 3
    max_len: int = 256
    tie_embeddings: bool = True  # share source/target embeddings and the pre-softmax projection (§3.4)


@dataclass(frozen=True)
class MaskedLMConfig(TransformerConfig):
    """An encoder pretrained with BERT's masked-language-model objective (Devlin et al. 2019, §3.1 Task #1).

    BERT-shaped by default (learned positions, no sqrt(d_model) scale, a LayerNorm after the embeddings, GELU,
    one token type), so that `attnkit export hf` writes it as a BERT folder and `classify train --init-from`
    fine-tunes it as it fine-tunes MiniLM."""

    vocab_size: int = 8000  # the tokenizer's maximum size, <mask> included
    positional: str = "learned"  # BERT's learned absolute positions (Table 3, row E)
    scale_embeddings: bool = False  # BERT does not scale its embeddings
    activation: str = "gelu"  # BERT's FFN uses the exact (erf) GELU
    n_token_types: int = 1  # one segment: single texts, no next-sentence pairs (BERT has 2)
    embedding_norm: bool = True  # BERT's LayerNorm after embeddings + positions
    layer_norm_eps: float = 1e-12  # BERT's


# ---------------------------------------------------------------------------------------------------------------
# Presets

CLASSIFIER_PRESETS: dict[str, dict] = {
    "default": {},
    # The default shape with a fixed 10,000-token vocabulary and 2 classes (d_model 128, 4 heads, d_ff 512, 2 layers).
    "vocab10k": dict(vocab_size=10000, d_model=128, n_heads=4, d_ff=512, n_layers=2, n_classes=2),
    # A tiny binary classifier on BERT's 30,522-token vocabulary: d_model 32, one layer, [CLS] pooling, one logit.
    "tiny-binary": dict(
        vocab_size=30522, d_model=32, n_heads=4, d_ff=32, n_layers=1, max_len=400, n_classes=1, pooling="cls"
    ),
}
# Earlier names, still accepted and not listed: the reference notes these shapes came from were numbered.
PRESET_ALIASES = {"seed000": "vocab10k", "seed001": "tiny-binary"}

TRANSLATOR_PRESETS: dict[str, dict] = {
    "small": {},  # d_model 256, 4 heads, d_ff 1024, 3 + 3 layers: trainable on a CPU in an hour
    "base": dict(d_model=512, n_heads=8, d_ff=2048, n_layers=6, dropout=0.1, vocab_size=37000),  # Table 3, "base"
    "big": dict(d_model=1024, n_heads=16, d_ff=4096, n_layers=6, dropout=0.3, vocab_size=37000),  # Table 3, "big"
}

# Each task's model config class, its presets and the preset used when none is named.
TASK_PRESETS: dict[str, tuple[type, dict[str, dict], str]] = {
    "classify": (ClassifierConfig, CLASSIFIER_PRESETS, "default"),
    "translate": (TranslatorConfig, TRANSLATOR_PRESETS, "small"),
    "pretrain": (MaskedLMConfig, {"default": {}}, "default"),
}
