"""The static-shape decoding step on every engine (``attnkit.inference.programs``): the tokens of the eager searches
(which ``test_search`` checks against plain references), whatever the batch and the bucket; shapes that do not
change during a call; one host read every ``check_every`` steps; graphs recorded once per model and bucket and
programs compiled once per bucket.

A CUDA graph cannot be recorded on a CPU; ``RecordedGraph`` stands in for one: it records the ATen calls of the
step, refusing those that read a value on the host or make a shape from data (a CUDA graph could not hold them),
and replays those calls on the same tensors, as a graph replays its kernels on the same memory. Whatever the
search keeps on the host between steps would be frozen at recording, and a replay would show it.
"""

from __future__ import annotations

import math
import threading
import time
from contextlib import contextmanager, nullcontext
from typing import Any

import pytest
import torch
from torch._dynamo.utils import counters
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from attnkit.config import TranslatorConfig
from attnkit.decoding import beam_search, beam_search_nbest, greedy_decode, static
from attnkit.errors import InputError
from attnkit.inference import background, cuda_graphs, prepare_for_inference, programs, quantize_for_inference
from attnkit.inference.programs import Engine
from attnkit.model.build import build_translator

PAD, BOS, EOS = 0, 3, 4
TINY = TranslatorConfig(vocab_size=24, d_model=16, n_heads=2, d_ff=32, n_layers=2, max_len=40, tie_embeddings=False)
IDS: dict[str, Any] = dict(bos_id=BOS, eos_id=EOS, max_positions=TINY.max_len)
aten = torch.ops.aten
# Calls that make the host wait for the device: a value read (``bool(t)`` dispatches ``is_nonzero`` under inference
# mode, ``_local_scalar_dense`` outside it; ``.item()`` and ``int(t)`` dispatch ``item``), or a shape that depends on
# data.
HOST_READS = {
    aten._local_scalar_dense.default,
    aten.item.default,
    aten.is_nonzero.default,
    aten.equal.default,
    aten.nonzero.default,
    aten.masked_select.default,
}


def _reads_host(func, args) -> bool:
    if func in HOST_READS:
        return True
    indices = args[1] if func in (aten.index.Tensor, aten.index_put.default, aten.index_put_.default) else ()
    return any(i is not None and i.dtype == torch.bool for i in indices)  # boolean-mask indexing


class CountingMode(TorchDispatchMode):
    """Counts the ATen calls dispatched, and those that read on the host."""

    def __init__(self):
        super().__init__()
        self.calls, self.host_reads = 0, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls += 1
        if _reads_host(func, args):
            self.host_reads.append(func)
        return func(*args, **(kwargs or {}))


class RecordedGraph:
    """A CPU stand-in for ``torch.cuda.CUDAGraph`` (module docstring)."""

    recorded = 0  # graphs recorded in this process (a class counter the tests read)

    def __init__(self):
        self.calls: list = []

    def replay(self) -> None:
        for func, args, kwargs, out in self.calls:
            new = func(*args, **kwargs)
            for old, fresh in zip(tree_flatten(out)[0], tree_flatten(new)[0]):
                # Later calls read the recorded tensors (a graph's fixed memory); a view of a recorded tensor
                # already shows its new values.
                if (
                    isinstance(old, torch.Tensor)
                    and old.untyped_storage().data_ptr() != fresh.untyped_storage().data_ptr()
                ):
                    old.copy_(fresh)


class _Recording(TorchDispatchMode):
    def __init__(self, graph: RecordedGraph):
        super().__init__()
        self.graph = graph

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        assert not _reads_host(func, args), f"{func} in a recorded step: a CUDA graph cannot read on the host"
        out = func(*args, **kwargs)
        self.graph.calls.append((func, args, kwargs, out))
        return out


@contextmanager
def _record(graph: RecordedGraph):
    RecordedGraph.recorded += 1
    with _Recording(graph):
        yield


class _Stream:
    def wait_stream(self, other: _Stream) -> None:
        pass


