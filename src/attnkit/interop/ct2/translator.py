"""Translating with an export (``attnkit translate --engine ct2``): ``CT2Translator``.

Decoding with CTranslate2 as ``attnkit translate`` decodes (``CT2Translator``):
    vocabulary   the tokenizer's id -> token list, so every CTranslate2 token string is exactly one attnkit id.
    source       attnkit's ids end with EOS (truncation keeps it). The export sets ``add_source_eos``, so the
                 translator passes the tokens before that EOS and CTranslate2 appends it: the same ids, EOS once.
                 ``max_input_length=0``: CTranslate2 must not cut sources; attnkit's policy already did.
    target       starts from BOS; ``min_decoding_length=0`` (CTranslate2's default 1 would forbid an immediate EOS,
                 which attnkit allows). attnkit bans ``<pad>`` after the softmax, so that scores stay the model's
                 log-probabilities; CTranslate2 can only ban before it, renormalizing them. Greedy search bans it
                 (the arg max is the same); beam search does not, so that hypotheses are ranked by the model's own
                 log-probabilities (a trained model gives ``<pad>``, never a target, a negligible probability).
    length       §6.1: at most input length (EOS included) + 50 output tokens, EOS not counted, and no more than
                 the positional table (``max_len``). CTranslate2's ``max_decoding_length`` counts the same tokens
                 but is one number per call, so sentences are grouped by their limit, one call per group.
    ranking      CTranslate2's own length penalty divides log P(Y) by |Y|^alpha, |Y| without EOS, and its beam
                 search then stops a sentence once ``beam`` hypotheses have finished; attnkit's default is GNMT's
                 ((5 + |Y|) / 6)^alpha with |Y| counting EOS (``attnkit.decoding.penalty``), and its beam search
                 stops only when no live hypothesis can overtake the best finished one. So CTranslate2 searches
                 with ``length_penalty=0`` and returns its ``beam`` finished hypotheses with their log-probabilities
                 (EOS included), and attnkit's penalty picks the best. The result is attnkit's exactly for beam 1
                 (greedy: nothing is ranked) and for alpha = 0 (lp = 1: CTranslate2 stops when the best candidate is
                 EOS, which no live hypothesis can beat). For beam > 1 and alpha > 0 CTranslate2 may stop before a
                 longer hypothesis that attnkit waits for has finished. On a toy reversal model, of 500 beam-4
                 outputs 500 were attnkit's with GNMT alpha 0.6, 498 at alpha 1; 415 with CTranslate2's own
                 ``length_penalty=0.6``; with "power" at alpha 1, which favours long outputs most, only 369.
"""

from __future__ import annotations

from pathlib import Path

import torch

from attnkit.decoding.penalty import check_length_penalty
from attnkit.decoding.penalty import length_penalty as penalty
from attnkit.errors import InputError
from attnkit.interop.ct2.convert import import_ctranslate2, tokenizer_tokens
from attnkit.interop.ct2.export import META, TOKENIZER
from attnkit.runs import sha256_file
from attnkit.tokenization.tokenizer import Tokenizer


