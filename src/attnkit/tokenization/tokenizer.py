"""One tokenizer type for every kind of vocabulary, backed by Hugging Face's `tokenizers` (Rust, fast, exact
save/load).

Kinds:
    word       lower-cased words and punctuation (the simple vocabulary of reference note 000, done properly:
               "great!" is two tokens, unseen words map to <unk>); min frequency and max size.
    bpe        byte-pair encoding (Sennrich et al.), the paper's shared source/target vocabulary (§5.1); spaces are
               kept as "▁" marks so that decoding restores the text exactly (detokenized output).
    wordpiece  BERT's subword scheme, lower-cased.

Attnkit's own special tokens take the first ids: <pad> = 0, <unk> = 1, <cls> = 2, <bos> = 3, <eos> = 4.
A pretrained tokenizer (a BERT folder) keeps its own ids; ``Tokenizer`` only records which tokens play which role.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as Backend
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers

from attnkit.atomic import atomic_write_bytes
from attnkit.errors import InputError

SPECIAL_TOKENS = ("<pad>", "<unk>", "<cls>", "<bos>", "<eos>")
KINDS = ("word", "bpe", "wordpiece")


@dataclass(frozen=True)
class SpecialTokens:
    """Which token plays which role. ``cls`` is None when the tokenizer does not prepend one."""

    pad: str = "<pad>"
    unk: str = "<unk>"
    cls: str | None = None
    bos: str | None = "<bos>"
    eos: str | None = "<eos>"


class Tokenizer:
    """Text <-> ids. Wraps a ``tokenizers.Tokenizer`` and the roles of its special tokens."""

    def __init__(self, backend: Backend, kind: str, specials: SpecialTokens):
        self.backend = backend
        self.kind = kind
        self.specials = specials
        self.pad_id = self._id(specials.pad)
        self.unk_id = self._id(specials.unk)
        self.cls_id = self._id(specials.cls) if specials.cls else None
        self.bos_id = self._id(specials.bos) if specials.bos else None
        self.eos_id = self._id(specials.eos) if specials.eos else None

    def _id(self, token: str) -> int:
        token_id = self.backend.token_to_id(token)
        if token_id is None:
            raise InputError(f"tokenizer has no special token {token!r}")
        return token_id

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    @property
    def n_trailing_specials(self) -> int:
        """How many special tokens follow the text in every encoding (BERT: one [SEP]), so that truncation keeps
        them; 0 for attnkit's own tokenizers."""
        mask = self.backend.encode("a").special_tokens_mask
        return len(mask) - len("".join(map(str, mask)).rstrip("1"))

    def encode(self, text: str) -> list[int]:
        """Ids of ``text``, with the CLS token first when the tokenizer has one."""
        return self.backend.encode(text).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [encoding.ids for encoding in self.backend.encode_batch(texts)]

    def tokens(self, text: str) -> list[str]:
        """The token strings of ``text`` (for attention-map labels and for reading what the model sees)."""
        return self.backend.encode(text).tokens

    def decode(self, ids: Iterable[int]) -> str:
        """Ids -> text, special tokens dropped, subwords joined (detokenized)."""
        return self.backend.decode(list(ids), skip_special_tokens=True)

    def decode_batch(self, batch: list[list[int]]) -> list[str]:
        return self.backend.decode_batch(batch, skip_special_tokens=True)

    def fingerprint(self) -> str:
        """sha256 of the canonical serialization: two tokenizers with the same fingerprint encode identically."""
        canonical = json.dumps(json.loads(self.backend.to_str()), sort_keys=True, ensure_ascii=False)
        return hashlib.sha256(canonical.encode("utf-8")).hexdigest()

    def meta(self) -> dict:
        """What, besides ``tokenizer.json``, restores this tokenizer (stored in the run's config)."""
        return {"kind": self.kind, "specials": asdict(self.specials), "fingerprint": self.fingerprint()}

    def save(self, path: str | Path) -> None:
        """Write ``tokenizer.json`` (the backend's own format) atomically, like every file of a run directory: a
        fresh temporary name in the same directory, fsynced, then renamed over ``path``."""
        atomic_write_bytes(path, self.backend.to_str(pretty=True).encode("utf-8"))

    @classmethod
    def load(cls, path: str | Path, meta: dict) -> Tokenizer:
        """Restore from ``tokenizer.json`` and the ``meta`` dict; a changed file fails the fingerprint check."""
        path = Path(path)
        try:
            backend = Backend.from_file(str(path))
        except Exception as err:  # the Rust side raises plain Exceptions on malformed files
            raise InputError(f"{path}: not a valid tokenizer file ({err})") from None
        tokenizer = cls(backend, meta["kind"], SpecialTokens(**meta["specials"]))
        expected = meta.get("fingerprint")
        if expected and tokenizer.fingerprint() != expected:
            raise InputError(
                f"{path}: tokenizer differs from the one the model was trained with (fingerprint mismatch)"
            )
        return tokenizer

    @classmethod
    def from_backend_file(cls, path: str | Path) -> Tokenizer:
        """Restore from a ``tokenizer.json`` alone, with no saved meta: the kind is read from the model type and
        a leading <cls> from what an encoding starts with. Attnkit's special-token names are assumed."""
        path = Path(path)
        try:
            backend = Backend.from_file(str(path))
        except Exception as err:  # the Rust side raises plain Exceptions on malformed files
            raise InputError(f"{path}: not a valid tokenizer file ({err})") from None
        model_kind = {"BPE": "bpe", "WordLevel": "word", "WordPiece": "wordpiece"}
        kind = model_kind.get(json.loads(backend.to_str())["model"]["type"])
        if kind is None:
            raise InputError(f"{path}: a tokenizer of an unsupported model type; expected BPE, WordLevel or WordPiece")
        cls_id = backend.token_to_id("<cls>")
        add_cls = cls_id is not None and backend.encode("a").ids[:1] == [cls_id]
        return cls(backend, kind, SpecialTokens(cls="<cls>" if add_cls else None))


