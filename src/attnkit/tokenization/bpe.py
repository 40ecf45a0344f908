"""The lossless BPE learner behind ``train_tokenizer(kind="bpe")``: merges learned on the text as it is (a space
prepended, lower-cased only when asked), then the 256 byte-fallback tokens given the ids after the specials, so that
any text round-trips (``LOSSLESS`` below says why this scheme).

Its vocabulary-size guarantees: ``vocab_size`` must leave room beyond the special and byte tokens, and the learned
alphabet is cut to the characters the rest has room for (the most frequent; the others are spelled in bytes), ties
broken by code point so that the same data always gives the same tokenizer. ``_CharacterCounts`` counts the
characters for that cut as the learner reads the text.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
from tokenizers import Tokenizer as Backend
from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers

from attnkit.errors import InputError
from attnkit.tokenization.tokenizer import SPECIAL_TOKENS

# LOSSLESS: BPE with byte fallback (SentencePiece's scheme), not byte-level BPE (GPT-2's). Byte-level BPE starts
# from the 256 byte values, so every Hangul syllable (3 UTF-8 bytes) costs two merges before it is even one token,
# and the rare ones stay split into byte pieces the model must learn to assemble; with byte fallback the learned
# alphabet is characters, so a syllable seen in training is one token from the start and the 256 byte tokens are
# used only for characters never seen (an emoji, an old jamo). Both reserve the same 256 ids. Spaces stay literal
# characters of the tokens (no "▁" mark, which would turn a literal "▁" in the input into a space), a space is
# prepended so that a sentence's first word is the same token as a later one, and the decoder strips it again.
BYTE_TOKENS = tuple(f"<0x{b:02X}>" for b in range(256))


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


def train_bpe(texts: Iterable[str], trainer_args: dict[str, Any], lowercase: bool) -> Backend:
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
