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
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

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
    training_flops,
)
from attnkit.bench.gpu import synchronizer
from attnkit.config import TRANSLATOR_PRESETS, TranslatorConfig
from attnkit.model.build import build_translator
from attnkit.model.transformer import Transformer
from attnkit.training.losses import sequence_loss
from attnkit.training.precision import autocast, native_bf16

CONFIGS: dict[str, TranslatorConfig] = {
    "small": TranslatorConfig(**TRANSLATOR_PRESETS["small"]),
    "base": TranslatorConfig(**{**TRANSLATOR_PRESETS["base"], "vocab_size": 8000}),
}
LENGTHS = (32, 128)
IMPLS = ("attnkit", "torch.nn", "transformers")
LABEL_SMOOTHING = 0.1


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
    model: nn.Module, forward: Callable, src: Tensor, tgt_in: Tensor, tgt_out: Tensor, precision: str = "fp32"
) -> Callable[[], float]:
    """A closure running one optimizer step on the batch (model and batch on one device); the model is put in
    training mode (dropout on). ``precision="bf16"`` runs the forward pass under bfloat16 autocast, as
    ``--set precision=bf16`` trains."""
    model.train()
    device = src.device
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, fused=True)
    ours = isinstance(model, Transformer)
    # What ``translate train``'s batches bring from the host (``tasks.translate.data.training_batch``): the flat
    # positions of the real target and source tokens and the targets there, made once, before the steps.
    positions = (tgt_out != PAD_ID).flatten().nonzero().squeeze(1)  # (N,)
    targets = tgt_out.flatten()[positions]  # (N,)
    src_rows = (src != PAD_ID).flatten().nonzero().squeeze(1)  # (N_src,)

    def step() -> float:
        with autocast(precision, device):
            if ours:
                logits = model(src, tgt_in, positions, src_rows=src_rows)  # (N, V)
            else:
                logits = forward(src, tgt_in)  # (B, T, V)
        loss = batch_loss(logits, targets) if ours else reference_loss(logits.float(), tgt_out)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.item()

    return step


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
) -> Iterator[Result]:
    """Yield the matmul ceilings, then one result per (config, length, implementation). ``quick``: small, L = 32,
    1,024 tokens per batch, 1 warm-up and 2 timed steps. On a GPU (``device``) batches hold 8x the tokens
    (32,768: a GPU is not busy with 4,096) and every implementation also runs under bfloat16 autocast."""
    device = device or torch.device("cpu")
    on_gpu = device.type == "cuda"
    configs = configs or ({"small": CONFIGS["small"]} if quick else CONFIGS)
    lengths = lengths or ((32,) if quick else LENGTHS)
    tokens_per_batch = tokens_per_batch or (1024 if quick else 4096) * (8 if on_gpu else 1)
    chosen = [i for i in (impls or IMPLS) if i != "transformers" or peers.available("transformers")]
    warmup = warmup if warmup is not None else (1 if quick else 2)
    reps = reps if reps is not None else (2 if quick else 5)

    with fixed_threads(threads):
        ceilings, ceiling_gflops = ceiling_results("train", threads=threads, quick=quick, device=device)
        yield from ceilings
        for name, cfg in configs.items():
            for length in lengths:
                batch = make_batch(cfg, length, tokens_per_batch, seed)
                src, tgt_in, tgt_out = (t.to(device) for t in batch)
                B = src.size(0)
                flop = training_flops(
                    seq2seq_forward_flops(
                        [length] * B,
                        [length] * B,
                        d_model=cfg.d_model,
                        d_ff=cfg.d_ff,
                        n_layers=cfg.n_layers,
                        vocab_size=cfg.vocab_size,
                    )
                )
                torch.manual_seed(seed)
                ours = build_translator(cfg, pad_id=PAD_ID).to(device)
                # Every implementation also with bfloat16 autocast (attnkit's --set precision=bf16) where the device
                # has native bfloat16, so that bfloat16 is compared with bfloat16.
                with_bf16 = torch.cuda.is_bf16_supported() if on_gpu else native_bf16()
                precisions = ("fp32", "bf16") if with_bf16 else ("fp32",)
                runs = [(impl, precision) for precision in precisions for impl in chosen]
                steps = []
                for impl, precision in runs:
                    torch.manual_seed(seed)  # same dropout masks' seed and, for peers, same initialisation seed
                    model, forward = forward_fn(impl, cfg, ours)
                    steps.append(training_step(model.to(device), forward, src, tgt_in, tgt_out, precision))
                timings = measure_interleaved(steps, warmup=warmup, reps=reps, budget_s=20.0, sync=synchronizer(device))
                for (impl, precision), timing in zip(runs, timings):
                    t = timing.median_s
                    yield Result(
                        suite="train",
                        impl=impl,
                        config=name,
                        seq_len=length,
                        search=None,
                        dtype="bfloat16" if precision == "bf16" else "float32",
                        mode="train",
                        batch=B,
                        tgt_tok_per_s=tgt_out.numel() / t,
                        sentences_per_s=B / t,
                        ms=t * 1e3,
                        gflop_per_s=gflops(flop, t),
                        mfu=mfu(flop, t, ceiling_gflops),
                        threads=threads,
                        reps=len(timing.times_s),
                    )
                del steps, ours


def run(*, quick: bool = False, **kwargs) -> list[Result]:
    """All results of ``iter_results`` (same arguments) as a list."""
    return list(iter_results(quick=quick, **kwargs))