@pytest.fixture
def recorded_graphs(monkeypatch):
    """The CUDA-graph engines run on the CPU with ``RecordedGraph``; each test starts with no graph recorded."""
    monkeypatch.setattr(torch.cuda, "CUDAGraph", RecordedGraph)
    monkeypatch.setattr(torch.cuda, "graph", _record)
    monkeypatch.setattr(torch.cuda, "Stream", _Stream)
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: nullcontext())
    monkeypatch.setattr(torch.cuda, "device", lambda device: nullcontext())
    monkeypatch.setattr(torch.cuda, "current_stream", _Stream)
    monkeypatch.setattr(cuda_graphs, "_GRAPHS", type(cuda_graphs._GRAPHS)())
    RecordedGraph.recorded = 0


pytestmark = pytest.mark.usefixtures("one_thread")


def _model(dtype: torch.dtype = torch.float32):
    """A tiny random translator whose outputs end with EOS at varied lengths (as ``test_search``'s: untied, with
    the output projection scaled up so that near ties are rare)."""
    torch.manual_seed(0)
    model = build_translator(TINY, pad_id=PAD)
    with torch.no_grad():
        model.output_proj.weight.mul_(3.0)
    return prepare_for_inference(model).to(dtype)


def _sources(lengths: list[int], seed: int = 1) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(EOS + 1, TINY.vocab_size, (len(lengths), max(lengths)), generator=gen)  # (B, S)
    for row, n in enumerate(lengths):
        src[row, n:] = PAD
    return src


def _unpadded(src: torch.Tensor) -> list[torch.Tensor]:
    return [row[row != PAD][None] for row in src]  # each (1, S_i): a sentence alone, no padding


GRAPH = Engine("cuda-graph")
SEARCHES = {
    "greedy": lambda m, s, **kw: greedy_decode(m, s, **IDS, max_extra=8, **kw),
    "beam gnmt": lambda m, s, **kw: beam_search(m, s, **IDS, beam_size=3, max_extra=8, **kw),
    "beam power": lambda m, s, **kw: beam_search(
        m, s, **IDS, beam_size=3, length_penalty="power", alpha=1.0, max_extra=8, **kw
    ),
    "beam none": lambda m, s, **kw: beam_search(m, s, **IDS, beam_size=2, length_penalty="none", max_extra=8, **kw),
}


@pytest.mark.parametrize("search", SEARCHES)
def test_a_sentence_decodes_alone_as_in_any_batch_and_bucket(recorded_graphs, search):
    """Batches of 1, 3, 5 and 8 sentences (buckets of 1, 4, 8 and 8 rows) on the recorded graph give, for every
    sentence, the tokens the eager search gives it alone and unpadded."""
    model, decode = _model(), SEARCHES[search]
    src = _sources([9, 3, 6, 1, 7, 5, 2, 8])
    alone = [decode(model, sentence)[0] for sentence in _unpadded(src)]
    assert any(len(a) for a in alone)  # the weights emit tokens before EOS: the outputs say something
    for size in (1, 3, 5, 8):
        assert decode(model, src[:size], engine=GRAPH) == alone[:size], size
    assert decode(model, src, engine=GRAPH) == decode(model, src)  # the eager batch, too


def test_nbest_on_the_recorded_graph_is_the_eager_one(recorded_graphs):
    """The same hypotheses in the same order; scores to float32 rounding (the bucket of 4 rows and 16 source
    positions multiplies in other blocks than the call's own 3 x 9)."""
    model, src = _model(), _sources([5, 9, 2])
    kwargs = dict(**IDS, beam_size=4, n_best=3, max_extra=6)
    graph, eager = beam_search_nbest(model, src, **kwargs, engine=GRAPH), beam_search_nbest(model, src, **kwargs)
    assert [[(h.tokens, h.eos) for h in hyps] for hyps in graph] == [
        [(h.tokens, h.eos) for h in hyps] for hyps in eager
    ]
    for ours, theirs in zip(sum(graph, []), sum(eager, [])):
        assert ours.score == pytest.approx(theirs.score, rel=1e-5)
        assert ours.normalized == pytest.approx(theirs.normalized, rel=1e-5)


