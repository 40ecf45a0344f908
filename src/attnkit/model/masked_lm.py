"""An encoder with BERT's masked-language-model head (Devlin et al. 2019, §3.1 "Task #1: Masked LM"): the hidden
state of each chosen position goes through a transform (dense, activation, LayerNorm) and a decoder to the
vocabulary whose weights are the token embedding matrix (tied, as the Transformer ties its pre-softmax projection,
§3.4) plus a bias of its own. The encoder's parameter names are the classifier's, so its weights move into a
``TransformerClassifier`` unchanged (``classify train --init-from``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.model.masking import padding_mask
from attnkit.model.transformer import Embeddings, Encoder


class MaskedLMHead(nn.Module):
    """h (N, D) -> logits (N, V) = LayerNorm(act(h W_t + b_t)) E^T + b, with E the (V, D) token embeddings.

    BERT's ``cls.predictions``: ``transform.dense``, ``transform.LayerNorm``, the tied ``decoder`` and ``bias``."""

    def __init__(self, *, dense: nn.Linear, norm: nn.LayerNorm, activation: str, vocab_size: int):
        super().__init__()
        if activation not in ("relu", "gelu"):
            raise ValueError(f"activation={activation!r}; expected 'relu' or 'gelu'")
        self.dense = dense  # (D -> D)
        self.norm = norm
        self.activation = activation
        self.bias = nn.Parameter(torch.zeros(vocab_size))  # (V,)

    def forward(self, hidden: Tensor, token_embeddings: Tensor) -> Tensor:
        """hidden (N, D), token_embeddings (V, D) -> logits (N, V)."""
        h = self.dense(hidden)  # (N, D)
        h = F.gelu(h) if self.activation == "gelu" else F.relu(h)
        return F.linear(self.norm(h), token_embeddings, self.bias)  # (N, V)


class MaskedLanguageModel(nn.Module):
    """Embeddings + encoder + ``MaskedLMHead``; ``attnkit.model.build.build_masked_lm`` wires one up."""

    def __init__(self, *, embeddings: Embeddings, encoder: Encoder, head: MaskedLMHead, pad_id: int):
        super().__init__()
        self.pad_id = pad_id
        self.embeddings = embeddings
        self.encoder = encoder
        self.head = head

    def encode(self, ids: Tensor, *, rows: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """ids (B, S) -> hidden states (B, S, D) and the key mask (B, 1, 1, S), True = real token. ``rows`` (N,): the
        flat positions of the real tokens, where the batch was built with them (``Encoder``: no read of the mask)."""
        mask = padding_mask(ids, self.pad_id)  # (B, 1, 1, S)
        hidden, _ = self.encoder(self.embeddings(ids), mask, rows=rows)  # (B, S, D)
        return hidden, mask

    def forward(self, ids: Tensor, positions: Tensor, *, rows: Tensor | None = None) -> Tensor:
        """ids (B, S), positions (B, S) bool or the (N,) flat positions b * S + s of the True ones -> logits (N, V) at
        those positions, in row-major order. Only the positions chosen for prediction pay for the (D x V) decoder
        (BERT predicts those alone). Flat positions made with the batch select without reading the device."""
        hidden, _ = self.encode(ids, rows=rows)  # (B, S, D)
        if positions.dtype == torch.bool:
            chosen = hidden[positions]  # (N, D)
        else:
            chosen = hidden.flatten(0, 1).index_select(0, positions)  # (B S, D) -> (N, D)
        return self.head(chosen, self.embeddings.token.weight)  # (N, V)
