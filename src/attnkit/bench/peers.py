"""The alternatives a user would pick, built with attnkit's dimensions: ``torch.nn``, Hugging Face, CTranslate2.

``torch.nn`` peers hold the same weights as the attnkit model they are built from (``attnkit.interop.torch_nn``
copies them), so a test can check that both compute the same loss before the suites time them. ``torch.nn`` has no
embeddings, positional encodings, output projection or pooling: the peers reuse copies of attnkit's, as a user
of ``nn.Transformer`` would write their own. Hugging Face models are randomly initialised with the same dimensions
(their own initialisation; the architectures differ in details listed at each builder). CTranslate2 runs attnkit's
weights through ``attnkit.interop.ct2``.

Optional packages are imported only inside the builders; ``available`` says which are installed.
"""

from __future__ import annotations

import copy
import importlib.util

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.config import ClassifierConfig, TranslatorConfig
from attnkit.interop.torch_nn import reference_encoder, reference_transformer
from attnkit.model.classifier import TransformerClassifier
from attnkit.model.transformer import Transformer


def available(package: str) -> bool:
    """Whether an optional peer package ("transformers", "ctranslate2") is installed."""
    return importlib.util.find_spec(package) is not None


def _causal_blocked(length: int, device: torch.device) -> Tensor:
    """PyTorch's convention: (T, T) boolean, True = may NOT attend (the future)."""
    return torch.ones(length, length, dtype=torch.bool, device=device).triu(1)  # (T, T)


class TorchNNTranslator(nn.Module):
    """``nn.Transformer`` (batch_first, post-LN, no final norms) between copies of attnkit's embeddings and tied
    output projection: what a user writes around ``nn.Transformer``, with the weights of ``ours``."""

    def __init__(self, ours: Transformer, *, enable_nested_tensor: bool = False):
        super().__init__()
        self.pad_id = ours.pad_id
        self.embeddings = copy.deepcopy(ours.embeddings)
        self.output_proj = None if ours.output_proj is None else copy.deepcopy(ours.output_proj)
        self.transformer = reference_transformer(ours, enable_nested_tensor=enable_nested_tensor)
        self.train(ours.training)

    def logits(self, x: Tensor) -> Tensor:
        if self.output_proj is None:
            return F.linear(x, self.embeddings.token.weight)  # (B, T, V)
        return self.output_proj(x)  # (B, T, V)

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """src (B, S) -> memory (B, S, D) and the key padding mask (B, S), True = pad."""
        src_pad = src == self.pad_id  # (B, S)
        return self.transformer.encoder(self.embeddings(src), src_key_padding_mask=src_pad), src_pad

    def decode(self, tgt_in: Tensor, memory: Tensor, src_pad: Tensor) -> Tensor:
        """Re-runs the decoder over the whole prefix tgt_in (B, T) -> logits (B, T, V); no key/value cache."""
        T = tgt_in.size(1)
        out = self.transformer.decoder(
            self.embeddings(tgt_in),
            memory,
            tgt_mask=_causal_blocked(T, tgt_in.device),
            tgt_is_causal=True,
            tgt_key_padding_mask=tgt_in == self.pad_id,
            memory_key_padding_mask=src_pad,
        )  # (B, T, D)
        return self.logits(out)

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """Teacher-forced: src (B, S), tgt_in (B, T) -> logits (B, T, V)."""
        memory, src_pad = self.encode(src)
        return self.decode(tgt_in, memory, src_pad)

    @torch.inference_mode()
    def greedy_no_cache(self, src: Tensor, *, bos_id: int, eos_id: int, steps: int) -> Tensor:
        """The loop a user writes without a key/value cache: exactly ``steps`` tokens (EOS, BOS and pad banned).

        Step t feeds the whole prefix (B, t + 1) through the decoder, so the work grows with t^2. Returns (B, steps).
        """
        memory, src_pad = self.encode(src)  # (B, S, D), (B, S)
        banned = torch.tensor([self.pad_id, bos_id, eos_id], device=src.device)
        prefix = src.new_full((src.size(0), 1), bos_id)  # (B, 1)
        for _ in range(steps):
            logits = self.decode(prefix, memory, src_pad)[:, -1]  # (B, V)
            next_token = logits.index_fill(1, banned, float("-inf")).argmax(dim=-1, keepdim=True)  # (B, 1)
            prefix = torch.cat([prefix, next_token], dim=1)  # (B, t + 2)
        return prefix[:, 1:]  # (B, steps)