def _teacher_forced_score(model, src: torch.Tensor, tokens: list[int], eos: bool) -> float:
    """log P(tokens, then EOS if emitted | src (1, S)) by one full pass over the output: the reference."""
    target = tokens + [EOS] if eos else tokens
    tgt_in = torch.tensor([[BOS] + target[:-1]])  # (1, T)
    with torch.inference_mode():
        logp = torch.log_softmax(model(src, tgt_in).float(), dim=-1)[0]  # (T, V)
    return float(logp.gather(1, torch.tensor(target)[:, None]).sum())


def test_greedy_scores_summed_in_the_search_are_a_teacher_forced_pass_on_every_engine(recorded_graphs):
    """``greedy_decode_scored``: greedy_decode's tokens, whether EOS ended each output (else its length limit), and
    the summed log-probabilities of its tokens and EOS, which a teacher-forced pass of each output gives too
    (float32 rounding apart), in a batch and on the recorded graph: the server reports them without that pass."""
    from attnkit.decoding import greedy_decode_scored

    model, src = _model(), _sources([9, 3, 6, 1, 7, 5, 2, 8])
    eager = greedy_decode_scored(model, src, **IDS, max_extra=8)
    assert [h.tokens for h in eager] == greedy_decode(model, src, **IDS, max_extra=8)
    assert {h.eos for h in eager} == {True, False}  # outputs that ended with EOS and outputs cut at their limit
    for hyp, sentence in zip(eager, _unpadded(src)):
        assert hyp.score == pytest.approx(_teacher_forced_score(model, sentence, hyp.tokens, hyp.eos), abs=1e-4)
        assert hyp.normalized == hyp.score and hyp.score < 0
    graph = greedy_decode_scored(model, src, **IDS, max_extra=8, engine=GRAPH)
    assert [(h.tokens, h.eos) for h in graph] == [(h.tokens, h.eos) for h in eager]
    assert [h.score for h in graph] == pytest.approx([h.score for h in eager], abs=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, "int8"])
def test_reduced_precision_decodes_on_the_recorded_graph_as_eager(recorded_graphs, dtype):
    model = quantize_for_inference(_model()) if dtype == "int8" else _model(dtype)
    src = _sources([9, 3, 6, 7])
    for decode in (SEARCHES["greedy"], SEARCHES["beam gnmt"]):
        assert decode(model, src, engine=GRAPH) == decode(model, src)
        assert [decode(model, s, engine=GRAPH)[0] for s in _unpadded(src)] == decode(model, src)


def test_graphs_are_recorded_once_per_model_and_bucket(recorded_graphs):
    """Twenty calls of batch sizes 1 to 8 and sources of 2 to 12 tokens: buckets of 1, 2, 4 and 8 rows and 16
    source positions, so four graphs per search, whatever the order of the calls; a second model has its own."""
    model = _model()
    gen = torch.Generator().manual_seed(3)
    sizes = [1, 2, 3, 4, 5, 8, 7, 6, 1, 2, 3, 8, 4, 5, 6, 7, 1, 8, 2, 3]
    for size in sizes:
        lengths = torch.randint(2, 13, (size,), generator=gen).tolist()
        SEARCHES["greedy"](model, _sources(lengths, seed=size), engine=GRAPH)
    assert RecordedGraph.recorded == 4
    SEARCHES["greedy"](_model(), _sources([4, 5]), engine=GRAPH)
    assert RecordedGraph.recorded == 5
    model._apply(torch.clone)  # the weights move (as .to() may move them): graphs that read the old ones go
    src = _sources([4, 5])
    assert SEARCHES["greedy"](model, src, engine=GRAPH) == SEARCHES["greedy"](model, src)
    assert RecordedGraph.recorded == 6 and len(cuda_graphs._GRAPHS[model][1]) == 1


def _count_steps(monkeypatch) -> CountingMode:
    """Count the ATen calls of the decoding loops (the steps and the stop test's reads), not the encoder's."""
    mode, run_steps = CountingMode(), static.run_steps

    def counted(runner, steps, stopped, check_every):
        with mode:
            run_steps(runner, steps, stopped, check_every)

    for module in ("greedy", "beam"):
        monkeypatch.setattr(f"attnkit.decoding.{module}.run_steps", counted)
    return mode


