"""Running a decoding step whose shapes do not change during a call: eagerly, compiled, or replayed as a CUDA graph.

A search (``attnkit.decoding``) is written as a step function ``step(model, state, options)`` that reads and writes
the tensors of ``state`` in place and returns nothing: no host read, no tensor whose shape depends on data, so that
the same step can run as Python calling PyTorch operators, as one compiled program, or as a recorded CUDA graph.
``options`` holds the search's Python constants (beam size, EOS id, ...). gpt-fast decodes the same way.

Engines (``Engine.kind``):
    eager                 the step as written; shapes are the call's own (no buckets)
    compiled              ``torch.compile(step, fullgraph=True, dynamic=False)``: one program per shape bucket,
                          compiled at the first call that needs it and reused by every later call in the process;
                          on a CPU each program runs ``STEPS_PER_PROGRAM`` steps a call, and the call's sources
                          are encoded by a compiled program too
    cuda-graph            the eager step recorded once per model and bucket as a ``torch.cuda.CUDAGraph`` on state
                          that lives as long as the graph; a call fills the state and replays the graph
    compiled-cuda-graph   the compiled step, recorded the same way (fewer, fused kernels in the graph)

A compiled engine made with ``background=True`` (a server's) never makes a call wait for the compiler: a bucket's
first calls run the step as written while its program is compiled in a thread of its own
(``attnkit.inference.background``).

Bucketed engines round the batch and the source length up to powers of two (``batch_bucket``, ``length_bucket``),
so that a process meets a handful of shapes, not one per call. A search reads its stop test on the host once every
``check_every`` steps (``default_check_every``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from attnkit.devices import model_device
from attnkit.errors import InputError
from attnkit.inference import background
from attnkit.inference.cuda_graphs import recorded

ENGINES = ("eager", "compiled", "cuda-graph", "compiled-cuda-graph")
Step = Callable[[Any, Any, Any], None]  # step(model, state, options), in place


@dataclass(frozen=True)
class Engine:
    """How a search runs its steps: ``kind`` (one of ``ENGINES``), how many steps pass between two host reads of
    the stop test (None: ``default_check_every`` of the model's device), and, for the compiled engine, whether a
    call of a bucket without a program runs eagerly while another thread compiles it (``background``: a server's
    choice, ``attnkit.inference.background``) rather than waiting for the compiler."""

    kind: str = "eager"
    check_every: int | None = None
    background: bool = False

    def __post_init__(self) -> None:
        if self.kind not in ENGINES:
            raise ValueError(f"engine={self.kind!r}; expected one of {', '.join(ENGINES)}")
        if self.check_every is not None and self.check_every < 1:
            raise ValueError(f"check_every={self.check_every} must be >= 1")
        if self.background and self.kind != "compiled":
            raise ValueError(f"background=True is for the compiled engine, not {self.kind}")

    @property
    def bucketed(self) -> bool:
        """Whether shapes are rounded to buckets: every engine but eager keeps one program or graph per shape."""
        return self.kind != "eager"

    @property
    def graphed(self) -> bool:
        return self.kind.endswith("cuda-graph")

    def every(self, device: torch.device) -> int:
        return self.check_every if self.check_every is not None else default_check_every(device)

    def steps_per_call(self, device: torch.device, sentences: int) -> int:
        """Decoding steps one call of the program runs: on a CPU, compiled, for a batch of at most
        ``MAX_UNROLLED_SENTENCES`` sentences, ``STEPS_PER_PROGRAM``; else one (a graph replay costs a few
        microseconds, an eager step is as long as it is, and a larger batch's step is long enough that a call's
        cost is a few percent of it)."""
        few = sentences <= MAX_UNROLLED_SENTENCES
        return STEPS_PER_PROGRAM if self.kind == "compiled" and device.type == "cpu" and few else 1

    def compiles_encoder(self, device: torch.device) -> bool:
        """Whether a call encodes its sources by a compiled program too: the compiled engine on a CPU, where the
        encoder's ~200 operators run eagerly in ~7 ms, a tenth of a one-sentence call (docs/performance.md)."""
        return self.kind == "compiled" and device.type == "cpu"

    def prefix(self, device: torch.device) -> bool:
        """Whether a step attends over, and reorders, only the cache positions written so far: the eager step on a
        CPU, which reads its position on the host for free, and then works on views whose length grows with it. A
        compiled step or a graph keeps one shape and needs the whole cache (an unwritten position is masked out)."""
        return self.kind == "eager" and device.type == "cpu"


# Steps a compiled CPU program runs per call: each call pays Dynamo's cache lookup, AOT autograd's wrapper and
# Inductor's (~0.3 ms on a 2-core EPYC, a seventh of a one-sentence step); four steps a call pay it once, for batches
# of a few sentences, where that counts; compiling four steps takes several times as long as one
# (docs/performance.md)
STEPS_PER_PROGRAM = 4
MAX_UNROLLED_SENTENCES = 4
ENV = "ATTNKIT_ENGINE"  # the default engine, where set (a long-lived server may compile: docs/performance.md)


def default_engine(device: torch.device, *, background: bool = False) -> Engine:
    """What a search runs on unless told: ``ATTNKIT_ENGINE`` where set; else CUDA graphs of the eager step on a GPU
    (a step of ~100 small kernels is launch-bound, and recording a graph takes a fraction of a second), the eager
    step elsewhere (compiling costs seconds per shape bucket on a GPU and tens of seconds on a CPU, which a one-shot
    command does not earn back; docs/performance.md). With ``background`` (a server), a compiled engine compiles
    in a thread of its own (``Engine.background``)."""
    chosen = os.environ.get(ENV, "").strip()
    if not chosen:
        return Engine("cuda-graph" if device.type == "cuda" else "eager")
    if chosen not in ENGINES:
        raise InputError(f"{ENV}={chosen!r}: expected one of {', '.join(ENGINES)}")
    if chosen.endswith("cuda-graph") and device.type != "cuda":
        raise InputError(f"{ENV}={chosen}: CUDA graphs need a CUDA device, and this model is on {device.type}")
    return Engine(chosen, background=background and chosen == "compiled")


def default_check_every(device: torch.device) -> int:
    """Steps between two host reads of the stop test. On a GPU a read waits for every kernel queued before it, which
    idles the GPU while the host catches up: once every 8 steps (at most 7 steps run after the last sentence ended).
    On a CPU a read costs nothing and a step run after the end does: every step."""
    return 8 if device.type == "cuda" else 1


def batch_bucket(n: int) -> int:
    """The smallest power of two >= ``n``: a batch of ``n`` rows runs in that many."""
    return 1 << max(0, n - 1).bit_length()


def length_bucket(n: int, limit: int) -> int:
    """The smallest power of two >= ``n`` (at least 16), but no more than ``limit`` (the positional limit)."""
    return min(max(16, batch_bucket(n)), max(n, limit))


class Runner:
    """One call's decoding: ``state`` to fill, then ``step()`` to advance it by ``steps_per_call`` positions."""

    def __init__(self, state: Any, step: Callable[[], None], steps_per_call: int = 1):
        self.state = state
        self.step = step
        self.steps_per_call = steps_per_call


@contextmanager
def running(
    engine: Engine,
    step: Step,
    model: nn.Module,
    options: Any,
    key: Hashable,
    allocate: Callable[[], Any],
    steps_per_call: int = 1,
) -> Iterator[Runner]:
    """A ``Runner`` for ``step`` on ``model``: state from ``allocate()`` (zeros, and valid to run: a graph is recorded
    by running it), or, for the CUDA-graph engines, the state recorded with the graph of ``(step, options, key)``
    for this model, made at the first call and held by one call at a time. ``key`` names the state's shapes. The
    compiled engine's program runs ``steps_per_call`` steps at a time (``Engine.steps_per_call``); the others run
    one. With ``engine.background``, a call that may not run the program yet (``Compiler.program``) runs the same
    steps as written, on the same state."""
    if engine.graphed:
        fn = _compiled(step, model_device(model)) if engine.kind == "compiled-cuda-graph" else step

        def run(state: Any) -> None:  # warmed up, then recorded (the compiled step compiles at the first)
            with _compiling():
                fn(model, state, options)

        graph = recorded(model, (engine.kind, step, options, key), allocate, run)
        with graph.lock:
            yield Runner(graph.state, graph.graph.replay)
        return
    state = allocate()
    if engine.kind == "eager":
        yield Runner(state, lambda: step(model, state, options))
        return
    steps = _steps(step, steps_per_call)
    compiled = _compiled(steps, model_device(model))
    seen = _SEEN.setdefault(steps, set())
    program = (key, options, _structure(model))
    if engine.background:

        def compile() -> None:  # in the compiler's thread, on a state of its own
            with _compiling():
                compiled(model, allocate(), options)
            seen.add(program)

        with background.COMPILER.program((steps, program), compile) as ready:
            if ready:
                with _skipping_guards():
                    yield Runner(state, lambda: compiled(model, state, options), steps_per_call)
            else:  # the same steps as written, on the same state: the same tokens, no compiler to wait for
                yield Runner(state, lambda: steps(model, state, options), steps_per_call)
        return
    if program in seen:
        with _skipping_guards():
            yield Runner(state, lambda: compiled(model, state, options), steps_per_call)
        return

    def first() -> None:  # a new bucket compiles once, with every guard; later calls find its program
        with _compiling():
            compiled(model, state, options)
        seen.add(program)
        runner.step = lambda: compiled(model, state, options)

    runner = Runner(state, first, steps_per_call)
    yield runner


def _skipping_guards():
    """For a program compiled before in this process: Dynamo checks only the guards that tell its programs apart
    (shapes, types, options; the model's structure is in the key), not the ~100 that hold for every call of this
    one."""
    return torch.compiler.set_stance(torch._dynamo.eval_frame._stance.stance, skip_guard_eval_unsafe=True)


_STEPS: dict[tuple[Step, int], Step] = {}


def _steps(step: Step, n: int) -> Step:
    """``step`` run ``n`` times, one function per ``(step, n)`` (a compiled program traces the ``n`` steps into one);
    ``step`` itself where ``n`` is 1."""
    if n == 1:
        return step
    if (step, n) not in _STEPS:

        def steps(model: Any, state: Any, options: Any) -> None:
            for _ in range(n):
                step(model, state, options)

        _STEPS[step, n] = steps
    return _STEPS[step, n]


_MAX_PROGRAMS = 512  # compiled programs one step function may have (Dynamo's default limit, 8, counts per function)
_COMPILED: dict[tuple[Callable, str], Callable] = {}
_SEEN: dict[Callable, set] = {}


def _structure(model: nn.Module) -> tuple:
    """What a compiled step's program depends on in the model besides the shapes of its inputs: its modules' types and
    its parameters' shapes, strides and types (the values are inputs, so any model of this structure may run the
    program; the program does not check the layout of what it is given, ``_compiled``). Read at every call, so by
    walking the modules' own tables: ``model.parameters()`` takes three times as long (~0.9 ms for the small
    translator on a 2-core EPYC)."""
    modules, parameters = [], []
    unseen: list[nn.Module | None] = [model]
    while unseen:
        module = unseen.pop()
        if module is not None:
            modules.append(type(module).__name__)
            parameters += [(p.shape, p.stride(), p.dtype) for p in module._parameters.values() if p is not None]
            unseen += module._modules.values()
    return tuple(modules), tuple(parameters)


def _compiling():
    """Room for one program per bucket: Dynamo's default limit (8 programs per function) would send the ninth
    bucket back to eager."""
    return torch._dynamo.config.patch(recompile_limit=_MAX_PROGRAMS, accumulated_recompile_limit=_MAX_PROGRAMS)


def _compiled(fn: Callable, device: torch.device) -> Callable:
    """``fn`` compiled with static shapes and no graph break, once per process and device type (one program per
    bucket inside). The program does not assert the sizes, strides and alignment of its ~80 inputs at every call
    (Inductor's default; 1.3 us each on a 2-core EPYC, so ~0.1 ms a call). What it is given has the layout it was
    compiled for: the state is allocated the same way at every call, and the model's layout is in the key of its
    program (``_structure``).

    On a CPU, two of Inductor's options differ from its defaults (docs/performance.md):
    - ``realize_opcount_threshold=10``: any value that feeds a reduction and is computed by more than 10 operations
      is stored, not recomputed inside the reduction's loop (default 50). The value that matters is a step's input
      x = E[token] sqrt(d_model) + PE[t]: E is held transposed (``TransposedEmbedding``), so recomputed for each
      output row of the first self-attention projection it is gathered scalar by scalar, in 8 x 8 tiles
      transposed by scalar code; stored once, that projection is a row-by-row sum like the others.
    - ``cpp_wrapper=True``: the program allocates its buffers and calls its kernels from C++, not from a Python
      function of a few hundred lines per step (compiling four steps: 70 s against 65 with Inductor's cache cold,
      5 s against 8 with it warm)."""
    if (fn, device.type) not in _COMPILED:
        options: dict[str, Any] = {"size_asserts": False, "alignment_asserts": False}
        if device.type == "cpu":
            options.update(realize_opcount_threshold=10, cpp_wrapper=True)
        _COMPILED[fn, device.type] = torch.compile(fn, fullgraph=True, dynamic=False, options=options)
    return _COMPILED[fn, device.type]


def compiled_call(engine: Engine, fn: Callable, model: nn.Module, *args: Tensor) -> Any:
    """``fn(model, *args)`` by its compiled program (``_compiled``, one per shape of ``args``): what the compiled
    engine runs once a call outside its steps (the encoder). Dynamo checks all its guards: once a call, that costs
    about what telling programs apart by the model's structure would (``_structure``, ~0.3 ms). With
    ``engine.background``, ``fn`` itself runs until the program is made."""
    compiled = _compiled(fn, model_device(model))
    if not engine.background:
        with _compiling():
            return compiled(model, *args)
    program = (fn, tuple((a.shape, a.dtype) for a in args), _structure(model))

    def compile() -> None:  # the compiler's thread runs the program once, on these inputs (read, never written)
        with _compiling():
            compiled(model, *args)

    with background.COMPILER.program(program, compile) as ready:
        if not ready:
            return fn(model, *args)
        with _compiling():
            return compiled(model, *args)