class TorchNNClassifier(nn.Module):
    """``nn.TransformerEncoder`` between copies of attnkit's embeddings, masked mean pooling and head.

    ``enable_nested_tensor=True`` is PyTorch's default for a user's ``nn.TransformerEncoder``: in eval mode without
    gradients it packs padded batches and runs its fused "fast path" (``torch.backends.mha`` switches it off).
    """

    def __init__(self, ours: TransformerClassifier, *, enable_nested_tensor: bool = True):
        super().__init__()
        if ours.pooling != "mean":
            raise ValueError(f"pooling={ours.pooling!r}: the torch.nn peer pools by masked mean only")
        self.pad_id = ours.pad_id
        self.embeddings = copy.deepcopy(ours.embeddings)
        self.encoder = reference_encoder(ours.encoder, enable_nested_tensor=enable_nested_tensor)
        self.head = copy.deepcopy(ours.head)
        self.train(ours.training)

    def forward(self, ids: Tensor) -> Tensor:
        """ids (B, S) -> logits (B, C)."""
        pad = ids == self.pad_id  # (B, S)
        hidden = self.encoder(self.embeddings(ids), src_key_padding_mask=pad)  # (B, S, D)
        real = (~pad)[:, :, None].to(hidden.dtype)  # (B, S, 1)
        pooled = (hidden * real).sum(dim=1) / real.sum(dim=1).clamp(min=1.0)  # (B, D)
        return self.head(pooled)  # (B, C)


def marian_translator(cfg: TranslatorConfig, *, pad_id: int, bos_id: int, eos_id: int) -> nn.Module:
    """Hugging Face ``MarianMTModel``, randomly initialised with ``cfg``'s dimensions.

    Like attnkit: post-LN, ReLU, sinusoidal positions, sqrt(d_model) embedding scale, one shared embedding matrix
    tied to the output projection, dropout on sub-layer outputs and embeddings only (attention and activation
    dropout 0, as §5.4 places it). Unlike: Marian's sinusoids put sines before cosines, and it adds a (zero) bias
    to the logits. ``forced_eos_token_id`` is cleared so that fixed-length generation emits no forced last token.
    """
    from transformers import MarianConfig, MarianMTModel

    config = MarianConfig(
        d_model=cfg.d_model,
        encoder_layers=cfg.n_layers,
        decoder_layers=cfg.n_layers,
        encoder_attention_heads=cfg.n_heads,
        decoder_attention_heads=cfg.n_heads,
        encoder_ffn_dim=cfg.d_ff,
        decoder_ffn_dim=cfg.d_ff,
        vocab_size=cfg.vocab_size,
        max_position_embeddings=cfg.max_len,
        dropout=cfg.dropout,
        attention_dropout=0.0,
        activation_dropout=0.0,
        activation_function=cfg.activation,
        scale_embedding=cfg.scale_embeddings,
        share_encoder_decoder_embeddings=True,
        tie_word_embeddings=cfg.tie_embeddings,
        pad_token_id=pad_id,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        decoder_start_token_id=bos_id,
        forced_eos_token_id=None,
    )
    return MarianMTModel(config)


def bert_classifier(cfg: ClassifierConfig) -> nn.Module:
    """Hugging Face ``BertForSequenceClassification``, randomly initialised with ``cfg``'s dimensions and ReLU.

    BERT differs from the seed-000 classifier by design: learned positions, token-type embeddings and a LayerNorm
    after the embeddings, no sqrt(d_model) scale, and [CLS] pooling through a tanh dense layer. Attention dropout is
    0 so that dropout sits where §5.4 puts it, as in the attnkit model.
    """
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.d_model,
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads,
        intermediate_size=cfg.d_ff,
        hidden_act=cfg.activation,
        max_position_embeddings=cfg.max_len,
        hidden_dropout_prob=cfg.dropout,
        attention_probs_dropout_prob=0.0,
        layer_norm_eps=cfg.layer_norm_eps,
        # transformers 5 accepts num_labels at run time (it sizes id2label) but its dataclass signature omits it
        num_labels=cfg.n_classes or 2,  # type: ignore[call-arg]
        pad_token_id=0,
    )
    return BertForSequenceClassification(config)
