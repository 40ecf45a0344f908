"""Pure functions of training: the learning-rate schedules (eq. 3 of §5.3, linear warmup and decay) and the
classification losses (cross-entropy with label smoothing, §5.4; binary cross-entropy for a single logit)."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from attnkit.training.losses import class_probabilities, classification_loss
from attnkit.training.schedules import constant_warmup, learning_rate, linear_warmup_decay, noam

# ---------------------------------------------------------------------------------------------------------------
# Schedules


@pytest.mark.parametrize(
    ("step", "expected"),
    [
        # lrate = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), d_model = 512, warmup = 4000 (§5.3)
        (1, 1 / math.sqrt(512) * 1 / 4000**1.5),
        (1000, 1 / math.sqrt(512) * 1000 / 4000**1.5),
        (4000, 1 / math.sqrt(512 * 4000)),  # the peak, about 7.0e-4
        (16000, 1 / math.sqrt(512 * 16000)),
        (100_000, 1 / math.sqrt(512 * 100_000)),
    ],
)
def test_noam_is_equation_3(step, expected):
    assert noam(step, d_model=512, warmup=4000) == pytest.approx(expected, rel=1e-12)
    assert noam(step, d_model=512, warmup=4000, factor=2.0) == pytest.approx(2 * expected, rel=1e-12)


def test_noam_golden_peak():
    assert noam(4000, d_model=512, warmup=4000) == pytest.approx(6.987712429686844e-4, rel=1e-12)


def test_noam_warms_up_linearly_and_decays_as_inverse_square_root():
    lr = [noam(step, d_model=64, warmup=100) for step in range(1, 1001)]
    assert max(range(len(lr)), key=lr.__getitem__) + 1 == 100  # the peak is at step == warmup
    assert lr[50 - 1] == pytest.approx(lr[100 - 1] / 2)  # linear before the peak
    assert lr[400 - 1] == pytest.approx(lr[100 - 1] / 2)  # 1 / sqrt(step) after it


def test_linear_warmup_then_decay_endpoints():
    peak, warmup, total = 1e-3, 10, 100
    lr = [linear_warmup_decay(step, peak=peak, warmup=warmup, total=total) for step in range(0, total + 5)]
    assert lr[0] == 0.0
    assert lr[warmup] == pytest.approx(peak)
    assert lr[5] == pytest.approx(peak / 2)
    assert lr[55] == pytest.approx(peak / 2)  # halfway down the decay
    assert lr[total] == 0.0
    assert lr[total + 1 :] == [0.0] * 4  # never negative past the planned end
    assert all(a < b for a, b in zip(lr[:warmup], lr[1 : warmup + 1]))
    assert all(a > b for a, b in zip(lr[warmup:total], lr[warmup + 1 : total + 1]))


def test_constant_schedule_warms_up_then_stays():
    assert [constant_warmup(step, peak=1.0, warmup=4) for step in (0, 2, 4, 100)] == [0.0, 0.5, 1.0, 1.0]
    assert constant_warmup(1, peak=1.0, warmup=0) == 1.0


@pytest.mark.parametrize("schedule", ["noam", "linear", "constant"])
def test_learning_rate_dispatches_by_name(schedule):
    args: dict[str, Any] = dict(peak=1e-3, factor=2.0, warmup=10, total=50, d_model=64)
    expected = {
        "noam": lambda step: noam(step, d_model=64, warmup=10, factor=2.0),
        "linear": lambda step: linear_warmup_decay(step, peak=1e-3, warmup=10, total=50),
        "constant": lambda step: constant_warmup(step, peak=1e-3, warmup=10),
    }[schedule]
    steps = range(1, 60)
    assert [learning_rate(step, schedule=schedule, **args) for step in steps] == [expected(step) for step in steps]


# ---------------------------------------------------------------------------------------------------------------
# Losses


def test_single_logit_loss_is_binary_cross_entropy():
    logits = torch.randn(6, 1)  # (B, 1)
    labels = torch.tensor([0, 1, 1, 0, 1, 0])
    p = logits.squeeze(-1).sigmoid()  # (B,)
    y = labels.float()
    bce = -(y * p.log() + (1 - y) * (1 - p).log()).mean()
    assert_close(classification_loss(logits, labels), bce, atol=1e-6, rtol=1e-6)
    # Smoothing pulls the targets towards 1/2: 0 -> eps/2, 1 -> 1 - eps/2.
    eps = 0.2
    y_smooth = y * (1 - eps) + eps / 2
    smoothed = -(y_smooth * p.log() + (1 - y_smooth) * (1 - p).log()).mean()
    assert_close(classification_loss(logits, labels, smoothing=eps), smoothed, atol=1e-6, rtol=1e-6)


def test_c_way_loss_is_cross_entropy():
    logits = torch.randn(5, 3)  # (B, C)
    labels = torch.tensor([0, 2, 1, 2, 0])
    assert_close(classification_loss(logits, labels), F.cross_entropy(logits, labels), atol=0, rtol=0)
    # §5.4: with smoothing eps the target is (1 - eps) on the label plus eps / C everywhere.
    eps = 0.1
    log_p = logits.log_softmax(dim=-1)  # (B, C)
    target = F.one_hot(labels, 3).float() * (1 - eps) + eps / 3  # (B, C)
    smoothed = -(target * log_p).sum(-1).mean()
    assert_close(classification_loss(logits, labels, smoothing=eps), smoothed, atol=1e-6, rtol=1e-6)


def test_class_probabilities_sum_to_one():
    single = class_probabilities(torch.tensor([[0.0], [2.0], [-3.0]]))  # (3, 2)
    assert_close(single[:, 1], torch.tensor([0.0, 2.0, -3.0]).sigmoid())
    assert_close(single.sum(-1), torch.ones(3))
    multi = class_probabilities(torch.randn(4, 5))  # (4, 5)
    assert_close(multi.sum(-1), torch.ones(4))
