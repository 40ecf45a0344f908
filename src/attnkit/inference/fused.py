"""Self-attention with W^Q, W^K, W^V held as one matrix, swapped in for a ``MultiHeadAttention`` for inference.

``MultiHeadAttention.project_qkv`` stacks the three weights at every call, so that training updates three separate
parameters; at inference that copy of 3 H Dh x D weights is paid at every decoding step and layer. A
``FusedSelfAttention`` is built from a ``MultiHeadAttention``'s weights and replaces it: it owns one (3 H Dh, D)
projection, ``qkv``, and no other copy of them, so nothing can go stale: it can be moved, cast, loaded and even
trained like any module. Its state dict still has the paper's keys (``q_proj.weight``, ...): the stacked matrix
is split when saved and stacked when loaded, so run directories and exports see no difference.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnkit.model.attention import MultiHeadAttention

_PARTS = ("q_proj", "k_proj", "v_proj")


class FusedSelfAttention(MultiHeadAttention):
    """A ``MultiHeadAttention`` for self-attention only, whose Q, K and V projections are one ``nn.Linear``,
    ``qkv`` (D -> 3 H Dh, rows W^Q, then W^K, then W^V), so that ``quantize_int8_`` rounds it as one matrix too."""

    def __init__(self, attention: MultiHeadAttention):
        nn.Module.__init__(self)  # not MultiHeadAttention.__init__: the projections are taken over, not made
        self.n_heads, self.d_head, self.dropout = attention.n_heads, attention.d_head, attention.dropout
        q = attention.q_proj
        self.qkv = nn.Linear(q.in_features, 3 * q.out_features, bias=q.bias is not None, device="meta")
        with torch.no_grad():
            weights = [getattr(attention, name).weight for name in _PARTS]
            self.qkv.weight = nn.Parameter(torch.cat(weights), requires_grad=q.weight.requires_grad)  # (3 H Dh, D)
            if q.bias is not None:
                biases = [getattr(attention, name).bias for name in _PARTS]
                self.qkv.bias = nn.Parameter(torch.cat(biases), requires_grad=q.bias.requires_grad)  # (3 H Dh,)
        self.out_proj = attention.out_proj
        self.train(attention.training)
        self.register_state_dict_post_hook(_split_qkv)
        self.register_load_state_dict_pre_hook(_stack_qkv)

    def project_qkv(self, x: Tensor) -> Tensor:
        """(..., D) -> (..., 3 H Dh) by the stacked projection, without copying weights."""
        return self.qkv(x)  # (..., 3 H Dh)


def _split_qkv(module: nn.Module, state_dict: dict, prefix: str, local_metadata: dict) -> None:
    """State-dict hook: the stacked ``qkv`` saved as the paper's ``q_proj``, ``k_proj``, ``v_proj``, in the paper's
    order. The module's keys are the last ones in ``state_dict`` when the hook runs, so they are re-inserted."""
    names = ("qkv.weight", "qkv.bias", "out_proj.weight", "out_proj.bias")
    saved = {name: state_dict.pop(prefix + name) for name in names if prefix + name in state_dict}
    for name in (*_PARTS, "out_proj"):
        for kind in ("weight", "bias"):
            if name == "out_proj":
                value = saved.get(f"out_proj.{kind}")
            else:
                stacked = saved.get(f"qkv.{kind}")  # (3 H Dh, ...)
                # A copy of its own: safetensors refuses tensors that share memory.
                value = None if stacked is None else stacked.chunk(3)[_PARTS.index(name)].clone()
            if value is not None:
                state_dict[f"{prefix}{name}.{kind}"] = value


def _stack_qkv(module: nn.Module, state_dict: dict, prefix: str, *args) -> None:
    """Load-state-dict pre-hook: the paper's ``q_proj``, ``k_proj``, ``v_proj`` stacked into ``qkv``."""
    for kind in ("weight", "bias"):
        keys = [f"{prefix}{name}.{kind}" for name in _PARTS]
        if all(key in state_dict for key in keys):
            state_dict[f"{prefix}qkv.{kind}"] = torch.cat([state_dict.pop(key) for key in keys])
