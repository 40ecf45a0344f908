"""Training a tokenizer: ``train_tokenizer`` learns a vocabulary of each kind (word, BPE, WordPiece) from texts, of
at most ``vocab_size`` entries, special tokens included, and returns the ``Tokenizer`` (``tokenizer.py``) a run then
saves and uses. The word and WordPiece kinds are trained here; BPE's lossless learner is ``bpe.py``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tokenizers import Tokenizer as Backend
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers

from attnkit.errors import InputError
from attnkit.tokenization import morphemes
from attnkit.tokenization.bpe import BYTE_TOKENS, train_bpe
from attnkit.tokenization.tokenizer import KINDS, SPECIAL_TOKENS, SpecialTokens, Tokenizer


def train_tokenizer(
    texts: Iterable[str],
    *,
    kind: str = "word",
    vocab_size: int = 10000,
    min_freq: int = 2,
    add_cls: bool = False,
    lowercase: bool | None = None,
    pretokenize: str = "none",
    reserved: int = 0,
) -> Tokenizer:
    """Learn a vocabulary of at most ``vocab_size`` entries (special tokens included) from ``texts``.

    Args:
        kind: "word", "bpe" or "wordpiece".
        min_freq: a word (word kind) or merge pair (subword kinds) must occur this often to get an id.
        add_cls: prepend <cls> to every encoding (for first-token pooling).
        lowercase: default True for word and wordpiece, False for bpe (translation keeps case; a lower-cased bpe
            is not lossless).
        pretokenize: "morphemes" (word kind only): Korean morphemes are the units (``morphemes.py``).
        reserved: ids of ``vocab_size`` kept for tokens the caller adds after training (pretraining's <mask>).
    """
    if kind not in KINDS:
        raise InputError(f"tokenizer kind {kind!r}; expected one of {', '.join(KINDS)}")
    if pretokenize not in morphemes.PRETOKENIZERS:
        choices = ", ".join(morphemes.PRETOKENIZERS)
        raise InputError(f"config key pretokenize={pretokenize!r}; expected one of {choices}")
    if pretokenize != "none" and kind != "word":
        # WordPiece's own "##" continuation mark would collide with the attached-morpheme mark; BPE is lossless.
        raise InputError(f"config key pretokenize={pretokenize!r} applies to tokenizer=word, not {kind}")
    fixed = {"special": len(SPECIAL_TOKENS), "byte-fallback": len(BYTE_TOKENS) if kind == "bpe" else 0}
    fixed["<mask>" if reserved == 1 else "reserved"] = reserved
    if vocab_size <= sum(fixed.values()):  # said in the user's own number (pretraining's <mask> counted in it)
        counts = [f"{n} {name}" for name, n in fixed.items() if n]
        what = ", ".join(counts[:-1]) + f" and {counts[-1]}" if len(counts) > 1 else counts[0]
        raise InputError(
            f"config key vocab_size={vocab_size} leaves no room for {kind} entries beyond the {what} tokens; use "
            f"vocab_size > {sum(fixed.values())}"
        )
    vocab_size -= reserved
    if lowercase is None:
        lowercase = kind != "bpe"
    specials = list(SPECIAL_TOKENS)
    # No progress bars: the Rust trainers draw them on stdout, which belongs to the CLI (library code never prints).
    trainer_args: dict[str, Any] = dict(
        vocab_size=vocab_size, min_frequency=min_freq, special_tokens=specials, show_progress=False
    )
    trainer: trainers.Trainer

    if kind == "bpe":
        backend = train_bpe(texts, trainer_args, lowercase)
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
