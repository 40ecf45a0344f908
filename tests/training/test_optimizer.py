"""make_optimizer: no weight decay on biases, norms and embeddings; layer-wise learning-rate decay for fine-tuning."""

from __future__ import annotations

import pytest
import torch

from attnkit.config import ClassifierConfig, ClassifierTrainConfig, TrainConfig
from attnkit.errors import InputError
from attnkit.model.build import build_classifier
from attnkit.training.optim import make_optimizer, set_learning_rate


def _lr_of(optimizer: torch.optim.Optimizer, param: torch.nn.Parameter) -> float:
    return next(g["lr"] for g in optimizer.param_groups if any(p is param for p in g["params"]))


def _decay_of(optimizer: torch.optim.Optimizer, param: torch.nn.Parameter) -> float:
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
