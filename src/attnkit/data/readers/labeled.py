"""Labeled examples: a text and its label on each row of a table (``.tsv``, ``.csv``) or JSON lines (``.jsonl``).

Formats, chosen by the file's extension:

- ``.tsv``: a header line naming the columns, then one row per line, fields separated by tabs. Columns
  ``text`` and ``label`` are used; other columns are allowed and ignored. No quoting: a tab or a newline
  cannot occur inside a field.
- ``.csv``: a header row with ``text`` and ``label`` columns, read with the ``csv`` module, so quoted fields
  may hold commas, quotes (``""``) and newlines; a record that spans several lines carries the line where it
  starts.
- ``.jsonl``: one JSON object per non-blank line with a string ``text`` and a ``label`` (a string, or an
  integer or boolean that is turned into its JSON spelling: ``1``, ``true``).

``iter_rows`` reads any of them with the label optional; ``texts.read_texts`` uses it for texts to predict on.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from attnkit.data.readers.lines import numbered_lines, raw_lines, supported_suffix
from attnkit.errors import InputError

_LABELED_SUFFIXES = (".tsv", ".csv", ".jsonl")


@dataclass(frozen=True)
class Example:
    """One labeled text and the line of the file it was read from."""

    text: str
    label: str
    line: int  # 1-based physical line (where the record starts, for a multi-line CSV record)


# ---------------------------------------------------------------------------------------------------------
# Tables (TSV and CSV): a header, then rows of fields. Both produce (line, fields) rows for _pick_columns.

Rows = Iterator[tuple[int, list[str]]]


def _tsv_rows(path: Path) -> tuple[list[str], Rows]:
    records = ((number, line.split("\t")) for number, line in numbered_lines(path))
    return _table(path, records, "tab-separated", "line such as 'text<TAB>label'")


def _csv_rows(path: Path) -> tuple[list[str], Rows]:
    # strict=True turns quoting mistakes (a stray quote, an unclosed one) into errors instead of silently
    # swallowing the rest of the file into one field. The lines keep their "\n" so that a quoted field may span
    # several of them.
    reader = csv.reader(raw_lines(path), strict=True)
    where = {"start": 1}

    def records() -> Rows:
        try:
            for fields in reader:
                yield where["start"], fields
                where["start"] = reader.line_num + 1  # the next record starts after the last line this one used
        except csv.Error as err:
            raise InputError(f"{path}:{where['start']}: malformed CSV record: {err}") from None

    return _table(path, records(), "comma-separated", "row such as 'text,label'")


def _table(path: Path, records: Rows, separated: str, header_example: str) -> tuple[list[str], Rows]:
    """The header (the first record) and the rest of a table's records, each checked as it is read: no blank
    record between rows (blank lines at the end, an editor's trailing newlines, are no rows), as many fields as the
    header."""
    first = next(records, None)
    if first is None or not any(field.strip() for field in first[1]):
        raise InputError(f"{path}:1: file is empty; expected a header {header_example}")
    header = [name.strip() for name in first[1]]

    def rows() -> Rows:
        blank = None  # the first blank line since the last row
        for number, fields in records:
            if not any(field.strip() for field in fields):
                blank = blank or number
                continue
            if blank is not None:
                raise InputError(f"{path}:{blank}: blank line; every line after the header must be a row")
            if len(fields) != len(header):
                raise InputError(
                    f"{path}:{number}: expected {len(header)} {separated} fields as in the header, found {len(fields)}"
                )
            yield number, fields

    return header, rows()


def _column(path: Path, header: list[str], name: str) -> int:
    if header.count(name) > 1:
        raise InputError(f"{path}:1: column {name!r} appears {header.count(name)} times in the header")
    if name not in header:
        raise InputError(f"{path}:1: header has no {name!r} column (found: {', '.join(header)})")
    return header.index(name)


def _pick_columns(
    path: Path, header: list[str], rows: Rows, *, with_label: bool
) -> Iterator[tuple[str, str | None, int]]:
    """(text, label or None, line) for each row, with empty texts and labels rejected."""
    text_at = _column(path, header, "text")
    label_at = _column(path, header, "label") if with_label else None
    n_rows = 0
    for number, fields in rows:
        text = fields[text_at].strip()
        if not text:
            raise InputError(f"{path}:{number}: empty text")
        label = None
        if label_at is not None:
            label = fields[label_at].strip()
            if not label:
                raise InputError(f"{path}:{number}: empty label")
        n_rows += 1
        yield text, label, number
    if not n_rows:
        raise InputError(f"{path}:1: only a header, no rows")


# ---------------------------------------------------------------------------------------------------------
# JSON lines.


def _json_type(value: object) -> str:
    """The JSON name of a decoded value's type, for messages a user who wrote the JSON will recognise."""
    names = {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def _jsonl_rows(path: Path, *, with_label: bool) -> Iterator[tuple[str, str | None, int]]:
    n_rows = 0
    for number, line in numbered_lines(path):
        if not line.strip():
            continue  # blank lines between records are harmless in JSON lines
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise InputError(f"{path}:{number}: invalid JSON: {err.msg} (column {err.colno})") from None
        except (ValueError, RecursionError) as err:  # json also refuses huge integers and deep nesting this way
            reason = f"{type(err).__name__}: {str(err)[:80]}"
            raise InputError(f"{path}:{number}: JSON that cannot be read ({reason})") from None
        if not isinstance(record, dict):
            raise InputError(f"{path}:{number}: expected a JSON object, found {_json_type(record)}")
        if "text" not in record:
            raise InputError(f"{path}:{number}: missing key 'text'")
        if not isinstance(record["text"], str):
            raise InputError(f"{path}:{number}: 'text' must be a string, found {_json_type(record['text'])}")
        # JSON strings may carry escaped CRs; normalise them like the line ends of the other formats.
        text = record["text"].replace("\r\n", "\n").replace("\r", "\n").strip()
        if not text:
            raise InputError(f"{path}:{number}: empty text")
        label = _json_label(path, number, record) if with_label else None
        n_rows += 1
        yield text, label, number
    if not n_rows:
        raise InputError(f"{path}:1: file is empty; expected one JSON object per line")


def _json_label(path: Path, number: int, record: dict) -> str:
    if "label" not in record:
        raise InputError(f"{path}:{number}: missing key 'label'")
    value = record["label"]
    # bool before int: in Python a bool is an int, but its label should read as JSON spells it ("true").
    if isinstance(value, bool):
        label = "true" if value else "false"
    elif isinstance(value, int):
        label = str(value)
    elif isinstance(value, str):
        label = value.replace("\r\n", "\n").replace("\r", "\n").strip()
    else:
        raise InputError(f"{path}:{number}: 'label' must be a string, integer or boolean, found {_json_type(value)}")
    if not label:
        raise InputError(f"{path}:{number}: empty label")
    return label


# ---------------------------------------------------------------------------------------------------------
# The readers: ``iter_labeled`` streams (constant memory, for ``data prepare``); ``read_labeled`` is its list.


def iter_rows(path: Path, suffix: str, *, with_label: bool) -> Iterator[tuple[str, str | None, int]]:
    """``(text, label, line)`` of each row of a ``.tsv``, ``.csv`` or ``.jsonl`` file; the label is None when
    ``with_label`` is False (texts to predict on)."""
    if suffix == ".jsonl":
        return _jsonl_rows(path, with_label=with_label)
    header, rows = _tsv_rows(path) if suffix == ".tsv" else _csv_rows(path)
    return _pick_columns(path, header, rows, with_label=with_label)


def iter_labeled(path: str | Path) -> Iterator[Example]:
    """Stream labeled examples from a ``.tsv``, ``.csv`` or ``.jsonl`` file, in file order."""
    path = Path(path)
    suffix = supported_suffix(path, _LABELED_SUFFIXES)
    for text, label, line in iter_rows(path, suffix, with_label=True):
        assert label is not None  # with_label=True: a row without a label was refused with its line
        yield Example(text, label, line)


def read_labeled(path: str | Path) -> list[Example]:
    """Read labeled examples from a ``.tsv``, ``.csv`` or ``.jsonl`` file, in file order: a table's header names a
    ``text`` and a ``label`` column (other columns are ignored), a JSON line has ``text`` and ``label`` keys."""
    return list(iter_labeled(path))
