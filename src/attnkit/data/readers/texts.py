"""Texts without labels: texts to predict on (a labeled format with the label optional, or ``.txt`` with one
text per line), and raw text for pretraining (any file, one text per line, blank lines skipped).
"""

from __future__ import annotations

from pathlib import Path

from attnkit.data.readers.labeled import iter_rows
from attnkit.data.readers.lines import numbered_lines, supported_suffix
from attnkit.errors import InputError

_TEXT_SUFFIXES = (".tsv", ".csv", ".jsonl", ".txt")


def read_texts(path: str | Path) -> list[tuple[str, int]]:
    """Read texts to predict on, as ``(text, line)``: the labeled formats with the label optional (and
    ignored), or ``.txt`` with one text per line, where a blank line is an error."""
    path = Path(path)
    suffix = supported_suffix(path, _TEXT_SUFFIXES)
    if suffix != ".txt":
        return [(text, line) for text, _, line in iter_rows(path, suffix, with_label=False)]
    texts = []
    for number, line in numbered_lines(path):
        if not line.strip():
            raise InputError(f"{path}:{number}: blank line; expected one text per line")
        texts.append((line.strip(), number))
    if not texts:
        raise InputError(f"{path}:1: file is empty; expected one text per line")
    return texts


def read_text_lines(path: str | Path) -> list[tuple[str, int]]:
    """Plain text, one text per line, as ``(text, line)``: blank lines are skipped (paragraph breaks in a corpus),
    an empty file is an error. For pretraining on raw text, where any file name is a text file."""
    path = Path(path)
    texts = [(line.strip(), number) for number, line in numbered_lines(path) if line.strip()]
    if not texts:
        raise InputError(f"{path}: no text (the file is empty or blank); expected one text per line")
    return texts
