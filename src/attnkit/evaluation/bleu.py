"""Corpus BLEU and chrF through sacreBLEU, on detokenized text, with sacreBLEU's signature so that figures can be
compared across papers and tools (Post, 2018)."""

from __future__ import annotations


def corpus_scores(hypotheses: list[str], references: list[str]) -> dict:
    """``{"bleu", "chrf", "signature"}`` of detokenized hypotheses against one reference each."""
    from sacrebleu.metrics import BLEU, CHRF

    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    bleu, chrf = BLEU(), CHRF()
    bleu_score = bleu.corpus_score(hypotheses, [references])
    chrf_score = chrf.corpus_score(hypotheses, [references])
    return {
        "bleu": round(bleu_score.score, 2),
        "chrf": round(chrf_score.score, 2),
        "signature": str(bleu.get_signature()),
        "chrf_signature": str(chrf.get_signature()),
    }
