"""Classifier speed: training steps and inference batches per second, with and without padding.

The seed-000 classifier (vocab 10,000, d_model 128, 4 heads, d_ff 512, 2 layers, masked mean pooling, 2 classes),
batches of 32 sentences of length 128. "full": every sentence has 128 real tokens; "padded": lengths drawn uniformly
from 8 .. 128 (seeded), padded to 128, the shape a real batch of reviews has. Training = forward + cross-entropy +
backward + Adam step (dropout 0.1); inference = forward in eval mode under ``torch.inference_mode``.

Peers: ``torch.nn`` (``nn.TransformerEncoder`` with attnkit's weights; in inference PyTorch's default "fast path"
with nested tensors, and the same with the fast path switched off, variant "fastpath-off"), Hugging Face
``BertForSequenceClassification`` (same dimensions, ReLU; see ``peers.bert_classifier`` for its differences).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.bench import peers
from attnkit.bench.ceiling import ceiling_results
from attnkit.bench.flops import encoder_forward_flops, gflops, mfu, training_flops
from attnkit.bench.gpu import synchronizer
from attnkit.bench.results import Result
from attnkit.bench.timing import fixed_threads, measure_interleaved
from attnkit.bench.token_ids import FIRST_ORDINARY_ID, PAD_ID
from attnkit.config import CLASSIFIER_PRESETS, ClassifierConfig
from attnkit.inference import prepare_for_inference
from attnkit.model.build import build_classifier
from attnkit.model.classifier import TransformerClassifier
from attnkit.training.precision import autocast, native_bf16

CONFIGS: dict[str, ClassifierConfig] = {"seed000": ClassifierConfig(**CLASSIFIER_PRESETS["vocab10k"])}
IMPLS = ("attnkit", "torch.nn", "transformers")
MIN_PADDED_LENGTH = 8


def make_batch(
    cfg: ClassifierConfig, batch: int, length: int, padded: bool, seed: int
) -> tuple[Tensor, Tensor, list[int]]:
    """ids (B, L) padded with PAD_ID after each sentence's length, labels (B,), and the lengths."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(FIRST_ORDINARY_ID, cfg.vocab_size, (batch, length), generator=gen)  # (B, L)
    if padded:
        lengths = torch.randint(min(MIN_PADDED_LENGTH, length), length + 1, (batch,), generator=gen)  # (B,)
        ids = ids.masked_fill(torch.arange(length)[None, :] >= lengths[:, None], PAD_ID)
    else:
        lengths = torch.full((batch,), length)
    labels = torch.randint(0, cfg.n_classes or 2, (batch,), generator=gen)  # (B,)
    return ids, labels, lengths.tolist()


def forward_fn(
    impl: str, cfg: ClassifierConfig, ours: TransformerClassifier
) -> tuple[nn.Module, Callable[[Tensor], Tensor]]:
    """The model of ``impl`` and its forward pass ids (B, L) -> logits (B, C)."""
    if impl == "attnkit":
        return ours, ours
    if impl == "torch.nn":
        model: nn.Module = peers.TorchNNClassifier(ours)
        return model, model
    if impl == "transformers":
        model = peers.bert_classifier(cfg)
        return model, lambda ids: model(input_ids=ids, attention_mask=(ids != PAD_ID).long()).logits  # (B, C)
    raise ValueError(f"unknown implementation {impl!r}; expected one of {IMPLS}")


