"""The token embedding held transposed, swapped in for an ``nn.Embedding`` whose matrix is also the output projection.

§3.4 shares one matrix E (V, D) between the embeddings and the pre-softmax projection, which multiplies by E^T:
``F.linear(x, E)``. That product is the largest of a decoding step (D x V), and on a CPU it ran faster with the
matrix stored (D, V), contiguous: 1.9x at one row, 1.2x at 32, 1.6x at 128 (docs/performance.md). A
``TransposedEmbedding`` stores E that way, once: lookups read its rows through a transposed view, and
``F.linear(x, weight)`` with ``weight`` that view multiplies by the contiguous (D, V) matrix. It saves and loads
under the embedding's key and shape (``weight``, (V, D)), so run directories and exports see no difference.
"""

from __future__ import annotations

from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.inference import onednn


class TransposedEmbedding(nn.Module):
    """An ``nn.Embedding`` without ``padding_idx`` or norms, with its (V, D) matrix stored as ``weight_t`` (D, V)."""

    def __init__(self, embedding: nn.Embedding):
        super().__init__()
        if embedding.padding_idx is not None or embedding.max_norm is not None:
            raise ValueError("TransposedEmbedding holds a plain lookup table: no padding_idx, no max_norm")
        self.num_embeddings, self.embedding_dim = embedding.num_embeddings, embedding.embedding_dim
        weight = embedding.weight
        self.weight_t = nn.Parameter(weight.detach().t().contiguous(), requires_grad=weight.requires_grad)  # (D, V)
        self.register_state_dict_post_hook(_save_untransposed)
        self.register_load_state_dict_pre_hook(_load_transposed)

    @property
    def weight(self) -> Tensor:
        """E (V, D), a view of ``weight_t``."""
        return self.weight_t.t()

    def forward(self, ids: Tensor) -> Tensor:
        """(...) ids -> (..., D)."""
        return F.embedding(ids, self.weight)


def _save_untransposed(module: nn.Module, state_dict: dict, prefix: str, local_metadata: dict) -> None:
    state_dict[prefix + "weight"] = state_dict.pop(prefix + "weight_t").t().contiguous()  # (V, D)


def _load_transposed(module: nn.Module, state_dict: dict, prefix: str, *args) -> None:
    if prefix + "weight" in state_dict:
        state_dict[prefix + "weight_t"] = state_dict.pop(prefix + "weight").t()  # (D, V), copied into weight_t


class TiedOutput(nn.Module):
    """The pre-softmax projection tied to the token embedding (§3.4), as an output module (``Transformer.output_proj``)
    that subclasses give a product. The embedding is referred to, not registered, so the tied matrix keeps one
    state-dict key (the embedding's) and follows it through ``.to()`` and ``load_state_dict``."""

    def __init__(self, embedding: nn.Module):
        super().__init__()
        self._tied: tuple[Any] = (embedding,)  # a tuple: nn.Module would register a module attribute as a child

    @property
    def weight(self) -> Tensor:
        return self._tied[0].weight  # (V, D)


class TiedTransposedOutput(TiedOutput):
    """The output projection tied to a ``TransposedEmbedding``: x (..., D) -> (..., V), x E^T with E held (D, V), on
    oneDNN where that pays (``attnkit.inference.onednn``)."""

    def __init__(self, embedding: TransposedEmbedding):
        super().__init__(embedding)
        self.onednn = onednn.uses_onednn()  # read once, as ``OneDNNLinear`` does

    def forward(self, x: Tensor) -> Tensor:
        return onednn.linear(x, self._tied[0].weight_t, None, onednn=self.onednn, transposed=True)  # (..., V)
