"""Benchmarks: the comparisons are apples to apples, the FLOP formula is right, and every suite runs end to end.

The parity tests are the ones that matter: the ``torch.nn`` peers compute the same losses and logits as attnkit with
the same weights, the no-cache ``torch.nn`` decoding loop emits the same tokens as attnkit's cached greedy search,
and the CTranslate2 export scores every target token as attnkit does. The smoke tests run each suite at tiny sizes
and check the records, never the timings.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from typing import Any

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from attnkit.bench import ceiling, classify, decode, peers, scaling, timing, train, train_inputs, train_steps
from attnkit.bench.flops import seq2seq_forward_flops, training_flops
from attnkit.bench.results import Result, format_table
from attnkit.bench.token_ids import BOS_ID, EOS_ID, PAD_ID
from attnkit.config import ClassifierConfig, TranslatorConfig
from attnkit.decoding import beam_search, greedy_decode
from attnkit.inference.programs import Engine
from attnkit.model.build import build_classifier, build_translator
from attnkit.model.positional import LearnedPositionalEmbedding
from attnkit.training.precision import native_bf16

TINY = TranslatorConfig(vocab_size=120, d_model=32, n_heads=2, d_ff=64, n_layers=2, max_len=48)
TINY_CLS = ClassifierConfig(vocab_size=120, d_model=32, n_heads=2, d_ff=64, n_layers=2, max_len=32, n_classes=2)
FIELDS = {"suite", "impl", "config", "seq_len", "search", "dtype", "tgt_tok_per_s", "sentences_per_s", "ms", "peak_mib"}


def _padded(ids: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    for b, n in enumerate(lengths):
        ids[b, n:] = PAD_ID
    return ids


# ---------------------------------------------------------------------------------------------------------------
# Same weights, same function


def test_train_suite_torch_nn_peer_gives_the_same_loss():
    """In eval mode (no dropout) the torch.nn peer of the train suite computes attnkit's loss on a padded batch."""
    ours = build_translator(TINY, pad_id=PAD_ID).eval()
    theirs, theirs_forward = train_steps.forward_fn("torch.nn", TINY, ours)
    theirs.eval()
    src, tgt_in, tgt_out = train_inputs.make_batch(TINY, 12, 96, seed=1)  # (4, 12) each
    src, tgt_in = _padded(src, [12, 9, 5, 12]), _padded(tgt_in, [12, 12, 7, 3])
    tgt_out = tgt_out.masked_fill(tgt_in == PAD_ID, PAD_ID)
    with torch.no_grad():
        ours_loss = train_steps.batch_loss(ours(src, tgt_in), tgt_out)
        theirs_loss = train_steps.batch_loss(theirs_forward(src, tgt_in), tgt_out)
    assert ours_loss.item() > 0
    torch.testing.assert_close(theirs_loss, ours_loss, rtol=1e-5, atol=1e-5)


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
@pytest.mark.parametrize("fastpath", [True, False])
def test_classify_suite_torch_nn_peer_gives_the_same_logits(fastpath):
    """With and without PyTorch's nested-tensor fast path, on a padded batch."""
    ours = build_classifier(TINY_CLS, pad_id=PAD_ID).eval()
    theirs = peers.TorchNNClassifier(ours).eval()
    ids, _, _ = classify.make_batch(TINY_CLS, 6, 32, padded=True, seed=2)
    with torch.inference_mode(), classify.mha_fastpath(fastpath):
        torch.testing.assert_close(theirs(ids), ours(ids), rtol=1e-4, atol=1e-5)


def test_decode_suite_torch_nn_loop_emits_attnkit_greedy_tokens():
    """The no-cache loop re-runs the decoder on the prefix; it must produce what the cached search produces."""
    ours = build_translator(TINY, pad_id=PAD_ID).eval()
    src = decode.make_sources(TINY, 5, 9, seed=3)
    expected = greedy_decode(ours, src, bos_id=BOS_ID, eos_id=EOS_ID, max_positions=TINY.max_len, fixed_len=12)
    got = peers.TorchNNTranslator(ours).greedy_no_cache(src, bos_id=BOS_ID, eos_id=EOS_ID, steps=12)
    assert got.tolist() == expected


