"""What every suite shares: the result record, timing, thread control, peak memory, the matmul ceiling, FLOP counts.

Why one file of ~350 lines: it is the measuring kit every suite imports whole (record, timing, threads, memory,
ceiling, FLOPs, table); each section is short and the module docstring states the method behind all of them, so
the method and its code are read in one place.

Timing. ``measure`` calls a function ``warmup`` times untimed (first-call allocation, oneDNN kernel selection,
lazy initialisation in the peers), then ``reps`` times timed with ``time.perf_counter``, and reports the median:
the median is robust to the occasional slow repetition on a shared machine. Every implementation in a suite is
timed on the same inputs, with the same number of threads (``fixed_threads``), in this process, except engines
with a thread pool of their own, which run in a child process that times its own calls (``attnkit.bench.isolated``,
``Elapsed``). The implementations
compared in one table are timed in turns (``measure_interleaved``): A B C, B C A, C A B, ... A slow minute of a
shared machine then costs every implementation alike; measured one after another, whichever ran during it looked
slower (the first release of these suites timed attnkit first and reported small/32 training at 0.76x torch.nn,
while A/B runs in turns gave 1.2-1.4x).

Peak memory (``PeakRSS``, Linux). The resident set size is the honest measure on a CPU: it includes memory that any
allocator (PyTorch's, CTranslate2's, NumPy's) holds. ``getrusage``'s ru_maxrss is process-wide and never falls, so
instead the kernel's high-water mark (VmHWM in /proc/self/status) is reset to the current RSS by writing "5" to
/proc/self/clear_refs just before the measured calls, and peak_mib = VmHWM after them - VmRSS before them. Memory
freed by an earlier measurement may stay resident in the allocator and be reused without raising the mark, so a
suite that reports memory runs every measurement in a fresh subprocess (``scaling``).

Model FLOPs (for MFU, model FLOPs utilisation = model FLOP/s / the machine's ceiling: the measured float32 matmul on
a CPU, the data sheet's dense peak of the row's arithmetic on a GPU, see ``ceiling_results``). Only matrix
multiplications are counted, 2 FLOPs per multiply-add, over real (non-pad) tokens, D = d_model, F = d_ff, V = vocab:

    forward = 2 * sum over tokens of (weights that token is multiplied by) + attention scores and weighted sums
    training step = 3 * forward   (the backward pass costs twice the forward: gradients of inputs and of weights)

    weights per token:  encoder layer  4 D^2 + 2 D F            (W^Q, W^K, W^V, W^O; W_1, W_2)
                        decoder layer  6 D^2 + 2 D F per target token (self W^QKVO, cross W^Q and W^O, FFN)
                                       + 2 D^2 per source token      (cross-attention W^K, W^V on the memory)
                        output projection  D V per target token (tied to the embedding, but a real matmul)
    attention, per layer and sentence:  4 D L_q L_k            (Q K^T and A V; the full square for causal masks,
                                                                as the kernels compute it)

So a training step is 6 * (weights used per token) * tokens + 3 * attention FLOPs; embedding lookups, LayerNorm,
softmax, dropout and the optimizer are not counted (they cost time, which is why MFU stays below 1).
"""

from __future__ import annotations

import dataclasses
import gc
import json
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from attnkit.bench.gpu import datasheet_tflops as gpu_datasheet_tflops
from attnkit.bench.gpu import synchronizer
from attnkit.bench.isolated import Elapsed
from attnkit.training.precision import native_bf16, set_tf32

# attnkit's tokenizers give the special tokens the first ids (attnkit.tokenization.tokenizer.SPECIAL_TOKENS);
# benchmark inputs draw ordinary tokens from FIRST_ORDINARY_ID up.
PAD_ID, UNK_ID, CLS_ID, BOS_ID, EOS_ID = 0, 1, 2, 3, 4
FIRST_ORDINARY_ID = 5


