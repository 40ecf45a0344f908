"""Conversions of the classification data sets (rt-polarity, sms-spam, trec, bbc) into canonical splits.

Each converter is a pure function of the raw text or rows as they stand in the package file (no files, no network),
so the tests can feed it small synthetic inputs; ``attnkit.data.recipes`` reads the raw form out of the package and
writes what the converter returns. The split helpers here (``Splits``, ``collapse_whitespace``) serve the Bible's
conversions in ``attnkit.data.bible`` too.

Canonical splits (DATA.md, "Canonical tasks and splits"):

- rt-polarity: label ``positive`` if the VADER sentiment > 0, ``negative`` if < 0, rows with 0 dropped
  (10,568 remain); ``id % 10 == 0`` test, ``== 1`` valid, the rest train.
- sms-spam (``spam``/``ham``), trec (the 6 coarse classes), bbc (5 topics, text = title and body on one
  line): deduplicated on the whitespace-collapsed text (first occurrence kept), then split by the first byte
  of sha1(text) % 10: 0 test, 1 valid, the rest train.
"""

from __future__ import annotations

import csv
import hashlib
import io
from collections.abc import Iterable

Splits = dict[str, list[tuple[str, str]]]  # split name -> rows of (text, label) or (source, target)
SPLITS = ("train", "valid", "test")


# ---------------------------------------------------------------------------------------------------------
# Conversions: pure functions of the raw text or rows, so the tests can feed them small synthetic inputs.


def collapse_whitespace(text: str) -> str:
    """One line, single spaces: the output files are TSV, where a tab or newline would break a row."""
    return " ".join(text.split())


def split_by_id(row_id: int) -> str:
    """RT polarity's split: by the integer id the file gives each snippet."""
    return {0: "test", 1: "valid"}.get(row_id % 10, "train")


def split_by_hash(text: str) -> str:
    """A split that depends on the text alone, so it is stable under reordering and new rows."""
    return {0: "test", 1: "valid"}.get(hashlib.sha1(text.encode("utf-8")).digest()[0] % 10, "train")


def empty_splits() -> Splits:
    """No rows yet in any split."""
    return {split: [] for split in SPLITS}


def _hash_split_deduplicated(rows: Iterable[tuple[str, str]]) -> Splits:
    """Drop repeated texts (the first occurrence wins), then split by hash: a sentence that occurs twice must
    not land in both train and test."""
    splits, seen = empty_splits(), set()
    for text, label in rows:
        text = collapse_whitespace(text)
        if text and text not in seen:
            seen.add(text)
            splits[split_by_hash(text)].append((text, label))
    return splits


def convert_rt_polarity(raw: str) -> Splits:
    """``id<TAB>sentiment<TAB>text`` rows (VADER's ``movieReviewSnippets_GroundTruth.txt``) to labeled splits."""
    lines = raw.lstrip("\ufeff").replace("\r\n", "\n").replace("\r", "\n").split("\n")
    if lines[0].split("\t") != ["id", "sentiment", "text"]:
        raise ValueError(f"rt-polarity: unexpected header {lines[0]!r}")
    splits = empty_splits()
    for number, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != 3:
            raise ValueError(f"rt-polarity line {number}: expected id<TAB>sentiment<TAB>text")
        row_id, sentiment, text = int(fields[0]), float(fields[1]), collapse_whitespace(fields[2])
        if sentiment == 0:
            continue  # neither positive nor negative: DATA.md drops these 37 rows
        splits[split_by_id(row_id)].append((text, "positive" if sentiment > 0 else "negative"))
    return splits


def convert_sms_spam(raw: str) -> Splits:
    """The ``,spam,text`` CSV (spam = 0 or 1) to ``ham``/``spam`` splits."""
    rows = list(csv.reader(io.StringIO(raw.lstrip("\ufeff"), newline="")))
    if [field.strip() for field in rows[0]] != ["", "spam", "text"]:
        raise ValueError(f"sms-spam: unexpected header {rows[0]!r}")
    labels = {"0": "ham", "1": "spam"}
    return _hash_split_deduplicated((text, labels[spam.strip()]) for _, spam, text in rows[1:])


def convert_trec(raw: str) -> Splits:
    """``COARSE:fine question`` lines to coarse-class splits (the same question can carry two fine labels)."""
    rows = []
    for number, line in enumerate(raw.splitlines(), start=1):
        if not line.strip():
            continue
        labels, _, question = line.partition(" ")
        coarse, colon, _ = labels.partition(":")
        if not colon or not question.strip():
            raise ValueError(f"trec line {number}: expected 'COARSE:fine question'")
        rows.append((question, coarse))
    return _hash_split_deduplicated(rows)


def convert_bbc(articles: Iterable[tuple[str, str]]) -> Splits:
    """``(topic folder, article)`` pairs, the article's first line being its title, to topic splits."""
    return _hash_split_deduplicated((text, topic) for topic, text in articles)
