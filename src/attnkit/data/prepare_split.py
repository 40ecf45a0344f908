"""Preparing one split: its sentence pairs or labelled examples encoded a chunk at a time and written to
memory-mapped token files (``data/indexed.py``), cut by the length policy exactly as training cuts them.

``prepare_corpus`` (``data/prepare.py``) calls one writer per split. Memory is constant in the split's size: input
is read line by line, encoded a chunk of lines at a time (``CHUNK_LINES``, ``CHUNK_CHARS``) with the tokenizer's
batch encoder, and written out at once. No torch is imported.
"""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TypeVar

import numpy as np

from attnkit.atomic import open_atomic
from attnkit.data.indexed import IndexedWriter, token_dtype
from attnkit.data.lengths import apply_length_policy, too_long_error
from attnkit.data.readers.labeled import Example
from attnkit.data.readers.parallel import Pair
from attnkit.errors import InputError
from attnkit.tokenization import Tokenizer

CHUNK_LINES = 10_000  # lines per encode_batch call at most: enough work for the Rust side's threads
CHUNK_CHARS = 1 << 20  # characters per call at most: what bounds the memory of a chunk (see _chunks)
T = TypeVar("T")


def _chunks(items: Iterable[T], n_chars: Callable[[T], int]) -> Iterator[list[T]]:
    """Runs of at most ``CHUNK_LINES`` items and about ``CHUNK_CHARS`` characters: a chunk's encodings (the Rust
    side's, then Python's lists of ids: ~100 bytes a token) stay a few tens of MB however long the lines are,
    and the peak does not creep up with the number of chunks."""
    chunk: list[T] = []
    chars = 0
    for item in items:
        chunk.append(item)
        chars += n_chars(item)
        if len(chunk) >= CHUNK_LINES or chars >= CHUNK_CHARS:
            yield chunk
            chunk, chars = [], 0
    if chunk:
        yield chunk


# ---------------------------------------------------------------------------------------------------------
# The length policy, applied chunk by chunk with the counts of the whole file.


class _LengthTally:
    """``apply_length_policy`` over a stream: cuts each chunk as training cuts the whole list, and for policy
    "error" raises at the end with the count and the first offender of the whole file (the message training gives).
    """

    def __init__(self, limit: int, policy: str, what: str, where: str, keep_last: int | None):
        self.limit, self.policy, self.what, self.where, self.keep_last = limit, policy, what, where, keep_last
        self.n_over = 0
        self.longest = 0
        self.first: tuple[int, int] | None = None  # (line, tokens) of the first sequence over the limit

    def apply(self, seqs: list[list[int]], lines: list[int]) -> list[list[int]]:
        if self.first is None:
            over = next((i for i, s in enumerate(seqs) if len(s) > self.limit), None)
            if over is not None:
                self.first = (lines[over], len(seqs[over]))
        seqs, cut = apply_length_policy(seqs, self.limit, "truncate", keep_last=self.keep_last)
        self.n_over += cut.n_truncated
        self.longest = max(self.longest, cut.longest)
        return seqs

    def check(self) -> None:
        if self.policy == "error" and self.first is not None:
            line, n_tokens = self.first
            raise too_long_error(self.n_over, self.what, self.limit, f"{self.where}:{line}", n_tokens)


# ---------------------------------------------------------------------------------------------------------
# One split of each kind.