@pytest.mark.parametrize(
    "overrides", [{}, {"norm": "pre"}, {"positional": "learned", "activation": "gelu"}, {"tie_embeddings": False}]
)
def test_ct2_export_scores_like_attnkit(tmp_path, overrides):
    """CTranslate2 running the exported weights gives attnkit's log-probability for every target token and EOS."""
    ctranslate2 = pytest.importorskip("ctranslate2")
    from attnkit.interop.ct2.convert import attnkit_to_ct2, default_tokens

    cfg = dataclasses.replace(TINY, **overrides)
    model = build_translator(cfg, pad_id=PAD_ID).eval()
    if cfg.positional == "learned":  # learned positions start random, not zero: check they are carried over
        position = model.embeddings.position
        assert isinstance(position, LearnedPositionalEmbedding)
        torch.nn.init.normal_(position.embedding.weight)
    tokens = default_tokens(cfg.vocab_size)
    attnkit_to_ct2(model, tmp_path, tokens=tokens, add_source_eos=False)
    translator = ctranslate2.Translator(str(tmp_path), device="cpu", compute_type="float32", intra_threads=1)

    src = decode.make_sources(cfg, 4, 9, seed=4)
    tgt = decode.make_sources(cfg, 4, 6, seed=5)
    scored = translator.score_batch(
        [[tokens[i] for i in row] for row in src.tolist()], [[tokens[i] for i in row] for row in tgt.tolist()]
    )
    tgt_in = torch.cat([torch.full((4, 1), BOS_ID), tgt], dim=1)  # (B, T + 1)
    tgt_out = torch.cat([tgt, torch.full((4, 1), EOS_ID)], dim=1)  # (B, T + 1)
    with torch.no_grad():
        expected = model(src, tgt_in).log_softmax(-1).gather(-1, tgt_out[..., None])[..., 0]  # (B, T + 1)
    got = torch.tensor([r.log_probs for r in scored])
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_ct2_export_decodes_exactly_fixed_length_like_attnkit(tmp_path):
    ctranslate2 = pytest.importorskip("ctranslate2")
    from attnkit.interop.ct2.convert import attnkit_to_ct2, default_tokens

    model = build_translator(TINY, pad_id=PAD_ID).eval()
    tokens = default_tokens(TINY.vocab_size)
    attnkit_to_ct2(model, tmp_path, tokens=tokens, add_source_eos=False)
    translator = ctranslate2.Translator(str(tmp_path), device="cpu", intra_threads=1)
    src = decode.make_sources(TINY, 4, 9, seed=6)
    out = translator.translate_batch(
        [[tokens[i] for i in row] for row in src.tolist()],
        beam_size=1,
        min_decoding_length=15,
        max_decoding_length=15,
        suppress_sequences=[["<pad>"], ["<bos>"]],  # as attnkit's search
    )
    expected = greedy_decode(model, src, bos_id=BOS_ID, eos_id=EOS_ID, max_positions=TINY.max_len, fixed_len=15)
    assert [[tokens.index(t) for t in r.hypotheses[0]] for r in out] == expected


def test_ct2_export_refuses_a_vocabulary_of_the_wrong_size(tmp_path):
    pytest.importorskip("ctranslate2")
    from attnkit.interop.ct2.convert import attnkit_to_ct2, default_tokens

    with pytest.raises(ValueError, match="119 tokens given for a vocabulary of 120"):
        attnkit_to_ct2(build_translator(TINY), tmp_path, tokens=default_tokens(119))


def test_training_flops_formula_matches_pytorch_flop_counter():
    """6 * weights per token * tokens + attention FLOPs = what FlopCounterMode counts for forward + backward
    (the math attention backend, whose matmuls it sees)."""
    model = build_translator(TINY, pad_id=PAD_ID).train()
    src, tgt_in, _ = train_inputs.make_batch(TINY, 10, 120, seed=7)  # (6, 10) each
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(src, tgt_in).sum().backward()
    lengths = [10] * src.size(0)
    expected = training_flops(
        seq2seq_forward_flops(
            lengths, lengths, d_model=TINY.d_model, d_ff=TINY.d_ff, n_layers=TINY.n_layers, vocab_size=TINY.vocab_size
        )
    )
    assert counter.get_total_flops() == expected


