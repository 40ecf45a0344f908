"""Translation training speed: one step = forward + backward + Adam update, in target tokens per second, and MFU.

The encoder-decoder at the ``small`` preset (d_model 256, 4 heads, d_ff 1024, 3 + 3 layers) and the paper's ``base``
(512, 8, 2048, 6 + 6), both with a shared vocabulary of 8,000 tied to the output projection, dropout 0.1. A batch
holds B sentence pairs of exactly L source and L target tokens (no padding), B = tokens_per_batch / 2L, so that
source + target = 4,096 tokens as in §5.1's ~25k-token batches scaled to a CPU. Every implementation minimises the
same loss (label-smoothed cross-entropy, smoothing 0.1, §5.4) with the same optimizer (Adam, §5.3 betas 0.9 / 0.98,
eps 1e-9, PyTorch's fused kernel: Hugging Face Trainer's default ``adamw_torch_fused``) on the same batch. attnkit
computes the loss as ``attnkit translate train`` does (``sequence_loss`` on the real target positions); the peers
with ``F.cross_entropy(label_smoothing=0.1)``, PyTorch's own, which is what their users write (``reference_loss``).

Peers: ``torch.nn`` (``nn.Transformer`` with attnkit's embeddings and weights; its layers also drop out attention
weights, which ``nn.TransformerEncoderLayer`` does not let a user separate), Hugging Face ``MarianMTModel``.

On a GPU, as training sees it. Every implementation runs in IEEE float32, in float32 with TF32 matrix products
(``translate train``'s default on a GPU, ``tf32=true``) and under bfloat16 autocast; MFU is relative to the data
sheet's peak of that arithmetic (``bench.gpu``). attnkit runs with the kernels ``translate train`` chooses
(``training.kernels``: no cuDNN attention), the peers with PyTorch's defaults, as their users run them. A second
row per length, variant "token-budget", replays what a real run feeds: token-budget batches (``data.batching``) of
sentences of varied lengths, padded, a new (B, S, T) at every step, never one seen before in the timing; each timed
call is a cycle of ``CYCLE`` such steps (ms is per step). Fixed shapes hide what new shapes cost (a cuDNN attention
plan per shape cost 13 ms a call on an H200).

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
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.bench import peers
from attnkit.bench.common import (
    BOS_ID,
    EOS_ID,
    FIRST_ORDINARY_ID,
    PAD_ID,
    Result,
    ceiling_results,
    fixed_threads,
    gflops,
    measure_interleaved,
    mfu,
    seq2seq_forward_flops,
    timed_call,
    training_flops,
)
from attnkit.bench.gpu import synchronizer
from attnkit.config import TRANSLATOR_PRESETS, TranslatorConfig, TranslatorTrainConfig
from attnkit.data.batching import token_budget_batches
from attnkit.data.readers.parallel import Pair
from attnkit.model.build import build_translator
from attnkit.model.transformer import Transformer
from attnkit.tasks.translate.data import fixed_shape_batch
from attnkit.training.graphs import GraphedStep
from attnkit.training.kernels import compiled, training_kernels
from attnkit.training.losses import sequence_loss
from attnkit.training.precision import autocast, native_bf16, set_tf32
from attnkit.training.task import Batch, BatchLoss

CONFIGS: dict[str, TranslatorConfig] = {
    "small": TranslatorConfig(**TRANSLATOR_PRESETS["small"]),
    "base": TranslatorConfig(**{**TRANSLATOR_PRESETS["base"], "vocab_size": 8000}),
}
LENGTHS = (32, 128)
IMPLS = ("attnkit", "torch.nn", "transformers")
LABEL_SMOOTHING = 0.1
COMPILE_BACKEND = "inductor"  # the "attnkit compiled" row's, as --set compile=true trains


def reversal_pairs(n: int, *, vocab: int = 300, seed: int = 0) -> list[Pair]:
    """``n`` sentence pairs of 4-20 words drawn from ``vocab`` word types, each target its source reversed: text for a
    whole ``translate train`` run (tokenizer, token-budget batches, steps) where real data is not needed."""
    r = random.Random(seed)
    words = [f"w{i}" for i in range(vocab)]
    pairs = []
    for line in range(n):
        s = r.choices(words, k=r.randint(4, 20))
        pairs.append(Pair(" ".join(s), " ".join(reversed(s)), line + 2))
    return pairs


def make_batch(cfg: TranslatorConfig, length: int, tokens_per_batch: int, seed: int) -> tuple[Tensor, Tensor, Tensor]:
    """``src`` (B, L), ``tgt_in`` (B, L) = BOS y_1 .. y_{L-1}, ``tgt_out`` (B, L) = y_1 .. y_{L-1} EOS."""
    if length > cfg.max_len:
        raise ValueError(f"length={length} is past the model's max_len={cfg.max_len}")
    B = max(1, tokens_per_batch // (2 * length))
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(FIRST_ORDINARY_ID, cfg.vocab_size, (B, length), generator=gen)  # (B, L)
    words = torch.randint(FIRST_ORDINARY_ID, cfg.vocab_size, (B, length - 1), generator=gen)  # (B, L - 1)
    tgt_in = torch.cat([torch.full((B, 1), BOS_ID), words], dim=1)  # (B, L)
    tgt_out = torch.cat([words, torch.full((B, 1), EOS_ID)], dim=1)  # (B, L)
    return src, tgt_in, tgt_out


def batch_loss(logits: Tensor, targets: Tensor) -> Tensor:
    """Mean label-smoothed cross-entropy per target token, as attnkit trains: logits (N, V) of the N real targets
    (N, known on the host, as a batch knows its token count when it is built)."""
    loss, _ = sequence_loss(logits, targets, PAD_ID, smoothing=LABEL_SMOOTHING)
    return loss / targets.numel()


def reference_loss(logits: Tensor, tgt_out: Tensor) -> Tensor:
    """The same loss through PyTorch's cross-entropy (the peers'): logits (B, T, V), tgt_out (B, T)."""
    logits, targets = logits.reshape(-1, logits.size(-1)), tgt_out.reshape(-1)  # (B T, V), (B T,)
    loss = F.cross_entropy(logits, targets, ignore_index=PAD_ID, label_smoothing=LABEL_SMOOTHING, reduction="sum")
    return loss / (targets != PAD_ID).sum()


def forward_fn(
    impl: str, cfg: TranslatorConfig, ours: Transformer
) -> tuple[nn.Module, Callable[[Tensor, Tensor], Tensor]]:
    """The model of ``impl`` and its teacher-forced forward pass (src, tgt_in) -> logits (B, T, V)."""
    if impl == "attnkit":
        return ours, ours
    if impl == "torch.nn":
        model: nn.Module = peers.TorchNNTranslator(ours)
        return model, model
    if impl == "transformers":
        model = peers.marian_translator(cfg, pad_id=PAD_ID, bos_id=BOS_ID, eos_id=EOS_ID)

        def forward(src: Tensor, tgt_in: Tensor) -> Tensor:
            return model(
                input_ids=src,
                attention_mask=(src != PAD_ID).long(),
                decoder_input_ids=tgt_in,
                decoder_attention_mask=(tgt_in != PAD_ID).long(),
            ).logits  # (B, T, V)

        return model, forward
    raise ValueError(f"unknown implementation {impl!r}; expected one of {IMPLS}")


def training_step(
    model: nn.Module,
    forward: Callable,
    src: Tensor,
    tgt_in: Tensor,
    tgt_out: Tensor,
    precision: str = "fp32",
    *,
    compile_backend: str | None = None,
    compile_optimizer: bool = False,
    cuda_graphs: bool = False,
) -> Callable[[], float]:
    """A closure running one optimizer step on the batch (model and batch on one device); the model is put in
    training mode (dropout on). ``precision="bf16"`` runs the forward pass under bfloat16 autocast, as
    ``--set precision=bf16`` trains; ``compile_backend``: attnkit's forward pass and loss compiled, and with
    ``compile_optimizer`` the optimizer's step too; ``cuda_graphs``: replayed from CUDA graphs (``training_steps``)."""
    return training_steps(
        model,
        forward,
        [(src, tgt_in, tgt_out)],
        precision,
        per_call=1,
        compile_backend=compile_backend,
        compile_optimizer=compile_optimizer,
        cuda_graphs=cuda_graphs,
    )


