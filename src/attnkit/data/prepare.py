"""Preparing corpora: a parallel or labelled corpus tokenised once, streaming, into memory-mapped token files.

This file holds the inputs (``Source``, ``TokenizerSpec``, ``load_tokenizer``) and ``prepare_corpus``, which checks
them, takes the tokenizer or trains one on the train split, writes every split and the sidecar. Each split's token
files are written by ``data/prepare_split.py``; the directory's layout, the sidecar and reading it back are
``data/prepared.py``'s (``open_prepared``).

Memory is constant in the corpus size: input is read line by line and encoded a chunk of lines at a time
(``prepare_split.py``); a tokenizer trained here is trained from the same stream. The whole directory appears
atomically (``atomic_directory``). No torch is imported.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from attnkit.atomic import atomic_directory, atomic_write_json
from attnkit.data.prepare_split import prepare_labelled, prepare_parallel
from attnkit.data.prepared import FORMAT, FORMAT_VERSION, SIDECAR, TOKENIZER, sha256_file
from attnkit.data.readers.labeled import Example, iter_labeled
from attnkit.data.readers.parallel import Pair, iter_parallel_files, iter_parallel_tsv
from attnkit.errors import InputError
from attnkit.tokenization import Tokenizer, train_tokenizer

RUN_CONFIG = "config.json"  # a run directory's config, whose "tokenizer" key holds the tokenizer's meta
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
]