def training_step(model: nn.Module, forward: Callable, ids: Tensor, labels: Tensor) -> Callable[[], float]:
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-4, betas=(0.9, 0.98), eps=1e-9)

    def step() -> float:
        loss = F.cross_entropy(forward(ids), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.item()

    return step


def inference_call(
    model: nn.Module, forward: Callable, ids: Tensor, precision: str = "fp32", fastpath: bool = True
) -> Callable[[], Tensor]:
    """A closure classifying ``ids`` in eval mode (model and ids on one device); ``precision="bf16"`` under bfloat16
    autocast; ``fastpath=False``
    switches off PyTorch's ``nn.TransformerEncoderLayer`` inference fast path for the call. attnkit's attention is
    prepared as ``ClassifierRun`` prepares it (W^Q, W^K, W^V fused once)."""
    prepare_for_inference(model)

    def call() -> Tensor:
        with torch.inference_mode(), autocast(precision, ids.device), mha_fastpath(fastpath), warnings.catch_warnings():
            # nn.TransformerEncoder's fast path warns at every call that nested tensors are a prototype API.
            warnings.filterwarnings("ignore", message="The PyTorch API of nested tensors is in prototype stage")
            return forward(ids)

    return call


@contextmanager
def mha_fastpath(enabled: bool):
    """PyTorch's switch for the ``nn.MultiheadAttention`` / ``nn.TransformerEncoderLayer`` inference fast path."""
    previous = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(enabled)
    try:
        yield
    finally:
        torch.backends.mha.set_fastpath_enabled(previous)


def iter_results(
    *,
    quick: bool = False,
    threads: int = 2,
    configs: dict[str, ClassifierConfig] | None = None,
    batch: int | None = None,
    length: int = 128,
    impls: tuple[str, ...] | None = None,
    warmup: int | None = None,
    reps: int | None = None,
    seed: int = 0,
    device: torch.device | None = None,
) -> Iterator[Result]:
    """Yield the matmul ceilings, then per (padding, implementation) a training and an inference result.
    ``quick``: 1 warm-up and 2 timed calls (3 for inference). Batches of 32 sentences on the CPU, 256 on a GPU
    (``device``). Where the device has native bfloat16, every implementation also runs inference under bfloat16
    autocast."""
    device = device or torch.device("cpu")
    on_gpu = device.type == "cuda"
    batch = batch or (256 if on_gpu else 32)
    with_bf16 = torch.cuda.is_bf16_supported() if on_gpu else native_bf16()
    sync = synchronizer(device)
    configs = configs or CONFIGS
    chosen = [i for i in (impls or IMPLS) if i != "transformers" or peers.available("transformers")]
    warmup = warmup if warmup is not None else (1 if quick else 3)
    reps = reps if reps is not None else (2 if quick else 10)

    with fixed_threads(threads):
        ceilings, references = ceiling_results("classify", threads=threads, quick=quick, device=device)
        yield from ceilings
        for name, cfg in configs.items():
            if length > cfg.max_len:
                raise ValueError(f"length={length} is past the model's max_len={cfg.max_len}")
            for padded in (False, True):
                ids, labels, lengths = make_batch(cfg, batch, length, padded, seed)
                ids, labels = ids.to(device), labels.to(device)
                flop = training_flops(
                    encoder_forward_flops(lengths, d_model=cfg.d_model, d_ff=cfg.d_ff, n_layers=cfg.n_layers)
                )
                common: dict[str, Any] = dict(  # the fields every result of this batch shares
                    suite="classify",
                    config=name,
                    seq_len=length,
                    search=None,
                    dtype="float32",
                    batch=batch,
                    threads=threads,
                )
                variant = "padded" if padded else "full"
                torch.manual_seed(seed)
                ours = build_classifier(cfg, pad_id=PAD_ID).to(device)
                models = {}
                for impl in chosen:
                    torch.manual_seed(seed)
                    model, forward = forward_fn(impl, cfg, ours)
                    models[impl] = (model.to(device), forward)
                steps = [training_step(*models[impl], ids, labels) for impl in chosen]
                timings = measure_interleaved(steps, warmup=warmup, reps=reps, budget_s=20.0, sync=sync)
                for impl, timing in zip(chosen, timings):
                    t = timing.median_s
                    yield Result(
                        **common,
                        impl=impl,
                        mode="train",
                        variant=variant,
                        sentences_per_s=batch / t,
                        ms=t * 1e3,
                        gflop_per_s=gflops(flop, t),
                        mfu=mfu(flop, t, references["float32"]),  # training rows run in IEEE float32
                        reps=len(timing.times_s),
                    )
                # Inference: every implementation with its default settings; also torch.nn with its fast path off,
                # and, where the device has native bfloat16, every implementation under bfloat16 autocast (attnkit's
                # `classify predict/eval --precision bf16`), so that bfloat16 is compared with bfloat16. torch.nn's
                # fast path fails under CPU autocast ("expected scalar type Float but found BFloat16", torch 2.13), so
                # its bfloat16 row runs with the fast path off, and says so.
                calls = [(impl, variant, "float32", inference_call(*models[impl], ids)) for impl in chosen]
                if "torch.nn" in models:
                    calls.append(
                        (
                            "torch.nn",
                            f"{variant}, fastpath-off",
                            "float32",
                            inference_call(*models["torch.nn"], ids, fastpath=False),
                        )
                    )
                if with_bf16:
                    for impl in chosen:
                        off = impl == "torch.nn" and device.type == "cpu"
                        call = inference_call(*models[impl], ids, "bf16", fastpath=not off)
                        calls.append((impl, f"{variant}, fastpath-off" if off else variant, "bfloat16", call))
                timings = measure_interleaved(
                    [c[3] for c in calls], warmup=warmup, reps=reps + 1, budget_s=20.0, sync=sync
                )
                for (impl, label, dtype, _), timing in zip(calls, timings):
                    t = timing.median_s
                    yield Result(
                        **{**common, "dtype": dtype},
                        impl=impl,
                        mode="infer",
                        variant=label,
                        sentences_per_s=batch / t,
                        ms=t * 1e3,
                        reps=len(timing.times_s),
                    )
                del models, steps, calls


def run(*, quick: bool = False, **kwargs) -> list[Result]:
    """All results of ``iter_results`` (same arguments) as a list."""
    return list(iter_results(quick=quick, **kwargs))