# ---------------------------------------------------------------------------------------------------------------
# Each suite end to end, tiny


EAGER = (Engine("eager"),)


def _check(results: list[Result], suite: str, impls: set[str], figures: tuple[str, ...]) -> None:
    assert results and {r.impl for r in results if r.impl != "matmul"} == impls
    for r in results:
        record = json.loads(r.to_json())
        assert FIELDS <= set(record) and record["suite"] == suite
        for key in figures if r.impl != "matmul" else ("gflop_per_s", "ms"):
            assert record[key] is not None and record[key] > 0, (key, record)
    assert all(i in format_table(results) for i in impls)


def _installed(*names: str) -> set[str]:
    return {n for n in names if peers.available(n)}


@pytest.mark.slow
def test_train_suite_smoke():
    results = train.run(quick=True, threads=1, configs={"tiny": TINY}, lengths=(8,), tokens_per_batch=128)
    _check(
        results,
        "train",
        {"attnkit", "torch.nn"} | _installed("transformers"),
        ("tgt_tok_per_s", "sentences_per_s", "ms", "gflop_per_s", "mfu"),
    )
    # bfloat16 rows (ceiling, and every implementation under autocast) only where the CPU has native bfloat16
    expected = {"float32", "bfloat16"} if native_bf16() else {"float32"}
    assert {r.dtype for r in results if r.impl == "matmul"} == expected
    assert {r.dtype for r in results if r.impl == "attnkit"} == expected
    assert {r.dtype for r in results if r.impl == "torch.nn"} == expected


def test_the_token_budget_variant_feeds_new_padded_shapes_to_every_implementation():
    """Token-budget batches as training cuts them: within the budget, padded, a new (B, S, T) nearly every step;
    every implementation gets a row of them."""
    cycles = train_inputs.token_budget_cycles(TINY, 24, 512, cycles=3, seed=0)
    batches = [batch for cycle in cycles for batch in cycle]
    assert [len(cycle) for cycle in cycles] == [train_inputs.CYCLE] * 3
    shapes = {(src.shape, tgt_in.shape) for src, tgt_in, _ in batches}
    assert len(shapes) >= len(batches) // 2
    for src, tgt_in, tgt_out in batches:
        assert src.numel() + tgt_in.numel() <= 512 and tgt_in.shape == tgt_out.shape
        assert (tgt_in[:, 0] == BOS_ID).all() and ((tgt_out == EOS_ID).sum(dim=1) == 1).all()
        assert ((tgt_in == PAD_ID) == (tgt_out == PAD_ID)).all()  # BOS y_1 .. y_n-1 against y_1 .. y_n-1 EOS
    results = train.run(
        quick=True, threads=1, configs={"tiny": TINY}, lengths=(12,), tokens_per_batch=256, variants=("token-budget",)
    )
    rows = [r for r in results if r.impl != "matmul"]
    assert {r.impl for r in rows} == {"attnkit", "torch.nn"} | _installed("transformers")
    assert all(r.variant == "token-budget" and (r.tgt_tok_per_s or 0) > 0 for r in rows)


