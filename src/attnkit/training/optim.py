"""The optimizer both tasks train with: Adam or AdamW with per-group weight decay and layer-wise learning-rate
scales, and the setting of the scheduled learning rate on it."""

from __future__ import annotations

import torch
from torch import nn

from attnkit.config import TrainConfig


def make_optimizer(model: nn.Module, cfg: TrainConfig, layer_lr_decay: float = 1.0) -> torch.optim.Optimizer:
    """Adam or AdamW (§5.3 betas and eps by default); biases, norms and embeddings get no weight decay.

    Every group carries an ``lr_scale`` that the training loop multiplies the scheduled learning rate by. It is 1
    unless ``layer_lr_decay`` < 1 (a classifier's key: layer-wise decay for fine-tuning, as in ELECTRA and BEiT):
    with N encoder layers, the head learns at lr, layer i (0 = the lowest) at lr * decay^(N - i), the embeddings at
    lr * decay^(N + 1), so the pretrained lower layers move least.
    """
    n_layers = len(list(model.get_submodule("encoder.layers").children())) if layer_lr_decay != 1.0 else 0
    groups: dict[tuple[float, float], list[nn.Parameter]] = {}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        weight_decay = 0.0 if param.ndim < 2 or "embeddings" in name else cfg.weight_decay
        groups.setdefault((weight_decay, layer_lr_decay ** _depth(name, n_layers)), []).append(param)
    param_groups = [{"params": params, "weight_decay": wd, "lr_scale": scale} for (wd, scale), params in groups.items()]
    optim_cls = torch.optim.AdamW if cfg.optimizer == "adamw" else torch.optim.Adam  # Adam: decay as an L2 term
    # The fused kernel updates every parameter in one pass per tensor instead of ~10 elementwise operations (the
    # default on a CPU is the per-parameter loop); same update rule, same state-dict format.
    fused = all(p.device.type in _FUSED_DEVICES and p.is_floating_point() for ps in groups.values() for p in ps)
    return optim_cls(param_groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.adam_eps, fused=fused or None)


_FUSED_DEVICES = ("cpu", "cuda")


def _depth(name: str, n_layers: int) -> int:
    """How many layers below the head a parameter sits: head 0, encoder layer i at n_layers - i, embeddings n + 1."""
    if not n_layers:
        return 0
    if name.startswith("embeddings."):
        return n_layers + 1
    if name.startswith("encoder.layers."):
        return n_layers - int(name.split(".")[2])
    return 0


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """The scheduled learning rate, times each group's ``lr_scale`` (layer-wise decay)."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)
