"""Tokenizers of every kind: exact save/load, fingerprints, the word vocabulary's rules (lower case, punctuation,
<pad>/<unk> ids, min_freq, the size cap), detokenized BPE output, the CLS token, and no crash on any text."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnkit.errors import InputError
from attnkit.tokenization import SPECIAL_TOKENS, Tokenizer, train_tokenizer

KINDS = ("word", "bpe", "wordpiece")
CORPUS = [
    "This movie was absolutely amazing, and I loved every moment!",
    "The performance was outstanding and truly inspiring.",
    "I had a wonderful experience; would I recommend it? Yes.",
    "Terrible plot, awful acting: a complete waste of time.",
    "The food was cold and the service was slow.",
    "Great! It's the best film I've seen this year.",
] * 3
OTHER_CORPUS = ["Der Hund schläft im Garten.", "Die Katze trinkt Milch, und der Hund bellt."] * 3
# Unseen sentences made of words and characters from CORPUS, so that BPE needs no <unk>.
UNSEEN = ["I loved the service, truly!", "It was a waste? The acting was amazing.", "absolutely the best year"]
UNKNOWN_WORDS = ["zebra xylophone quokka", "Ünïcödé ☃ 漢字"]

KIND = pytest.mark.parametrize("kind", KINDS)


def tokenizer(
    kind: str, corpus: list[str] = CORPUS, *, vocab_size: int = 300, min_freq: int = 1, **kwargs
) -> Tokenizer:
    return train_tokenizer(corpus, kind=kind, vocab_size=vocab_size, min_freq=min_freq, **kwargs)


# ---------------------------------------------------------------------------------------------------------------
# Save, load, fingerprint


@KIND
def test_save_and_load_restore_identical_encodings(kind, tmp_path):
    original = tokenizer(kind)
    path = tmp_path / "tokenizer.json"
    original.save(path)
    loaded = Tokenizer.load(path, json.loads(json.dumps(original.meta())))  # meta goes through config.json
    for text in UNSEEN + UNKNOWN_WORDS:
        assert loaded.encode(text) == original.encode(text)
        assert loaded.tokens(text) == original.tokens(text)
    ids = [original.encode(text) for text in UNSEEN]
    assert loaded.decode_batch(ids) == original.decode_batch(ids)
    assert (loaded.vocab_size, loaded.pad_id, loaded.unk_id, loaded.kind) == (
        original.vocab_size,
        original.pad_id,
        original.unk_id,
        kind,
    )
    assert loaded.fingerprint() == original.fingerprint()
    assert [p.name for p in tmp_path.iterdir()] == ["tokenizer.json"]  # no temporary file left behind


@KIND
def test_fingerprint_tells_tokenizers_apart(kind):
    assert tokenizer(kind).fingerprint() != tokenizer(kind, OTHER_CORPUS).fingerprint()


@pytest.mark.parametrize(
    "kind",
    [
        "word",
        "bpe",
        # The trainer numbers "##" pieces in hash-map order, so ties and ids differ from run to run (upstream bug).
        pytest.param("wordpiece", marks=pytest.mark.xfail(reason="huggingface/tokenizers#1794", strict=False)),
    ],
)
def test_training_is_deterministic(kind):
    assert tokenizer(kind).fingerprint() == tokenizer(kind).fingerprint()


@KIND
def test_load_with_a_mismatched_fingerprint_is_an_error(kind, tmp_path):
    path = tmp_path / "tokenizer.json"
    tokenizer(kind).save(path)
    meta = {**tokenizer(kind).meta(), "fingerprint": tokenizer(kind, OTHER_CORPUS).fingerprint()}
    with pytest.raises(InputError, match="fingerprint"):
        Tokenizer.load(path, meta)


def test_edited_tokenizer_file_fails_the_fingerprint_check(tmp_path):
    original = tokenizer("word")
    path = tmp_path / "tokenizer.json"
    original.save(path)
    data = json.loads(path.read_text(encoding="utf-8"))
    vocab = data["model"]["vocab"]
    vocab["great"], vocab["awful"] = vocab["awful"], vocab["great"]  # same size, same tokens, swapped meaning
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(InputError, match="tokenizer.json"):
        Tokenizer.load(path, original.meta())


def test_failed_save_keeps_the_previous_file(tmp_path, monkeypatch):
    path = tmp_path / "tokenizer.json"
    tokenizer("word").save(path)
    before = path.read_bytes()

    def fail(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        tokenizer("word", OTHER_CORPUS).save(path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["tokenizer.json"]


@KIND
def test_training_prints_nothing(kind, capfd):
    # The Rust trainers draw progress bars on file descriptor 1, which is where the CLI prints its JSON.
    tokenizer(kind)
    out, err = capfd.readouterr()
    assert (out, err) == ("", "")


# ---------------------------------------------------------------------------------------------------------------
# The word vocabulary


def test_word_kind_lower_cases_and_splits_punctuation():
    tok = tokenizer("word")
    assert tok.tokens("Great!") == ["great", "!"]
    assert tok.tokens("It's the BEST film.") == ["it", "'", "s", "the", "best", "film", "."]
    assert tok.encode("GREAT") == tok.encode("great")


def test_special_tokens_take_the_first_ids():
    tok = tokenizer("word")
    assert (tok.pad_id, tok.unk_id) == (0, 1)
    assert [tok.backend.token_to_id(token) for token in SPECIAL_TOKENS] == list(range(len(SPECIAL_TOKENS)))


def test_unseen_word_is_unk():
    tok = tokenizer("word")
    assert tok.encode("zebra") == [tok.unk_id]
    assert tok.encode("a zebra") == [tok.encode("a")[0], tok.unk_id]
    assert tok.unk_id not in tok.encode("great")


def test_min_freq():
    texts = ["common rare", "common other", "other"]  # "rare" once, the others twice
    strict = tokenizer("word", texts, min_freq=2)
    assert strict.encode("rare") == [strict.unk_id]
    assert strict.unk_id not in strict.encode("common other")
    lenient = tokenizer("word", texts, min_freq=1)
    assert lenient.encode("rare") != [lenient.unk_id]


def test_vocab_size_cap():
    assert tokenizer("word").vocab_size > 20  # the corpus has more words than the cap below
    capped = tokenizer("word", vocab_size=20)
    assert capped.vocab_size == 20
    assert all(i < 20 for text in CORPUS for i in capped.encode(text))


def test_vocab_size_must_leave_room_beyond_the_special_tokens():
    with pytest.raises(InputError, match="vocab_size=5"):
        tokenizer("word", vocab_size=len(SPECIAL_TOKENS))


# ---------------------------------------------------------------------------------------------------------------
# Subwords and the CLS token


DETOKENIZED = [*UNSEEN, "Great! It's the best film I've seen this year.", "Yes; a waste? The plot: amazing."]


@pytest.mark.parametrize("text", DETOKENIZED)
def test_bpe_decodes_to_the_original_text(text):
    # Translation output is detokenized: case, spaces and punctuation come back exactly.
    tok = tokenizer("bpe")
    assert tok.decode(tok.encode(text)) == text


def test_wordpiece_splits_unseen_words_into_known_pieces():
    tok = tokenizer("wordpiece")
    assert tok.unk_id not in tok.encode("lovedmoment")
    assert len(tok.encode("lovedmoment")) > 1


@KIND
def test_add_cls_prepends_the_cls_id(kind):
    plain, with_cls = tokenizer(kind), tokenizer(kind, add_cls=True)
    assert plain.cls_id is None
    assert with_cls.cls_id == SPECIAL_TOKENS.index("<cls>")
    for text in UNSEEN:
        without = with_cls.backend.encode(text, add_special_tokens=False).ids
        assert with_cls.encode(text) == [with_cls.cls_id] + without
        assert with_cls.decode(with_cls.encode(text)) == with_cls.decode(without)  # CLS is not decoded
    assert with_cls.encode_batch(UNSEEN) == [with_cls.encode(text) for text in UNSEEN]


# ---------------------------------------------------------------------------------------------------------------
# Any text

TRAINED = {kind: tokenizer(kind) for kind in KINDS}


@KIND
@settings(max_examples=100, deadline=None)
@given(text=st.text())
def test_any_text_encodes_to_ids_inside_the_vocabulary(kind, text):
    tok = TRAINED[kind]
    ids = tok.encode(text)
    assert all(0 <= i < tok.vocab_size for i in ids)
    assert len(tok.tokens(text)) == len(ids)


# ---------------------------------------------------------------------------------------------------------------
# Long texts: only the part a model can read is encoded


@KIND
@pytest.mark.parametrize("add_cls", [False, True])
@settings(max_examples=25, deadline=None)
@given(
    words=st.lists(st.sampled_from([*" ".join(CORPUS + UNKNOWN_WORDS).split(), "x" * 300, "", "a.b,c"]), max_size=80),
    max_tokens=st.integers(1, 40),
)
def test_a_bounded_encoding_starts_as_the_whole_one(kind, add_cls, words, max_tokens):
    tok = _cached_tokenizer(kind, add_cls)
    texts = [" ".join(words), "  ".join(words), "short one"]
    whole = tok.encode_batch(texts)
    bounded = tok.encode_batch(texts, max_tokens)
    for full, part in zip(whole, bounded):
        assert part[:max_tokens] == full[:max_tokens]
        assert len(part) > max_tokens or part == full  # a text cut short still shows it was longer than the limit


_TOKENIZERS: dict[tuple[str, bool], Tokenizer] = {}


def _cached_tokenizer(kind: str, add_cls: bool) -> Tokenizer:
    if (kind, add_cls) not in _TOKENIZERS:
        _TOKENIZERS[kind, add_cls] = tokenizer(kind, add_cls=add_cls)
    return _TOKENIZERS[kind, add_cls]


@KIND
def test_a_20_mb_line_is_encoded_only_as_far_as_the_limit_reaches(kind):
    """Encoded whole, a 20 MB line took 2.6 GB; bounded, only its beginning is read."""
    tok = _cached_tokenizer(kind, False)
    line = "the acting was amazing " * 900_000  # 20.7 MB
    (ids,) = tok.encode_batch([line], 128)
    assert 128 < len(ids) < 16 * 129
    assert tok.count_unknown([line, line], 128) == 0
