"""Classification metrics, computed from predicted and true label ids."""

from __future__ import annotations

from collections import Counter


def accuracy(pred: list[int], gold: list[int]) -> float:
    return sum(p == g for p, g in zip(pred, gold)) / max(1, len(gold))


def macro_f1(pred: list[int], gold: list[int]) -> float:
    """The unweighted mean over classes of F1 = 2PR / (P + R) = 2TP / (2TP + FP + FN), over the classes that occur
    among the references or the predictions (as scikit-learn's ``f1_score(average="macro")`` counts them): a class
    the evaluation set lacks and the model never predicts has no F1 and does not pull the mean down."""
    classes = set(pred) | set(gold)
    if not classes:
        return 0.0
    hits = Counter(p for p, g in zip(pred, gold) if p == g)
    predicted, present = Counter(pred), Counter(gold)
    return sum(2 * hits[c] / (predicted[c] + present[c]) for c in classes) / len(classes)  # 2TP+FP+FN = |pred|+|gold|
