"""How many numbers a model holds, from its config alone: the closed form of each concept and the totals of each
model the builders make, computed without building anything.

Symbols: V vocabulary, d = d_model, h heads, dh = d_head (d_k = d_v), d_ff, C classes, N layers.

    attention   (§3.2.2)  W^Q, W^K, W^V: d -> h*dh and W^O: h*dh -> d, all with biases
                          = 3(d*h*dh + h*dh) + h*dh*d + d, which is 4(d^2 + d) when h*dh = d (the paper's choice)
    FFN         (eq. 2)   W_1: d -> d_ff, W_2: d_ff -> d, with biases = 2*d*d_ff + d_ff + d
    LayerNorm             gain and bias = 2d
    embedding   (§3.4)    V*d; the translator shares it with the pre-softmax projection, so it is counted once
    positions   (§3.5)    sinusoids: nothing trainable (a max_len*d buffer); learned (Table 3 row E): max_len*d
    head                  d*C + C

``analysis.params`` checks every closed form against the modules it counts. ``model_size`` is what a config
allocates: a run's weights file is compared with it before a model is built (``runs.load``), so that a config.json
cannot make attnkit allocate more than the weights it ships, and a training compares it with the device's memory.
"""

from __future__ import annotations

from dataclasses import dataclass

from attnkit.config import ClassifierConfig, MaskedLMConfig, TransformerConfig, TranslatorConfig


def attention_params(d: int, h: int, dh: int, bias: bool = True) -> tuple[str, int]:
    """§3.2.2: four projections between d and h*dh."""
    inner = h * dh
    if bias:
        formula = "4(d^2 + d)" if inner == d else "3(d*h*dh + h*dh) + h*dh*d + d"
        return formula, 3 * (d * inner + inner) + inner * d + d
    return ("4d^2" if inner == d else "4*d*h*dh"), 4 * d * inner


def ffn_params(d: int, d_ff: int) -> tuple[str, int]:
    """Eq. 2: two linear maps with biases, d -> d_ff -> d."""
    return "2*d*d_ff + d_ff + d", 2 * d * d_ff + d_ff + d


def layer_norm_params(d: int, affine: bool = True, bias: bool = True) -> tuple[str, int]:
    if not affine:
        return "0", 0
    return ("2d", 2 * d) if bias else ("d", d)


def encoder_layer_params(cfg: TransformerConfig) -> int:
    """Self-attention + FFN + two LayerNorms (§3.1)."""
    d_head = cfg.d_head or cfg.d_model // cfg.n_heads
    return (
        attention_params(cfg.d_model, cfg.n_heads, d_head)[1] + ffn_params(cfg.d_model, cfg.d_ff)[1] + 4 * cfg.d_model
    )


def decoder_layer_params(cfg: TransformerConfig) -> int:
    """Masked self-attention + encoder-decoder attention + FFN + three LayerNorms (§3.1)."""
    d_head = cfg.d_head or cfg.d_model // cfg.n_heads
    attention = attention_params(cfg.d_model, cfg.n_heads, d_head)[1]
    return 2 * attention + ffn_params(cfg.d_model, cfg.d_ff)[1] + 6 * cfg.d_model


def _embeddings(cfg: TransformerConfig) -> int:
    """V*d, plus max_len*d for learned positions (sinusoids are not parameters)."""
    return cfg.vocab_size * cfg.d_model + (cfg.max_len * cfg.d_model if cfg.positional == "learned" else 0)


def _encoder(cfg: ClassifierConfig | MaskedLMConfig) -> int:
    """The embeddings (BERT's token types and LayerNorm included) and N encoder layers [+ a final pre-LN LayerNorm]."""
    d = cfg.d_model
    total = _embeddings(cfg) + cfg.n_token_types * d + (2 * d if cfg.embedding_norm else 0)
    return total + cfg.n_layers * encoder_layer_params(cfg) + (2 * d if cfg.norm == "pre" else 0)


def classifier_params(cfg: ClassifierConfig) -> int:
    """``V*d [+ max_len*d] [+ types*d + 2d] + N(4(d^2 + d) + 2*d*d_ff + d_ff + d + 4d) [+ 2d pre-LN] + d*C + C``."""
    n_classes = cfg.n_classes or 2  # 0 = "from the training labels"; the builder makes a 2-class head for inspection
    return _encoder(cfg) + cfg.d_model * n_classes + n_classes


def masked_lm_params(cfg: MaskedLMConfig) -> int:
    """The encoder + BERT's head: dense d -> d with bias, a LayerNorm, the tied decoder's bias V."""
    d = cfg.d_model
    return _encoder(cfg) + d * d + d + 2 * d + cfg.vocab_size


def translator_params(cfg: TranslatorConfig) -> int:
    """``V*d [+ max_len*d] + N(encoder layer) + N(decoder layer) [+ 2 * 2d pre-LN] [+ V*d untied projection]``.

    With the shared vocabulary and tied embeddings of §3.4: base (V = 37,000) 63,082,496; big 214,245,376.
    """
    d = cfg.d_model
    total = _embeddings(cfg) + cfg.n_layers * (encoder_layer_params(cfg) + decoder_layer_params(cfg))
    total += 2 * 2 * d if cfg.norm == "pre" else 0
    return total + (0 if cfg.tie_embeddings else cfg.vocab_size * d)


@dataclass(frozen=True)
class ModelSize:
    params: int  # parameters: what the weights file holds
    buffers: int  # values the builder computes rather than loads (the sinusoidal table, max_len*d)

    @property
    def weights_bytes(self) -> int:
        return 4 * (self.params + self.buffers)  # float32

    @property
    def training_bytes(self) -> int:
        """The weights, and a float32 gradient and Adam's two moments per parameter (activations not included)."""
        return self.weights_bytes + 12 * self.params


def model_size(cfg: TransformerConfig) -> ModelSize:
    """What the builder of ``cfg``'s model allocates."""
    if isinstance(cfg, MaskedLMConfig):
        params = masked_lm_params(cfg)
    elif isinstance(cfg, ClassifierConfig):
        params = classifier_params(cfg)
    elif isinstance(cfg, TranslatorConfig):
        params = translator_params(cfg)
    else:
        raise TypeError(f"no model is built from a {type(cfg).__name__}")
    return ModelSize(params, cfg.max_len * cfg.d_model if cfg.positional == "sinusoidal" else 0)
