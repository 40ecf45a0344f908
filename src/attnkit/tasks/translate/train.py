"""Training the encoder-decoder on parallel text with the paper's recipe (§5): a shared BPE vocabulary, token-budget
batches, Adam(0.9, 0.98, 1e-9), the warmup schedule of eq. 3 (or one sized to a stated step budget), label smoothing
0.1, the last K checkpoints kept for averaging, validation loss and BLEU at each evaluation. The translation task
the one training loop (``attnkit.training.loop.fit``) runs is ``TranslationTask``."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from attnkit import runs
from attnkit.config import TranslatorConfig, TranslatorTrainConfig
from attnkit.data.batching import Truncation, token_budget_batches
from attnkit.data.readers import Pair
from attnkit.decoding.corpus import translate_ids
from attnkit.devices import model_device
from attnkit.evaluation.bleu import corpus_scores
from attnkit.model.build import build_translator
from attnkit.model.transformer import Transformer
from attnkit.tasks.translate.data import ParallelData, encode_pairs, make_batch
from attnkit.tokenization import Tokenizer, train_tokenizer
from attnkit.training.events import Event, Prepared
from attnkit.training.loop import fit
from attnkit.training.losses import sequence_loss
from attnkit.training.optim import make_optimizer
from attnkit.training.precision import check_precision
from attnkit.training.run_setup import open_run, write_run_files
from attnkit.training.state import fingerprint_texts
from attnkit.training.task import Batch, BatchLoss, TrainContext


@dataclass
class TranslateSummary:
    run_dir: Path
    steps: int
    epochs: float
    seconds: float
    valid_loss: float | None  # of the weights kept as the model (the best evaluation)
    valid_bleu: float | None
    truncation: Truncation
    stopped_by: str


@torch.no_grad()
def validation_loss(model: Transformer, data: ParallelData, tokenizer: Tokenizer, max_tokens: int) -> float:
    """Mean per-token cross-entropy (no label smoothing) on ``data``; exp of it is the perplexity."""
    model.eval()
    device = model_device(model)
    total, n_tokens = 0.0, 0
    for batch in token_budget_batches([len(s) for s in data.src], [len(t) + 1 for t in data.tgt], max_tokens, None):
        src, tgt_in, tgt_out = (t.to(device) for t in make_batch(data, batch, tokenizer))
        loss, n = sequence_loss(model(src, tgt_in), tgt_out, tokenizer.pad_id)
        total, n_tokens = total + loss.item(), n_tokens + n
    return total / max(1, n_tokens)


@dataclass
class TranslationTask:
    """The loop's view of a translator run (``attnkit.training.loop.Task``): the loss is summed over target tokens
    and normalised by the step's target tokens (§5.1 batches by tokens)."""

    data: ParallelData
    valid: ParallelData | None
    valid_targets: list[str]
    tokenizer: Tokenizer
    cfg: TranslatorTrainConfig
    d_model: int
    fingerprint: str
    unit: str = "tokens"
    stats: tuple[str, ...] = ()
    metric: str = field(init=False)
    higher_is_better: bool = field(init=False)

    def __post_init__(self) -> None:
        # Greedy BLEU when it is computed; otherwise the validation loss. Ties go to the lower loss either way.
        self.metric, self.higher_is_better = ("bleu", True) if self.cfg.valid_bleu else ("loss", False)

    def epoch_batches(self, generator: torch.Generator | None) -> list[list[int]]:
        return token_budget_batches(
            [len(s) for s in self.data.src], [len(t) + 1 for t in self.data.tgt], self.cfg.max_tokens, generator
        )

    def collate(self, indices: list[int]) -> Batch:
        src, tgt_in, tgt_out = make_batch(self.data, indices, self.tokenizer)
        return Batch((src, tgt_in, tgt_out), int((tgt_out != self.tokenizer.pad_id).sum()))

    def loss(self, model: nn.Module, batch: Batch) -> BatchLoss:
        src, tgt_in, tgt_out = batch.tensors
        logits = model(src, tgt_in)  # (B, T, V)
        loss, _ = sequence_loss(logits.float(), tgt_out, self.tokenizer.pad_id, self.cfg.label_smoothing)
        return BatchLoss(loss)

    def evaluate(self, model: nn.Module, device: torch.device) -> dict[str, float] | None:
        if self.valid is None:
            return None
        assert isinstance(model, Transformer)
        loss = validation_loss(model, self.valid, self.tokenizer, self.cfg.max_tokens)
        metrics = {"loss": loss, "ppl": math.exp(min(loss, 50.0))}
        if self.cfg.valid_bleu:
            hyps = self.tokenizer.decode_batch(translate_ids(model, self.tokenizer, self.valid.src, beam=1))
            metrics.update({k: v for k, v in corpus_scores(hyps, self.valid_targets).items() if k in ("bleu", "chrf")})
        return metrics