def test_the_compiled_row_computes_the_eager_steps_losses_and_times_its_compilation_apart(monkeypatch):
    """attnkit's step with its forward pass and loss compiled (as --set compile=true trains) gives the eager step's
    losses step after step (no dropout: the compiled graph draws its own masks); its row reports the first call,
    the compilation, apart from the timed median; the optimizer's step compiled too (an experiment of
    benchmarks/profile_train.py) updates the same. Traced with "aot_eager" here: the same graphs, no kernels made."""
    cfg = dataclasses.replace(TINY, dropout=0.0)
    src, tgt_in, tgt_out = train_inputs.make_batch(cfg, 8, 128, seed=3)  # (8, 8) each
    losses = []
    for backend, optimizer in ((None, False), ("aot_eager", False), ("aot_eager", True)):
        torch.manual_seed(0)
        model = build_translator(cfg, pad_id=PAD_ID)
        step = train_steps.training_step(
            model, model, src, tgt_in, tgt_out, compile_backend=backend, compile_optimizer=optimizer
        )
        losses.append([step() for _ in range(3)])
    assert losses[1] == pytest.approx(losses[0], abs=1e-5) and losses[0][2] < losses[0][0]
    assert losses[2] == pytest.approx(losses[0], abs=1e-5)
    with pytest.raises(ValueError, match="compile_optimizer"):
        train_steps.training_step(model, model, src, tgt_in, tgt_out, compile_optimizer=True)
    monkeypatch.setattr(train, "COMPILE_BACKEND", "aot_eager")
    results = train.run(
        quick=True, threads=1, configs={"tiny": TINY}, lengths=(8,), tokens_per_batch=128, impls=("attnkit",),
        compiled_precisions=("fp32",),
    )  # fmt: skip
    rows = {r.impl: r for r in results if r.impl != "matmul"}
    assert set(rows) == {"attnkit", "attnkit compiled"}
    assert rows["attnkit compiled"].first_call_s > 0 and rows["attnkit"].first_call_s is None
    assert rows["attnkit compiled"].ms > 0 and rows["attnkit compiled"].dtype == "float32"


def test_bench_train_compiled_adds_the_compiled_row_on_the_command_line(tmp_path, monkeypatch):
    """``attnkit bench train --compiled``: the "attnkit compiled" row beside attnkit's, in bfloat16 where the CPU has
    it natively, else float32, with its first call (the compilation) reported."""
    from attnkit.cli import main

    monkeypatch.setattr(train, "CONFIGS", {"small": TINY})
    monkeypatch.setattr(train, "COMPILE_BACKEND", "aot_eager")  # the same graphs, no kernels made: fast
    out = tmp_path / "train.json"
    assert main(["bench", "train", "--quick", "--impl", "attnkit", "--compiled", "--json", str(out)]) == 0
    rows = [r for r in json.loads(out.read_text())["results"] if r["impl"] == "attnkit compiled"]
    assert [r["dtype"] for r in rows] == ["bfloat16" if native_bf16() else "float32"]
    assert rows[0]["first_call_s"] > 0 and rows[0]["ms"] > 0


def test_bfloat16_ceiling_is_skipped_without_native_bfloat16(monkeypatch):
    monkeypatch.setattr(ceiling, "native_bf16", lambda: False)
    results, references = ceiling.ceiling_results("train", threads=1, quick=True)
    assert [r.dtype for r in results] == ["float32"] and references["float32"] > 0


@pytest.mark.slow
def test_classify_suite_smoke():
    results = classify.run(quick=True, threads=1, configs={"tiny": TINY_CLS}, batch=4, length=16)
    _check(results, "classify", {"attnkit", "torch.nn"} | _installed("transformers"), ("sentences_per_s", "ms"))
    rows = {(r.impl, r.mode, r.variant) for r in results}
    assert ("torch.nn", "infer", "padded, fastpath-off") in rows and ("attnkit", "train", "full") in rows
    # inference under bfloat16 autocast for every implementation (bfloat16 against bfloat16) where it is native
    bf16 = {(r.impl, r.variant) for r in results if r.mode == "infer" and r.dtype == "bfloat16"}
    impls = {"attnkit"} | _installed("transformers")
    expected = {(i, v) for i in impls for v in ("full", "padded")} | {
        ("torch.nn", "full, fastpath-off"),
        ("torch.nn", "padded, fastpath-off"),
    }
    assert bf16 == (expected if native_bf16() else set())


@pytest.mark.slow
def test_decode_suite_smoke():
    # The eager engine only: the compiled one (the suite's other CPU engine) compiles for tens of seconds per bucket;
    # tests/decoding/test_engines.py checks it.
    results = decode.run(quick=True, threads=1, configs={"tiny": TINY}, batch=3, src_len=5, attnkit_engines=EAGER)
    _check(
        results,
        "decode",
        {"attnkit", "torch.nn (no cache)"} | _installed("transformers", "ctranslate2"),
        ("tgt_tok_per_s", "sentences_per_s", "ms"),
    )
    assert {r.search for r in results} == {"greedy", "beam4"}
    assert all(r.search == "greedy" for r in results if r.impl == "torch.nn (no cache)")
    assert all(r.first_call_s is not None for r in results if r.impl == "attnkit")
    assert [engine.kind for engine in decode.engines(torch.device("cpu"))] == ["eager", "compiled"]
    assert [e.kind for e in decode.engines(torch.device("cuda"))] == ["eager", "cuda-graph", "compiled-cuda-graph"]