def training_steps(
    model: nn.Module,
    forward: Callable,
    batches: list[tuple[Tensor, Tensor, Tensor]],
    precision: str = "fp32",
    *,
    per_call: int,
    compile_backend: str | None = None,
    compile_optimizer: bool = False,
    cuda_graphs: bool = False,
) -> Callable[[], float]:
    """A closure running ``per_call`` optimizer steps, each on the next batch of ``batches`` (src, tgt_in, tgt_out,
    on the model's device; round again at the end); returns the last step's loss. "tf32" is float32 with TF32
    matrix products. attnkit runs under the kernels ``translate train`` chooses (``training.kernels``), and with
    ``compile_backend`` ("inductor", as ``--set compile=true`` trains; "aot_eager" to trace without generating
    kernels) its forward pass and loss compiled into one graph. ``compile_optimizer`` (with ``compile_backend``; an
    experiment, not what ``translate train`` does): the fused Adam step compiled with the same backend too, so that
    its Python walk over every parameter runs once, when it is traced, rather than at every step. ``cuda_graphs``
    (attnkit, CUDA): each step replayed from the graphs ``--set cuda_graphs=true`` records
    (``training.graphs.GraphedStep``: forward, loss, backward and clipping per batch shape, then the host's read of
    the loss, then Adam's update), with or without ``compile_backend``."""
    model.train()
    device = batches[0][0].device
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, fused=True)
    ours = isinstance(model, Transformer)
    if compile_backend is not None and not ours:
        raise ValueError("compile_backend: only attnkit's step is compiled here")
    if compile_optimizer and compile_backend is None:
        raise ValueError("compile_optimizer: with compile_backend only")
    prepared = with_indices(batches)
    if cuda_graphs:
        if not ours or device.type != "cuda":
            raise ValueError("cuda_graphs: attnkit's step on a CUDA device only")
        return _graphed_steps(model, optimizer, prepared, precision, per_call, compile_backend=compile_backend)

    def our_loss(src: Tensor, tgt_in: Tensor, positions: Tensor, targets: Tensor, src_rows: Tensor) -> Tensor:
        return batch_loss(model(src, tgt_in, positions, src_rows=src_rows), targets)  # logits (N, V) -> ()

    loss_of = our_loss if compile_backend is None else compiled(our_loss, backend=compile_backend)
    update = optimizer.step
    if compile_optimizer and compile_backend is not None:
        update = torch.compile(optimizer.step, backend=compile_backend)
    settings = training_kernels if ours else _tf32_only
    cursor = 0

    def step() -> float:
        nonlocal cursor
        with settings(tf32=precision == "tf32", device=device):
            for _ in range(per_call):
                src, tgt_in, tgt_out, positions, targets, src_rows = prepared[cursor % len(prepared)]
                cursor += 1
                with autocast(precision, device):
                    if ours:
                        loss = loss_of(src, tgt_in, positions, targets, src_rows)
                    else:
                        logits = forward(src, tgt_in)  # (B, T, V)
                if not ours:
                    loss = reference_loss(logits.float(), tgt_out)
                loss.backward()
                update()
                optimizer.zero_grad(set_to_none=True)
        return loss.item()

    return step