def train_translator(
    train: list[Pair],
    valid: list[Pair] | None,
    *,
    model_cfg: TranslatorConfig,
    train_cfg: TranslatorTrainConfig,
    out_dir: str | Path,
    resume: bool = False,
    on_event: Callable[[Event], None] = lambda event: None,
    context: TrainContext | None = None,
) -> TranslateSummary:
    """Train on ``train`` and write the run (config, shared BPE, weights, checkpoints, metrics) to ``out_dir``.

    With ``resume``, continue a killed run from its last saved state, bit-exactly (configs come from the run).
    ``context`` says where to train (the device, default the CPU, and the process's rank in a data-parallel run;
    see ``fit``); the run directory it writes does not depend on it.
    """
    context = context or TrainContext()
    run = open_run(out_dir, resume, context)
    if run.saved is not None:
        model_cfg = TranslatorConfig(**run.saved["model"])
        train_cfg = TranslatorTrainConfig(**run.saved["train"])
        tokenizer = Tokenizer.load(run.path / runs.TOKENIZER, run.saved["tokenizer"])
    else:
        # §5.1: a shared source-target vocabulary of byte-pair encodings.
        tokenizer = train_tokenizer(
            (text for pair in train for text in (pair.source, pair.target)),
            kind=train_cfg.tokenizer,
            vocab_size=model_cfg.vocab_size,
            min_freq=train_cfg.min_freq,
        )
        model_cfg = dataclasses.replace(model_cfg, vocab_size=tokenizer.vocab_size)
    check_precision(train_cfg.precision, context.device)
    torch.manual_seed(train_cfg.seed)
    data = encode_pairs(tokenizer, train, model_cfg.max_len, train_cfg.max_len_policy)
    valid_data = encode_pairs(tokenizer, valid, model_cfg.max_len, train_cfg.max_len_policy) if valid else None
    on_event(
        Prepared(
            len(train),
            len(valid or []),
            "file" if valid else "none",
            tokenizer.vocab_size,
            data.truncation.n_truncated,
            model_cfg.max_len,
            None,
        )
    )

    model = build_translator(model_cfg, pad_id=tokenizer.pad_id).to(
        context.device
    )  # before the optimizer: its state too
    optimizer = make_optimizer(model, train_cfg)
    write_run_files(run, "translate", model_cfg, train_cfg, tokenizer, context=context)
    task = TranslationTask(
        data,
        valid_data,
        [p.target for p in valid or []],
        tokenizer,
        train_cfg,
        model_cfg.d_model,
        fingerprint_texts([p.source for p in train], [p.target for p in train], [p.source for p in valid or []]),
    )
    result = fit(model, optimizer, task, train_cfg, run.path, resume=run.resume, on_event=on_event, context=context)
    return TranslateSummary(
        run.path,
        result.steps,
        result.epochs,
        result.seconds,
        result.best.get("loss"),
        result.best.get("bleu"),
        data.truncation,
        result.stopped_by,
    )
