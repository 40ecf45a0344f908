"""Reading a prepared corpus: the directory ``attnkit data prepare`` writes (``data/prepare.py``), memory-mapped.

A prepared directory holds, per split (``train``, ``valid``, ...):

    translate   SPLIT.src.bin/.idx   source ids + EOS, cut to max_len (the EOS kept) as training cuts them
                SPLIT.tgt.bin/.idx   target ids, bare, at most max_len - 1 (BOS / EOS are added when batching)
    classify    SPLIT.text.bin/.idx  text ids (a trailing [SEP] kept when cutting)
                SPLIT.labels.npy     int64 label ids, indices into the sidecar's ``labels``

plus ``tokenizer.json`` and the sidecar ``prepared.json`` (format, tokenizer fingerprint, length policy, and per
split the counts and the sha256 of every source file and every written file). Opening checks the format, the
tokenizer fingerprint, sizes and tiling; ``verify`` hashes every file, and training does that once before its first
step (``check``): a byte changed after preparation is an error naming the file, never a token id out of the
vocabulary in the middle of an epoch. No torch is imported.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from attnkit.data.indexed import IndexedTokens
from attnkit.errors import InputError
from attnkit.tokenization import Tokenizer

FORMAT = "attnkit-prepared"
FORMAT_VERSION = 1
SIDECAR = "prepared.json"
TOKENIZER = "tokenizer.json"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


@dataclass
class ParallelTokens:
    """A translate split: ``src[i]`` (ids + EOS) and ``tgt[i]`` (bare ids), and their lengths for batching."""

    src: IndexedTokens
    tgt: IndexedTokens

    def __len__(self) -> int:
        return len(self.src)


@dataclass
class LabelledTokens:
    """A classify split: ``text[i]`` and ``labels[i]`` (an id into the corpus's ``labels``)."""

    text: IndexedTokens
    labels: np.ndarray  # (N,) int64, memory-mapped

    def __len__(self) -> int:
        return len(self.text)


@dataclass
class PreparedCorpus:
    directory: Path
    meta: dict  # the sidecar
    tokenizer: Tokenizer

    @property
    def task(self) -> str:
        return self.meta["task"]

    @property
    def labels(self) -> list[str] | None:
        return self.meta.get("labels")

    def verify(self) -> None:
        """Hash every written file against the sidecar's sha256 (reads the whole corpus once, about a second a
        gigabyte; opening does not: it checks sizes and tiling only)."""
        for split, info in self.meta["splits"].items():
            self.split(split)  # sizes and tiling first: what they find says more than a checksum
            for name, digest in info["files"].items():
                path = self.directory / name
                if not path.is_file():
                    raise InputError(f"{path}: no such file (listed in {self.directory / SIDECAR})")
                if sha256_file(path) != digest:
                    raise InputError(
                        f"{path}: sha256 differs from {self.directory / SIDECAR}; the file was changed "
                        "after preparation"
                    )

    def check(self, task: str, max_len: int) -> None:
        """Before training on it: the corpus is of ``task``, its files are the ones prepared (``verify``) and its
        longest sequence fits a model of ``max_len`` positions (else an InputError); a corpus prepared with a larger
        max_len whose sequences all fit is fine."""
        sidecar = self.directory / SIDECAR
        _check_task(sidecar, self.task, task)
        self.verify()
        # "longest" is counted before cutting (what was truncated, for the report); what was written is at most max_len
        longest = max(min(info["longest"], self.meta["max_len"]) for info in self.meta["splits"].values())
        if longest > max_len:
            raise InputError(
                f"{sidecar}: its longest sequence has {longest} tokens (prepared with max_len="
                f"{self.meta['max_len']}), more than the model's max_len={max_len}; train with --set "
                f"max_len={longest} or prepare again with --max-len {max_len}"
            )

    def fingerprint(self, *splits: str) -> str:
        """sha256 over the sidecar's sha256 of every file of ``splits`` and the tokenizer's fingerprint: what a
        resumed run compares, without reading the corpus (the files were hashed when they were written)."""
        files = {name: self.meta["splits"][name]["files"] for name in splits if name in self.meta["splits"]}
        document = {"tokenizer": self.meta["tokenizer"]["fingerprint"], "files": files}
        return hashlib.sha256(json.dumps(document, sort_keys=True).encode("utf-8")).hexdigest()

    def split(self, name: str) -> ParallelTokens | LabelledTokens:
        """Map one split's files (cheap: nothing is read but the index), after checking they match the sidecar."""
        info = self.meta["splits"].get(name)
        if info is None:
            raise InputError(f"{self.directory / SIDECAR}: no split {name!r} (has: {', '.join(self.meta['splits'])})")
        prefix = self.directory / name
        parts: dict[str, IndexedTokens] = {}
        for part in ("src", "tgt") if self.task == "translate" else ("text",):
            tokens = IndexedTokens(f"{prefix}.{part}")
            if len(tokens) != info["sequences"]:
                raise InputError(
                    f"{tokens.prefix}.idx: {len(tokens)} sequences, but {self.directory / SIDECAR} "
                    f"records {info['sequences']}; the files come from different preparations"
                )
            recorded = info.get("tokens", {}).get(part)
            if recorded is not None and int(tokens.sizes.sum(dtype=np.int64)) != recorded:
                raise InputError(
                    f"{tokens.prefix}.idx: {int(tokens.sizes.sum(dtype=np.int64))} tokens, but "
                    f"{self.directory / SIDECAR} records {recorded}; the files were changed after preparation"
                )
            parts[part] = tokens
        if self.task == "translate":
            return ParallelTokens(parts["src"], parts["tgt"])
        labels_path = Path(f"{prefix}.labels.npy")
        try:
            labels = np.load(labels_path, mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError) as err:
            raise InputError(f"{labels_path}: cannot read the label ids ({err})") from None
        if labels.shape != (info["sequences"],):
            raise InputError(
                f"{labels_path}: {labels.shape[0] if labels.ndim else 0} label ids for {info['sequences']} texts"
            )
        return LabelledTokens(parts["text"], labels)


def _check_task(sidecar: Path, prepared_for: object, task: str) -> None:
    """A corpus prepared for another task than ``task``'s training is an InputError naming its sidecar."""
    if prepared_for != task:
        raise InputError(
            f"{sidecar}: a prepared {prepared_for} corpus; {task} train needs one prepared with --task {task}"
        )


def open_prepared(
    directory: str | Path, tokenizer: Tokenizer | None = None, *, task: str | None = None
) -> PreparedCorpus:
    """Open a prepared corpus. With ``tokenizer`` (the run's), its fingerprint must be the one the corpus was
    prepared with; without, the corpus's own ``tokenizer.json`` is loaded (and checked against the sidecar). With
    ``task`` (a train command's), a corpus of the other task is refused at once, before anything reads it."""
    directory = Path(directory)
    sidecar_path = directory / SIDECAR
    if not sidecar_path.is_file():
        raise InputError(f"{directory}: not a prepared corpus (no {SIDECAR}); run `attnkit data prepare`")
    try:
        meta = json.loads(sidecar_path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise InputError(f"{sidecar_path}: not valid JSON ({err})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise InputError(f"{sidecar_path}: not an attnkit prepared-corpus sidecar")
    if meta.get("version") != FORMAT_VERSION:
        raise InputError(f"{sidecar_path}: format version {meta.get('version')}; this attnkit reads {FORMAT_VERSION}")
    if task is not None:
        _check_task(sidecar_path, meta.get("task"), task)
    expected = meta["tokenizer"]["fingerprint"]
    if tokenizer is None:
        tokenizer = Tokenizer.load(directory / TOKENIZER, meta["tokenizer"])
    elif tokenizer.fingerprint() != expected:
        raise InputError(
            f"{sidecar_path}: the corpus was prepared with another tokenizer (fingerprint "
            f"{expected[:12]}, the given one is {tokenizer.fingerprint()[:12]}); prepare it again "
            "with this tokenizer (--tokenizer RUN_DIR)"
        )
    return PreparedCorpus(directory, meta, tokenizer)


__all__ = ["LabelledTokens", "ParallelTokens", "PreparedCorpus", "open_prepared"]
