"""Losses: cross-entropy with label smoothing (§5.4), for C-way heads, single-logit heads and token sequences."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def classification_loss(logits: Tensor, labels: Tensor, smoothing: float = 0.0) -> Tensor:
    """logits (B, C) and labels (B,) -> mean loss.

    C = 1 is a binary task with one logit: binary cross-entropy against targets smoothed towards 1/2.
    """
    if logits.size(-1) == 1:
        targets = labels.to(logits.dtype) * (1.0 - smoothing) + 0.5 * smoothing  # (B,)
        return F.binary_cross_entropy_with_logits(logits.squeeze(-1), targets)
    return F.cross_entropy(logits, labels, label_smoothing=smoothing)


def class_probabilities(logits: Tensor) -> Tensor:
    """(B, C) logits -> (B, C') probabilities; a single logit becomes [P(class 0), P(class 1)]."""
    if logits.size(-1) == 1:
        p1 = logits.squeeze(-1).sigmoid()  # (B,)
        return torch.stack([1.0 - p1, p1], dim=-1)  # (B, 2)
    return logits.softmax(dim=-1)  # (B, C)


def sequence_loss(logits: Tensor, targets: Tensor, pad_id: int, smoothing: float = 0.0) -> tuple[Tensor, Tensor]:
    """Token-level cross-entropy with label smoothing over non-pad targets.

    logits (B, T, V) or (N, V), targets (B, T) or (N,). Returns the summed loss and the number of target tokens, so
    that gradient accumulation can normalise by the tokens of the whole effective batch. The count is a tensor on
    the targets' device: reading it (``int``) waits for a GPU, and training does not need to, since its batches
    know their token counts when they are built. Equal to ``F.cross_entropy(..., ignore_index=pad_id,
    label_smoothing=smoothing, reduction="sum")`` (tests check loss and gradients), computed by
    ``smoothed_cross_entropy``.
    """
    loss = smoothed_cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1), pad_id, smoothing)
    return loss, (targets != pad_id).sum()


def smoothed_cross_entropy(logits: Tensor, targets: Tensor, pad_id: int, smoothing: float = 0.0) -> Tensor:
    """Summed label-smoothed cross-entropy (§5.4) of logits (N, V) against targets (N,), rows with ``pad_id`` left out.

    With q = (1 - eps) onehot(y) + eps / V, the loss of a row is -sum_v q_v log p_v = lse - (1 - eps) z_y - eps mean(z)
    (lse = log sum_v exp z_v), and its gradient is p - q: one softmax. Half-precision logits (autocast) are read in
    float32, as ``smoothed_cross_entropy(logits.float(), ...)`` would compute them; the loss is float32 and the
    gradient has the logits' dtype. Two paths compute it, chosen by ``blocked_loss``: ``F.cross_entropy`` in one
    pass over the (N, V) logits, a fixed number of kernels whatever N; or ``_SmoothedCrossEntropy``, which runs both
    directions over blocks of rows small enough to stay in a CPU's cache, without the float32 copy of the whole
    tensor, in ~20 operator calls a block.
    """
    if blocked_loss(logits):
        return _SmoothedCrossEntropy.apply(logits, targets, pad_id, smoothing)
    return F.cross_entropy(logits.float(), targets, ignore_index=pad_id, label_smoothing=smoothing, reduction="sum")


def blocked_loss(logits: Tensor) -> bool:
    """Whether the loss of ``logits`` (N, V) walks them in cache-sized blocks (see ``smoothed_cross_entropy``).

    On a GPU never: each block is ~23 kernel launches of a few microseconds, far more than its arithmetic (16-row
    blocks at V = 8,000 cost ~200 ms a step of 16,384 target tokens on an H200, ~23,500 launches; the fused pass is a
    few launches whatever N). Nor in a compiled graph, where Inductor fuses the one pass. On a CPU, always: forward
    and backward took 1.55-1.62x less time in blocks than in the fused pass for float32 logits and 2.0-2.2x for
    bfloat16 ones, at 2,048 and 16,384 rows, V = 8,000, 16,000 and 37,000 (3 rows a block), one thread (AMD EPYC
    with AVX2, ``python benchmarks/profile_loss.py --threads 1``, the two paths in turns, load average 1.3-2.3); on
    an Intel Xeon with AMX, 1.91-2.52x for float32 and 3.0-5.0x for bfloat16 at the same shapes (two threads, the
    default, idle).
    """
    return logits.device.type == "cpu" and not torch.compiler.is_compiling()


_BLOCK = 1 << 17  # logits per block of rows: 512 KiB of float32, within a core's L2 cache


class _SmoothedCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: Tensor, targets: Tensor, pad_id: int, smoothing: float) -> Tensor:
        N, V = logits.shape
        keep = targets != pad_id  # (N,)
        safe = targets.masked_fill(~keep, 0)[:, None]  # (N, 1) any valid index on ignored rows
        lse = logits.new_empty(N, dtype=torch.float32)  # (N,)
        row_loss = torch.empty_like(lse)  # (N,)
        rows = max(1, _BLOCK // max(V, 1))
        for i in range(0, N, rows):
            z = logits[i : i + rows].float()  # (n, V)
            torch.logsumexp(z, dim=-1, out=lse[i : i + rows])
            picked = z.gather(1, safe[i : i + rows]).squeeze(1)  # (n,) z_y
            row_loss[i : i + rows] = lse[i : i + rows] - (1.0 - smoothing) * picked - smoothing * z.mean(dim=-1)
        ctx.save_for_backward(logits, lse, safe, keep)
        ctx.smoothing = smoothing
        return row_loss.masked_fill(~keep, 0.0).sum()

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        logits, lse, safe, keep = ctx.saved_tensors
        eps, (N, V) = ctx.smoothing, logits.shape
        scale = (grad_out.float() * keep.float())[:, None]  # (N, 1) dL/dloss on kept rows, 0 on ignored ones
        grad = torch.empty_like(logits, memory_format=torch.contiguous_format)  # (N, V)
        rows = max(1, _BLOCK // max(V, 1))
        for i in range(0, N, rows):
            block = grad[i : i + rows]  # (n, V)
            z = logits[i : i + rows].float()  # (n, V)
            g = torch.sub(z, lse[i : i + rows, None], out=block if block.dtype == z.dtype else None).exp_()  # p
            g.sub_(eps / V).scatter_add_(1, safe[i : i + rows], g.new_full((g.size(0), 1), eps - 1.0))  # p - q
            g.mul_(scale[i : i + rows])
            if g is not block:
                block.copy_(g)  # rounded once, as the backward pass of logits.float() rounds
        return grad, None, None, None