@pytest.mark.slow
def test_scaling_suite_smoke():
    results = scaling.run(
        quick=True, threads=1, lengths=(32,), dropouts=(0.1,), layer=dict(d_model=16, n_heads=2, d_ff=32)
    )
    _check(results, "scaling", {"attnkit", "torch.nn"}, ("ms", "peak_mib"))
    assert {(r.impl, r.mode) for r in results} == {(i, m) for i in ("attnkit", "torch.nn") for m in ("infer", "train")}


def test_changes_probe_variants_compute_the_same_function():
    """benchmarks/changes.py times attnkit with one choice switched off; each variant must compute the same outputs
    and gradients (eval mode), and the explicit variant must really take the explicit path."""
    import importlib.util
    from pathlib import Path

    from attnkit.model import attention

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "changes.py"
    spec = importlib.util.spec_from_file_location("changes", path)
    assert spec is not None and spec.loader is not None
    changes = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(changes)
    models = changes.variant_models(lambda: build_translator(TINY, pad_id=PAD_ID))
    src = torch.randint(5, TINY.vocab_size, (3, 7))
    tgt = torch.randint(5, TINY.vocab_size, (3, 6))
    explicit_calls = []
    original = attention.scaled_dot_product_attention
    try:
        attention.scaled_dot_product_attention = lambda *a, **k: explicit_calls.append(1) or original(*a, **k)
        outputs = []
        for model in models:
            model.eval()
            logits = model(src, tgt)  # (B, T, V)
            logits.square().mean().backward()
            outputs.append((logits.detach(), model.encoder.layers[0].self_attn.q_proj.weight.grad))
    finally:
        attention.scaled_dot_product_attention = original
    assert len(explicit_calls) == 3 * TINY.n_layers  # encoder self, decoder self and cross, in the explicit variant
    for logits, grad in outputs[1:]:
        torch.testing.assert_close(logits, outputs[0][0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(grad, outputs[0][1], atol=1e-5, rtol=1e-5)

    build = functools.partial(build_translator, TINY, pad_id=PAD_ID)
    shipped, recomputing = changes.variant_models(build, changes.DECODE_VARIANTS)
    src = _padded(torch.randint(5, TINY.vocab_size, (4, 9)), [9, 4, 7, 2])
    for beam in (1, 3):
        call: dict[str, Any] = dict(bos_id=BOS_ID, eos_id=EOS_ID, max_positions=TINY.max_len, fixed_len=12)
        if beam == 1:
            assert greedy_decode(shipped.eval(), src, **call) == greedy_decode(recomputing.eval(), src, **call)
        else:
            call["beam_size"] = beam
            assert beam_search(shipped, src, **call) == beam_search(recomputing, src, **call)


# ---------------------------------------------------------------------------------------------------------------
# Engines with their own thread pool run in a process of their own; every run says what it ran on


def test_ctranslate2_is_timed_in_a_child_process_in_turns_with_attnkit():
    """Two OpenMP pools in one process slow both engines, so CTranslate2 decodes in a child: its rows carry the
    child's pid (reported by the child itself), attnkit's this process's, and both carry the settings used."""
    pytest.importorskip("ctranslate2")
    import os

    results = decode.run(
        quick=True,
        threads=1,
        configs={"tiny": TINY},
        batch=3,
        src_len=5,
        impls=("attnkit", "ctranslate2"),
        searches=("greedy",),
        latency_sentences=2,
        reps=2,
        attnkit_engines=EAGER,
    )
    rows = {(r.impl, r.dtype, r.variant): r for r in results}
    # bfloat16, and int8 weights (bfloat16 activations), only where bfloat16 is native
    attnkit_types = ("float32", "bfloat16", "int8") if native_bf16() else ("float32",)
    assert set(rows) == {
        (impl, dtype, variant)
        for impl, types in (("attnkit", attnkit_types), ("ctranslate2", ("float32", "int8")))
        for dtype in types
        for variant in ("8 tokens", "batch 1")
    }
    ct2 = [r for r in results if r.impl == "ctranslate2"]
    assert all(r.pid is not None and r.pid != os.getpid() for r in ct2)
    assert len({r.pid for r in ct2 if r.dtype == "int8"} & {r.pid for r in ct2 if r.dtype == "float32"}) == 0
    assert all(r.pid == os.getpid() and r.settings is None for r in results if r.impl == "attnkit")
    assert {r.settings for r in ct2} == {
        f"inter_threads=1, intra_threads=1, compute_type={dtype}" for dtype in ("float32", "int8")
    }
    latency = rows[("attnkit", "float32", "batch 1")]
    assert latency.batch == 1 and latency.ms == pytest.approx(1e3 / latency.sentences_per_s)  # ms per sentence


def test_ctranslate2_is_also_timed_with_one_thread_when_the_suite_has_more():
    """CTranslate2's pool can be slower with two threads than with one (a 2-vCPU KVM guest: 5.0-5.9x one thread's
    time at one sentence), so with threads > 1 every type also gets a "ctranslate2 (1 thread)" row, from a child of
    its own, with the same tokens to produce (the suite raises on a wrong count)."""
    pytest.importorskip("ctranslate2")
    results = decode.run(
        quick=True,
        threads=2,
        configs={"tiny": TINY},
        batch=2,
        src_len=5,
        impls=("ctranslate2",),
        searches=("greedy",),
        latency_sentences=1,
        reps=1,
    )
    settings = {(r.impl, r.dtype, r.variant): r.settings for r in results}
    assert settings == {
        (impl, dtype, variant): f"inter_threads=1, intra_threads={n}, compute_type={dtype}"
        for impl, n in (("ctranslate2", 2), ("ctranslate2 (1 thread)", 1))
        for dtype in ("float32", "int8")
        for variant in ("8 tokens", "batch 1")
    }
    pids = {impl: {r.pid for r in results if r.impl == impl} for impl in ("ctranslate2", "ctranslate2 (1 thread)")}
    assert not pids["ctranslate2"] & pids["ctranslate2 (1 thread)"]


def test_a_failing_child_engine_raises_its_error_in_the_parent(tmp_path):
    pytest.importorskip("ctranslate2")
    from attnkit.bench.isolated import ChildEngine, CT2Translator

    with ChildEngine() as child, pytest.raises(RuntimeError, match=f"child process {child.pid}, 'load': .*"):
        CT2Translator(child, tmp_path / "missing", compute_type="float32", threads=1)


def test_interleaved_timing_takes_a_child_s_own_seconds():
    """A call that timed itself elsewhere (``Elapsed``) is counted by its own seconds, not the parent's clock."""
    from attnkit.bench.isolated import Elapsed

    here = [0]
    timings = timing.measure_interleaved(
        [lambda: Elapsed(5.0, None), lambda: here.append(1)], warmup=1, reps=3, settle_s=0.001
    )
    assert timings[0].times_s == (5.0, 5.0, 5.0) and timings[0].median_s == 5.0
    assert 0 < timings[1].median_s < 1.0 and len(here) == 1 + 4


def test_machine_record_names_cpu_features_threads_and_versions():
    from attnkit.bench.machine import cpu_model_and_flags, machine_info

    cpuinfo = "processor\t: 0\nmodel name\t: AMD EPYC 9R14\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_tile\n" * 2
    assert cpu_model_and_flags(cpuinfo) == ("AMD EPYC 9R14", {"fpu", "avx2", "avx512f", "avx512_bf16", "amx_tile"})
    info = machine_info(threads=3)
    assert info["threads"] == 3 and info["cpu"] and info["cores"] >= 1
    assert info["versions"]["torch"] == torch.__version__
    assert set(info["features"]) <= set(cpu_model_and_flags()[1])


def test_bench_json_file_holds_the_machine_and_every_result(tmp_path, monkeypatch, capsys):
    import attnkit.bench
    from attnkit.cli import main

    row = Result(suite="decode", impl="attnkit", config="tiny", seq_len=5, search="greedy", dtype="float32", ms=2.0)
    monkeypatch.setattr(attnkit.bench, "iter_suite", lambda *a, **k: iter([row]))
    out = tmp_path / "out.json"
    assert main(["bench", "decode", "--json", str(out)]) == 0
    document = json.loads(out.read_text())
    assert document["suite"] == "decode" and document["results"] == [json.loads(row.to_json())]
    machine = document["machine"]
    assert {"cpu", "features", "threads", "versions", "load_average", "load_average_end"} <= set(machine)
    assert "attnkit" in capsys.readouterr().out  # the table


def test_bench_json_lines_start_with_the_machine(monkeypatch, capsys):
    import attnkit.bench
    from attnkit.cli import main

    row = Result(suite="decode", impl="attnkit", config="tiny", seq_len=5, search="greedy", dtype="float32", ms=2.0)
    monkeypatch.setattr(attnkit.bench, "iter_suite", lambda *a, **k: iter([row]))
    assert main(["bench", "decode", "--json"]) == 0
    first, second = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert first["machine"]["threads"] == 2 and second == json.loads(row.to_json())


def test_changes_probe_decoding_variants_emit_the_shipped_tokens():
    """benchmarks/changes.py's decoding variant (cross-attention keys and values projected at every step) must
    decode exactly what shipped attnkit decodes, on a padded batch where sentences and beams differ."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "changes.py"
    spec = importlib.util.spec_from_file_location("changes", path)
    assert spec is not None and spec.loader is not None
    changes = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(changes)
    from attnkit.inference import prepare_for_inference

    src = _padded(torch.randint(5, TINY.vocab_size, (4, 9)), [9, 4, 7, 2])
    call: dict[str, Any] = dict(bos_id=BOS_ID, eos_id=EOS_ID, max_positions=TINY.max_len, fixed_len=12)

    def make_call(model, beam):
        prepare_for_inference(model)
        if beam == 1:
            return lambda: greedy_decode(model, src, **call)
        return lambda: beam_search(model, src, beam_size=beam, **call)

    build = functools.partial(build_translator, TINY, pad_id=PAD_ID)
    for search, beam in (("greedy", 1), ("beam4", 4)):
        variants, calls = changes.decode_variant_calls(build, lambda m, b=beam: make_call(m, b), search)
        assert set(variants) == {"shipped", "cross K/V every step"}
        outputs = [c() for c in calls]
        assert all(out == outputs[0] for out in outputs[1:]), search


def test_the_cuda_graphs_rows_step_as_the_eager_rows_on_padded_token_budget_batches(replayed_step):
    """The "attnkit cuda-graphs" rows' step (``train_steps._graphed_steps``: each batch padded to translate train's
    bounded set of shapes, the loss summed over its target tokens, recorded gradients, the one read, the update)
    computes the eager row's losses on token-budget batches of varied shapes (no dropout; Adam's steps amplify the
    padding's rounding, hence the later steps' tolerance). Here each recording stands in for itself (a replay runs
    the recorded work again), so that it runs on a CPU; the rows themselves need CUDA."""
    cfg = dataclasses.replace(TINY, dropout=0.0)
    batches = train_inputs.token_budget_cycles(cfg, 12, 256, cycles=1, seed=0)[0]
    losses = []
    for graphed in (False, True):
        torch.manual_seed(0)
        model = build_translator(cfg, pad_id=PAD_ID)
        if graphed:
            optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
            prepared = train_steps.with_indices(batches)
            step = train_steps._graphed_steps(model, optimizer, prepared, "fp32", 1, recorder=replayed_step)
        else:
            step = train_steps.training_steps(model, model, batches, "fp32", per_call=1)
        losses.append([step() for _ in batches])
    assert losses[1][0] == pytest.approx(losses[0][0], rel=1e-6)
    assert losses[1] == pytest.approx(losses[0], rel=1e-3)
    with pytest.raises(ValueError, match="cuda_graphs"):
        train_steps.training_steps(model, model, batches, "fp32", per_call=1, cuda_graphs=True)  # (a CPU)