def with_indices(batches: Sequence[tuple[Tensor, Tensor, Tensor]]) -> list[tuple[Tensor, ...]]:
    """Each (src, tgt_in, tgt_out) with what ``translate train``'s batches bring from the host
    (``tasks.translate.data.training_batch``), made once, before the steps: (src, tgt_in, tgt_out, positions (N,),
    targets (N,), src_rows (N_src,)), the flat positions of the real target tokens, the targets there, and the flat
    positions of the real source tokens."""
    prepared: list[tuple[Tensor, ...]] = []
    for src, tgt_in, tgt_out in batches:
        positions = (tgt_out != PAD_ID).flatten().nonzero().squeeze(1)  # (N,)
        src_rows = (src != PAD_ID).flatten().nonzero().squeeze(1)  # (N_src,)
        prepared.append((src, tgt_in, tgt_out, positions, tgt_out.flatten()[positions], src_rows))
    return prepared


def _graphed_steps(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    prepared: Sequence[tuple[Tensor, ...]],
    precision: str,
    per_call: int,
    *,
    compile_backend: str | None = None,
    recorder: type[GraphedStep] = GraphedStep,
) -> Callable[[], float]:
    """``training_steps`` replayed from CUDA graphs, each step as ``translate train`` takes it on one GPU: the batch
    padded to the bounded set of shapes (``fixed_shape_batch``; the fixed-shape rows' sizes are on that set already),
    the graphs' gradients of the loss summed over its target tokens, the one read of the loss and norm, the update.
    ``recorder``: ``GraphedStep``, or a test's stand-in that records nothing."""
    cfg = TranslatorTrainConfig(precision="bf16" if precision == "bf16" else "fp32", cuda_graphs=True)
    device = prepared[0][0].device
    assert isinstance(model, Transformer)
    max_positions = model.embeddings.position.max_len

    def summed(model: nn.Module, batch: Batch) -> BatchLoss:  # as ``TranslationTask.loss`` computes it
        src, tgt_in, positions, targets = batch.tensors
        loss, _ = sequence_loss(model(src, tgt_in, positions), targets, PAD_ID, smoothing=LABEL_SMOOTHING)
        return BatchLoss(loss)

    class Step:  # the loop's view of a task (``training.task.StepTask``) for this loss
        stats: tuple[str, ...] = ()
        loss = staticmethod(summed if compile_backend is None else compiled(summed, backend=compile_backend))

    graphs = recorder(model, optimizer, Step(), Step.loss, cfg)
    batches = []
    for src, tgt_in, _, positions, targets, src_rows in prepared:
        host = Batch(tuple(t.cpu() for t in (src, tgt_in, positions, targets, src_rows)), len(targets))
        fixed = fixed_shape_batch(host, PAD_ID, max_positions)
        batches.append(Batch(tuple(t.to(device) for t in fixed.tensors), fixed.size))
    cursor = 0

    def step() -> float:
        nonlocal cursor
        with training_kernels(tf32=precision == "tf32", device=device):
            for _ in range(per_call):
                batch = batches[cursor % len(batches)]
                values, _, _ = graphs.gradients(batch, seed=cursor)
                loss = values[0].item() / batch.size  # the loop's one read of a step (loss, statistics, norm)
                graphs.update()
                cursor += 1
        return loss

    return step


