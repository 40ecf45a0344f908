"""Classification metrics, computed from predicted and true label ids."""

from __future__ import annotations


def accuracy(pred: list[int], gold: list[int]) -> float:
    return sum(p == g for p, g in zip(pred, gold)) / max(1, len(gold))


def macro_f1(pred: list[int], gold: list[int], n_classes: int) -> float:
    """Unweighted mean over classes of F1 = 2PR / (P + R); a class never predicted nor present scores 0."""
    scores = []
    for c in range(n_classes):
        tp = sum(p == c and g == c for p, g in zip(pred, gold))
        fp = sum(p == c and g != c for p, g in zip(pred, gold))
        fn = sum(p != c and g == c for p, g in zip(pred, gold))
        scores.append(2 * tp / (2 * tp + fp + fn) if tp else 0.0)
    return sum(scores) / max(1, n_classes)
