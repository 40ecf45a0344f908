"""Readers for the plain files a user gives us: labeled examples, texts to predict on, and sentence pairs.

Formats, chosen by the file's extension:

- ``.tsv``: a header line naming the columns, then one row per line, fields separated by tabs. Columns
  ``text`` and ``label`` are used; other columns are allowed and ignored. No quoting: a tab or a newline
  cannot occur inside a field.
- ``.csv``: a header row with ``text`` and ``label`` columns, read with the ``csv`` module, so quoted fields
  may hold commas, quotes (``""``) and newlines.
- ``.jsonl``: one JSON object per non-blank line with a string ``text`` and a ``label`` (a string, or an
  integer or boolean that is turned into its JSON spelling: ``1``, ``true``).
- ``.txt`` (texts to predict on only): one text per line.

Every file is decoded as strict UTF-8 (a leading byte-order mark is dropped), and CRLF or lone CR line ends
count as one line break, so no ``\\r`` reaches a text or a label. Surrounding whitespace is stripped from
every field. Line numbers are 1-based physical lines, the header being line 1; a CSV record that spans
several lines carries the line where it starts.

Anything we cannot use raises ``InputError`` with a message that starts ``"{path}:{line}: "`` (or just
``"{path}: "`` when the file as a whole is at fault), which the CLI prints as is.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path

from attnkit.errors import InputError

_UTF8_BOM = b"\xef\xbb\xbf"
_LABELED_SUFFIXES = (".tsv", ".csv", ".jsonl")
_TEXT_SUFFIXES = (".tsv", ".csv", ".jsonl", ".txt")


@dataclass(frozen=True)
class Example:
    """One labeled text and the line of the file it was read from."""

    text: str
    label: str
    line: int  # 1-based physical line (where the record starts, for a multi-line CSV record)


@dataclass(frozen=True)
class Pair:
    """One source sentence, its translation, and the line they were read from."""

    source: str
    target: str
    line: int  # 1-based; for two aligned files, the same line in both


# ---------------------------------------------------------------------------------------------------------
# Bytes to lines: the checks every format shares.


def _read_text(path: Path) -> str:
    """The whole file as text with ``\\n`` line ends, or InputError naming what is wrong with it."""
    if not path.exists():
        raise InputError(f"{path}: no such file")
    if path.is_dir():
        raise InputError(f"{path}: is a directory, expected a file")
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise InputError(f"{path}: cannot read the file: {err.strerror}") from None
    if raw.startswith(_UTF8_BOM):
        raw = raw[len(_UTF8_BOM) :]
    # Normalising the bytes first is safe (no UTF-8 multi-byte sequence contains CR or LF) and keeps the
    # line count of a decoding error right whatever line ends the file uses.
    raw = raw.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    try:
        return raw.decode("utf-8", errors="strict")
    except UnicodeDecodeError as err:
        line = raw.count(b"\n", 0, err.start) + 1
        bad = raw[err.start : err.end].hex(" ")
        raise InputError(f"{path}:{line}: not valid UTF-8 (bytes {bad}); save the file as UTF-8") from None


def _split_lines(text: str) -> list[str]:
    """Lines without their ends. ``str.splitlines`` is avoided on purpose: it also breaks on form feeds,
    U+2028 and other characters that are ordinary text in a TSV field."""
    if not text:
        return []
    lines = text.split("\n")
    if text.endswith("\n"):
        lines.pop()  # the final line break ends the last line; it does not start a new, empty one
    return lines


def _suffix(path: Path, supported: tuple[str, ...]) -> str:
    suffix = path.suffix.lower()
    if suffix not in supported:
        raise InputError(
            f"{path}: unsupported file extension {path.suffix or '(none)'!r}; expected one of {', '.join(supported)}"
        )
    return suffix


# ---------------------------------------------------------------------------------------------------------
# Tables (TSV and CSV): a header, then rows of fields. Both produce (line, fields) rows for _pick_columns.


def _tsv_rows(path: Path, text: str) -> tuple[list[str], list[tuple[int, list[str]]]]:
    lines = _split_lines(text)
    if not lines or not lines[0].strip():
        raise InputError(f"{path}:1: file is empty; expected a header line such as 'text<TAB>label'")
    header = [name.strip() for name in lines[0].split("\t")]
    rows = []
    for number, line in enumerate(lines[1:], start=2):
        if not line.strip():
            raise InputError(f"{path}:{number}: blank line; every line after the header must be a row")
        fields = line.split("\t")
        if len(fields) != len(header):
            raise InputError(
                f"{path}:{number}: expected {len(header)} tab-separated fields as in the header, found {len(fields)}"
            )
        rows.append((number, fields))
    return header, rows


def _csv_rows(path: Path, text: str) -> tuple[list[str], list[tuple[int, list[str]]]]:
    # strict=True turns quoting mistakes (a stray quote, an unclosed one) into errors instead of silently
    # swallowing the rest of the file into one field.
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    records = []
    start = 1
    try:
        for fields in reader:
            records.append((start, fields))
            start = reader.line_num + 1  # the next record starts after the last line this one used
    except csv.Error as err:
        raise InputError(f"{path}:{start}: malformed CSV record: {err}") from None
    if not records or not any(field.strip() for field in records[0][1]):
        raise InputError(f"{path}:1: file is empty; expected a header row such as 'text,label'")
    header = [name.strip() for name in records[0][1]]
    rows = []
    for number, fields in records[1:]:
        if not any(field.strip() for field in fields):
            raise InputError(f"{path}:{number}: blank line; every line after the header must be a row")
        if len(fields) != len(header):
            raise InputError(
                f"{path}:{number}: expected {len(header)} comma-separated fields as in the header, found {len(fields)}"
            )
        rows.append((number, fields))
    return header, rows


def _column(path: Path, header: list[str], name: str) -> int:
    if header.count(name) > 1:
        raise InputError(f"{path}:1: column {name!r} appears {header.count(name)} times in the header")
    if name not in header:
        raise InputError(f"{path}:1: header has no {name!r} column (found: {', '.join(header)})")
    return header.index(name)


def _pick_columns(
    path: Path, header: list[str], rows: list[tuple[int, list[str]]], *, with_label: bool
) -> list[tuple[str, str | None, int]]:
    """(text, label or None, line) for each row, with empty texts and labels rejected."""
    text_at = _column(path, header, "text")
    label_at = _column(path, header, "label") if with_label else None
    if not rows:
        raise InputError(f"{path}:1: only a header, no rows")
    picked = []
    for number, fields in rows:
        text = fields[text_at].strip()
        if not text:
            raise InputError(f"{path}:{number}: empty text")
        label = None
        if label_at is not None:
            label = fields[label_at].strip()
            if not label:
                raise InputError(f"{path}:{number}: empty label")
        picked.append((text, label, number))
    return picked


# ---------------------------------------------------------------------------------------------------------
# JSON lines.


def _json_type(value: object) -> str:
    """The JSON name of a decoded value's type, for messages a user who wrote the JSON will recognise."""
    names = {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def _jsonl_rows(path: Path, text: str, *, with_label: bool) -> list[tuple[str, str | None, int]]:
    picked = []
    for number, line in enumerate(_split_lines(text), start=1):
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
        picked.append((text, label, number))
    if not picked:
        raise InputError(f"{path}:1: file is empty; expected one JSON object per line")
    return picked


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
# Public readers.


def _read_rows(path: Path, suffix: str, *, with_label: bool) -> list[tuple[str, str | None, int]]:
    text = _read_text(path)
    if suffix == ".jsonl":
        return _jsonl_rows(path, text, with_label=with_label)
    header, rows = _tsv_rows(path, text) if suffix == ".tsv" else _csv_rows(path, text)
    return _pick_columns(path, header, rows, with_label=with_label)


def read_labeled(path: str | Path) -> list[Example]:
    """Read labeled examples from a ``.tsv``, ``.csv`` or ``.jsonl`` file, in file order."""
    path = Path(path)
    suffix = _suffix(path, _LABELED_SUFFIXES)
    examples = []
    for text, label, line in _read_rows(path, suffix, with_label=True):
        assert label is not None  # with_label=True: a row without a label was refused with its line
        examples.append(Example(text, label, line))
    return examples


def read_texts(path: str | Path) -> list[tuple[str, int]]:
    """Read texts to predict on, as ``(text, line)``: the labeled formats with the label optional (and
    ignored), or ``.txt`` with one text per line, where a blank line is an error."""
    path = Path(path)
    suffix = _suffix(path, _TEXT_SUFFIXES)
    if suffix != ".txt":
        return [(text, line) for text, _, line in _read_rows(path, suffix, with_label=False)]
    lines = _split_lines(_read_text(path))
    if not lines:
        raise InputError(f"{path}:1: file is empty; expected one text per line")
    texts = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            raise InputError(f"{path}:{number}: blank line; expected one text per line")
        texts.append((line.strip(), number))
    return texts


def read_parallel_tsv(path: str | Path) -> list[Pair]:
    """Read ``source<TAB>target`` lines; a first line ``source<TAB>target`` is taken as a header and skipped."""
    path = Path(path)
    lines = _split_lines(_read_text(path))
    if not lines:
        raise InputError(f"{path}:1: file is empty; expected lines of source<TAB>target")
    pairs = []
    for number, line in enumerate(lines, start=1):
        fields = line.split("\t")
        if number == 1 and [field.strip() for field in fields] == ["source", "target"]:
            continue
        if not line.strip():
            raise InputError(f"{path}:{number}: blank line; expected source<TAB>target")
        if len(fields) == 1:
            raise InputError(f"{path}:{number}: no tab; expected source<TAB>target")
        if len(fields) > 2:
            raise InputError(
                f"{path}:{number}: {len(fields) - 1} tabs; expected exactly one, between source and target"
            )
        source, target = fields[0].strip(), fields[1].strip()
        if not source:
            raise InputError(f"{path}:{number}: empty source")
        if not target:
            raise InputError(f"{path}:{number}: empty target")
        pairs.append(Pair(source, target, number))
    if not pairs:
        raise InputError(f"{path}:1: only a header, no pairs")
    return pairs


def read_parallel_files(src_path: str | Path, tgt_path: str | Path) -> list[Pair]:
    """Read two plain-text files of sentences aligned line by line (line n of one translates line n of the
    other)."""
    src_path, tgt_path = Path(src_path), Path(tgt_path)
    src_lines = _split_lines(_read_text(src_path))
    tgt_lines = _split_lines(_read_text(tgt_path))
    for path, lines in ((src_path, src_lines), (tgt_path, tgt_lines)):
        if not lines:
            raise InputError(f"{path}:1: file is empty; expected one sentence per line")
    if len(src_lines) != len(tgt_lines):
        raise InputError(
            f"{src_path} has {len(src_lines)} lines but {tgt_path} has {len(tgt_lines)}; "
            "aligned files must have the same number of lines"
        )
    pairs = []
    for number, (source, target) in enumerate(zip(src_lines, tgt_lines), start=1):
        for path, sentence in ((src_path, source), (tgt_path, target)):
            if not sentence.strip():
                raise InputError(f"{path}:{number}: blank line; every line must hold a sentence")
        pairs.append(Pair(source.strip(), target.strip(), number))
    return pairs