@dataclass
class Result:
    """One measured figure: one implementation, one configuration, one input shape. Unmeasured figures are None."""

    suite: str  # "train", "classify", "decode", "scaling" (the matmul ceiling is reported under the suite's name)
    impl: str  # "attnkit", "torch.nn", "torch.nn (no cache)", "transformers", "ctranslate2", "matmul"
    config: str  # model preset or shape: "small", "base", "seed000", "layer-d256", "2048x2048"
    seq_len: int | None  # source (= target) length, or the sequence length of the encoder layer
    search: str | None  # decode: "greedy" or "beam4"
    dtype: str  # compute type: "float32", "bfloat16", "int8"
    mode: str | None = None  # "train" (forward + backward + Adam step) or "infer" (forward, no gradients)
    variant: str | None = None  # what else distinguishes the row: "padded", "fastpath-off", "dropout=0", ...
    batch: int | None = None  # sentences per call
    tgt_tok_per_s: float | None = None  # target tokens per second (train: teacher-forced; decode: generated)
    sentences_per_s: float | None = None
    ms: float | None = None  # median wall time of one call (one step, one batch), milliseconds
    peak_mib: float | None = None  # peak resident memory added by the call, MiB (see PeakRSS)
    gflop_per_s: float | None = None  # model (or matmul) GFLOP/s
    mfu: float | None = None  # model FLOPs utilisation: gflop_per_s / the ceiling (``ceiling_results``)
    threads: int | None = None  # torch.set_num_threads in this process, or the engine's intra-op threads in its own
    reps: int | None = None  # timed repetitions behind the median
    pid: int | None = None  # the process that ran the timed calls (a child process for engines with their own pool)
    settings: str | None = None  # a peer's settings where they are not the defaults ("inter_threads=1, ...")
    first_call_s: float | None = None  # the first call, untimed in the median: compilation or graph recording

    def to_json(self) -> str:
        return json.dumps({k: _rounded(v) for k, v in dataclasses.asdict(self).items()})


def _rounded(value):
    return round(value, 4) if isinstance(value, float) else value


# ---------------------------------------------------------------------------------------------------------------
# Timing and threads


@dataclass(frozen=True)
class Timing:
    median_s: float
    times_s: tuple[float, ...]


def measure(
    fn: Callable[[], object],
    *,
    warmup: int,
    reps: int,
    budget_s: float | None = None,
    sync: Callable[[], None] | None = None,
) -> Timing:
    """Call ``fn`` ``warmup`` times untimed, then time ``reps`` calls and return their median.

    ``budget_s`` caps slow measurements: if the last warm-up call shows that ``reps`` calls would take longer, fewer
    are timed, never fewer than 2 (each result reports how many). ``sync`` waits for the device (a GPU's queued
    kernels, ``gpu.synchronizer``) before each clock reading.
    """
    gc.collect()
    elapsed = None
    for _ in range(warmup):
        elapsed = timed_call(fn, sync)
    if budget_s is not None and elapsed is not None and elapsed * reps > budget_s:
        reps = max(2, min(reps, int(budget_s / elapsed)))
    times = [timed_call(fn, sync) for _ in range(reps)]
    return Timing(statistics.median(times), tuple(times))


