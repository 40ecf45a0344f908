"""One tokenizer type for every kind of vocabulary, backed by Hugging Face's `tokenizers` (Rust, fast, exact
save/load).

Kinds:
    word       lower-cased words and punctuation (the simple vocabulary of reference note 000, done properly:
               "great!" is two tokens, unseen words map to <unk>); min frequency and max size. With
               ``pretokenize="morphemes"`` the units are Korean morphemes (``morphemes.py``).
    bpe        byte-pair encoding (Sennrich et al.), the paper's shared source/target vocabulary (§5.1). Lossless:
               no normalisation, and a character outside the learned alphabet falls back to its UTF-8 bytes, so
               ``decode(encode(x)) == x`` for any text (``bpe.py`` says why this scheme).
    wordpiece  BERT's subword scheme, lower-cased.

Nothing is dropped without a trace: decoding skips the padding and sequence-marking specials but writes <unk> where
an unknown token stood (the word and wordpiece kinds, and BPE tokenizers saved before byte fallback, which normalised
with NFKC and mapped characters outside their alphabet to <unk>; those still load and encode as before).

Attnkit's own special tokens take the first ids: <pad> = 0, <unk> = 1, <cls> = 2, <bos> = 3, <eos> = 4.
A pretrained tokenizer (a BERT folder) keeps its own ids; ``Tokenizer`` only records which tokens play which role.

This module is the tokenizer a run loads and uses: encoding and decoding, the fingerprint that ties a model to its
vocabulary, saving and loading. Learning a vocabulary from text is ``train.py`` (``train_tokenizer``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as Backend

from attnkit.atomic import atomic_write_bytes
from attnkit.errors import InputError
from attnkit.tokenization import morphemes

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

    def __init__(self, backend: Backend, kind: str, specials: SpecialTokens, pretokenize: str = "none"):
        """``pretokenize``: "morphemes" splits text into Korean morphemes before the backend (``morphemes.py``)."""
        if pretokenize not in morphemes.PRETOKENIZERS:
            raise InputError(f"tokenizer pretokenize={pretokenize!r}; expected one of {morphemes.PRETOKENIZERS}")
        if pretokenize == "morphemes":
            morphemes.check_available()
        self.backend = backend
        self.kind = kind
        self.specials = specials
        self.pretokenize = pretokenize
        self.lossless = is_lossless(backend)
        # A lossless tokenizer reads "<pad>" in the input as five characters, not as the padding id, which decoding
        # would then drop. Not part of tokenizer.json (nor of the fingerprint): it follows from the model above.
        backend.encode_special_tokens = self.lossless
        self.pad_id = self._id(specials.pad)
        self.unk_id = self._id(specials.unk)
        self.cls_id = self._id(specials.cls) if specials.cls else None
        self.bos_id = self._id(specials.bos) if specials.bos else None
        self.eos_id = self._id(specials.eos) if specials.eos else None
        # Decoding skips these (padding, sequence marks, BERT's [SEP]...) and keeps <unk> visible.
        self._skipped = {
            i for i, token in backend.get_added_tokens_decoder().items() if token.special and i != self.unk_id
        }

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

    def _pre(self, text: str) -> str:
        return morphemes.split_morphemes(text) if self.pretokenize == "morphemes" else text

    def encode(self, text: str) -> list[int]:
        """Ids of ``text``, with the CLS token first when the tokenizer has one."""
        try:
            return self.backend.encode(self._pre(text)).ids
        except TypeError:  # the backend takes Unicode text only: say which character is not
            _refuse_lone_surrogates([text])
            raise

    def encode_batch(self, texts: list[str], max_tokens: int | None = None) -> list[list[int]]:
        """Ids of each text. With ``max_tokens``, a long text is encoded only as far as it gives more than
        ``max_tokens`` ids, which are then the first ids of the whole text: what a model of that length can read
        costs memory in proportion to it, whatever the text's length (a 20 MB line encoded whole took 2.6 GB)."""
        if max_tokens is None:
            try:
                return [encoding.ids for encoding in self.backend.encode_batch([self._pre(text) for text in texts])]
            except TypeError:
                _refuse_lone_surrogates(texts)
                raise
        ids: list[list[int]] = [[] for _ in texts]
        todo, chars = list(range(len(texts))), CHARS_PER_TOKEN * (max_tokens + 1)
        while todo:
            heads = [_head(texts[i], chars) for i in todo]
            again = []
            for i, head, seq in zip(todo, heads, self.encode_batch(heads)):
                if len(seq) > max_tokens or len(head) == len(texts[i]):
                    ids[i] = seq
                else:  # long tokens (or many spaces): a longer part of the text
                    again.append(i)
            todo, chars = again, 2 * chars
        return ids

    def tokens(self, text: str) -> list[str]:
        """The token strings of ``text`` (for attention-map labels and for reading what the model sees)."""
        try:
            return self.backend.encode(self._pre(text)).tokens
        except TypeError:
            _refuse_lone_surrogates([text])
            raise

    def count_unknown(self, texts: list[str], max_tokens: int | None = None) -> int:
        """How many tokens of ``texts`` (of their first ``max_tokens``, the part a model reads) are <unk> (always 0
        for a lossless tokenizer)."""
        return sum(ids[:max_tokens].count(self.unk_id) for ids in self.encode_batch(texts, max_tokens))

    def decode(self, ids: Iterable[int]) -> str:
        """Ids -> text, subwords joined (detokenized); padding and the sequence-marking specials are dropped, and
        an unknown token is written as <unk>, visibly, rather than silently left out."""
        return self.backend.decode([i for i in ids if i not in self._skipped], skip_special_tokens=False)

    def decode_batch(self, batch: list[list[int]]) -> list[str]:
        kept = [[i for i in ids if i not in self._skipped] for ids in batch]
        return self.backend.decode_batch(kept, skip_special_tokens=False)

    def fingerprint(self) -> str:
        """sha256 of the canonical serialization: two tokenizers with the same fingerprint encode identically. The
        Python pre-tokenizer is part of it (a suffix only when there is one, so older fingerprints are unchanged)."""
        canonical = json.dumps(json.loads(self.backend.to_str()), sort_keys=True, ensure_ascii=False)
        if self.pretokenize != "none":
            canonical += f"\npretokenize={self.pretokenize}"
        return hashlib.sha256(canonical.encode("utf-8")).hexdigest()

    def meta(self) -> dict:
        """What, besides ``tokenizer.json``, restores this tokenizer (stored in the run's config). ``lossless``
        is a record (it follows from the file); ``pretokenize`` is needed to reload, and absent when "none"."""
        meta: dict[str, Any] = {"kind": self.kind, "specials": asdict(self.specials), "fingerprint": self.fingerprint()}
        meta["lossless"] = self.lossless
        if self.pretokenize != "none":
            meta["pretokenize"] = self.pretokenize
        return meta

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
        tokenizer = cls(backend, meta["kind"], SpecialTokens(**meta["specials"]), meta.get("pretokenize", "none"))
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


