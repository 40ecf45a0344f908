"""Which kernels a training step runs on its device: TF32 matrix products and the attention backends (CUDA), and
the forward pass and loss compiled into fused kernels by ``torch.compile`` (``compile=true``).

Attention. PyTorch's ``scaled_dot_product_attention`` picks a backend per call. On Hopper GPUs it prefers cuDNN's,
which builds an execution plan for every new (B, S, T) shape: token-budget batches change shape at nearly every
step, and 200 steps of the Bible recipe took about 60 s on an H200 against 10.8 s with cuDNN attention off (13 ms
a call: the plans). FlashAttention (half precision, no mask: decoder self-attention, unpadded sources) and the
memory-efficient kernel (masks, float32) need no plan, so training allows those two and the reference kernel that
is always there, in that order, and not cuDNN.

Compilation. ``torch.compile`` traces the task's loss (the forward pass and the loss of one batch) into one graph
(``fullgraph=True``: a graph break is an error, not a silent slowdown) that Inductor turns into fused kernels: the
residual, dropout and LayerNorm of each sub-layer in one pass, the cross-entropy's softmax in one. The model's code
keeps the padded layout under tracing (the packing of ``Unpadded`` depends on data). Lengths change from batch to
batch; after the first new shape the graph is recompiled with symbolic sizes, once. Off by default: the first
steps pay the compilation (tens of seconds), and on CPUs it did not pay back (docs/gpu.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import torch

from attnkit.training.precision import set_tf32

F = TypeVar("F", bound=Callable)


@contextmanager
def training_kernels(*, tf32: bool, device: torch.device) -> Iterator[None]:
    """Within the block, ``device`` computes float32 matrix products in TF32 or not (``precision.set_tf32``), and on
    CUDA attention runs on FlashAttention, the memory-efficient kernel or the reference one, never cuDNN's."""
    restore_tf32 = set_tf32(tf32, device)
    try:
        if device.type == "cuda":
            from torch.nn.attention import SDPBackend, sdpa_kernel

            backends = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
            with sdpa_kernel(backends, set_priority=True):
                yield
        else:
            yield
    finally:
        restore_tf32()


def compiled(loss: F, *, backend: str = "inductor") -> F:
    """``loss`` (a task's ``loss(model, batch)``) compiled into one graph; a graph break raises. ``backend``: Inductor's
    fused kernels, or ``"aot_eager"`` to trace the same graphs, forward and backward, without generating kernels."""
    return torch.compile(loss, fullgraph=True, backend=backend)  # type: ignore[return-value]
