"""One tokenizer type for every kind of vocabulary, backed by Hugging Face's `tokenizers` (Rust, fast, exact
save/load).

Kinds:
    word       lower-cased words and punctuation (the simple vocabulary of reference note 000, done properly:
               "great!" is two tokens, unseen words map to <unk>); min frequency and max size. With
               ``pretokenize="morphemes"`` the units are Korean morphemes (``morphemes.py``).
    bpe        byte-pair encoding (Sennrich et al.), the paper's shared source/target vocabulary (§5.1). Lossless:
               no normalisation, and a character outside the learned alphabet falls back to its UTF-8 bytes, so
               ``decode(encode(x)) == x`` for any text (``LOSSLESS`` below says why this scheme).
    wordpiece  BERT's subword scheme, lower-cased.

Nothing is dropped without a trace: decoding skips the padding and sequence-marking specials but writes <unk> where
an unknown token stood (the word and wordpiece kinds, and BPE tokenizers saved before byte fallback, which normalised
with NFKC and mapped characters outside their alphabet to <unk>; those still load and encode as before).

Attnkit's own special tokens take the first ids: <pad> = 0, <unk> = 1, <cls> = 2, <bos> = 3, <eos> = 4.
A pretrained tokenizer (a BERT folder) keeps its own ids; ``Tokenizer`` only records which tokens play which role.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer as Backend
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers

from attnkit.atomic import atomic_write_bytes
from attnkit.errors import InputError
from attnkit.tokenization import morphemes

SPECIAL_TOKENS = ("<pad>", "<unk>", "<cls>", "<bos>", "<eos>")
KINDS = ("word", "bpe", "wordpiece")
# LOSSLESS: BPE with byte fallback (SentencePiece's scheme), not byte-level BPE (GPT-2's). Byte-level BPE starts
# from the 256 byte values, so every Hangul syllable (3 UTF-8 bytes) costs two merges before it is even one token,
# and the rare ones stay split into byte pieces the model must learn to assemble; with byte fallback the learned
# alphabet is characters, so a syllable seen in training is one token from the start and the 256 byte tokens are
# used only for characters never seen (an emoji, an old jamo). Both reserve the same 256 ids. Spaces stay literal
# characters of the tokens (no "▁" mark, which would turn a literal "▁" in the input into a space), a space is
# prepended so that a sentence's first word is the same token as a later one, and the decoder strips it again.
BYTE_TOKENS = tuple(f"<0x{b:02X}>" for b in range(256))


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
                    f"text {n}: character {i} is a lone surrogate (U+{ord(char):04X}), not Unicode text "
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


def train_tokenizer(
    texts: Iterable[str],
    *,
    kind: str = "word",
    vocab_size: int = 10000,
    min_freq: int = 2,
    add_cls: bool = False,
    lowercase: bool | None = None,
    pretokenize: str = "none",
) -> Tokenizer:
    """Learn a vocabulary of at most ``vocab_size`` entries (special tokens included) from ``texts``.

    Args:
        kind: "word", "bpe" or "wordpiece".
        min_freq: a word (word kind) or merge pair (subword kinds) must occur this often to get an id.
        add_cls: prepend <cls> to every encoding (for first-token pooling).
        lowercase: default True for word and wordpiece, False for bpe (translation keeps case; a lower-cased bpe
            is not lossless).
        pretokenize: "morphemes" (word kind only): Korean morphemes are the units (``morphemes.py``).
    """
    if kind not in KINDS:
        raise InputError(f"tokenizer kind {kind!r}; expected one of {', '.join(KINDS)}")
    if pretokenize not in morphemes.PRETOKENIZERS:
        choices = ", ".join(morphemes.PRETOKENIZERS)
        raise InputError(f"config key pretokenize={pretokenize!r}; expected one of {choices}")
    if pretokenize != "none" and kind != "word":
        # WordPiece's own "##" continuation mark would collide with the attached-morpheme mark; BPE is lossless.
        raise InputError(f"config key pretokenize={pretokenize!r} applies to tokenizer=word, not {kind}")
    if vocab_size <= len(SPECIAL_TOKENS):
        raise InputError(
            f"config key vocab_size={vocab_size} leaves no room beyond the {len(SPECIAL_TOKENS)} special tokens"
        )
    if lowercase is None:
        lowercase = kind != "bpe"
    specials = list(SPECIAL_TOKENS)
    # No progress bars: the Rust trainers draw them on stdout, which belongs to the CLI (library code never prints).
    trainer_args: dict[str, Any] = dict(
        vocab_size=vocab_size, min_frequency=min_freq, special_tokens=specials, show_progress=False
    )
    trainer: trainers.Trainer

    if kind == "bpe":
        backend = _train_bpe(texts, trainer_args, lowercase)
    else:
        if kind == "word":
            backend = Backend(models.WordLevel(unk_token="<unk>"))
            # Morphemes come split (punctuation included) and marked "##" when attached, which BERT's splitting
            # on punctuation would cut apart; plain words are split on whitespace and punctuation.
            backend.pre_tokenizer = (
                pre_tokenizers.WhitespaceSplit() if pretokenize == "morphemes" else pre_tokenizers.BertPreTokenizer()
            )
            trainer = trainers.WordLevelTrainer(**trainer_args)
        else:
            backend = Backend(models.WordPiece(unk_token="<unk>"))
            backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
            # Characters and their "##" forms take two ids each: when the alphabet alone would overfill the
            # vocabulary, the rarest characters become <unk>.
            trainer = trainers.WordPieceTrainer(**trainer_args, limit_alphabet=(vocab_size - len(specials)) // 2)
        backend.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces, glues "##" pieces and punctuation
        steps = [normalizers.NFKC()] + ([normalizers.Lowercase()] if lowercase else [])
        backend.normalizer = normalizers.Sequence(steps)
        if pretokenize == "morphemes":
            morphemes.check_available()
            texts = (morphemes.split_morphemes(text) for text in texts)
        backend.train_from_iterator(texts, trainer=trainer)
    if add_cls:
        cls_id = backend.token_to_id("<cls>")
        backend.post_processor = processors.TemplateProcessing(single="<cls> $A", special_tokens=[("<cls>", cls_id)])
    return Tokenizer(backend, kind, SpecialTokens(cls="<cls>" if add_cls else None), pretokenize)


class _CharacterCounts:
    """How often each character occurs in the texts the BPE learner reads, as it sees them (a space prepended,
    lower-cased if it lower-cases), counted in chunks through numpy: a ``Counter`` a text cost a third of the
    learner's own time. The normalisation is redone here in Python, not asked of the learner: ``train_from_iterator``
    holds the learner's lock while another thread runs this generator, and a call into the learner from it (its
    ``normalizer.normalize_str``, say) waits on that lock for ever."""

    CHUNK = 1 << 20  # characters joined before they are counted (4 MiB as UTF-32)

    def __init__(self, lowercase: bool) -> None:
        self.lowercase = lowercase
        self.counts = np.zeros(0, dtype=np.int64)  # by code point, up to the highest one seen

    def counted(self, texts: Iterable[str]) -> Iterator[str]:
        """``texts``, unchanged, counted on the way through."""
        chunk: list[str] = []
        size = 0
        for text in texts:
            chunk.append(text)
            size += len(text)
            if size >= self.CHUNK:
                self._add(chunk)
                chunk, size = [], 0
            yield text
        self._add(chunk)

    def _add(self, chunk: list[str]) -> None:
        joined = "".join(chunk)
        if self.lowercase:
            joined = joined.lower()
        # UTF-32: one code point in 4 bytes. surrogatepass: a lone surrogate is left for the learner to refuse.
        points = np.frombuffer(joined.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
        found = np.bincount(points, minlength=ord(" ") + 1)  # (highest code point + 1,)
        found[ord(" ")] += sum(1 for text in chunk if text)  # normalizers.Prepend's space (not before an empty text)
        if len(found) > len(self.counts):
            self.counts = np.pad(self.counts, (0, len(found) - len(self.counts)))
        self.counts[: len(found)] += found

    def distinct(self) -> int:
        return int(np.count_nonzero(self.counts))

    def most_frequent(self, n: int) -> list[str]:
        """The ``n`` (at most ``distinct()``) most frequent characters, ties broken by code point, in code-point
        order."""
        by_count = np.lexsort((np.arange(len(self.counts)), -self.counts))[:n]  # count descending, then code point
        return [chr(point) for point in sorted(by_count.tolist())]


def _train_bpe(texts: Iterable[str], trainer_args: dict[str, Any], lowercase: bool) -> Backend:
    """The lossless BPE of ``LOSSLESS``: merges learned on the text as it is (a space prepended), then the 256 byte
    tokens given the ids after the specials, as SentencePiece numbers them."""
    vocab_size = trainer_args["vocab_size"]
    if vocab_size <= len(SPECIAL_TOKENS) + len(BYTE_TOKENS):
        raise InputError(
            f"config key vocab_size={vocab_size} leaves no room for BPE beyond the {len(SPECIAL_TOKENS)} special "
            f"and {len(BYTE_TOKENS)} byte-fallback tokens; use vocab_size > {len(SPECIAL_TOKENS) + len(BYTE_TOKENS)}"
        )
    steps = [normalizers.Prepend(" ")] + ([normalizers.Lowercase()] if lowercase else [])
    learner = Backend(models.BPE(unk_token="<unk>"))
    learner.normalizer = normalizers.Sequence(steps)
    learner.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_next")  # " word" pieces, spaces kept
    # At most the characters the learner's share of the vocabulary holds (the most frequent; the rest are spelled
    # in bytes): a vocabulary never grows past vocab_size because the text has many distinct characters.
    learned_size = vocab_size - len(BYTE_TOKENS)
    limit = learned_size - len(SPECIAL_TOKENS)
    trainer = trainers.BpeTrainer(**{**trainer_args, "vocab_size": learned_size}, limit_alphabet=limit)
    chars = _CharacterCounts(lowercase)
    learner.train_from_iterator(chars.counted(texts), trainer=trainer)

    learned = json.loads(learner.to_str())["model"]
    if chars.distinct() > limit:
        # The trainer keeps the most frequent characters, but breaks ties at the cut in hash-map order, which
        # changes from run to run (the same data and seed gave another tokenizer). The kept characters fill the
        # learned vocabulary, so it has no merges: the same vocabulary is made here with ties broken by code point,
        # numbered as the trainer numbers them (specials, then characters by code point).
        assert not learned["merges"], "an alphabet cut to fit leaves no room for merges"
        learned["vocab"] = {token: i for i, token in enumerate((*SPECIAL_TOKENS, *chars.most_frequent(limit)))}
    n_specials = len(SPECIAL_TOKENS)
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    vocab.update({token: n_specials + b for b, token in enumerate(BYTE_TOKENS)})
    for token, i in sorted(learned["vocab"].items(), key=lambda item: item[1]):
        # A learned "<0x41>" (the seven characters) would be decoded as the byte; text never holds one in practice.
        vocab.setdefault(token, i + len(BYTE_TOKENS))
    merges = [tuple(pair) for pair in learned["merges"]]
    backend = Backend(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True))
    backend.add_special_tokens(list(SPECIAL_TOKENS))
    backend.normalizer = normalizers.Sequence(steps) if lowercase else normalizers.Prepend(" ")
    backend.pre_tokenizer = learner.pre_tokenizer
    # Byte tokens back to characters (invalid UTF-8 from a model's output becomes U+FFFD), tokens joined, and the
    # prepended space removed.
    backend.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    return backend
