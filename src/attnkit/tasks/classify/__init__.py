"""Text classification: ``data`` (labels, encoding), ``pretrained`` (an encoder to fine-tune), ``train``
(``train_classifier``), ``predict`` (``ClassifierRun``)."""

from attnkit.tasks.classify.data import encode_examples, resolve_classes
from attnkit.tasks.classify.predict import (
    ClassifierRun,
    Prediction,
    predict_ids,
    predicted_classes,
)
from attnkit.tasks.classify.pretrained import Pretrained
from attnkit.tasks.classify.train import ClassificationTask, TrainSummary, train_classifier

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
