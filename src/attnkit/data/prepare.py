"""Preparing corpora: a parallel or labelled corpus tokenised once, streaming, into memory-mapped token files.

The directory's layout, the sidecar and reading it back are ``data/prepared.py``'s (``open_prepared``). This file
is past ~300 lines as one concept, the writer: its inputs (``Source``, ``TokenizerSpec``), the chunked encoding and
the length tally it shares, one writer per task and ``prepare_corpus`` driving them; splitting them further would
scatter one streaming pipeline over files.

Memory is constant in the corpus size: input is read line by line, encoded a chunk of lines at a time
(``CHUNK_LINES``, ``CHUNK_CHARS``) with the tokenizer's batch encoder, and written out at once; a tokenizer trained
here is trained from the same stream. The whole directory appears atomically (``atomic_directory``). No torch is
imported.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np

from attnkit.atomic import atomic_directory, atomic_write_json, open_atomic
from attnkit.data.indexed import IndexedWriter, token_dtype
from attnkit.data.lengths import apply_length_policy, too_long_error
from attnkit.data.prepared import FORMAT, FORMAT_VERSION, SIDECAR, TOKENIZER, sha256_file
from attnkit.data.readers import Example, Pair, iter_labeled, iter_parallel_files, iter_parallel_tsv
from attnkit.errors import InputError
from attnkit.tokenization import Tokenizer, train_tokenizer

RUN_CONFIG = "config.json"  # a run directory's config, whose "tokenizer" key holds the tokenizer's meta
CHUNK_LINES = 10_000  # lines per encode_batch call at most: enough work for the Rust side's threads
CHUNK_CHARS = 1 << 20  # characters per call at most: what bounds the memory of a chunk (see _chunks)
T = TypeVar("T")
TASKS = ("translate", "classify")


# ---------------------------------------------------------------------------------------------------------
# Inputs: where the text comes from, and the tokenizer.


@dataclass(frozen=True)
class Source:
    """One split's input: a TSV (``source<TAB>target``, or a labelled .tsv/.csv/.jsonl) or two aligned files."""

    paths: tuple[Path, ...]

    def pairs(self) -> Iterator[Pair]:
        return iter_parallel_tsv(self.paths[0]) if len(self.paths) == 1 else iter_parallel_files(*self.paths)

    def examples(self) -> Iterator[Example]:
        return iter_labeled(self.paths[0])


@dataclass(frozen=True)
class TokenizerSpec:
    """How to train a tokenizer on the train split, as training does (``train_tokenizer``'s arguments)."""

    kind: str = "word"
    vocab_size: int = 10000
    min_freq: int = 2
    add_cls: bool = False  # classify with pooling="cls"
    pretokenize: str = "none"  # "morphemes": Korean morphemes as the word kind's units


