"""Translation training speed: one step = forward + backward + Adam update, in target tokens per second, and MFU.

The encoder-decoder at the ``small`` preset (d_model 256, 4 heads, d_ff 1024, 3 + 3 layers) and the paper's ``base``
(512, 8, 2048, 6 + 6), both with a shared vocabulary of 8,000 tied to the output projection, dropout 0.1. A batch holds
B sentence pairs of exactly L source and L target tokens (no padding), B = tokens_per_batch / 2L, so that source +
target = 4,096 tokens as in §5.1's ~25k-token batches scaled to a CPU. Every implementation minimises the same loss
(label-smoothed cross-entropy, smoothing 0.1, §5.4) with the same optimizer (Adam, §5.3 betas 0.9 / 0.98, eps 1e-9,
PyTorch's fused kernel: Hugging Face Trainer's default ``adamw_torch_fused``) on the same batch. attnkit computes the
loss as ``attnkit translate train`` does (``sequence_loss`` on the real target positions); the peers with
``F.cross_entropy(label_smoothing=0.1)``, PyTorch's own, which is what their users write
(``train_steps.reference_loss``).

Peers: ``torch.nn`` (``nn.Transformer`` with attnkit's embeddings and weights; its layers also drop out attention
weights, which ``nn.TransformerEncoderLayer`` does not let a user separate), Hugging Face ``MarianMTModel``.

On a GPU, as training sees it. Every implementation runs in IEEE float32, in float32 with TF32 matrix products
(``translate train``'s default on a GPU, ``tf32=true``) and under bfloat16 autocast; MFU is relative to the data sheet's
peak of that arithmetic (``bench.gpu``). attnkit runs with the kernels ``translate train`` chooses
(``training.kernels``: no cuDNN attention), the peers with PyTorch's defaults, as their users run them. A second row per
length, variant "token-budget", replays what a real run feeds: token-budget batches (``data.batching``) of sentences of
varied lengths, padded, a new (B, S, T) at every step, never one seen before in the timing; each timed call is a cycle
of ``train_inputs.CYCLE`` such steps (ms is per step). Fixed shapes hide what new shapes cost (a cuDNN attention plan
per shape cost 13 ms a call on an H200).

Row "attnkit compiled" is attnkit's step with its forward pass and loss compiled as ``--set compile=true`` trains
(``training.kernels.compiled``: one graph, no break); its first call (the compilation: tens of seconds) is timed
apart (``first_call_s``) and left out of the median. It runs in the first precision of ``compiled_precisions`` that
the device runs, and only when asked (``attnkit bench train --compiled``: bfloat16, else float32): each row costs a
compilation of 20-90 s on an H100's host, and more on a CPU. In bfloat16 a GPU step is bound by the elementwise
kernels that compiling fuses.

Rows "attnkit cuda-graphs" and "attnkit compiled cuda-graphs" (CUDA) are attnkit's step replayed from CUDA graphs,
as ``translate train`` runs it on one GPU by default (``training.graphs.GraphedStep``: each batch padded to a bounded
set of shapes, per shape the forward pass, loss, backward and clipping recorded as one graph, Adam's update as
another, the host's one read of the loss between them). Their first call is one pass over every batch of the row,
which records each shape as it first comes, timed apart (``first_call_s``); the timed calls then replay: on
token-budget batches, the regime of a run once its shapes are recorded (the Bible recipe's ~50 shapes, in its first
epoch).

Where the parts are: the batches in ``train_inputs``, each implementation's step in ``train_steps``; this module times
the steps in turns and makes the rows.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator

import torch
from torch import Tensor

from attnkit.bench import peers
from attnkit.bench.ceiling import ceiling_results
from attnkit.bench.flops import gflops, mfu, seq2seq_forward_flops, training_flops
from attnkit.bench.gpu import synchronizer
from attnkit.bench.results import Result
from attnkit.bench.timing import fixed_threads, measure_interleaved, timed_call
from attnkit.bench.token_ids import PAD_ID
from attnkit.bench.train_inputs import make_batch, token_budget_cycles
from attnkit.bench.train_steps import IMPLS, forward_fn, training_steps
from attnkit.config import TRANSLATOR_PRESETS, TranslatorConfig
from attnkit.model.build import build_translator
from attnkit.training.precision import native_bf16

CONFIGS: dict[str, TranslatorConfig] = {
    "small": TranslatorConfig(**TRANSLATOR_PRESETS["small"]),
    "base": TranslatorConfig(**{**TRANSLATOR_PRESETS["base"], "vocab_size": 8000}),
}
LENGTHS = (32, 128)
COMPILE_BACKEND = "inductor"  # the "attnkit compiled" row's, as --set compile=true trains


def iter_results(
    *,
    quick: bool = False,
    threads: int = 2,
    configs: dict[str, TranslatorConfig] | None = None,
    lengths: tuple[int, ...] | None = None,
    tokens_per_batch: int | None = None,
    impls: tuple[str, ...] | None = None,
    warmup: int | None = None,
    reps: int | None = None,
    seed: int = 0,
    device: torch.device | None = None,
    variants: tuple[str, ...] | None = None,
    precisions: tuple[str, ...] | None = None,
    compiled_precisions: tuple[str, ...] | None = None,
) -> Iterator[Result]:
    """Yield the matmul ceilings, then one result per (config, length, variant, precision, implementation).
    ``quick``: small, L = 32, 1,024 tokens per batch, 1 warm-up and 2 timed steps. On a GPU (``device``) batches
    hold 8x the tokens (32,768: a GPU is not busy with 4,096), every implementation also runs in TF32 and under
    bfloat16 autocast, and the variants are "fixed" and "token-budget" (see the module docstring); on a CPU "fixed"
    alone unless ``variants`` says otherwise. ``precisions`` keeps only those of the device's ("fp32", "tf32",
    "bf16"); ``compiled_precisions`` adds the "attnkit compiled" row in the first of them the device runs (default
    none: each compiles for tens of seconds)."""
    device = device or torch.device("cpu")
    on_gpu = device.type == "cuda"
    configs = configs or ({"small": CONFIGS["small"]} if quick else CONFIGS)
    lengths = lengths or ((32,) if quick else LENGTHS)
    tokens_per_batch = tokens_per_batch or (1024 if quick else 4096) * (8 if on_gpu else 1)
    chosen = [i for i in (impls or IMPLS) if i != "transformers" or peers.available("transformers")]
    warmup = warmup if warmup is not None else (1 if quick else 2)
    reps = reps if reps is not None else (2 if quick else 5)
    variants = variants or (("fixed", "token-budget") if on_gpu else ("fixed",))
    # Every implementation also in TF32 (a GPU's) and with bfloat16 autocast (attnkit's --set precision=bf16) where
    # the device has native bfloat16, so that like is compared with like.
    with_bf16 = torch.cuda.is_bf16_supported() if on_gpu else native_bf16()
    available = ("fp32", *(("tf32",) if on_gpu else ()), *(("bf16",) if with_bf16 else ()))
    precisions = tuple(p for p in available if precisions is None or p in precisions)
    compiled_runs = [p for p in (compiled_precisions or ()) if p in available][:1] if "attnkit" in chosen else []

    with fixed_threads(threads):
        ceilings, references = ceiling_results("train", threads=threads, quick=quick, device=device)
        yield from ceilings
        for name, cfg in configs.items():
            for length in lengths:
                if length > cfg.max_len:
                    raise ValueError(f"length={length} is past the model's max_len={cfg.max_len}")
                for variant in variants:
                    if variant == "fixed":
                        cycles = [[make_batch(cfg, length, tokens_per_batch, seed)]]
                    else:
                        cycles = token_budget_cycles(cfg, length, tokens_per_batch, warmup + reps, seed)
                    yield from _timed_rows(
                        name, cfg, length, variant, cycles, chosen, precisions, compiled_runs, references, threads,
                        warmup, reps, seed, device,
                    )  # fmt: skip


def _timed_rows(
    name: str,
    cfg: TranslatorConfig,
    length: int,
    variant: str,
    cycles: list[list[tuple[Tensor, Tensor, Tensor]]],
    chosen: list[str],
    precisions: tuple[str, ...],
    compiled_runs: list[str],
    references: dict[str, float],
    threads: int,
    warmup: int,
    reps: int,
    seed: int,
    device: torch.device,
) -> Iterator[Result]:
    """One result per (implementation, precision), and per precision of ``compiled_runs`` an "attnkit compiled" one:
    each timed call runs the steps of the next cycle of batches (one batch at fixed shapes), every implementation on
    the same batches, in turns. A compiled step's first call, its compilation, is timed alone beforehand."""
    batches = [(src.to(device), tgt_in.to(device), tgt_out.to(device)) for c in cycles for src, tgt_in, tgt_out in c]
    per_call = len(cycles[0])
    tgt_tokens = sum(int((b[2] != PAD_ID).sum()) for b in batches) / len(batches)  # a step's, on average
    sentences = sum(b[0].size(0) for b in batches) / len(batches)
    flop = sum(training_flops(_forward_flops(cfg, src, tgt_out)) for src, _, tgt_out in batches) / len(batches)
    torch.manual_seed(seed)
    ours = build_translator(cfg, pad_id=PAD_ID).to(device)
    runs = [(impl, precision) for precision in precisions for impl in chosen]
    # Replayed from CUDA graphs, as translate train runs on one GPU (batches padded to its bounded set of shapes)
    graphed = "attnkit" in chosen and device.type == "cuda"
    runs += [("attnkit cuda-graphs", precision) for precision in precisions if graphed]
    runs += [("attnkit compiled", precision) for precision in compiled_runs]
    runs += [("attnkit compiled cuda-graphs", precision) for precision in compiled_runs if graphed]
    steps, first_call_s = [], {}
    sync = synchronizer(device)
    for impl, precision in runs:
        torch.manual_seed(seed)  # same dropout masks' seed and, for peers, same initialisation seed
        model, forward = forward_fn(impl.split(" ")[0], cfg, ours)
        backend = COMPILE_BACKEND if " compiled" in impl else None
        steps.append(training_steps(model.to(device), forward, batches, precision, per_call=per_call,
                                    compile_backend=backend, cuda_graphs=impl.endswith("cuda-graphs")))  # fmt: skip
        if impl != "attnkit" and impl.startswith("attnkit"):  # the compilation or recording, kept out of the timing
            # (recorded rows: a pass over every cycle, each shape recorded as it first comes)
            calls = len(cycles) if impl.endswith("cuda-graphs") else 1
            first_call_s[(impl, precision)] = timed_call(functools.partial(_calls, steps[-1], calls), sync)
    timings = measure_interleaved(steps, warmup=warmup, reps=reps, budget_s=20.0, sync=sync)
    for (impl, precision), timing in zip(runs, timings):
        t = timing.median_s / per_call  # one step
        dtype = DTYPE_NAMES[precision]
        yield Result(
            suite="train",
            impl=impl,
            config=name,
            seq_len=length,
            search=None,
            dtype=dtype,
            mode="train",
            variant=None if variant == "fixed" else variant,
            batch=round(sentences),
            tgt_tok_per_s=tgt_tokens / t,
            sentences_per_s=sentences / t,
            ms=t * 1e3,
            gflop_per_s=gflops(flop, t),
            mfu=mfu(flop, t, references[dtype]),
            threads=threads,
            reps=len(timing.times_s),
            first_call_s=first_call_s.get((impl, precision)),
        )


def _calls(step: Callable[[], float], n: int) -> None:
    for _ in range(n):
        step()


DTYPE_NAMES = {"fp32": "float32", "tf32": "tf32", "bf16": "bfloat16"}  # --set precision -> the row's arithmetic


def _forward_flops(cfg: TranslatorConfig, src: Tensor, tgt_out: Tensor) -> float:
    """One teacher-forced forward pass over the real tokens of a batch (``flops.seq2seq_forward_flops``)."""
    return seq2seq_forward_flops(
        (src != PAD_ID).sum(dim=1).tolist(),
        (tgt_out != PAD_ID).sum(dim=1).tolist(),
        d_model=cfg.d_model,
        d_ff=cfg.d_ff,
        n_layers=cfg.n_layers,
        vocab_size=cfg.vocab_size,
    )


def run(*, quick: bool = False, **kwargs) -> list[Result]:
    """All results of ``iter_results`` (same arguments) as a list."""
    return list(iter_results(quick=quick, **kwargs))
