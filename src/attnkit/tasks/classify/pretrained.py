"""A pretrained encoder to fine-tune: ``interop.bert.load_pretrained`` (a BERT folder) or a pretraining run
(``tasks.pretrain.encoder``) makes one; a classifier run (``--init-from``) starts from its encoder under a fresh
head."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from attnkit.config import FINE_TUNE_TRAIN_DEFAULTS, ClassifierConfig, ClassifierTrainConfig, task_configs
from attnkit.model.build import build_classifier
from attnkit.model.classifier import TransformerClassifier
from attnkit.tokenization import Tokenizer


@dataclass
class Pretrained:
    """A pretrained encoder to fine-tune (``interop.bert.load_pretrained`` reads one from a BERT folder): the model
    (its head is replaced), its config and tokenizer, and where it came from (recorded as ``init_from``)."""

    model: TransformerClassifier
    config: ClassifierConfig
    tokenizer: Tokenizer
    source: str


def fine_tuning_train_config(
    pretrained: object, train_cfg: ClassifierTrainConfig | None
) -> ClassifierTrainConfig | None:
    """``train_classifier``'s ``train_cfg`` for ``pretrained``: when fine-tuning without one, fine-tuning's defaults,
    as ``classify train --init-from`` has them (``FINE_TUNE_TRAIN_DEFAULTS``); a ``pretrained`` that is not a
    ``Pretrained`` (a path) is a TypeError saying what to pass."""
    if pretrained is None:
        return train_cfg
    if not isinstance(pretrained, Pretrained):
        what = type(pretrained).__name__
        raise TypeError(f"pretrained is a {what}, not a Pretrained: pass attnkit.load_pretrained({pretrained!r})")
    return train_cfg or task_configs("classify", None, {}, dict(FINE_TUNE_TRAIN_DEFAULTS))[1]


def with_fresh_head(
    pretrained: Pretrained, *, n_classes: int, pooling: str
) -> tuple[TransformerClassifier, ClassifierConfig]:
    """The pretrained encoder under a freshly initialised head of ``n_classes`` outputs."""
    cfg = dataclasses.replace(pretrained.config, n_classes=n_classes, pooling=pooling)
    model = build_classifier(cfg, pad_id=pretrained.tokenizer.pad_id)
    encoder = {name: t for name, t in pretrained.model.state_dict().items() if not name.startswith("head.")}
    result = model.load_state_dict(encoder, strict=False)
    if result.unexpected_keys or any(not name.startswith("head.") for name in result.missing_keys):
        raise ValueError(
            f"pretrained model does not fit its config (missing: {result.missing_keys}, "
            f"unexpected: {result.unexpected_keys})"
        )
    return model, cfg
