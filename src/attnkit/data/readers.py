"""Readers for the plain files a user gives us: labeled examples, texts to predict on, and sentence pairs.

Why one file of ~380 lines: every reader shares one byte-to-line layer (UTF-8, line endings, a BOM, errors that
name file and line) and one set of formats chosen by extension; the public ``iter_*`` / ``read_*`` functions are
thin over it. Split by format, the shared checks would have to be imported back into each.

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
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

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
# Bytes to lines: the checks every format shares. Files are streamed line by line, so a reader's memory does not
# grow with the file (``attnkit data prepare`` reads corpora of millions of lines through these generators).


def _check_file(path: Path) -> None:
    if not path.exists():
        raise InputError(f"{path}: no such file")
    if path.is_dir():
        raise InputError(f"{path}: is a directory, expected a file")


def _raw_lines(path: Path) -> Iterator[str]:
    """The file's lines as text, each with its ``\\n`` (CRLF and lone CR read as ``\\n``, a leading BOM dropped),
    or InputError naming what is wrong with it."""
    _check_file(path)
    try:
        # utf-8-sig drops a leading byte-order mark; newline=None turns CRLF and lone CR into "\n" (also across
        # the decoder's chunk boundaries), and a line ends only there, never at a form feed or U+2028.
        f = open(path, encoding="utf-8-sig", errors="strict", newline=None)
    except OSError as err:
        raise InputError(f"{path}: cannot read the file: {err.strerror}") from None
    with f:
        try:
            yield from f
        except UnicodeDecodeError:
            raise _utf8_error(path) from None
        except OSError as err:
            raise InputError(f"{path}: cannot read the file: {err.strerror}") from None


def _utf8_error(path: Path) -> InputError:
    """The line and bytes of the first invalid UTF-8 sequence, found by a second, binary pass (only on this error
    path) because the text decoder reports neither."""
    number = 1
    with open(path, "rb") as f:
        for i, chunk in enumerate(f):  # binary lines end at b"\n", which no multi-byte sequence contains
            if i == 0 and chunk.startswith(_UTF8_BOM):
                chunk = chunk[len(_UTF8_BOM) :]
            try:
                chunk.decode("utf-8", errors="strict")
            except UnicodeDecodeError as err:
                line = number + _count_breaks(chunk[: err.start])
                bad = chunk[err.start : err.end].hex(" ")
                return InputError(f"{path}:{line}: not valid UTF-8 (bytes {bad}); save the file as UTF-8")
            number += _count_breaks(chunk)
    return InputError(f"{path}: not valid UTF-8; save the file as UTF-8")


def stream_lines(stream: BinaryIO, name: str = "<stdin>") -> Iterator[str]:
    """The lines of a byte stream (standard input), each without its line end (CRLF, LF), decoded as files are:
    strict UTF-8, a leading BOM dropped; bytes that are not UTF-8 are an InputError naming ``name``, the line and
    the bytes."""
    for number, raw in enumerate(stream, start=1):
        if number == 1 and raw.startswith(_UTF8_BOM):
            raw = raw[len(_UTF8_BOM) :]
        try:
            line = raw.decode("utf-8", errors="strict")
        except UnicodeDecodeError as err:
            bad = raw[err.start : err.end].hex(" ")
            raise InputError(f"{name}:{number}: not valid UTF-8 (bytes {bad}); send UTF-8 text") from None
        yield line.rstrip("\r\n")


def _count_breaks(raw: bytes) -> int:
    """Line breaks in ``raw``: CRLF, LF and a lone CR each count once."""
    return raw.replace(b"\r\n", b"\n").replace(b"\r", b"\n").count(b"\n")


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    """``(number, line)`` without the line end; numbers are 1-based. A final line break ends the last line; it
    does not start a new, empty one."""
    for number, line in enumerate(_raw_lines(path), start=1):
        yield number, line[:-1] if line.endswith("\n") else line


def _suffix(path: Path, supported: tuple[str, ...]) -> str:
    suffix = path.suffix.lower()
    if suffix not in supported:
        raise InputError(
            f"{path}: unsupported file extension {path.suffix or '(none)'!r}; expected one of {', '.join(supported)}"
        )
    return suffix


# ---------------------------------------------------------------------------------------------------------
# Tables (TSV and CSV): a header, then rows of fields. Both produce (line, fields) rows for _pick_columns.

Rows = Iterator[tuple[int, list[str]]]


def _tsv_rows(path: Path) -> tuple[list[str], Rows]:
    lines = _lines(path)
    first = next(lines, None)
    if first is None or not first[1].strip():
        raise InputError(f"{path}:1: file is empty; expected a header line such as 'text<TAB>label'")
    header = [name.strip() for name in first[1].split("\t")]

    def rows() -> Rows:
        for number, line in lines:
            if not line.strip():
                raise InputError(f"{path}:{number}: blank line; every line after the header must be a row")
            fields = line.split("\t")
            if len(fields) != len(header):
                raise InputError(
                    f"{path}:{number}: expected {len(header)} tab-separated fields as in the header, "
                    f"found {len(fields)}"
                )
            yield number, fields

    return header, rows()


def _csv_rows(path: Path) -> tuple[list[str], Rows]:
    # strict=True turns quoting mistakes (a stray quote, an unclosed one) into errors instead of silently
    # swallowing the rest of the file into one field. The lines keep their "\n" so that a quoted field may span
    # several of them.
    reader = csv.reader(_raw_lines(path), strict=True)
    where = {"start": 1}

    def records() -> Rows:
        try:
            for fields in reader:
                yield where["start"], fields
                where["start"] = reader.line_num + 1  # the next record starts after the last line this one used
        except csv.Error as err:
            raise InputError(f"{path}:{where['start']}: malformed CSV record: {err}") from None

    stream = records()
    first = next(stream, None)
    if first is None or not any(field.strip() for field in first[1]):
        raise InputError(f"{path}:1: file is empty; expected a header row such as 'text,label'")
    header = [name.strip() for name in first[1]]

    def rows() -> Rows:
        for number, fields in stream:
            if not any(field.strip() for field in fields):
                raise InputError(f"{path}:{number}: blank line; every line after the header must be a row")
            if len(fields) != len(header):
                raise InputError(
                    f"{path}:{number}: expected {len(header)} comma-separated fields as in the header, "
                    f"found {len(fields)}"
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
    for number, line in _lines(path):
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
# Public readers: ``iter_*`` stream (constant memory, for ``data prepare``); ``read_*`` are their lists.


def _iter_rows(path: Path, suffix: str, *, with_label: bool) -> Iterator[tuple[str, str | None, int]]:
    if suffix == ".jsonl":
        return _jsonl_rows(path, with_label=with_label)
    header, rows = _tsv_rows(path) if suffix == ".tsv" else _csv_rows(path)
    return _pick_columns(path, header, rows, with_label=with_label)


def iter_labeled(path: str | Path) -> Iterator[Example]:
    """Stream labeled examples from a ``.tsv``, ``.csv`` or ``.jsonl`` file, in file order."""
    path = Path(path)
    suffix = _suffix(path, _LABELED_SUFFIXES)
    for text, label, line in _iter_rows(path, suffix, with_label=True):
        assert label is not None  # with_label=True: a row without a label was refused with its line
        yield Example(text, label, line)


def read_labeled(path: str | Path) -> list[Example]:
    """Read labeled examples from a ``.tsv``, ``.csv`` or ``.jsonl`` file, in file order."""
    return list(iter_labeled(path))


def read_texts(path: str | Path) -> list[tuple[str, int]]:
    """Read texts to predict on, as ``(text, line)``: the labeled formats with the label optional (and
    ignored), or ``.txt`` with one text per line, where a blank line is an error."""
    path = Path(path)
    suffix = _suffix(path, _TEXT_SUFFIXES)
    if suffix != ".txt":
        return [(text, line) for text, _, line in _iter_rows(path, suffix, with_label=False)]
    texts = []
    for number, line in _lines(path):
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
    texts = [(line.strip(), number) for number, line in _lines(path) if line.strip()]
    if not texts:
        raise InputError(f"{path}: no text (the file is empty or blank); expected one text per line")
    return texts


_PAIR_HEADERS = {("source", "target"), ("src", "tgt")}  # compared lower-cased: "Source<TAB>Target" is one too


def iter_parallel_tsv(path: str | Path) -> Iterator[Pair]:
    """Stream ``source<TAB>target`` lines; a first line ``source<TAB>target`` (or ``src<TAB>tgt``, in any case)
    is taken as a header and skipped."""
    path = Path(path)
    n_lines = n_pairs = 0
    for number, line in _lines(path):
        n_lines = number
        fields = line.split("\t")
        if number == 1 and tuple(field.strip().lower() for field in fields) in _PAIR_HEADERS:
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
        n_pairs += 1
        yield Pair(source, target, number)
    if not n_lines:
        raise InputError(f"{path}:1: file is empty; expected lines of source<TAB>target")
    if not n_pairs:
        raise InputError(f"{path}:1: only a header, no pairs")


def read_parallel_tsv(path: str | Path) -> list[Pair]:
    """Read ``source<TAB>target`` lines; a first line ``source<TAB>target`` (or ``src<TAB>tgt``, in any case) is
    taken as a header and skipped."""
    return list(iter_parallel_tsv(path))


def iter_parallel_files(src_path: str | Path, tgt_path: str | Path) -> Iterator[Pair]:
    """Stream two plain-text files of sentences aligned line by line (line n of one translates line n of the
    other). Unequal line counts are found when the shorter file ends."""
    src_path, tgt_path = Path(src_path), Path(tgt_path)
    src_lines, tgt_lines = _lines(src_path), _lines(tgt_path)
    n_src = n_tgt = 0
    for n_src, source in src_lines:
        next_tgt = next(tgt_lines, None)
        if next_tgt is None:
            break
        n_tgt, target = next_tgt
        for path, sentence in ((src_path, source), (tgt_path, target)):
            if not sentence.strip():
                raise InputError(f"{path}:{n_src}: blank line; every line must hold a sentence")
        yield Pair(source.strip(), target.strip(), n_src)
    n_src += sum(1 for _ in src_lines)  # the lines left over in the longer file, counted for the message
    n_tgt += sum(1 for _ in tgt_lines)
    for path, n in ((src_path, n_src), (tgt_path, n_tgt)):
        if not n:
            raise InputError(f"{path}:1: file is empty; expected one sentence per line")
    if n_src != n_tgt:
        raise InputError(
            f"{src_path} has {n_src} lines but {tgt_path} has {n_tgt}; aligned files must have the same number of lines"
        )


def read_parallel_files(src_path: str | Path, tgt_path: str | Path) -> list[Pair]:
    """Read two plain-text files of sentences aligned line by line (line n of one translates line n of the
    other)."""
    return list(iter_parallel_files(src_path, tgt_path))