@pytest.mark.parametrize("search", ["greedy", "beam gnmt"])
@pytest.mark.parametrize("check_every", [1, 8])
@pytest.mark.parametrize("prefix", [False, True])
def test_the_loop_reads_the_host_once_every_check_every_steps(monkeypatch, search, check_every, prefix):
    """Over a whole call, the static step reads nothing on the host; the loop reads its stop test once every
    ``check_every`` steps; and a step dispatches as many ATen calls (GPU kernels) at batch 8 as at batch 1. The eager
    step on a CPU (``Engine.prefix``) also reads its position, once a step, where that read costs nothing."""
    monkeypatch.setattr(Engine, "prefix", lambda self, device: prefix)
    model, decode = _model(), SEARCHES[search]
    per_step = {}
    for lengths in ([30], [30, 3, 9, 1, 12, 7, 5, 2]):
        mode = _count_steps(monkeypatch)
        decode(model, _sources(lengths), engine=Engine("eager", check_every=check_every), fixed_len=24)
        stop_reads = [f for f in mode.host_reads if f is not aten.item.default]
        assert set(stop_reads) <= {aten.is_nonzero.default}  # bool(stop), nothing else
        assert len(stop_reads) == math.ceil(24 / check_every) - 1  # not after the last step: it stops anyway
        assert mode.host_reads.count(aten.item.default) == (24 if prefix else 0)  # int(t), once a step
        per_step[len(lengths)] = mode.calls
    assert per_step[1] == per_step[8]


def test_the_loop_stops_at_the_first_read_after_every_sentence_ended(monkeypatch):
    model = _model()
    steps = []
    real_step = programs.Runner.__init__

    def counting(self, state, step):
        def counted():
            steps.append(1)
            step()

        real_step(self, state, counted)

    monkeypatch.setattr(programs.Runner, "__init__", counting)
    src = _sources([3, 4])
    out = SEARCHES["greedy"](model, src, engine=Engine("eager", check_every=4))
    limits = [3 + 8, 4 + 8]  # input length + max_extra
    ended = max(len(o) + 1 if len(o) < limit else limit for o, limit in zip(out, limits))  # the last one's step
    assert ended < 12  # the check is worth something: decoding ended before the longest limit
    assert len(steps) == min(4 * math.ceil(ended / 4), 12)  # on to the next read, at most to the longest limit


# ---------------------------------------------------------------------------------------------------------------
# The compiled engine on a CPU: slow to compile, so one search, the tiny model and two buckets


@pytest.fixture
def fresh_compiler(monkeypatch):
    """No program compiled before the test, none left after it; two steps a program instead of
    ``STEPS_PER_PROGRAM`` (the same code, at half the compiling time: see ``test_a_compiled_call_runs_...``)."""
    monkeypatch.setattr(programs, "STEPS_PER_PROGRAM", 2)
    torch._dynamo.reset()
    monkeypatch.setattr(programs, "_COMPILED", {})
    monkeypatch.setattr(programs, "_SEEN", {})
    counters.clear()
    yield
    torch._dynamo.reset()


def test_twenty_calls_compile_one_program_per_bucket_and_decode_as_eager(fresh_compiler):
    """Batches of 1 and 2 sentences of 2 to 12 tokens (buckets of 1 and 2 rows, 16 source positions): per bucket a
    program of the steps and one of the encoder, each compiled by the first call of its bucket and found by the
    later ones (Dynamo is told to fail on any recompilation after the first call of a bucket), with the eager
    step's tokens."""
    model, compiled = _model(), Engine("compiled")
    gen = torch.Generator().manual_seed(5)
    seen: set[int] = set()
    for call, size in enumerate([1, 2] * 10):
        src = _sources(torch.randint(2, 13, (size,), generator=gen).tolist(), seed=call)
        with torch.compiler.set_stance("fail_on_recompile" if size in seen else "default"):
            out = SEARCHES["greedy"](model, src, engine=compiled)
        assert out == SEARCHES["greedy"](model, src), call
        seen.add(size)
    assert counters["stats"]["unique_graphs"] == 2 * 2  # a step program and an encoder program per bucket
    assert not counters["graph_break"]


