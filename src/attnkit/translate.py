"""A trained translator, loaded from its run directory: translate text, evaluate with sacreBLEU."""

from __future__ import annotations

from pathlib import Path

import torch

from attnkit.config import TranslatorConfig
from attnkit.data.batching import apply_length_policy, bucketed_batches, pad
from attnkit.data.readers import Pair
from attnkit.errors import InputError
from attnkit.evaluation.bleu import corpus_scores
from attnkit.model.build import build_translator, prepare_for_inference
from attnkit.model.transformer import Transformer
from attnkit.tokenization import Tokenizer
from attnkit.training import checkpoint


def translate_ids(
    model: Transformer,
    tokenizer: Tokenizer,
    sources: list[list[int]],
    *,
    beam: int = 4,
    alpha: float = 0.6,
    length_penalty: str = "gnmt",
    batch_size: int = 32,
) -> list[list[int]]:
    """Decode encoded sources (each ending with EOS) in input order; batches are length-sorted to save padding.

    beam 1 is greedy search; beam > 1 is beam search with the paper's length penalty (§6.1: beam 4, alpha 0.6).
    """
    from attnkit.decoding import beam_search, greedy_decode

    max_positions = model.embeddings.position.max_len
    out: list[list[int]] = [[] for _ in sources]
    for batch in bucketed_batches([len(s) for s in sources], batch_size, generator=None, bucket_factor=10**9):
        src = pad([sources[i] for i in batch], tokenizer.pad_id)  # (B, S)
        if beam == 1:
            hyps = greedy_decode(model, src, bos_id=tokenizer.bos_id, eos_id=tokenizer.eos_id, max_positions=max_positions)
        else:
            hyps = beam_search(model, src, beam_size=beam, alpha=alpha, length_penalty=length_penalty,
                               bos_id=tokenizer.bos_id, eos_id=tokenizer.eos_id, max_positions=max_positions)
        for i, hyp in zip(batch, hyps):
            out[i] = hyp
    return out


def encode_sources(tokenizer: Tokenizer, texts: list[str], max_len: int, policy: str) -> tuple[list[list[int]], int]:
    """Source ids + EOS, as in training; over-long sources are truncated (keeping the EOS, and counted) or refused,
    as the run was configured. Returns the ids and how many were truncated."""
    for i, text in enumerate(texts, start=1):
        if not text.strip():
            raise InputError(f"source line {i} is empty")
    ids = [s + [tokenizer.eos_id] for s in tokenizer.encode_batch(texts)]
    ids, cut = apply_length_policy(ids, max_len, policy, what="source sentence", keep_last=1)
    return ids, cut.n_truncated


class TranslatorRun:
    """Model and shared tokenizer of one translation run directory (or an averaged one)."""

    def __init__(self, run_dir: str | Path):
        run_dir = checkpoint.check_run_dir(run_dir)
        config = checkpoint.read_json(run_dir / checkpoint.CONFIG)
        if config.get("task") != "translate":
            raise InputError(f"{run_dir}: is a {config.get('task')!r} run, not a translator")
        try:
            self.model_cfg = TranslatorConfig(**config["model"])
            self.max_len_policy = config["train"]["max_len_policy"]
            tokenizer_meta = config["tokenizer"]
        except (KeyError, TypeError) as err:
            raise InputError(f"{run_dir / checkpoint.CONFIG}: missing or unknown key ({err})") from None
        self.tokenizer = Tokenizer.load(run_dir / checkpoint.TOKENIZER, tokenizer_meta)
        self.model = build_translator(self.model_cfg, pad_id=self.tokenizer.pad_id)
        checkpoint.load_weights(self.model, run_dir / checkpoint.WEIGHTS)
        prepare_for_inference(self.model)  # eval mode, W^Q W^K W^V fused once the weights are loaded
        self.run_dir = run_dir

    def encode_sources(self, texts: list[str]) -> tuple[list[list[int]], int]:
        return encode_sources(self.tokenizer, texts, self.model_cfg.max_len, self.max_len_policy)

    def translate(self, texts: list[str], *, beam: int = 4, alpha: float = 0.6, length_penalty: str = "gnmt",
                  batch_size: int = 32) -> tuple[list[str], int]:
        """Detokenized translations in input order, and how many sources were truncated."""
        ids, n_truncated = self.encode_sources(texts)
        with torch.inference_mode():
            hyps = translate_ids(self.model, self.tokenizer, ids, beam=beam, alpha=alpha,
                                 length_penalty=length_penalty, batch_size=batch_size)
        return self.tokenizer.decode_batch(hyps), n_truncated

    def evaluate(self, pairs: list[Pair], *, beam: int = 4, alpha: float = 0.6, length_penalty: str = "gnmt") -> dict:
        """sacreBLEU BLEU and chrF of the translations of ``pairs`` (detokenized), with signatures."""
        hyps, n_truncated = self.translate([p.source for p in pairs], beam=beam, alpha=alpha, length_penalty=length_penalty)
        refs = [p.target for p in pairs]
        exact = sum(h.strip() == r.strip() for h, r in zip(hyps, refs)) / max(1, len(refs))
        return {**corpus_scores(hyps, refs), "exact_match": round(exact, 4), "n": len(pairs), "beam": beam,
                "truncated": n_truncated}