def train_tokenizer(
    texts: Iterable[str],
    *,
    kind: str = "word",
    vocab_size: int = 10000,
    min_freq: int = 2,
    add_cls: bool = False,
    lowercase: bool | None = None,
) -> Tokenizer:
    """Learn a vocabulary of at most ``vocab_size`` entries (special tokens included) from ``texts``.

    Args:
        kind: "word", "bpe" or "wordpiece".
        min_freq: a word (word kind) or merge pair (subword kinds) must occur this often to get an id.
        add_cls: prepend <cls> to every encoding (for first-token pooling).
        lowercase: default True for word and wordpiece, False for bpe (translation keeps case).
    """
    if kind not in KINDS:
        raise InputError(f"tokenizer kind {kind!r}; expected one of {', '.join(KINDS)}")
    if vocab_size <= len(SPECIAL_TOKENS):
        raise InputError(
            f"config key vocab_size={vocab_size} leaves no room beyond the {len(SPECIAL_TOKENS)} special tokens"
        )
    if lowercase is None:
        lowercase = kind != "bpe"
    specials = list(SPECIAL_TOKENS)
    steps = [normalizers.NFKC()] + ([normalizers.Lowercase()] if lowercase else [])
    # No progress bars: the Rust trainers draw them on stdout, which belongs to the CLI (library code never prints).
    trainer_args: dict[str, Any] = dict(
        vocab_size=vocab_size, min_frequency=min_freq, special_tokens=specials, show_progress=False
    )
    trainer: trainers.Trainer

    if kind == "word":
        backend = Backend(models.WordLevel(unk_token="<unk>"))
        backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()  # split on whitespace and punctuation
        trainer = trainers.WordLevelTrainer(**trainer_args)
        backend.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces, glues punctuation sensibly
    elif kind == "bpe":
        backend = Backend(models.BPE(unk_token="<unk>"))
        backend.pre_tokenizer = pre_tokenizers.Metaspace()  # "▁" marks a space, so decoding is exact
        backend.decoder = decoders.Metaspace()
        trainer = trainers.BpeTrainer(**trainer_args)
    else:
        backend = Backend(models.WordPiece(unk_token="<unk>"))
        backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        backend.decoder = decoders.WordPiece(prefix="##")
        trainer = trainers.WordPieceTrainer(**trainer_args)
    backend.normalizer = normalizers.Sequence(steps)
    backend.train_from_iterator(texts, trainer=trainer)
    if add_cls:
        cls_id = backend.token_to_id("<cls>")
        backend.post_processor = processors.TemplateProcessing(single="<cls> $A", special_tokens=[("<cls>", cls_id)])
    return Tokenizer(backend, kind, SpecialTokens(cls="<cls>" if add_cls else None))
