"""One training step of each implementation the train suite compares, as a closure that a timing calls: the model and
its teacher-forced forward pass (``forward_fn``), the loss it minimises, and the optimizer steps, eager, compiled or
replayed from CUDA graphs (``training_steps``).

attnkit's step is ``translate train``'s: the loss on the real target positions that a batch brings from the host
(``batch_loss``, ``with_indices``), under the kernels ``translate train`` chooses (``training.kernels``); the peers
minimise the same loss through PyTorch's cross-entropy (``reference_loss``), with PyTorch's defaults. Every
implementation updates with the same fused Adam (§5.3 betas 0.9 / 0.98, eps 1e-9).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.bench import peers
from attnkit.bench.token_ids import BOS_ID, EOS_ID, PAD_ID
from attnkit.config import TranslatorConfig, TranslatorTrainConfig
from attnkit.model.transformer import Transformer
from attnkit.tasks.translate.data import fixed_shape_batch
from attnkit.training.graphs import GraphedStep
from attnkit.training.kernels import compiled, training_kernels
from attnkit.training.losses import sequence_loss
from attnkit.training.precision import autocast, set_tf32
from attnkit.training.task import Batch, BatchLoss

IMPLS = ("attnkit", "torch.nn", "transformers")
LABEL_SMOOTHING = 0.1


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
