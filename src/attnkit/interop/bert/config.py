"""``config.json`` of a BERT folder read as an attnkit ``ClassifierConfig`` and written from one.

A BERT encoder is the paper's post-LN encoder (§3.1) with four traits that ``Embeddings`` and the config already
offer as options (``BERT_TRAITS``): learned positions (Table 3 row E), no sqrt(d_model) scale on the embeddings,
token-type (segment) embeddings, and a LayerNorm after the embedding sum; its FFN uses the exact (erf) GELU.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from attnkit import runs
from attnkit.config import ClassifierConfig, MaskedLMConfig
from attnkit.errors import InputError

# The traits that make an attnkit classifier config a BERT encoder (besides token types and d_head = D / H).
BERT_TRAITS: dict[str, Any] = {
    "positional": "learned",
    "scale_embeddings": False,
    "embedding_norm": True,
    "norm": "post",
    "activation": "gelu",
}


def bert_config(folder: str | Path, *, n_classes: int = 0, pooling: str = "mean") -> ClassifierConfig:
    """The ``ClassifierConfig`` of the BERT encoder described by ``folder/config.json``, with a fresh head."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise InputError(f"{folder}: no config.json (not a Hugging Face model folder)")
    raw = runs.read_json(path)
    model_type, architectures = raw.get("model_type"), raw.get("architectures") or []
    is_bert = model_type == "bert" or (model_type is None and any(str(a).startswith("Bert") for a in architectures))
    if not is_bert:
        raise InputError(
            f"{folder}: model_type {model_type!r} (architectures {architectures}) is not BERT; "
            "attnkit loads BERT-format encoders only"
        )
    missing = [
        k
        for k in ("hidden_size", "num_attention_heads", "intermediate_size", "num_hidden_layers", "vocab_size")
        if k not in raw
    ]
    if missing:
        raise InputError(f"{path}: missing key(s) {', '.join(missing)}")
    # The remaining keys default as in transformers' BertConfig.
    if raw.get("hidden_act", "gelu") != "gelu":
        raise InputError(
            f"{path}: hidden_act {raw['hidden_act']!r} is not supported; attnkit's GELU is the exact "
            "erf form, BERT's 'gelu' (a tanh approximation such as 'gelu_new' would give other outputs)"
        )
    if raw.get("position_embedding_type", "absolute") != "absolute":
        raise InputError(
            f"{path}: position_embedding_type {raw['position_embedding_type']!r} is not supported "
            "(attnkit has absolute learned positions only)"
        )
    if raw.get("is_decoder", False):
        raise InputError(f"{path}: is_decoder is true; attnkit loads bidirectional BERT encoders only")
    try:
        return ClassifierConfig(
            vocab_size=raw["vocab_size"],
            d_model=raw["hidden_size"],
            n_heads=raw["num_attention_heads"],
            d_ff=raw["intermediate_size"],
            n_layers=raw["num_hidden_layers"],
            max_len=raw.get("max_position_embeddings", 512),
            dropout=raw.get("hidden_dropout_prob", 0.1),
            attention_dropout=raw.get("attention_probs_dropout_prob", 0.1),
            layer_norm_eps=raw.get("layer_norm_eps", 1e-12),
            n_token_types=raw.get("type_vocab_size", 2),
            n_classes=n_classes,
            pooling=pooling,
            **BERT_TRAITS,
        )
    except InputError as err:
        raise InputError(f"{path}: {err}") from None


def check_bert_shaped(cfg: ClassifierConfig | MaskedLMConfig) -> None:
    """InputError listing what keeps ``cfg`` from being a BERT encoder (only those can be written as BERT folders)."""
    problems = [
        f"{key}={getattr(cfg, key)!r} (BERT: {value!r})"
        for key, value in BERT_TRAITS.items()
        if getattr(cfg, key) != value
    ]
    if cfg.n_token_types < 1:
        problems.append("n_token_types=0 (BERT: at least 1)")
    if cfg.d_head is not None and cfg.d_head * cfg.n_heads != cfg.d_model:
        problems.append(f"d_head={cfg.d_head} (BERT: d_model / n_heads = {cfg.d_model / cfg.n_heads:g})")
    if problems:
        raise InputError(
            "only BERT-shaped encoders can be exported as BERT folders; this model has "
            + ", ".join(problems)
            + ". Train with these keys set as BERT has them, or start from --init-from"
        )


def bert_config_dict(cfg: ClassifierConfig | MaskedLMConfig, pad_id: int) -> dict:
    """``config.json`` of the BERT folder for ``cfg``, every field written out."""
    return {
        "architectures": ["BertModel"],
        "model_type": "bert",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "intermediate_size": cfg.d_ff,
        "hidden_act": "gelu",
        "hidden_dropout_prob": cfg.dropout,
        "attention_probs_dropout_prob": cfg.attention_dropout,
        "max_position_embeddings": cfg.max_len,
        "type_vocab_size": cfg.n_token_types,
        "initializer_range": 0.02,
        "layer_norm_eps": cfg.layer_norm_eps,
        "pad_token_id": pad_id,
        "position_embedding_type": "absolute",
        "use_cache": False,
    }
