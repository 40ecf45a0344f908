"""A trained translator, loaded from its run directory: translate text, evaluate with sacreBLEU."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from attnkit.config import TranslatorConfig
from attnkit.data.readers.parallel import Pair
from attnkit.decoding.corpus import translate_ids
from attnkit.devices import check_device
from attnkit.errors import check_records
from attnkit.evaluation.bleu import bleu_metric, corpus_scores
from attnkit.inference import prepare_for_inference, quantize_for_inference
from attnkit.model.transformer import Transformer
from attnkit.runs import load_run
from attnkit.tasks.translate.data import encode_sources
from attnkit.training.precision import DECODING_PRECISIONS, DTYPES, check_precision

log = logging.getLogger(__name__)


class TranslatorRun:
    """Model and shared tokenizer of one translation run directory (or an averaged one)."""

    def __init__(self, run_dir: str | Path, precision: str = "fp32", device: torch.device | str = "cpu"):
        """The run's model on ``device``. ``precision="bf16"`` (GPUs, CPUs with AMX / AVX512-BF16) or ``"fp16"``
        (CUDA only): the weights and activations are cast to that type for decoding, which halves the bytes a
        decoding step reads; the search still ranks float32 log-probabilities. ``"int8"`` (CPUs): bf16 with every
        weight matrix rounded to int8, one scale per row, which halves them again where a product has one to four
        rows (one sentence at a time: ``attnkit.inference.quantize``)."""
        self.device = check_device(device)
        check_precision(precision, self.device, what="precision", allowed=DECODING_PRECISIONS)
        self.precision = precision
        loaded = load_run(run_dir, task="translate", device=self.device)
        self.max_len_policy = loaded.max_len_policy
        self.tokenizer = loaded.tokenizer
        if not isinstance(loaded.model, Transformer) or not isinstance(loaded.model_cfg, TranslatorConfig):
            raise TypeError(f"load_run(task='translate') returned a {type(loaded.model).__name__}")
        self.model_cfg: TranslatorConfig = loaded.model_cfg
        self.model: Transformer = loaded.model
        if precision == "int8":
            quantize_for_inference(self.model)
        else:
            prepare_for_inference(self.model.to(DTYPES.get(precision, torch.float32)))
        self.run_dir = loaded.run_dir

    def encode_sources(self, texts: list[str]) -> tuple[list[list[int]], int]:
        """The token ids of each text as the model reads it (ending with EOS; longer than the run's ``max_len``:
        cut, or an ``InputError`` under the run's ``max_len_policy="error"``), and how many were cut: the input of
        ``greedy_decode`` and ``beam_search`` once padded."""
        return encode_sources(self.tokenizer, texts, self.model_cfg.max_len, self.max_len_policy)

    def translate(
        self, texts: list[str], *, beam: int = 4, alpha: float = 0.6, length_penalty: str = "gnmt", batch_size: int = 32
    ) -> tuple[list[str], int]:
        """Detokenized translations in input order, and how many sources were truncated. ``beam``: the beam size,
        1 for greedy search (§6.1: 4); ``alpha`` and ``length_penalty`` rank the finished hypotheses
        (``decoding.penalty``); ``batch_size``: the most sentences decoded together (sources of similar length are
        batched together; the translations do not depend on it)."""
        ids, n_truncated = self.encode_sources(texts)
        with torch.inference_mode():
            hyps = translate_ids(
                self.model,
                self.tokenizer,
                ids,
                beam=beam,
                alpha=alpha,
                length_penalty=length_penalty,
                batch_size=batch_size,
            )
        if n_empty := sum(not hyp for hyp in hyps):  # blank lines in the output, which look like a bug of the tool
            log.warning(
                "%d of %d translations are empty: the model put the end token first (an undertrained model's usual "
                "answer)",
                n_empty,
                len(hyps),
            )
        return self.tokenizer.decode_batch(hyps), n_truncated

    def evaluate(
        self,
        pairs: list[Pair],
        *,
        beam: int = 4,
        alpha: float = 0.6,
        length_penalty: str = "gnmt",
        bleu_tokenize: str = "13a",
    ) -> dict:
        """sacreBLEU BLEU (with ``bleu_tokenize``, e.g. "ko-mecab" for Korean) and chrF of the translations of
        ``pairs`` (detokenized), with signatures."""
        pairs = check_records(pairs, Pair, "pairs", reader="attnkit.read_parallel_tsv")
        bleu_metric(bleu_tokenize)  # a missing analyser fails before the translating
        hyps, n_truncated = self.translate(
            [p.source for p in pairs], beam=beam, alpha=alpha, length_penalty=length_penalty
        )
        refs = [p.target for p in pairs]
        exact = sum(h.strip() == r.strip() for h, r in zip(hyps, refs)) / max(1, len(refs))
        return {
            **corpus_scores(hyps, refs, tokenize=bleu_tokenize),
            "exact_match": round(exact, 4),
            "n": len(pairs),
            "beam": beam,
            "truncated": n_truncated,
        }
