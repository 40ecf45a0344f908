"""Decoding speed: target tokens generated per second, greedy and beam 4, exactly 32 tokens per sentence.

The ``small`` translator (randomly initialised), a batch of 32 sources of 32 tokens. Every implementation is made
to emit exactly ``steps`` tokens per sentence whatever its random weights predict (EOS masked until then), so all
do the same number of decoding steps; each result counts the tokens actually returned and the suite raises if any
implementation returned a different number.

    attnkit        ``greedy_decode`` / ``beam_search(beam_size=4)`` with ``fixed_len``, on the key/value cache;
                   float32, and bfloat16 (the model cast, as ``translate run --precision bf16`` decodes) where the
                   device has native bfloat16 (a GPU that has it; a CPU with AMX or AVX512-BF16); on such a CPU
                   also int8 (``--precision int8``: bfloat16 with every weight matrix rounded to int8). Each on
                   every engine of the device (``ENGINES``: the decoding step eager and compiled on a CPU; eager,
                   replayed as a CUDA graph, and compiled and replayed on a GPU), labelled "attnkit" (eager) or
                   "attnkit ENGINE"; ``first call s`` is the first call's time, compilation or recording included
    torch.nn       no decoding API: ``TorchNNTranslator.greedy_no_cache`` re-runs the decoder on the whole prefix
                   at every step (the loop a user writes); greedy only, labelled "torch.nn (no cache)"
    transformers   ``MarianMTModel.generate(num_beams=1 | 4, min_new_tokens=steps, max_new_tokens=steps)``
    ctranslate2    attnkit's weights exported by ``attnkit.interop.ct2.convert.attnkit_to_ct2``,
                   ``Translator.translate_batch(beam_size=1 | 4, min_decoding_length=steps,
                   max_decoding_length=steps)``, float32 and int8
                   (weights quantized at load time, ``compute_type="int8"``), each in a child process of its own
                   (``attnkit.bench.isolated``: two OpenMP pools in one process slow both engines), with
                   ``inter_threads=1, intra_threads=threads`` (the ``settings`` of its rows); on a CPU with
                   ``threads`` > 1 also with ``intra_threads=1``, labelled "ctranslate2 (1 thread)", because its
                   thread pool can lose more than it gains: on a 2-vCPU KVM guest (Xeon with AMX, 2026-11-27) two
                   threads took 5.0-5.9x one thread's time at one sentence and 1.7-2.1x at a batch of 32 (float32,
                   greedy). A user would run it with one thread there, so a comparison takes the faster row.

Two kinds of rows: throughput (variant "32 tokens": the batch of 32 in one call) and the latency a service sees
(variant "batch 1": the same sources one sentence per call, ``ms`` = milliseconds per sentence; attnkit and
CTranslate2, each in every type it runs here). The implementations of one table are timed in turns, with a short
pause before each call so that the previous engine's threads have gone to sleep (``settle_s``).

Beam search uses each implementation's own length normalisation (with a fixed length it does not change the work).
"""

from __future__ import annotations

import copy
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
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
from attnkit.bench.gpu import synchronizer
from attnkit.bench.isolated import ChildEngine, CT2Translator, Elapsed, describe_settings
from attnkit.config import TranslatorConfig
from attnkit.decoding import beam_search, greedy_decode
from attnkit.inference import prepare_for_inference, quantize_for_inference
from attnkit.inference.programs import Engine
from attnkit.model.build import build_translator
from attnkit.training.precision import native_bf16

CONFIGS: dict[str, TranslatorConfig] = {"small": TranslatorConfig()}
SEARCHES = {"greedy": 1, "beam4": 4}
IMPLS = ("attnkit", "torch.nn", "transformers", "ctranslate2")
CT2_COMPUTE_TYPES = ("float32", "int8")
CT2_COMPUTE_TYPES_GPU = ("float32", "bfloat16")
SETTLE_S = 0.05  # pause before each timed call: OpenMP threads spin a few milliseconds after a call, then sleep