def test_a_compiled_call_runs_several_steps_a_program_inside_its_cache(monkeypatch):
    """On a CPU the compiled engine runs ``STEPS_PER_PROGRAM`` steps a call for a few sentences, in a cache rounded
    up to a multiple of them, so that the steps run after the longest output write inside it; where the rounding
    would pass the positional limit, or for a larger batch, one step a call. The loop reads its stop test after
    every call and counts steps, not calls."""
    model, k = _model(), programs.STEPS_PER_PROGRAM
    assert k > 1
    limits: dict[str, Any] = dict(max_positions=200, max_extra=50, fixed_len=None)
    for length in (2, 7, 13):
        call = static.plan(model, _sources([length]), Engine("compiled"), **limits)
        assert call.per_call == k and call.cache % k == 0 and call.cache >= call.steps
    near = static.plan(model, _sources([13]), Engine("compiled"), **{**limits, "max_positions": 66})
    assert near.per_call == 1 and near.cache <= 66  # 16 source positions + 50 = 66, not a multiple of 4
    assert static.plan(model, _sources([3]), Engine("eager"), **limits).per_call == 1
    many = _sources([3] * (programs.MAX_UNROLLED_SENTENCES + 1))  # a larger batch: one step a call
    assert static.plan(model, many, Engine("compiled"), **limits).per_call == 1

    calls, reads = [], []
    runner = programs.Runner(None, lambda: calls.append(1), steps_per_call=k)
    static.run_steps(runner, 10, lambda: reads.append(1) or torch.tensor(False), check_every=1)
    assert len(calls) == math.ceil(10 / k) and len(reads) == len(calls) - 1


def test_a_known_program_is_found_again_only_for_a_model_of_the_same_structure():
    """A compiled program found again skips Dynamo's guards (``programs.running``), so its key holds the model's
    structure (``programs._structure``): the same for another model of the same shapes, different for one cast to
    another dtype, one not prepared or quantized (other modules), or one with a weight held in another layout."""
    model = _model()
    other = _model()
    with torch.no_grad():
        other.output_proj.weight.add_(1.0)  # other values, the same structure
    structure = programs._structure(model)
    assert programs._structure(other) == structure
    assert programs._structure(_model(torch.bfloat16)) != structure
    assert programs._structure(build_translator(TINY, pad_id=PAD)) != structure  # not prepared: other modules
    assert programs._structure(quantize_for_inference(build_translator(TINY, pad_id=PAD))) != structure
    transposed = _model()
    transposed.output_proj.weight = torch.nn.Parameter(transposed.output_proj.weight.t().contiguous().t())
    assert programs._structure(transposed) != structure  # the same shape, another stride


@pytest.fixture
def background_compiler(monkeypatch):
    """A compiler thread of the test's own (``attnkit.inference.background``), told to stop waiting at the end."""
    compiler = background.Compiler()
    monkeypatch.setattr(background, "COMPILER", compiler)
    return compiler


