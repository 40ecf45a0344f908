"""Classification metrics against hand counts (scikit-learn's conventions, which users compare with)."""

from __future__ import annotations

import pytest

from attnkit.evaluation.metrics import accuracy, macro_f1


def test_macro_f1_is_the_mean_of_the_per_class_f1():
    gold = [0, 0, 0, 1, 1, 2]
    pred = [0, 0, 1, 1, 2, 2]
    # class 0: TP 2, FP 0, FN 1 -> 4/5; class 1: TP 1, FP 1, FN 1 -> 2/4; class 2: TP 1, FP 1, FN 0 -> 2/3
    assert macro_f1(pred, gold) == pytest.approx((4 / 5 + 2 / 4 + 2 / 3) / 3)
    assert accuracy(pred, gold) == pytest.approx(4 / 6)


def test_a_class_absent_from_the_references_and_the_predictions_is_not_averaged_as_zero():
    """An evaluation file of positive texts only, all predicted positive: F1 1.0, as scikit-learn reports it (it
    read 0.5, the absent negative class counted as F1 0)."""
    assert macro_f1([1, 1, 1], [1, 1, 1]) == 1.0
    # A class predicted but absent from the references does count: its F1 is 0.
    assert macro_f1([1, 1, 0], [1, 1, 1]) == pytest.approx((0 + 2 * 2 / (2 + 3)) / 2)


def test_empty_inputs_score_zero():
    assert macro_f1([], []) == 0.0
    assert accuracy([], []) == 0.0
