"""Text classification: ``data`` (labels, encoding), ``train`` (``train_classifier``), ``predict``
(``ClassifierRun``)."""

from attnkit.tasks.classify.data import encode_examples, resolve_classes
from attnkit.tasks.classify.predict import (
    ClassifierRun,
    Prediction,
    predict_ids,
    predicted_classes,
)
from attnkit.tasks.classify.train import ClassificationTask, Pretrained, TrainSummary, train_classifier

__all__ = [
    "ClassificationTask",
    "ClassifierRun",
    "Prediction",
    "Pretrained",
    "TrainSummary",
    "encode_examples",
    "predict_ids",
    "predicted_classes",
    "resolve_classes",
    "train_classifier",
]