def load_tokenizer(path: str | Path) -> Tokenizer:
    """A tokenizer from a run directory, a prepared directory, or a ``tokenizer.json`` (whose meta is then read
    from a ``config.json`` or ``prepared.json`` beside it, or inferred from the file)."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: no such file or directory")
    file = path / TOKENIZER if path.is_dir() else path
    if not file.is_file():
        raise InputError(f"{path}: no {TOKENIZER} here; give a run directory, a prepared corpus or a tokenizer.json")
    for sidecar in (file.parent / RUN_CONFIG, file.parent / SIDECAR):
        if sidecar.is_file():
            try:
                meta = json.loads(sidecar.read_text(encoding="utf-8")).get("tokenizer")
            except (ValueError, AttributeError):
                raise InputError(f"{sidecar}: not a JSON object") from None
            if meta:
                return Tokenizer.load(file, meta)
    return Tokenizer.from_backend_file(file)


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


# ---------------------------------------------------------------------------------------------------------
# A whole corpus: the tokenizer (given or trained on the train split), every split, the sidecar.


def prepare_corpus(
    task: str,
    splits: dict[str, Source],
    out_dir: str | Path,
    *,
    max_len: int,
    policy: str = "truncate",
    tokenizer: Tokenizer | None = None,
    tokenizer_spec: TokenizerSpec | None = None,
    labels: list[str] | None = None,
    on_event: Callable[[dict], None] = lambda event: None,
) -> dict:
    """Prepare ``splits`` (``train`` first; others such as ``valid`` optional) into ``out_dir`` and return the
    sidecar. Give ``tokenizer``, or ``tokenizer_spec`` to train one on the train split as training would. For
    classify, ``labels`` default to the train split's distinct labels, sorted (training's order)."""
    if task not in TASKS:
        raise InputError(f"task {task!r}; expected one of {', '.join(TASKS)}")
    if "train" not in splits:
        raise InputError("a prepared corpus needs a train split")
    if max_len < 2:
        raise InputError(f"max_len={max_len}; a sequence needs room for at least 2 tokens")
    if policy not in ("truncate", "error"):
        raise InputError(f"max_len_policy {policy!r}; expected truncate or error")
    if (tokenizer is None) == (tokenizer_spec is None):
        raise InputError("give a tokenizer or the settings to train one (one of them)")
    out_dir = Path(out_dir)
    if out_dir.exists() and (not out_dir.is_dir() or (any(out_dir.iterdir()) and not (out_dir / SIDECAR).exists())):
        raise InputError(f"{out_dir}: exists and is not a prepared corpus; choose a new directory")
    train = splits["train"]

    if task == "classify" and (labels is None or tokenizer is None):
        seen: set[str] = set()

        def texts() -> Iterator[str]:
            for ex in train.examples():
                seen.add(ex.label)
                yield ex.text

        if tokenizer is None:
            assert tokenizer_spec is not None
            on_event({"event": "tokenizer", "kind": tokenizer_spec.kind, "vocab_size": tokenizer_spec.vocab_size})
            tokenizer = _train(texts(), tokenizer_spec)
        else:
            for _ in texts():
                pass
        labels = labels or sorted(seen)
    elif tokenizer is None:
        assert tokenizer_spec is not None
        on_event({"event": "tokenizer", "kind": tokenizer_spec.kind, "vocab_size": tokenizer_spec.vocab_size})
        # §5.1: one vocabulary shared by source and target, learned from both sides in the order training reads.
        tokenizer = _train((text for pair in train.pairs() for text in (pair.source, pair.target)), tokenizer_spec)
    if task == "classify" and labels is not None and len(labels) < 2:
        raise InputError(f"{train.paths[0]}: {len(labels)} distinct label(s) ({labels}); a classifier needs at least 2")

    sidecar: dict = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "task": task,
        "layout": "Megatron-LM / fairseq MMapIndexedDataset (.bin + .idx, MMIDIDX version 1)",
        "tokenizer": tokenizer.meta(),
        "vocab_size": tokenizer.vocab_size,
        "max_len": max_len,
        "max_len_policy": policy,
        "splits": {},
    }
    if task == "classify":
        sidecar["labels"] = labels
    with atomic_directory(out_dir) as work:
        tokenizer.save(work / TOKENIZER)
        for name, source in splits.items():
            on_event({"event": "split", "split": name, "files": [str(p) for p in source.paths]})
            if task == "translate":
                where = (str(source.paths[0]), str(source.paths[-1]))
                summary = prepare_parallel(
                    source.pairs(), tokenizer, work / name, max_len=max_len, policy=policy, names=where
                )
            else:
                assert labels is not None
                summary = prepare_labelled(
                    source.examples(),
                    tokenizer,
                    labels,
                    work / name,
                    max_len=max_len,
                    policy=policy,
                    name=str(source.paths[0]),
                )
            summary["sources"] = [{"file": str(p), "sha256": sha256_file(p)} for p in source.paths]
            sidecar["splits"][name] = summary
            on_event(
                {
                    "event": "split_done",
                    "split": name,
                    "sequences": summary["sequences"],
                    "truncated": summary["truncated"],
                }
            )
        atomic_write_json(work / SIDECAR, sidecar)
    return sidecar


def _train(texts: Iterator[str], spec: TokenizerSpec) -> Tokenizer:
    return train_tokenizer(
        texts,
        kind=spec.kind,
        vocab_size=spec.vocab_size,
        min_freq=spec.min_freq,
        add_cls=spec.add_cls,
        pretokenize=spec.pretokenize,
    )


__all__ = [
    "Source",
    "TokenizerSpec",
    "load_tokenizer",
    "prepare_corpus",
    "prepare_labelled",
    "prepare_parallel",
]
