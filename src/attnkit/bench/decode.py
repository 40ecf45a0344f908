"""Decoding speed: target tokens generated per second, greedy and beam 4, exactly 32 tokens per sentence.

The ``small`` translator (randomly initialised), a batch of 32 sources of 32 tokens. Every implementation is made
to emit exactly ``steps`` tokens per sentence whatever its random weights predict (EOS masked until then), so all
do the same number of decoding steps; each result counts the tokens actually returned and the suite raises if any
implementation returned a different number.

    attnkit        ``greedy_decode`` / ``beam_search(beam_size=4)`` with ``fixed_len``, on the key/value cache
    torch.nn       no decoding API: ``TorchNNTranslator.greedy_no_cache`` re-runs the decoder on the whole prefix
                   at every step (the loop a user writes); greedy only, labelled "torch.nn (no cache)"
    transformers   ``MarianMTModel.generate(num_beams=1 | 4, min_new_tokens=steps, max_new_tokens=steps)``
    ctranslate2    attnkit's weights exported by ``attnkit.interop.ct2.attnkit_to_ct2``, ``Translator.translate_batch(
                   beam_size=1 | 4, min_decoding_length=steps, max_decoding_length=steps)``, float32 and int8
                   (weights quantized at load time, ``compute_type="int8"``)

Beam search uses each implementation's own length normalisation (with a fixed length it does not change the work).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from torch import Tensor

from attnkit.bench import peers
from attnkit.bench.common import (
    BOS_ID,
    EOS_ID,
    FIRST_ORDINARY_ID,
    PAD_ID,
    Result,
    fixed_threads,
    measure_interleaved,
)
from attnkit.config import TranslatorConfig
from attnkit.decoding import beam_search, greedy_decode
from attnkit.model.build import build_translator, prepare_for_inference

CONFIGS: dict[str, TranslatorConfig] = {"small": TranslatorConfig()}
SEARCHES = {"greedy": 1, "beam4": 4}
IMPLS = ("attnkit", "torch.nn", "transformers", "ctranslate2")


def make_sources(cfg: TranslatorConfig, batch: int, length: int, seed: int) -> Tensor:
    """(B, S) source ids, every sentence ``length`` real tokens."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(FIRST_ORDINARY_ID, cfg.vocab_size, (batch, length), generator=gen)  # (B, S)


def _attnkit(model, src: Tensor, beam: int, steps: int, max_positions: int) -> Callable[[], int]:
    def call() -> int:
        if beam == 1:
            hyps = greedy_decode(model, src, bos_id=BOS_ID, eos_id=EOS_ID, max_positions=max_positions, fixed_len=steps)
        else:
            hyps = beam_search(
                model, src, bos_id=BOS_ID, eos_id=EOS_ID, max_positions=max_positions, beam_size=beam, fixed_len=steps
            )
        return sum(len(h) for h in hyps)

    return call


def _torch_nn(model: peers.TorchNNTranslator, src: Tensor, steps: int) -> Callable[[], int]:
    model.eval()
    return lambda: model.greedy_no_cache(src, bos_id=BOS_ID, eos_id=EOS_ID, steps=steps).numel()


def _transformers(model, src: Tensor, beam: int, steps: int) -> Callable[[], int]:
    model.eval()
    mask = (src != PAD_ID).long()

    def call() -> int:
        with torch.inference_mode():
            out = model.generate(
                input_ids=src,
                attention_mask=mask,
                num_beams=beam,
                min_new_tokens=steps,
                max_new_tokens=steps,
                do_sample=False,
            )  # (B, 1 + steps), decoder start first
        return int((out[:, 1:] != PAD_ID).sum())

    return call


def _ctranslate2(translator, tokens: list[list[str]], beam: int, steps: int) -> Callable[[], int]:
    def call() -> int:
        results = translator.translate_batch(
            tokens,
            beam_size=beam,
            min_decoding_length=steps,
            max_decoding_length=steps,
            return_scores=False,
            suppress_sequences=[["<pad>"]],  # as attnkit, which never emits padding
        )
        return sum(len(r.hypotheses[0]) for r in results)

    return call