@dataclass(frozen=True)
class Call:
    """One implementation's timed call: ``fn()`` decodes the inputs and returns the tokens produced (an int, or
    ``Elapsed`` where a child process timed it)."""

    impl: str
    search: str
    dtype: str
    fn: Callable[[], int | Elapsed]
    pid: int  # the process that runs fn's decoding
    settings: str | None = None


def make_sources(cfg: TranslatorConfig, batch: int, length: int, seed: int) -> Tensor:
    """(B, S) source ids, every sentence ``length`` real tokens."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(FIRST_ORDINARY_ID, cfg.vocab_size, (batch, length), generator=gen)  # (B, S)


def engines(device: torch.device) -> tuple[Engine, ...]:
    """The engines attnkit's rows are timed on: the step eager and compiled on a CPU; on a GPU eager, replayed as a
    CUDA graph, and compiled and replayed."""
    if device.type == "cuda":
        return (Engine("eager"), Engine("cuda-graph"), Engine("compiled-cuda-graph"))
    return (Engine("eager"), Engine("compiled"))


def engine_label(engine: Engine) -> str:
    return "attnkit" if engine.kind == "eager" else f"attnkit {engine.kind}"


def _attnkit(
    model, src: Tensor, beam: int, steps: int, max_positions: int, per_call: int = 0, engine: Engine | None = None
) -> Callable[[], int]:
    """Decode ``src`` (B, S) in one call, or ``per_call`` sentences at a time (batch 1: latency); tokens produced."""
    parts = [src] if not per_call else list(src.split(per_call))  # each (b, S)

    def call() -> int:
        return sum(len(h) for part in parts for h in _search(model, part, beam, steps, max_positions, engine))

    return call


def _search(model, part: Tensor, beam: int, steps: int, max_positions: int, engine: Engine | None = None) -> list:
    """attnkit's greedy search or beam search of ``part`` (b, S), exactly ``steps`` tokens per sentence."""
    if beam == 1:
        return greedy_decode(
            model, part, bos_id=BOS_ID, eos_id=EOS_ID, max_positions=max_positions, fixed_len=steps, engine=engine
        )
    return beam_search(
        model,
        part,
        bos_id=BOS_ID,
        eos_id=EOS_ID,
        max_positions=max_positions,
        beam_size=beam,
        fixed_len=steps,
        engine=engine,
    )


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


