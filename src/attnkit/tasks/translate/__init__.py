"""Translation: ``data`` (pairs, batches, sources), ``train`` (``train_translator``), ``predict``
(``TranslatorRun``)."""

from attnkit.tasks.translate.data import (
    ParallelData,
    encode_pairs,
    encode_sources,
    make_batch,
)
from attnkit.tasks.translate.predict import TranslatorRun
from attnkit.tasks.translate.train import (
    TranslateSummary,
    TranslationTask,
    train_translator,
    validation_loss,
)

__all__ = [
    "ParallelData",
    "TranslateSummary",
    "TranslationTask",
    "TranslatorRun",
    "encode_pairs",
    "encode_sources",
    "make_batch",
    "train_translator",
    "validation_loss",
]
