"""Weight-only int8 for decoding one or a few sentences at a time on a CPU, by module swap (gpt-fast's
``WeightOnlyInt8Linear``).

Decoding one sentence multiplies one row of activations by every weight matrix of the decoder at every step, so a
step's time is the time to read its weights. Rounding each weight matrix to int8 with one scale per output row
(symmetric, w ~= q * scale, |q| <= 127) halves the bytes of bfloat16, and PyTorch has a kernel that reads the int8
weights directly (``torch.ops.aten._weight_int8pack_mm``: bfloat16 activations, float32 sums, the row scales applied
to the sums). That kernel wins only where the weights dominate, at a few rows (docs/performance.md), so an
``Int8Weight`` keeps two copies of the same rounded weights: the int8 one for products of at most
``INT8_MAX_ROWS`` rows, and ``dense``, ``q * scale`` in the activations' type, for larger products. Both multiply by
the same values; they differ by bfloat16 rounding only, so a sentence decoded alone and in a batch of 32 is decoded
by one model.

    q      (N, K) int8     the weights divided by their row's scale, rounded
    scale  (N,)            max_k |w[n, k]| / 127, in the activations' dtype (the kernel's requirement)
    dense  (N, K)          q * scale in that dtype: the same weights for products of more rows

The kernel reads K in blocks of 16 (in torch 2.13 other K give garbage or crash: measured), so a matrix whose input
size is not a multiple of 16 is left as it is. The modules keep the rounded values as their ``weight`` (what the
state dict saves, under the same keys) and the int8 copy in buffers that are not saved; loading a state dict rounds
the loaded weights again.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.inference.onednn import OneDNNLinear
from attnkit.inference.transposed import TiedOutput

INT8_MAX_ROWS = 4  # a product of at most this many rows runs on the int8 weights, a larger one on ``dense``
K_BLOCK = 16  # the kernel's block along the input dimension


@dataclass(frozen=True)
class Int8Weight:
    """A (N, K) weight matrix rounded to int8 with one scale per row, and the same values in ``dense``."""

    q: Tensor  # (N, K) int8
    scale: Tensor  # (N,)
    dense: Tensor  # (N, K) q * scale

    @classmethod
    def quantize(cls, weight: Tensor) -> Int8Weight:
        """Round ``weight`` (N, K) row by row; ``scale`` and ``dense`` take ``weight``'s dtype."""
        w = weight.detach().float()  # (N, K)
        scale = w.abs().amax(dim=1).clamp_min(torch.finfo(torch.float32).tiny) / 127  # (N,)
        q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8).contiguous()  # (N, K), the kernel's layout
        scale = scale.to(weight.dtype)
        return cls(q, scale, q.to(weight.dtype) * scale[:, None])

    @staticmethod
    def supports(in_features: int) -> bool:
        return in_features % K_BLOCK == 0

    def linear(self, x: Tensor, bias: Tensor | None = None) -> Tensor:
        """x (..., K) -> (..., N), as ``F.linear(x, dense, bias)``; on the int8 weights when x has few rows."""
        K = self.q.size(1)
        rows = x.numel() // K
        if rows > INT8_MAX_ROWS or x.dtype != self.scale.dtype or not x.is_cpu:
            return F.linear(x, self.dense, bias)  # (..., N)
        y = torch.ops.aten._weight_int8pack_mm(x.reshape(rows, K), self.q, self.scale)  # (rows, N)
        y = y.view(*x.shape[:-1], y.size(-1))  # (..., N)
        return y if bias is None else y + bias


class _Int8Rows(nn.Module):
    """What ``Int8Linear`` and ``Int8Embedding`` share: ``weight`` holds the rounded values in the floating-point
    type (what the state dict saves), the buffers ``q`` and ``scale`` (not saved) the int8 copy."""

    weight: Tensor
    q: Tensor
    scale: Tensor

    def _hold(self, int8: Int8Weight) -> None:
        self.weight = nn.Parameter(int8.dense, requires_grad=False)
        self.register_buffer("q", int8.q, persistent=False)
        self.register_buffer("scale", int8.scale, persistent=False)

    def _round_on_load(self) -> None:
        """Loading a state dict replaces ``weight``: round the new values then, so the int8 copy is never stale."""
        self.register_load_state_dict_post_hook(lambda module, _: module._hold(Int8Weight.quantize(module.weight)))

    @property
    def int8(self) -> Int8Weight:
        return Int8Weight(self.q, self.scale, self.weight)


class Int8Linear(nn.Linear, _Int8Rows):
    """An ``nn.Linear`` whose weight is rounded to int8 (``Int8Weight``). For inference: with autograd on, the
    forward pass multiplies by ``weight``, the rounded values, alone."""

    @classmethod
    def of(cls, linear: nn.Linear) -> Int8Linear:
        module = cls(linear.in_features, linear.out_features, bias=linear.bias is not None, device="meta")
        module._hold(Int8Weight.quantize(linear.weight))
        module._round_on_load()
        module.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach(), requires_grad=False)
        return module

    def forward(self, x: Tensor) -> Tensor:
        if torch.is_grad_enabled():
            return super().forward(x)
        return self.int8.linear(x, self.bias)  # (..., out_features)


class Int8Embedding(nn.Embedding, _Int8Rows):
    """An ``nn.Embedding`` whose table is rounded to int8 row by row: lookups read the rounded values (``weight``),
    and a tied output projection (``TiedInt8Output``) multiplies by the int8 copy when it has few rows."""

    @classmethod
    def of(cls, embedding: nn.Embedding) -> Int8Embedding:
        V, D = embedding.weight.shape
        module = cls(V, D, padding_idx=embedding.padding_idx, device="meta")
        module._hold(Int8Weight.quantize(embedding.weight))
        module._round_on_load()
        return module


class TiedInt8Output(TiedOutput):
    """The pre-softmax projection tied to an ``Int8Embedding`` (§3.4): x (..., D) -> (..., V) by the embedding's
    int8 copy."""

    def __init__(self, embedding: Int8Embedding):
        super().__init__(embedding)

    def forward(self, x: Tensor) -> Tensor:
        return self._tied[0].int8.linear(x)  # (..., V)


def quantize_int8_(module: nn.Module) -> int:
    """Replace, in place, every ``nn.Linear`` and ``nn.Embedding`` under ``module`` whose input size is a multiple
    of ``K_BLOCK`` by its int8 counterpart; returns how many were replaced. Cast the module to the activations'
    dtype first (bfloat16: the kernel's fast path)."""
    replaced = 0
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if (
                isinstance(child, nn.Linear)
                and type(child) in (nn.Linear, OneDNNLinear)
                and Int8Weight.supports(child.in_features)
            ):
                setattr(parent, name, Int8Linear.of(child))
            elif type(child) is nn.Embedding and Int8Weight.supports(child.embedding_dim):
                setattr(parent, name, Int8Embedding.of(child))
            else:
                continue
            replaced += 1
    return replaced