def _ctranslate2(translator: CT2Translator, batches: list, beam: int, steps: int) -> Callable[[], Elapsed]:
    return lambda: translator.translate(batches, beam_size=beam, steps=steps)


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
    latency_sentences: int | None = None,
    seed: int = 0,
    device: torch.device | None = None,
    attnkit_engines: tuple[Engine, ...] | None = None,
) -> Iterator[Result]:
    """Yield one result per (search, implementation, compute type), then the batch-1 latency rows (the first
    ``latency_sentences`` sources, default all ``batch``; 0: none). ``quick``: 8 tokens, 2 sentences for latency,
    1 warm-up, 2 timed calls, and no compiled engine. On a GPU (``device``) every implementation decodes there,
    CTranslate2 (its wheel's CUDA build) in float32 and bfloat16 (``CT2_COMPUTE_TYPES_GPU``). ``attnkit_engines``:
    default ``engines`` (with ``quick``, those that compile nothing)."""
    device = device or torch.device("cpu")
    if attnkit_engines is None:  # quick: no compiled engine, whose first call compiles for 10-30 s a bucket
        attnkit_engines = tuple(e for e in engines(device) if not (quick and e.kind.startswith("compiled")))
    sync = synchronizer(device)
    configs = configs or CONFIGS
    chosen = [i for i in (impls or IMPLS) if i in ("attnkit", "torch.nn") or peers.available(i)]
    searches = searches or tuple(SEARCHES)
    steps = 8 if quick else steps
    warmup = warmup if warmup is not None else (1 if quick else 2)
    reps = reps if reps is not None else (2 if quick else 5)
    if latency_sentences is None:
        latency_sentences = 2 if quick else batch
    latency_sentences = min(latency_sentences, batch)

    with fixed_threads(threads), tempfile.TemporaryDirectory(prefix="attnkit-bench-") as tmp, ExitStack() as stack:
        for name, cfg in configs.items():
            torch.manual_seed(seed)
            built = build_translator(cfg, pad_id=PAD_ID).to(device).eval()  # the peers take the paper's modules
            ours = prepare_for_inference(copy.deepcopy(built))  # as TranslatorRun does
            models = _attnkit_models(ours, device) if "attnkit" in chosen else {}
            src = make_sources(cfg, batch, src_len, seed).to(device)
            translators = {}
            if "ctranslate2" in chosen:
                translators = _ct2_translators(built, Path(tmp, name), threads, stack, device)
            # (kind, variant, sentences per call, sentences per timed call, calls)
            batch_calls = list(
                _calls(chosen, searches, built, models, attnkit_engines, cfg, src, steps, translators, seed)
            )
            tables = [("batch", f"{steps} tokens", batch, batch, batch_calls)]
            if latency_sentences and (models or translators):
                few = src[:latency_sentences]  # (n, S)
                latency = list(_latency_calls(searches, models, attnkit_engines, cfg, few, steps, translators))
                tables.append(("latency", "batch 1", 1, latency_sentences, latency))
            for kind, variant, per_call, sentences, calls in tables:
                for search in searches:  # the implementations of one search are timed in turns
                    group = [c for c in calls if c.search == search]
                    first_call_s = {}
                    for c in group:
                        start = time.perf_counter()
                        out = c.fn()  # also the first warm-up call: compiles or records what it needs
                        if sync is not None:
                            sync()
                        first_call_s[id(c)] = time.perf_counter() - start
                        produced = out.value if isinstance(out, Elapsed) else out
                        if produced != sentences * steps:
                            raise RuntimeError(
                                f"{c.impl} {search} returned {produced} tokens, expected {sentences} x {steps}"
                            )
                    timings = measure_interleaved(
                        [c.fn for c in group],
                        warmup=max(0, warmup - 1),
                        reps=reps,
                        budget_s=30.0,
                        settle_s=SETTLE_S if translators else 0.0,
                        sync=sync,
                    )
                    for c, timing in zip(group, timings):
                        t = timing.median_s
                        yield Result(
                            suite="decode",
                            impl=c.impl,
                            config=name,
                            seq_len=src_len,
                            search=search,
                            dtype=c.dtype,
                            mode="infer",
                            variant=variant,
                            batch=per_call,
                            tgt_tok_per_s=sentences * steps / t,
                            sentences_per_s=sentences / t,
                            ms=t * 1e3 / (sentences if kind == "latency" else 1),  # latency: per sentence
                            threads=threads,
                            reps=len(timing.times_s),
                            pid=c.pid,
                            settings=c.settings,
                            first_call_s=first_call_s[id(c)] if c.impl.startswith("attnkit") else None,
                        )


def _attnkit_models(ours, device: torch.device) -> dict:
    """dtype -> attnkit's model in it: float32 (``ours``), and where ``device`` has native bfloat16 a bfloat16 copy
    and, on a CPU, an int8 one (``translate run --precision int8``: bfloat16 with int8 weights)."""
    with_bf16 = torch.cuda.is_bf16_supported() if device.type == "cuda" else native_bf16()
    models = {"float32": ours}
    if with_bf16:
        models["bfloat16"] = copy.deepcopy(ours).to(torch.bfloat16)
    if with_bf16 and device.type == "cpu":
        models["int8"] = quantize_for_inference(copy.deepcopy(ours))
    return models