def measure_interleaved(
    fns: Sequence[Callable[[], object]],
    *,
    warmup: int,
    reps: int,
    budget_s: float | None = None,
    settle_s: float = 0.0,
    sync: Callable[[], None] | None = None,
) -> list[Timing]:
    """``measure`` for several implementations at once, timed in turns: round r times every function once, starting
    from a different one each round, so that a slow phase of a shared, noisy machine (another job, a frequency
    change) falls on all of them alike instead of on whichever was measured during it.

    ``budget_s`` caps the rounds (never fewer than 2) by the slowest warm-up: ``reps`` rounds of all functions
    take at most about ``budget_s`` times their number.

    A function may run elsewhere (an engine in a child process, ``attnkit.bench.isolated``) and return the
    ``Elapsed`` seconds it measured there; those are its times. ``settle_s`` sleeps before each timed call, so that
    the threads of the engine called before it (in this process or another) have stopped spinning and left the
    cores idle (OpenMP pools spin for a while after a call before they sleep).
    """
    gc.collect()
    slowest = 0.0
    for fn in fns:
        for _ in range(warmup):
            slowest = max(slowest, timed_call(fn, sync))
    if budget_s is not None and warmup and slowest * reps > budget_s:
        reps = max(2, min(reps, int(budget_s / slowest)))
    times: list[list[float]] = [[] for _ in fns]
    for r in range(reps):
        for k in range(len(fns)):
            i = (r + k) % len(fns)
            if settle_s:
                time.sleep(settle_s)
            times[i].append(timed_call(fns[i], sync))
    return [Timing(statistics.median(t), tuple(t)) for t in times]


def timed_call(fn: Callable[[], object], sync: Callable[[], None] | None = None) -> float:
    """Seconds of one call: the call's own figure where it timed itself (``Elapsed``, a child process), else the
    parent's clock around it (after waiting for the device, where ``sync`` is given, at both ends)."""
    if sync is not None:
        sync()
    start = time.perf_counter()
    out = fn()
    if sync is not None:
        sync()
    elapsed = time.perf_counter() - start
    return out.seconds if isinstance(out, Elapsed) else elapsed


@contextmanager
def fixed_threads(n: int):
    """Run the block with ``torch.set_num_threads(n)`` (intra-op threads), then restore the previous number."""
    if n < 1:
        raise ValueError(f"threads={n} must be >= 1")
    previous = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


# ---------------------------------------------------------------------------------------------------------------
# Peak memory


class PeakRSS:
    """Peak resident memory added by the block, in MiB (``peak_mib``; None where /proc is unavailable).

    Resets the kernel's high-water mark on entry (see the module docstring). Meaningful in a fresh process.
    """

    def __init__(self) -> None:
        self.peak_mib: float | None = None
        self._base_kib: int | None = None

    def __enter__(self) -> PeakRSS:
        gc.collect()
        try:
            Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
            self._base_kib = _proc_status_kib("VmRSS")
        except OSError:
            self._base_kib = None
        return self

    def __exit__(self, *exc) -> None:
        if self._base_kib is not None:
            self.peak_mib = max(0, _proc_status_kib("VmHWM") - self._base_kib) / 1024


def _proc_status_kib(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])  # "VmHWM:   123456 kB"
    raise OSError(f"{key} not in /proc/self/status")


# ---------------------------------------------------------------------------------------------------------------
# The machine's matmul ceiling


def matmul_ceiling(
    dtype: torch.dtype,
    *,
    n: int = 2048,
    warmup: int = 2,
    reps: int = 5,
    device: torch.device | None = None,
    tf32: bool = False,
) -> Timing:
    """Time ``C = A B`` for square (n, n) matrices of ``dtype`` on ``device`` (default the CPU), float32 products on
    TF32 tensor cores where ``tf32`` (CUDA); GFLOP/s = 2 n^3 / median / 1e9 (``gflops``)."""
    device = device or torch.device("cpu")
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    c = torch.empty(n, n, dtype=dtype, device=device)
    restore = set_tf32(tf32, device)
    try:
        return measure(lambda: torch.mm(a, b, out=c), warmup=warmup, reps=reps, sync=synchronizer(device))
    finally:
        restore()


def gflops(flop: float, seconds: float) -> float:
    return flop / seconds / 1e9