def iter_results(
    *,
    quick: bool = False,
    threads: int = 2,
    configs: dict[str, TranslatorConfig] | None = None,
    batch: int = 32,
    src_len: int = 32,
    steps: int = 32,
    impls: tuple[str, ...] | None = None,
    searches: tuple[str, ...] | None = None,
    warmup: int | None = None,
    reps: int | None = None,
    seed: int = 0,
) -> Iterator[Result]:
    """Yield one result per (search, implementation, compute type). ``quick``: 8 tokens, 1 warm-up, 2 timed calls."""
    configs = configs or CONFIGS
    chosen = [i for i in (impls or IMPLS) if i in ("attnkit", "torch.nn") or peers.available(i)]
    searches = searches or tuple(SEARCHES)
    steps = 8 if quick else steps
    warmup = warmup if warmup is not None else (1 if quick else 2)
    reps = reps if reps is not None else (2 if quick else 5)

    with fixed_threads(threads), tempfile.TemporaryDirectory(prefix="attnkit-bench-") as tmp:
        for name, cfg in configs.items():
            torch.manual_seed(seed)
            ours = prepare_for_inference(build_translator(cfg, pad_id=PAD_ID))  # as TranslatorRun does
            src = make_sources(cfg, batch, src_len, seed)
            calls = list(_calls(chosen, searches, ours, cfg, src, steps, Path(tmp, name), threads, seed))
            for search in searches:  # the implementations of one search are timed in turns
                group = [c for c in calls if c[1] == search]
                for impl, _, _, call in group:
                    produced = call()  # also the first warm-up call
                    if produced != batch * steps:
                        raise RuntimeError(f"{impl} {search} returned {produced} tokens, expected {batch} x {steps}")
                timings = measure_interleaved(
                    [c[3] for c in group], warmup=max(0, warmup - 1), reps=reps, budget_s=30.0
                )
                for (impl, _, dtype, _), timing in zip(group, timings):
                    t = timing.median_s
                    yield Result(
                        suite="decode",
                        impl=impl,
                        config=name,
                        seq_len=src_len,
                        search=search,
                        dtype=dtype,
                        mode="infer",
                        variant=f"{steps} tokens",
                        batch=batch,
                        tgt_tok_per_s=batch * steps / t,
                        sentences_per_s=batch / t,
                        ms=t * 1e3,
                        threads=threads,
                        reps=len(timing.times_s),
                    )


def _calls(
    impls, searches, ours, cfg: TranslatorConfig, src: Tensor, steps: int, ct2_dir: Path, threads: int, seed: int
) -> Iterator[tuple[str, str, str, Callable[[], int]]]:
    """(impl, search, dtype, call) for every implementation and search; each peer is built once."""
    torch_nn = peers.TorchNNTranslator(ours) if "torch.nn" in impls else None
    marian = None
    if "transformers" in impls:
        torch.manual_seed(seed)
        marian = peers.marian_translator(cfg, pad_id=PAD_ID, bos_id=BOS_ID, eos_id=EOS_ID)
    ct2 = list(_ct2_translators(ours, src, ct2_dir, threads)) if "ctranslate2" in impls else []
    for search in searches:
        beam = SEARCHES[search]
        if "attnkit" in impls:
            yield "attnkit", search, "float32", _attnkit(ours, src, beam, steps, cfg.max_len)
        if torch_nn is not None and beam == 1:
            yield "torch.nn (no cache)", search, "float32", _torch_nn(torch_nn, src, steps)
        if marian is not None:
            yield "transformers", search, "float32", _transformers(marian, src, beam, steps)
        for dtype, translator, tokens in ct2:
            yield "ctranslate2", search, dtype, _ctranslate2(translator, tokens, beam, steps)


def _ct2_translators(ours, src: Tensor, out_dir: Path, threads: int):
    """float32 and int8 CTranslate2 translators of ``ours``'s weights, each with the source batch as tokens."""
    import ctranslate2

    from attnkit.interop.ct2 import attnkit_to_ct2, default_tokens

    tokens = default_tokens(ours.embeddings.token.num_embeddings)
    attnkit_to_ct2(ours, out_dir, tokens=tokens, add_source_eos=False)  # the sources are passed complete
    source = [[tokens[i] for i in row] for row in src.tolist()]  # (B, S) token strings
    for dtype in ("float32", "int8"):
        translator = ctranslate2.Translator(
            str(out_dir), device="cpu", compute_type=dtype, inter_threads=1, intra_threads=threads
        )
        yield dtype, translator, source


def run(*, quick: bool = False, **kwargs) -> list[Result]:
    """All results of ``iter_results`` (same arguments) as a list."""
    return list(iter_results(quick=quick, **kwargs))
