"""Each implementation's decoding call in the decode suite (``Call``: what one timed call runs), made to emit
exactly ``steps`` tokens per sentence, and the calls of a table: the batch in one call (``batch_calls``), or one
sentence per call (``latency_calls``).

    attnkit        ``greedy_decode`` / ``beam_search(beam_size=4)`` with ``fixed_len``, on the key/value cache;
                   float32, and bfloat16 (the model cast, as ``translate run --precision bf16`` decodes) where the
                   device has native bfloat16 (a GPU that has it; a CPU with AMX or AVX512-BF16); on such a CPU
                   also int8 (``--precision int8``: bfloat16 with every weight matrix rounded to int8). Each on
                   every engine of the device (``decode.engines``: the decoding step eager and compiled on a CPU; eager,
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
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from attnkit.bench import peers
from attnkit.bench.isolated import ChildEngine, CT2Translator, Elapsed, describe_settings
from attnkit.bench.token_ids import BOS_ID, EOS_ID, PAD_ID
from attnkit.config import TranslatorConfig
from attnkit.decoding import beam_search, greedy_decode
from attnkit.inference import quantize_for_inference
from attnkit.inference.programs import Engine
from attnkit.training.precision import native_bf16

SEARCHES = {"greedy": 1, "beam4": 4}
CT2_COMPUTE_TYPES = ("float32", "int8")
CT2_COMPUTE_TYPES_GPU = ("float32", "bfloat16")


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


def attnkit_models(ours, device: torch.device) -> dict:
    """dtype -> attnkit's model in it: float32 (``ours``), and where ``device`` has native bfloat16 a bfloat16 copy
    and, on a CPU, an int8 one (``translate run --precision int8``: bfloat16 with int8 weights)."""
    with_bf16 = torch.cuda.is_bf16_supported() if device.type == "cuda" else native_bf16()
    models = {"float32": ours}
    if with_bf16:
        models["bfloat16"] = copy.deepcopy(ours).to(torch.bfloat16)
    if with_bf16 and device.type == "cpu":
        models["int8"] = quantize_for_inference(copy.deepcopy(ours))
    return models


def batch_calls(
    impls, searches, ours, models: dict, engines: tuple, cfg: TranslatorConfig, src: Tensor, steps: int, ct2, seed: int
) -> Iterator[Call]:
    """The batch calls of every implementation and search; each peer is built once. ``ct2``: ``ct2_translators``."""
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


def latency_calls(searches, models: dict, engines: tuple, cfg: TranslatorConfig, src: Tensor, steps: int, ct2):
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


def ct2_translators(ours, out_dir: Path, threads: int, stack: ExitStack, device: torch.device) -> dict:
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
