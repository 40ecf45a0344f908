"""make_optimizer: no weight decay on biases, norms and embeddings; layer-wise learning-rate decay for fine-tuning."""

from __future__ import annotations

import copy

import pytest
import torch

from attnkit.config import ClassifierConfig, ClassifierTrainConfig, TrainConfig
from attnkit.errors import InputError
from attnkit.model.build import build_classifier
from attnkit.training.optim import make_optimizer, set_learning_rate


def _lr_of(optimizer: torch.optim.Optimizer, param: torch.Tensor | torch.nn.Module) -> float:
    return next(g["lr"] for g in optimizer.param_groups if any(p is param for p in g["params"]))


def _decay_of(optimizer: torch.optim.Optimizer, param: torch.Tensor | torch.nn.Module) -> float:
    return next(g["weight_decay"] for g in optimizer.param_groups if any(p is param for p in g["params"]))


@pytest.mark.parametrize("optimizer", ["adam", "adamw"])
def test_every_parameter_once_decay_only_on_matrices(optimizer):
    model = build_classifier(
        ClassifierConfig(vocab_size=50, d_model=16, n_heads=2, d_ff=32, n_layers=2, n_classes=2), pad_id=0
    )
    opt = make_optimizer(model, TrainConfig(optimizer=optimizer, weight_decay=0.1))
    in_groups = [p for g in opt.param_groups for p in g["params"]]
    assert len(in_groups) == len(list(model.parameters())) == len({id(p) for p in in_groups})
    layer = model.encoder.layers[0]
    assert _decay_of(opt, layer.ffn.linear1.weight) == 0.1
    assert _decay_of(opt, layer.ffn.linear1.bias) == 0.0
    assert _decay_of(opt, model.embeddings.token.weight) == 0.0


def test_layer_wise_decay_scales_lr_from_the_head_down():
    cfg = ClassifierConfig(vocab_size=50, d_model=16, n_heads=2, d_ff=32, n_layers=3, n_classes=2)
    model = build_classifier(cfg, pad_id=0)
    opt = make_optimizer(model, TrainConfig(lr=1e-3), layer_lr_decay=0.5)
    set_learning_rate(opt, 1e-3)
    assert _lr_of(opt, model.head.weight) == pytest.approx(1e-3)
    for i, layer in enumerate(model.encoder.layers):  # layer i of 3 sits 3 - i below the head
        assert _lr_of(opt, layer.ffn.linear1.weight) == pytest.approx(1e-3 * 0.5 ** (3 - i))
        assert _lr_of(opt, layer.norm1.weight) == pytest.approx(1e-3 * 0.5 ** (3 - i))
    assert _lr_of(opt, model.embeddings.token.weight) == pytest.approx(1e-3 * 0.5**4)

    plain = make_optimizer(model, TrainConfig(lr=1e-3))
    set_learning_rate(plain, 2e-3)
    assert {g["lr"] for g in plain.param_groups} == {2e-3}


@pytest.mark.parametrize("value", [0.0, 1.5, -0.1])
def test_layer_lr_decay_out_of_range_is_refused(value):
    with pytest.raises(InputError, match="layer_lr_decay"):
        ClassifierTrainConfig(layer_lr_decay=value)  # a classifier key: the translator has one learning rate


@pytest.mark.parametrize("optimizer", ["adam", "adamw"])
def test_fused_step_equals_the_per_parameter_loop(optimizer):
    """On a CPU make_optimizer steps with the fused kernel; the parameters follow the plain loop's update.

    (A small MLP: in attention, the key bias has a gradient of rounding noise only, which Adam scales up to full
    steps of either sign.)"""
    torch.manual_seed(0)
    fused_model = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.LayerNorm(16), torch.nn.Linear(16, 3)
    )
    loop_model = copy.deepcopy(fused_model)
    train_cfg = TrainConfig(optimizer=optimizer, weight_decay=0.1, lr=1e-2)
    fused = make_optimizer(fused_model, train_cfg)
    assert all(g["fused"] for g in fused.param_groups)
    loop = make_optimizer(loop_model, train_cfg)
    for group in loop.param_groups:
        group["fused"] = None
    x = torch.randn(32, 8, generator=torch.Generator().manual_seed(1))
    for _ in range(5):
        for model, opt in ((fused_model, fused), (loop_model, loop)):
            model(x).square().sum().backward()
            opt.step()
            opt.zero_grad()
    for (name, a), b in zip(fused_model.named_parameters(), loop_model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)
    torch.manual_seed(0)
    start = torch.nn.Linear(8, 16)
    first = fused_model[0]
    assert isinstance(first, torch.nn.Linear)
    assert not torch.allclose(first.weight, start.weight)  # the steps moved the parameters
