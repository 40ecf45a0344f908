"""Positional encodings (§3.5): the paper's sinusoids, and the learned variant it compares them with (Table 3 E).

PE(pos, 2i)   = sin(pos / 10000^(2i / d_model))
PE(pos, 2i+1) = cos(pos / 10000^(2i / d_model))
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


def sinusoidal_table(max_len: int, d_model: int) -> Tensor:
    """The (max_len, D) table of §3.5, computed in float64 and returned as float32."""
    position = torch.arange(max_len, dtype=torch.float64)[:, None]  # (max_len, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (ceil(D / 2),)
    angle = position / torch.pow(10000.0, two_i / d_model)  # (max_len, ceil(D / 2))
    table = torch.zeros(max_len, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle[:, : d_model // 2])
    return table.float()  # (max_len, D)


class SinusoidalPositionalEncoding(nn.Module):
    """Adds nothing trainable: the table is a buffer, rebuilt on load rather than saved."""

    table: Tensor  # (max_len, D), registered as a buffer below

    def __init__(self, *, max_len: int, d_model: int):
        super().__init__()
        self.max_len = max_len
        self.register_buffer("table", sinusoidal_table(max_len, d_model), persistent=False)  # (max_len, D)

    def forward(self, length: int, offset: int | Tensor = 0) -> Tensor:
        """Encodings of positions ``offset .. offset + length - 1``: (length, D)."""
        if isinstance(offset, Tensor):  # a decoding step's position, on the device: gathered, not checked
            return self.table[offset + torch.arange(length, device=offset.device)]  # (T, D)
        if offset + length > self.table.size(0):
            raise ValueError(f"position {offset + length - 1} is past max_len={self.table.size(0)}")
        return self.table[offset : offset + length]  # (T, D)


class LearnedPositionalEmbedding(nn.Module):
    """One trained vector per position (Table 3 row E: "positional embedding instead of sinusoids")."""

    def __init__(self, *, max_len: int, d_model: int):
        super().__init__()
        self.max_len = max_len
        self.embedding = nn.Embedding(max_len, d_model)
        nn.init.normal_(self.embedding.weight, std=d_model**-0.5)

    def forward(self, length: int, offset: int | Tensor = 0) -> Tensor:
        """Embeddings of positions ``offset .. offset + length - 1``: (length, D)."""
        if isinstance(offset, Tensor):  # a decoding step's position, on the device: gathered, not checked
            return self.embedding(offset + torch.arange(length, device=offset.device))  # (T, D)
        if offset + length > self.embedding.num_embeddings:
            raise ValueError(f"position {offset + length - 1} is past max_len={self.embedding.num_embeddings}")
        return self.embedding.weight[offset : offset + length]  # (T, D)


def scale_for(d_model: int, scale_embeddings: bool) -> float:
    """§3.4: "In the embedding layers, we multiply those weights by sqrt(d_model)"."""
    return math.sqrt(d_model) if scale_embeddings else 1.0