# How far into a text ``encode_batch(texts, max_tokens)`` first looks: this many characters per token wanted (a token
# of English or Korean text is a few characters; a longer part is encoded when this gives too few).
CHARS_PER_TOKEN = 16


def _refuse_lone_surrogates(texts: Iterable[str]) -> None:
    """An ``InputError`` naming the first lone surrogate (U+D800-DFFF) of ``texts``, if one has any: a Python string
    may hold one (``"\\ud800"``, or bytes decoded with ``errors="surrogateescape"``), but it is no Unicode character,
    and the tokenizer library refuses such a string with a bare ``TypeError``."""
    for n, text in enumerate(texts):
        for i, char in enumerate(text):
            if "\ud800" <= char <= "\udfff":
                raise InputError(
                    f"text #{n + 1}: character {i + 1} is a lone surrogate (U+{ord(char):04X}), not Unicode text "
                    "(read the input as UTF-8, or decode it with errors='replace')"
                )


def _head(text: str, chars: int) -> str:
    """The beginning of ``text``, about ``chars`` characters, cut before a space: every pre-tokenizer here splits
    text at spaces, so the tokens of the part are the whole text's first tokens. A text with no space there (one
    long word) is cut at ``chars``."""
    if len(text) <= chars:
        return text
    cut = text.rfind(" ", 0, chars + 1)
    return text[:cut] if cut > 0 else text[:chars]


def is_lossless(backend: Backend) -> bool:
    """Whether ``backend`` is the lossless BPE that ``train_tokenizer`` builds: byte fallback and no normaliser
    beyond the prepended space (a tokenizer saved before it, with NFKC, is not)."""
    data = json.loads(backend.to_str())
    normalizer = data.get("normalizer") or {}
    return bool(data["model"].get("byte_fallback")) and normalizer.get("type") == "Prepend"