def prepare_parallel(
    pairs: Iterable[Pair],
    tokenizer: Tokenizer,
    prefix: str | Path,
    *,
    max_len: int,
    policy: str,
    names: tuple[str, str] = ("source", "target"),
) -> dict:
    """Write ``PREFIX.src`` and ``PREFIX.tgt`` token files from ``pairs``, encoded as ``encode_pairs`` encodes
    them: source = tokens + EOS (at most ``max_len``, the EOS kept when cutting), target = tokens (at most
    ``max_len - 1``, room for BOS / EOS). ``names`` are the files the sides come from, for errors.

    Returns the split's counts and the sha256 of the files written.
    """
    prefix = Path(prefix)
    dtype = token_dtype(tokenizer.vocab_size)
    eos = tokenizer.eos_id
    if eos is None:
        raise InputError("the tokenizer has no EOS token; a translator's source ends with one")
    src_tally = _LengthTally(max_len, policy, "source sentence", names[0], keep_last=1)
    tgt_tally = _LengthTally(max_len - 1, policy, "target sentence", names[1], keep_last=None)
    with IndexedWriter(f"{prefix}.src", dtype) as src_out, IndexedWriter(f"{prefix}.tgt", dtype) as tgt_out:
        for chunk in _chunks(pairs, lambda pair: len(pair.source) + len(pair.target)):
            lines = [p.line for p in chunk]
            src = [ids + [eos] for ids in tokenizer.encode_batch([p.source for p in chunk], max_len)]
            tgt = tokenizer.encode_batch([p.target for p in chunk], max_len)
            src_out.add_many(src_tally.apply(src, lines))
            tgt_out.add_many(tgt_tally.apply(tgt, lines))
        src_tally.check()  # training refuses over-long sources before it looks at the targets
        tgt_tally.check()
        src_out.finish()
        tgt_out.finish()
    return {
        "sequences": src_out.n_sequences,
        "tokens": {"src": src_out.n_tokens, "tgt": tgt_out.n_tokens},
        "truncated": src_tally.n_over + tgt_tally.n_over,
        "longest": max(src_tally.longest, tgt_tally.longest + 1),  # a target's length counts its BOS / EOS
        "files": {**src_out.sha256, **tgt_out.sha256},
    }


def prepare_labelled(
    examples: Iterable[Example],
    tokenizer: Tokenizer,
    labels: list[str],
    prefix: str | Path,
    *,
    max_len: int,
    policy: str,
    name: str = "input",
) -> dict:
    """Write ``PREFIX.text`` token files and ``PREFIX.labels.npy`` (ids into ``labels``) from ``examples``,
    encoded as ``encode_examples`` encodes them (a trailing [SEP] kept when cutting). ``name`` is the file, for
    errors. Returns the split's counts and the sha256 of the files written."""
    prefix = Path(prefix)
    label_id = {label: i for i, label in enumerate(labels)}
    tally = _LengthTally(max_len, policy, "text", name, keep_last=tokenizer.n_trailing_specials or None)
    labels_path = Path(f"{prefix}.labels.npy")
    with (
        IndexedWriter(f"{prefix}.text", token_dtype(tokenizer.vocab_size)) as text_out,
        tempfile.TemporaryFile(dir=prefix.parent) as label_spool,
    ):
        for chunk in _chunks(examples, lambda ex: len(ex.text)):
            for ex in chunk:
                if ex.label not in label_id:
                    raise InputError(f"{name}:{ex.line}: label {ex.label!r} is not one of the labels {labels}")
            label_spool.write(np.array([label_id[ex.label] for ex in chunk], dtype="<i8").tobytes())
            seqs = tokenizer.encode_batch([ex.text for ex in chunk], max_len)
            text_out.add_many(tally.apply(seqs, [ex.line for ex in chunk]))
        tally.check()
        text_out.finish()
        n = text_out.n_sequences
        label_hash = hashlib.sha256()
        with open_atomic(labels_path) as f:
            header = {"descr": "<i8", "fortran_order": False, "shape": (n,)}
            np.lib.format.write_array_header_1_0(f, header)  # the .npy header, then the spooled ids: no list of N
            label_spool.seek(0)
            while block := label_spool.read(1 << 20):
                f.write(block)
        with open(labels_path, "rb") as f:
            while block := f.read(1 << 20):
                label_hash.update(block)
    return {
        "sequences": n,
        "tokens": {"text": text_out.n_tokens},
        "truncated": tally.n_over,
        "longest": tally.longest,
        "files": {**text_out.sha256, labels_path.name: label_hash.hexdigest()},
    }


__all__ = ["prepare_labelled", "prepare_parallel"]