@contextmanager
def _tf32_only(*, tf32: bool, device: torch.device) -> Iterator[None]:
    """A peer's settings: PyTorch's defaults, with float32 products in TF32 or not."""
    restore = set_tf32(tf32, device)
    try:
        yield
    finally:
        restore()


CYCLE = 8  # steps per timed call of the token-budget variant


def token_budget_cycles(
    cfg: TranslatorConfig, length: int, tokens_per_batch: int, cycles: int, seed: int
) -> list[list[tuple[Tensor, Tensor, Tensor]]]:
    """``cycles`` lists of ``CYCLE`` batches as ``translate train`` cuts them: sentence pairs of lengths drawn
    uniformly from L/4 .. L (the target within 3 tokens of its source), cut into batches of at most
    ``tokens_per_batch`` source + target tokens, padding included (``data.batching.token_budget_batches``), each
    batch padded to its longest; the shapes vary from batch to batch."""
    gen = torch.Generator().manual_seed(seed)
    n = cycles * CYCLE * max(1, tokens_per_batch // length) * 2  # more pairs than the batches need
    src_len = torch.randint(max(2, length // 4), length + 1, (n,), generator=gen)  # (n,)
    tgt_len = (src_len + torch.randint(-3, 4, (n,), generator=gen)).clamp(2, length)  # (n,) counting BOS / EOS
    batches = []
    for indices in token_budget_batches(src_len.numpy(), tgt_len.numpy(), tokens_per_batch, gen)[: cycles * CYCLE]:
        s_len, t_len = src_len[indices], tgt_len[indices]  # (B,), (B,)
        B, S, T = len(indices), int(s_len.max()), int(t_len.max())
        src = torch.randint(FIRST_ORDINARY_ID, cfg.vocab_size, (B, S), generator=gen)  # (B, S)
        words = torch.randint(FIRST_ORDINARY_ID, cfg.vocab_size, (B, T), generator=gen)  # (B, T)
        tgt_in = torch.cat([torch.full((B, 1), BOS_ID), words[:, : T - 1]], dim=1)  # (B, T) BOS y_1 .. y_{n-1}
        tgt_out = words.scatter(1, (t_len - 1)[:, None], EOS_ID)  # (B, T) y_1 .. y_{n-1} EOS
        src = src.masked_fill(torch.arange(S) >= s_len[:, None], PAD_ID)
        tgt_pad = torch.arange(T) >= t_len[:, None]  # (B, T)
        batches.append((src, tgt_in.masked_fill(tgt_pad, PAD_ID), tgt_out.masked_fill(tgt_pad, PAD_ID)))
    return [batches[i : i + CYCLE] for i in range(0, len(batches), CYCLE)]


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
    """One teacher-forced forward pass over the real tokens of a batch (``common.seq2seq_forward_flops``)."""
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