def test_a_call_never_waits_for_the_background_compiler(monkeypatch, background_compiler):
    """With ``Engine.background``, a call whose bucket has no program decodes eagerly and queues its programs (the
    encoder's and the steps') for the compiler's thread; a call of a known bucket runs its programs, except while
    the thread compiles (Dynamo's guard switch is the process's): then eagerly too. Every call gives the eager
    tokens. The compiler here is a stand-in that holds each compilation until the test lets it go and records which
    thread runs a program (real compilation: the next test)."""
    release = threading.Event()
    runs: list[str] = []  # the thread of each program run

    def stand_in(fn, device):
        def program(*args):
            if threading.current_thread().name == "attnkit-compile":
                assert release.wait(30), "bounded: the test releases every compilation"
            runs.append(threading.current_thread().name)
            return fn(*args)

        return program

    monkeypatch.setattr(programs, "_compiled", stand_in)
    monkeypatch.setattr(programs, "_SEEN", {})
    model, engine = _model(), Engine("compiled", background=True)
    one, two = _sources([7], seed=3), _sources([9, 4], seed=4)  # buckets of 1 and 2 rows
    expected = {1: SEARCHES["greedy"](model, one), 2: SEARCHES["greedy"](model, two)}

    assert SEARCHES["greedy"](model, one, engine=engine) == expected[1]  # eager: both programs queued
    assert runs == []
    release.set()
    assert background_compiler.wait(30)
    assert runs == ["attnkit-compile"] * 2  # the encoder's program and the steps', each run once to compile it
    runs.clear()
    assert SEARCHES["greedy"](model, one, engine=engine) == expected[1]  # the programs, in the caller's thread
    assert runs and set(runs) == {"MainThread"}

    release.clear()
    runs.clear()
    assert SEARCHES["greedy"](model, two, engine=engine) == expected[2]  # a new bucket: eager, queued
    assert SEARCHES["greedy"](model, one, engine=engine) == expected[1]  # known, but the compiler is busy: eager
    assert runs == []
    release.set()
    assert background_compiler.wait(30)
    runs.clear()
    assert SEARCHES["greedy"](model, two, engine=engine) == expected[2]
    assert runs and set(runs) == {"MainThread"}


def test_the_compiler_pauses_while_calls_run_and_takes_a_slice_when_they_never_stop(monkeypatch):
    """The compiler's thread holds the GIL while it compiles, and an eager call beside it waits up to 5 ms for it at
    each operator (measured: a 0.4 s call took 2-40 s): so it pauses at its next Python call while a call runs. A
    call that never stops still lets it go on, ``SLICE_S`` after each ``GIVE_WAY_S``. The compilation here is a
    stand-in that counts its Python calls, for at most 20 s."""
    monkeypatch.setattr(background, "GIVE_WAY_S", 0.5)
    monkeypatch.setattr(background, "SLICE_S", 0.1)
    compiler, started, stop = background.Compiler(), threading.Event(), threading.Event()
    ticks: list[None] = []

    def tick() -> None:
        ticks.append(None)

    def compile() -> None:
        started.set()
        deadline = time.monotonic() + 20
        while not stop.is_set() and time.monotonic() < deadline:
            tick()

    compiler.submit("slow", compile)
    assert started.wait(10)
    with compiler.program("another", lambda: None) as ready:  # a call: not compiled, so eager, and queued
        assert not ready
        time.sleep(0.1)  # the compiler reaches its next call and waits there
        before = len(ticks)
        time.sleep(0.3)
        assert len(ticks) - before <= 1  # paused
        time.sleep(1.0)  # past GIVE_WAY_S: a slice of compiling, then paused again
        assert len(ticks) - before > 1
    after = len(ticks)
    time.sleep(0.2)
    assert len(ticks) > after  # no call: on at full speed
    stop.set()
    assert compiler.wait(30) and compiler.known == {"slow", "another"}


def test_programs_compiled_in_the_background_thread_serve_the_callers_calls(fresh_compiler, background_compiler):
    """Real compilation in the compiler's thread (one bucket: the encoder's program and the steps'): a later call
    runs them without compiling again, even with every guard checked (Dynamo is told to fail on a recompilation;
    a program compiled in another grad mode than the caller's would fail it), and decodes as eager."""
    model, src = _model(), _sources([6], seed=2)
    expected = SEARCHES["greedy"](model, src)
    with torch.inference_mode():  # as the server decodes
        assert SEARCHES["greedy"](model, src, engine=Engine("compiled", background=True)) == expected
        assert background_compiler.wait(300)
        assert background_compiler.known and not background_compiler.failed
        assert counters["stats"]["unique_graphs"] == 2
        with torch.compiler.set_stance("fail_on_recompile"):
            assert SEARCHES["greedy"](model, src, engine=Engine("compiled", background=True)) == expected
            programs._SEEN.clear()  # the steps' program looked up again with all its guards, as at a first call
            assert SEARCHES["greedy"](model, src, engine=Engine("compiled")) == expected
    assert counters["stats"]["unique_graphs"] == 2 and not counters["graph_break"]


