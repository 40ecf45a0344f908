"""Decoding speed: target tokens generated per second, greedy and beam 4, exactly 32 tokens per sentence.

The ``small`` translator (randomly initialised), a batch of 32 sources of 32 tokens. Every implementation is made
to emit exactly ``steps`` tokens per sentence whatever its random weights predict (EOS masked until then), so all
do the same number of decoding steps; each result counts the tokens actually returned and the suite raises if any
implementation returned a different number.

The implementations and how each is made to decode (``decode_calls``): attnkit on every engine of the device
(``engines``) and in every type it decodes in, ``torch.nn``'s loop without a key/value cache, Hugging Face
``generate``, and CTranslate2 in a child process of its own.

Two kinds of rows: throughput (variant "32 tokens": the batch of 32 in one call) and the latency a service sees
(variant "batch 1": the same sources one sentence per call, ``ms`` = milliseconds per sentence; attnkit and
CTranslate2, each in every type it runs here). The implementations of one table are timed in turns, with a short
pause before each call so that the previous engine's threads have gone to sleep (``settle_s``).

Beam search uses each implementation's own length normalisation (with a fixed length it does not change the work).
"""

from __future__ import annotations

import copy
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import torch
from torch import Tensor

from attnkit.bench import peers
from attnkit.bench.decode_calls import SEARCHES, attnkit_models, batch_calls, ct2_translators, latency_calls
from attnkit.bench.gpu import synchronizer
from attnkit.bench.isolated import Elapsed
from attnkit.bench.results import Result
from attnkit.bench.timing import fixed_threads, measure_interleaved
from attnkit.bench.token_ids import FIRST_ORDINARY_ID, PAD_ID
from attnkit.config import TranslatorConfig
from attnkit.inference import prepare_for_inference
from attnkit.inference.programs import Engine
from attnkit.model.build import build_translator

CONFIGS: dict[str, TranslatorConfig] = {"small": TranslatorConfig()}
IMPLS = ("attnkit", "torch.nn", "transformers", "ctranslate2")
SETTLE_S = 0.05  # pause before each timed call: OpenMP threads spin a few milliseconds after a call, then sleep


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
    CTranslate2 (its wheel's CUDA build) in float32 and bfloat16 (``decode_calls.CT2_COMPUTE_TYPES_GPU``).
    ``attnkit_engines``: default ``engines`` (with ``quick``, those that compile nothing)."""
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
            models = attnkit_models(ours, device) if "attnkit" in chosen else {}
            src = make_sources(cfg, batch, src_len, seed).to(device)
            translators = {}
            if "ctranslate2" in chosen:
                translators = ct2_translators(built, Path(tmp, name), threads, stack, device)
            # (kind, variant, sentences per call, sentences per timed call, calls)
            throughput = list(
                batch_calls(chosen, searches, built, models, attnkit_engines, cfg, src, steps, translators, seed)
            )
            tables = [("batch", f"{steps} tokens", batch, batch, throughput)]
            if latency_sentences and (models or translators):
                few = src[:latency_sentences]  # (n, S)
                latency = list(latency_calls(searches, models, attnkit_engines, cfg, few, steps, translators))
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


def run(*, quick: bool = False, **kwargs) -> list[Result]:
    """All results of ``iter_results`` (same arguments) as a list."""
    return list(iter_results(quick=quick, **kwargs))
