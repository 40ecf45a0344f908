"""Bytes to lines: the checks every reader shares. A file is decoded as strict UTF-8 (a leading byte-order mark
dropped), CRLF and lone CR read as one line break, and bytes that are not UTF-8 are an ``InputError`` naming the
file, the line and the bytes; standard input is decoded the same way (``stream_lines``). The file's extension
chooses its format (``supported_suffix``).

Files are streamed line by line, so a reader's memory does not grow with the file (``attnkit data prepare`` reads
corpora of millions of lines through these generators).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from attnkit.errors import InputError

_UTF8_BOM = b"\xef\xbb\xbf"


def _check_file(path: Path) -> None:
    if not path.exists():
        raise InputError(f"{path}: no such file")
    if path.is_dir():
        raise InputError(f"{path}: is a directory, expected a file")


def raw_lines(path: Path) -> Iterator[str]:
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


def numbered_lines(path: Path) -> Iterator[tuple[int, str]]:
    """``(number, line)`` without the line end; numbers are 1-based. A final line break ends the last line; it
    does not start a new, empty one."""
    for number, line in enumerate(raw_lines(path), start=1):
        yield number, line[:-1] if line.endswith("\n") else line


def supported_suffix(path: Path, supported: tuple[str, ...]) -> str:
    suffix = path.suffix.lower()
    if suffix not in supported:
        raise InputError(
            f"{path}: unsupported file extension {path.suffix or '(none)'!r}; expected one of {', '.join(supported)}"
        )
    return suffix