def test_only_the_compiled_engine_compiles_in_the_background(monkeypatch):
    with pytest.raises(ValueError, match="background=True is for the compiled engine, not eager"):
        Engine("eager", background=True)
    cpu = torch.device("cpu")
    monkeypatch.setenv(programs.ENV, "compiled")
    assert programs.default_engine(cpu, background=True) == Engine("compiled", background=True)
    monkeypatch.setenv(programs.ENV, "eager")
    assert programs.default_engine(cpu, background=True) == Engine("eager")


@pytest.mark.parametrize("search", SEARCHES)
def test_steps_run_past_the_longest_output_change_no_token(monkeypatch, search):
    """A program of several steps runs up to ``per_call - 1`` steps after the longest output (here 5 a call, and
    outputs of at most 5 + 8, 2 + 8 and 16 + 8 tokens, the last filling the 24 positions its source bucket's cache
    would hold): on finished rows, inside the cache rounded up to 25, they change nothing. The compiled engine's
    steps run uncompiled here (the same step function, in seconds)."""
    monkeypatch.setattr(programs, "STEPS_PER_PROGRAM", 5)
    monkeypatch.setattr(programs, "_compiled", lambda fn, device: fn)
    monkeypatch.setattr(programs, "_SEEN", {})
    model, src = _model(), _sources([5, 2, 16])
    call = static.plan(model, src, Engine("compiled"), max_positions=TINY.max_len, max_extra=8, fixed_len=None)
    assert (call.per_call, call.steps, call.cache) == (5, 24, 25)  # the last call runs a 25th step
    assert SEARCHES[search](model, src, engine=Engine("compiled")) == SEARCHES[search](model, src)


# ---------------------------------------------------------------------------------------------------------------
# On a GPU (skipped elsewhere): the real CUDA graphs, and the compiled step inside them


@pytest.mark.cuda
@pytest.mark.parametrize("kind", ["cuda-graph", "compiled-cuda-graph"])
def test_cuda_graphs_decode_as_the_eager_step_on_the_gpu(kind):
    """Float32 (no TF32 in matrix products by default): every search on the graph gives the eager step's tokens,
    in batches of several buckets, and a second round of calls replays the graphs recorded by the first."""
    model, engine = _model().cuda(), Engine(kind)
    src = _sources([9, 3, 6, 1, 7, 5, 2, 8]).cuda()
    for name, decode in SEARCHES.items():
        if kind.startswith("compiled") and name not in ("greedy", "beam gnmt"):
            continue  # compiling every variant would take minutes
        eager = decode(model, src)
        for _ in range(2):
            assert [decode(model, src[:n], engine=engine) for n in (1, 3, 8)] == [eager[:1], eager[:3], eager], name


@pytest.mark.cuda
def test_a_gpu_decoding_loop_reads_the_host_once_every_check_every_steps(monkeypatch):
    model, decode = _model().cuda(), SEARCHES["beam gnmt"]
    mode = _count_steps(monkeypatch)
    decode(model, _sources([9, 3, 6]).cuda(), engine=Engine("cuda-graph", check_every=8), fixed_len=24)
    assert mode.host_reads == [aten.is_nonzero.default] * 2  # after steps 8 and 16; the graph replays read nothing


def test_the_default_engine_is_the_devices_unless_attnkit_engine_says(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    monkeypatch.delenv(programs.ENV, raising=False)
    assert programs.default_engine(cpu) == Engine("eager") and programs.default_engine(cuda) == Engine("cuda-graph")
    monkeypatch.setenv(programs.ENV, "compiled")
    assert programs.default_engine(cpu) == Engine("compiled")
    monkeypatch.setenv(programs.ENV, "cuda-graph")
    with pytest.raises(InputError, match="ATTNKIT_ENGINE=cuda-graph: CUDA graphs need a CUDA device"):
        programs.default_engine(cpu)
    monkeypatch.setenv(programs.ENV, "fast")
    with pytest.raises(InputError, match="ATTNKIT_ENGINE='fast': expected one of eager, compiled, cuda-graph"):
        programs.default_engine(cuda)