class CT2Translator:
    """An exported translator run by CTranslate2 (on the CPU, or a GPU with its CUDA build), with attnkit's tokenizer
    and decoding conventions.

    Args:
        model_dir: a directory written by ``export_ct2``.
        compute_type: CTranslate2's compute type; "default" keeps the stored weight type (converted when the CPU
            has no kernels for it), "int8" quantizes a float32 export when loading.
        threads: CTranslate2's ``intra_threads`` (0 = its default).
        device: ``cpu`` or ``cuda:N`` (CTranslate2 has no MPS backend).
    """

    def __init__(
        self,
        model_dir: str | Path,
        *,
        compute_type: str = "default",
        threads: int = 0,
        device: torch.device | None = None,
    ):
        from attnkit.runs import read_json

        ctranslate2 = import_ctranslate2()
        model_dir = Path(model_dir)
        if not (model_dir / META).is_file():
            raise InputError(
                f"{model_dir}: not an attnkit CTranslate2 export (no {META}); write one with `attnkit export ct2`"
            )
        meta = read_json(model_dir / META)
        try:
            self.tokenizer = Tokenizer.load(model_dir / TOKENIZER, meta["tokenizer"])
            self.max_len = int(meta["decoding"]["max_len"])
            self.max_len_policy = meta["decoding"]["max_len_policy"]
            self.max_extra = int(meta["decoding"]["max_extra"])
            hashes = meta.get("sha256", {})  # earlier exports have none
            if not isinstance(hashes, dict):
                raise ValueError("sha256 is not an object")
            for name, expected in hashes.items():
                if sha256_file(model_dir / name) != expected:
                    raise InputError(
                        f"{model_dir / name}: changed or corrupted since it was exported (sha256 differs from {META})"
                    )
        except InputError:
            raise
        except (KeyError, TypeError, ValueError) as err:
            raise InputError(f"{model_dir / META}: missing or malformed key ({err})") from None
        self.tokens = tokenizer_tokens(self.tokenizer)  # id -> token
        self.ids = {token: i for i, token in enumerate(self.tokens)}  # token -> id
        # never emitted by attnkit's search (attnkit.decoding.greedy), so greedy search gives attnkit's tokens
        self.banned = [t for t in (self.tokenizer.pad_id, self.tokenizer.bos_id) if t is not None]
        device = device or torch.device("cpu")
        if device.type not in ("cpu", "cuda"):
            raise InputError(f"--engine ct2 runs on cpu or cuda, not {device}")
        if device.type == "cuda" and ctranslate2.get_cuda_device_count() == 0:
            raise InputError(f"--engine ct2 --device {device}: this CTranslate2 build sees no CUDA device")
        try:
            self.translator = ctranslate2.Translator(
                str(model_dir),
                device=device.type,
                device_index=device.index or 0,
                compute_type=compute_type,
                intra_threads=threads,
            )
        except (RuntimeError, ValueError) as err:
            raise InputError(f"{model_dir}: CTranslate2 cannot load it ({err})") from None
        self.model_dir = model_dir
        self.meta = meta

    def encode_sources(self, texts: list[str]) -> tuple[list[list[int]], int]:
        """Source ids (+ EOS), truncated (and counted) or refused exactly as ``TranslatorRun`` does."""
        from attnkit.tasks.translate import encode_sources

        return encode_sources(self.tokenizer, texts, self.max_len, self.max_len_policy)

    def translate_ids(
        self,
        sources: list[list[int]],
        *,
        beam: int = 4,
        alpha: float = 0.6,
        length_penalty: str = "gnmt",
        batch_size: int = 32,
    ) -> list[list[int]]:
        """Output ids (no BOS, no EOS) of encoded sources (each ending with EOS), in input order.

        beam 1 is greedy search; beam > 1 is beam search ranked by attnkit's ``length_penalty`` (the module
        docstring says when the result is exactly ``attnkit.decoding.corpus.translate_ids``'s).
        """
        check_length_penalty(length_penalty, alpha)
        if beam < 1 or batch_size < 1:
            raise InputError(f"beam={beam} and batch_size={batch_size} must be >= 1")
        eos = self.tokenizer.eos_id
        by_limit: dict[int, list[int]] = {}
        for i, src in enumerate(sources):
            if not src or src[-1] != eos:
                raise ValueError(f"source #{i + 1} does not end with EOS (id {eos})")
            # §6.1: input length + 50 tokens, within the positional table (attnkit.decoding.limits.output_limits).
            by_limit.setdefault(max(1, min(len(src) + self.max_extra, self.max_len)), []).append(i)
        out: list[list[int]] = [[] for _ in sources]
        for limit, rows in by_limit.items():
            results = self.translator.translate_batch(
                [[self.tokens[t] for t in sources[i][:-1]] for i in rows],  # CTranslate2 appends the EOS
                max_batch_size=batch_size,
                beam_size=beam,
                num_hypotheses=beam,
                length_penalty=0,
                return_scores=beam > 1,
                return_end_token=True,
                max_decoding_length=limit,
                min_decoding_length=0,
                max_input_length=0,
                suppress_sequences=[[self.tokens[t]] for t in self.banned] if beam == 1 else None,
            )
            for i, result in zip(rows, results):
                out[i] = self._best(result, kind=length_penalty, alpha=alpha)
        return out

    def _best(self, result, *, kind: str, alpha: float) -> list[int]:
        """The finished hypothesis with the best log P(Y) / lp(|Y|), |Y| counting EOS when it was emitted (as
        attnkit's beam search ranks), without its EOS."""
        hyps = [[self.ids[token] for token in tokens] for tokens in result.hypotheses]  # (n, |Y|) ids, EOS included
        if len(hyps) > 1:
            normalized = [score / penalty(len(ids), kind=kind, alpha=alpha) for ids, score in zip(hyps, result.scores)]
            hyps = [hyps[max(range(len(hyps)), key=normalized.__getitem__)]]
        best = hyps[0]
        return best[:-1] if best and best[-1] == self.tokenizer.eos_id else best

    def translate(
        self, texts: list[str], *, beam: int = 4, alpha: float = 0.6, length_penalty: str = "gnmt", batch_size: int = 32
    ) -> tuple[list[str], int]:
        """Detokenized translations in input order, and how many sources were truncated."""
        ids, n_truncated = self.encode_sources(texts)
        hyps = self.translate_ids(ids, beam=beam, alpha=alpha, length_penalty=length_penalty, batch_size=batch_size)
        return self.tokenizer.decode_batch(hyps), n_truncated