def _calls(
    impls, searches, ours, models: dict, engines: tuple, cfg: TranslatorConfig, src: Tensor, steps: int, ct2, seed: int
) -> Iterator[Call]:
    """The batch calls of every implementation and search; each peer is built once. ``ct2``: ``_ct2_translators``."""
    torch_nn = peers.TorchNNTranslator(ours) if "torch.nn" in impls else None
    marian = None
    if "transformers" in impls:
        torch.manual_seed(seed)
        marian = peers.marian_translator(cfg, pad_id=PAD_ID, bos_id=BOS_ID, eos_id=EOS_ID).to(src.device)
    here = os.getpid()
    for search in searches:
        beam = SEARCHES[search]
        yield from _attnkit_calls(search, models, engines, cfg, src, steps, per_call=0)
        if torch_nn is not None and beam == 1:
            yield Call("torch.nn (no cache)", search, "float32", _torch_nn(torch_nn, src, steps), here)
        if marian is not None:
            settings = f"generate(num_beams={beam}, do_sample=False), key/value cache on (its default)"
            yield Call("transformers", search, "float32", _transformers(marian, src, beam, steps), here, settings)
        yield from _ct2_calls(search, ct2, src, steps, per_call=0)


def _latency_calls(searches, models: dict, engines: tuple, cfg: TranslatorConfig, src: Tensor, steps: int, ct2):
    """One sentence per call (batch 1): attnkit and CTranslate2, each in every type of ``models`` and ``ct2``."""
    for search in searches:
        yield from _attnkit_calls(search, models, engines, cfg, src, steps, per_call=1)
        yield from _ct2_calls(search, ct2, src, steps, per_call=1)


def _attnkit_calls(
    search: str, models: dict, engines: tuple, cfg: TranslatorConfig, src: Tensor, steps: int, per_call: int
) -> Iterator[Call]:
    """attnkit in every type of ``models`` on every engine of ``engines``."""
    for dtype, model in models.items():
        for engine in engines:
            call = _attnkit(model, src, SEARCHES[search], steps, cfg.max_len, per_call=per_call, engine=engine)
            yield Call(engine_label(engine), search, dtype, call, os.getpid())


def _ct2_calls(search: str, ct2: dict, src: Tensor, steps: int, per_call: int) -> Iterator[Call]:
    """CTranslate2 in every type of ``ct2``: the batch in one call, or one sentence per call (``per_call=1``)."""
    for (label, dtype), (translator, tokens) in ct2.items():
        batches = [tokens(src)] if not per_call else [tokens(row[None]) for row in src]
        fn = _ctranslate2(translator, batches, SEARCHES[search], steps)
        yield Call(label, search, dtype, fn, translator.pid, describe_settings(translator.settings))


def _ct2_translators(ours, out_dir: Path, threads: int, stack: ExitStack, device: torch.device) -> dict:
    """(row label, dtype) -> (CTranslate2 translator of ``ours``'s weights in a child process of its own, a function
    from a (B, S) batch of ids to CTranslate2's token lists), for float32 and int8 on the CPU, float32 and bfloat16 on
    a GPU (``device``: the same GPU). On a CPU with ``threads`` > 1, each type also with one thread (the module
    docstring says why)."""
    from attnkit.interop.ct2.convert import attnkit_to_ct2, default_tokens

    vocab = default_tokens(ours.embeddings.token.num_embeddings)
    attnkit_to_ct2(ours, out_dir, tokens=vocab, add_source_eos=False)  # the sources are passed complete

    def tokens(src: Tensor) -> list[list[str]]:
        return [[vocab[i] for i in row] for row in src.tolist()]  # (B, S) token strings

    pools = {"ctranslate2": threads}
    if device.type == "cpu" and threads > 1:
        pools["ctranslate2 (1 thread)"] = 1
    translators = {}
    for label, n in pools.items():
        for dtype in CT2_COMPUTE_TYPES_GPU if device.type == "cuda" else CT2_COMPUTE_TYPES:
            child = stack.enter_context(ChildEngine())
            translator = CT2Translator(child, out_dir, compute_type=dtype, threads=n, device=device)
            translators[label, dtype] = (translator, tokens)
    return translators


def run(*, quick: bool = False, **kwargs) -> list[Result]:
    """All results of ``iter_results`` (same arguments) as a list."""
    return list(iter_results(quick=quick, **kwargs))
