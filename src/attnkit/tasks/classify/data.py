"""Classifier data: the label set fixes the head's size; texts become token ids cut to the model's length."""

from __future__ import annotations

import dataclasses

import numpy as np

from attnkit.config import ClassifierConfig
from attnkit.data.batching import Truncation, apply_length_policy
from attnkit.data.prepared import LabelledTokens, PreparedCorpus
from attnkit.data.sequences import MappedSequences
from attnkit.errors import InputError
from attnkit.tokenization import Tokenizer


def resolve_classes(cfg: ClassifierConfig, labels: list[str]) -> ClassifierConfig:
    """Fix ``n_classes`` from the training labels: 0 means one per label; 1 is a binary single-logit head."""
    if len(labels) < 2:
        raise InputError(f"training data has {len(labels)} distinct label(s) ({labels}); a classifier needs at least 2")
    if cfg.n_classes == 0:
        return dataclasses.replace(cfg, n_classes=len(labels))
    if cfg.n_classes == 1 and len(labels) != 2:
        raise InputError(
            f"config key n_classes=1 (one binary logit) needs exactly 2 labels; the training data has {len(labels)}"
        )
    if cfg.n_classes not in (1, len(labels)):
        raise InputError(
            f"config key n_classes={cfg.n_classes} but the training data has {len(labels)} labels: {labels}"
        )
    return cfg


def encode_examples(
    tokenizer: Tokenizer,
    texts: list[str],
    max_len: int,
    policy: str,
    lines: list[int] | None = None,
    where: str | None = None,
) -> tuple[list[list[int]], Truncation]:
    """Ids of ``texts``, cut to ``max_len`` (keeping a trailing [SEP]) or refused, as ``policy`` says; a refusal
    names the file ``where`` and the line (``lines``, one per text) of the first text too long."""
    return apply_length_policy(
        tokenizer.encode_batch(texts, max_len),
        max_len,
        policy,
        what="text",
        keep_last=tokenizer.n_trailing_specials or None,
        lines=lines,
        where=where,
    )


def prepared_examples(
    corpus: PreparedCorpus,
) -> tuple[MappedSequences, np.ndarray, list[list[int]], list[int], Truncation]:
    """A prepared corpus's train split as memory maps (texts read a batch at a time, label ids (N,) int64), its
    valid split (empty if it has none) read into lists, and the train split's truncation as preparing counted it."""
    train = corpus.split("train")
    assert isinstance(train, LabelledTokens)
    info = corpus.meta["splits"]["train"]
    truncation = Truncation(info["truncated"], len(train), info["longest"], corpus.meta["max_len"])
    valid_ids: list[list[int]] = []
    valid_y: list[int] = []
    if "valid" in corpus.meta["splits"]:
        valid = corpus.split("valid")
        assert isinstance(valid, LabelledTokens)
        valid_ids, valid_y = MappedSequences(valid.text)[:], valid.labels.tolist()
    return MappedSequences(train.text), train.labels, valid_ids, valid_y, truncation
