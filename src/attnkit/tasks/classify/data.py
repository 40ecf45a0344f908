"""Classifier data: the label set fixes the head's size; texts become token ids cut to the model's length."""

from __future__ import annotations

import dataclasses
import random

import numpy as np

from attnkit.config import ClassifierConfig
from attnkit.data.batching import Truncation, apply_length_policy
from attnkit.data.prepared import LabelledTokens, PreparedCorpus
from attnkit.data.readers.labeled import Example
from attnkit.data.sequences import MappedSequences
from attnkit.errors import InputError
from attnkit.tokenization import Tokenizer


def hold_out_tenth(examples: list[Example], seed: int) -> tuple[list[Example], list[Example]]:
    """(train, valid): a tenth of ``examples``, drawn with ``seed``, held out for model selection, except the
    examples of a label the tenth would take whole, which train (else the model would have a class it never trains
    on, and no place for it among the run's labels)."""
    shuffled = list(examples)
    random.Random(seed).shuffle(shuffled)
    n_valid = len(shuffled) // 10
    valid, train = shuffled[:n_valid], shuffled[n_valid:]
    trained = {ex.label for ex in train}
    return train + [ex for ex in valid if ex.label not in trained], [ex for ex in valid if ex.label in trained]


def check_labels(files: tuple[tuple[list[Example], str], ...], labels: list[str]) -> None:
    """An ``InputError`` naming the file and line of the first example (in file order) of each ``(examples, file)``
    whose label is not one of ``labels``."""
    known = set(labels)
    for examples, where in files:
        if unknown := [ex for ex in examples if ex.label not in known]:
            ex = min(unknown, key=lambda ex: ex.line)  # the first in the file (held-out examples are shuffled)
            raise InputError(f"{where}:{ex.line}: label {ex.label!r} is not one of the run's labels {labels}")


def conflicting_labels(examples: list[Example], where: str) -> str | None:
    """A warning when one text appears in ``examples`` with two labels or more (no model fits both), naming how
    many such texts and the lines of the first; None when there are none."""
    first: dict[str, Example] = {}
    conflicts: dict[str, tuple[Example, Example]] = {}
    for ex in examples:
        seen = first.setdefault(ex.text, ex)
        if seen.label != ex.label and ex.text not in conflicts:
            conflicts[ex.text] = (seen, ex)
    if not conflicts:
        return None
    a, b = min(conflicts.values(), key=lambda pair: pair[1].line)
    return (
        f"{where}: {len(conflicts):,} {'text appears' if len(conflicts) == 1 else 'texts appear'} with more than "
        f"one label (the first: line {a.line} "
        f"{a.label!r}, line {b.line} {b.label!r}); no model fits both"
    )


def repeated_in_train(train: list[Example], valid: list[Example], valid_where: str) -> str | None:
    """A warning when validation texts are also training texts (validation then measures memory as well as
    generalisation, and picks the epoch that remembers best), naming how many and the line of the first; None
    when there are none."""
    trained = {ex.text for ex in train}
    if not (repeated := [ex for ex in valid if ex.text in trained]):
        return None
    first, n = min(repeated, key=lambda ex: ex.line), len(repeated)
    return (
        f"{valid_where}: {n:,} of the {len(valid):,} validation texts ({n / len(valid):.1%}) "
        f"{'is a training text' if n == 1 else 'are training texts'} too (the first: line {first.line}); accuracy on "
        f"{'it' if n == 1 else 'them'} measures memory, not generalisation"
    )


def resolve_classes(cfg: ClassifierConfig, labels: list[str], where: str = "training data") -> ClassifierConfig:
    """Fix ``n_classes`` from the training labels (read from ``where``, named in errors): 0 means one per label; 1
    is a binary single-logit head."""
    if len(labels) < 2:
        raise InputError(f"{where}: {len(labels)} distinct label(s) ({labels}); a classifier needs at least 2")
    if cfg.n_classes == 0:
        return dataclasses.replace(cfg, n_classes=len(labels))
    if cfg.n_classes == 1 and len(labels) != 2:
        raise InputError(
            f"{where}: config key n_classes=1 (one binary logit) needs exactly 2 labels; the data has "
            f"{len(labels)}: {some_labels(labels)}"
        )
    if cfg.n_classes not in (1, len(labels)):
        raise InputError(
            f"{where}: config key n_classes={cfg.n_classes} but the data has {len(labels)} labels: "
            f"{some_labels(labels)}"
        )
    return cfg


def some_labels(labels: list[str], most: int = 10) -> str:
    """The label names for a message: the first ``most``, and how many more."""
    shown = ", ".join(repr(label) for label in labels[:most])
    return shown + (f" and {len(labels) - most:,} more" if len(labels) > most else "")


def lookalike_labels(labels: list[str]) -> str | None:
    """What to warn of when two label names differ only in case or surrounding spaces ("Pos" and "pos"): each is a
    class of its own, which is seldom what the data meant. None when no two do."""
    by_form: dict[str, list[str]] = {}
    for label in labels:
        by_form.setdefault(label.strip().casefold(), []).append(label)
    alike = [names for names in by_form.values() if len(names) > 1]
    if not alike:
        return None
    pairs = "; ".join(" and ".join(repr(name) for name in names) for names in alike[:3])
    more = f" (and {len(alike) - 3} more such groups)" if len(alike) > 3 else ""
    return (
        f"labels {pairs}{more} differ only in case or spaces: each is a class of its own; make them one label in "
        "the data if they mean one class"
    )


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