def ceiling_results(
    suite: str, *, threads: int, quick: bool, device: torch.device | None = None
) -> tuple[list[Result], dict[str, float]]:
    """The matrix-multiplication ceilings as results, and the GFLOP/s that MFU is relative to for each arithmetic a
    row computes in ("float32", "tf32", "bfloat16").

    A ceiling is the fastest of square matrix multiplications of a few sizes: which size a BLAS runs fastest
    differs between CPUs (on an AVX2 EPYC, 1024 ran at ~158 GFLOP/s and 2048 at ~107, which made a model's
    training step look faster than "the ceiling"). On the CPU, MFU is relative to the measured float32 ceiling for
    every row, and the bfloat16 one is measured only where the CPU has native bfloat16 (``native_bf16``: emulated, it
    takes minutes and means nothing). On a GPU (``attnkit.bench.gpu``) TF32 is measured too, and MFU is relative to
    the data sheet's dense peak of the row's arithmetic (rows of their own, impl "data sheet"), or to the measured
    ceiling of that arithmetic for a GPU the table does not know.
    """
    device = device or torch.device("cpu")
    on_gpu = device.type == "cuda"
    if on_gpu:
        sizes = (2048, 4096) if quick else (2048, 4096, 8192)
    else:
        sizes = (512, 1024) if quick else (512, 1024, 2048)
    with_bf16 = torch.cuda.is_bf16_supported() if on_gpu else native_bf16()
    results: list[Result] = []
    rates: dict[str, float] = {}  # arithmetic -> the best measured GFLOP/s
    kinds = [("float32", torch.float32, False)] + ([("tf32", torch.float32, True)] if on_gpu else [])
    kinds += [("bfloat16", torch.bfloat16, False)] if with_bf16 else []
    for name, dtype, tf32 in kinds:
        per_size: list[tuple[float, Result]] = []
        for n in sizes:
            timing = matmul_ceiling(
                dtype, n=n, warmup=1 if quick else 3, reps=3 if quick else 10, device=device, tf32=tf32
            )
            rate = gflops(2 * n**3, timing.median_s)
            result = Result(
                suite=suite,
                impl="matmul",
                config=f"{n}x{n}",
                seq_len=None,
                search=None,
                dtype=name,
                ms=timing.median_s * 1e3,
                gflop_per_s=rate,
                threads=threads,
                reps=len(timing.times_s),
            )
            per_size.append((rate, result))
        rate, best = max(per_size, key=lambda pair: pair[0])
        results.append(best)
        rates[name] = rate
    if not on_gpu:
        return results, dict.fromkeys(rates, rates["float32"])
    gpu_name = torch.cuda.get_device_name(device)
    if gpu_datasheet_tflops(gpu_name, "bfloat16") is None:
        for result in results:
            result.settings = f"MFU reference ({gpu_name} is not in attnkit.bench.gpu's data-sheet table)"
        return results, rates
    references: dict[str, float] = {}
    for name in rates:
        peak = gpu_datasheet_tflops(gpu_name, name)
        assert peak is not None  # a GPU in the table has every figure
        references[name] = peak * 1e3
        results.append(
            Result(
                suite=suite,
                impl="data sheet",
                config=gpu_name,
                seq_len=None,
                search=None,
                dtype=name,
                gflop_per_s=peak * 1e3,
                settings="dense peak; the MFU reference of the rows in this arithmetic",
            )
        )
    return results, references


# ---------------------------------------------------------------------------------------------------------------
# Model FLOPs (formulas in the module docstring); lengths are per sentence, real tokens only.


def encoder_forward_flops(lengths: Sequence[int], *, d_model: int, d_ff: int, n_layers: int) -> float:
    D, F = d_model, d_ff
    tokens = sum(lengths)
    per_layer = 2 * tokens * (4 * D * D + 2 * D * F) + 4 * D * sum(L * L for L in lengths)
    return n_layers * per_layer


def seq2seq_forward_flops(
    src_lengths: Sequence[int], tgt_lengths: Sequence[int], *, d_model: int, d_ff: int, n_layers: int, vocab_size: int
) -> float:
    """Encoder + decoder (``n_layers`` each) + the output projection, one teacher-forced forward pass."""
    D, F = d_model, d_ff
    src_tokens, tgt_tokens = sum(src_lengths), sum(tgt_lengths)
    encoder = encoder_forward_flops(src_lengths, d_model=D, d_ff=F, n_layers=n_layers)
    decoder_layer = (
        2 * tgt_tokens * (6 * D * D + 2 * D * F)
        + 2 * src_tokens * 2 * D * D
        + 4 * D * sum(t * t + t * s for s, t in zip(src_lengths, tgt_lengths))
    )
    return encoder + n_layers * decoder_layer + 2 * tgt_tokens * D * vocab_size


