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


def sequence_loss(logits: Tensor, targets: Tensor, pad_id: int, smoothing: float = 0.0) -> tuple[Tensor, int]:
    """Token-level cross-entropy with label smoothing over non-pad targets.

    logits (B, T, V), targets (B, T). Returns the summed loss and the number of target tokens, so that
    gradient accumulation can normalise by the tokens of the whole effective batch.
    """
    loss = F.cross_entropy(
        logits.reshape(-1, logits.size(-1)),
        targets.reshape(-1),
        ignore_index=pad_id,
        label_smoothing=smoothing,
        reduction="sum",
    )
    return loss, int((targets != pad_id).sum())
