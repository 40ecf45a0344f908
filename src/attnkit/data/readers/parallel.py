"""Sentence pairs for translation: ``source<TAB>target`` lines in one file (a header line optional), or two
plain-text files aligned line by line. ``iter_*`` stream (constant memory, for ``data prepare``); ``read_*`` are
their lists.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from attnkit.data.readers.lines import numbered_lines
from attnkit.errors import InputError


@dataclass(frozen=True)
class Pair:
    """One source sentence, its translation, and the line they were read from."""

    source: str
    target: str
    line: int  # 1-based; for two aligned files, the same line in both


_PAIR_HEADERS = {("source", "target"), ("src", "tgt")}  # compared lower-cased: "Source<TAB>Target" is one too


def iter_parallel_tsv(path: str | Path) -> Iterator[Pair]:
    """Stream ``source<TAB>target`` lines; a first line ``source<TAB>target`` (or ``src<TAB>tgt``, in any case)
    is taken as a header and skipped. Blank lines at the end (an editor's trailing newlines) are no pairs; one
    between pairs is an error."""
    path = Path(path)
    n_lines = n_pairs = 0
    blank = None  # the first blank line since the last pair
    for number, line in numbered_lines(path):
        n_lines = number
        fields = line.split("\t")
        if number == 1 and tuple(field.strip().lower() for field in fields) in _PAIR_HEADERS:
            continue
        if not line.strip():
            blank = blank or number
            continue
        if blank is not None:
            raise InputError(f"{path}:{blank}: blank line; expected source<TAB>target")
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
    src_lines, tgt_lines = numbered_lines(src_path), numbered_lines(tgt_path)
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