def training_flops(forward_flops: float) -> float:
    return 3 * forward_flops


def mfu(flop_per_step: float, seconds: float, ceiling_gflops: float) -> float:
    return gflops(flop_per_step, seconds) / ceiling_gflops


# ---------------------------------------------------------------------------------------------------------------
# Table


_FIGURES = (
    ("tgt_tok_per_s", "tgt tok/s", "{:,.0f}"),
    ("sentences_per_s", "sent/s", "{:,.1f}"),
    ("ms", "ms", "{:,.1f}"),
    ("peak_mib", "peak MiB", "{:,.1f}"),
    ("gflop_per_s", "GFLOP/s", "{:,.1f}"),
    ("mfu", "MFU", "{:.1%}"),
    ("first_call_s", "first call s", "{:,.2f}"),
)
_KEYS = (
    ("impl", "impl"),
    ("config", "config"),
    ("variant", "variant"),
    ("mode", "mode"),
    ("seq_len", "len"),
    ("search", "search"),
    ("dtype", "dtype"),
    ("batch", "batch"),
)


def format_table(results: Iterable[Result]) -> str:
    """A plain-text table, one row per result; columns that no row fills are left out."""
    results = list(results)
    if not results:
        return "(no results)"
    columns = [(key, title, "{}") for key, title in _KEYS] + list(_FIGURES) + [("settings", "settings", "{}")]
    columns = [c for c in columns if any(getattr(r, c[0]) is not None for r in results)]
    rows = [[title for _, title, _ in columns]]
    for r in results:
        rows.append(["" if getattr(r, key) is None else fmt.format(getattr(r, key)) for key, _, fmt in columns])
    widths = [max(len(row[i]) for row in rows) for i in range(len(columns))]
    numeric = [key in _NUMERIC for key, _, _ in columns]
    lines = []
    for j, row in enumerate(rows):
        cells = [cell.rjust(w) if num else cell.ljust(w) for cell, w, num in zip(row, widths, numeric)]
        lines.append("  ".join(cells).rstrip())
        if j == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


_NUMERIC = {key for key, _, _ in _FIGURES} | {"seq_len", "batch"}


def describe_machine(info: dict) -> str:
    """One line naming what ``machine.machine_info`` recorded: CPU, features, threads, versions, load (and the GPU,
    where the run timed one: ``gpu.gpu_info``)."""
    versions = ", ".join(f"{k} {v}" for k, v in info["versions"].items() if v)
    load = info["load_average"]
    gpu = info.get("gpu")
    on_gpu = ""
    if gpu:
        on_gpu = f"{gpu['name']} (compute {gpu['capability']}, {gpu['memory_gib']} GiB, CUDA {gpu['cuda']}); "
    return (
        f"{on_gpu}{info['cpu']} ({info['cores']} cores; {' '.join(info['features']) or 'no AVX2'}); "
        f"{info['threads']} threads per engine; {versions}; {info.get('malloc', 'malloc not recorded')}; "
        f"load average {load}"
    )


def describe(result: Result) -> str:
    """One short line for progress output: what was measured and its figures."""
    what = " ".join(
        str(v)
        for v in (
            result.suite,
            result.config,
            result.variant,
            result.mode,
            f"L={result.seq_len}" if result.seq_len else None,
            result.search,
            result.dtype,
            result.impl,
        )
        if v
    )
    figures = [
        f"{fmt.format(getattr(result, key))} {title}"
        for key, title, fmt in _FIGURES
        if getattr(result, key) is not None
    ]
    return f"{what}: {', '.join(figures)}"
