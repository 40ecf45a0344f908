"""Pretraining an encoder on plain text with BERT's masked-language-model objective (Devlin et al. 2019, §3.1): the
tokenizer learnt from the text, a held-out share of the lines, and the task the one training loop
(``attnkit.training.loop.fit``) runs: length-bucketed batches of texts, the summed cross-entropy over the chosen
tokens normalised by their count, held-out masked-token loss deciding the best weights."""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit import runs
from attnkit.config import MaskedLMConfig, PretrainTrainConfig, check_task_configs
from attnkit.data.batching import Batches, Truncation, bucketed_batches, pad, real_positions
from attnkit.data.lengths import apply_length_policy
from attnkit.data.sequences import sequence_lengths
from attnkit.errors import InputError, check_texts
from attnkit.model.build import build_masked_lm
from attnkit.tasks.pretrain.corruption import MASK_TOKEN, batch_seed, choose_and_corrupt
from attnkit.tokenization import Tokenizer, train_tokenizer
from attnkit.tokenization.tokenizer import SPECIAL_TOKENS
from attnkit.training.events import Event, Prepared, warn_only
from attnkit.training.loop import fit
from attnkit.training.optim import make_optimizer
from attnkit.training.run_setup import (
    check_memory,
    check_where,
    holds_run_lock,
    open_run,
    saved_configs,
    write_run_files,
)
from attnkit.training.state import fingerprint_texts
from attnkit.training.task import Batch, BatchLoss, TrainContext


@dataclass
class PretrainSummary:
    run_dir: Path
    best_epoch: float
    best: dict[str, float]  # held-out masked-token loss, accuracy and perplexity of the kept weights ({} without)
    epochs_run: float
    steps: int
    seconds: float
    truncation: Truncation
    n_train: int
    n_valid: int
    stopped_by: str


def maskable_ids(tokenizer: Tokenizer) -> Tensor:
    """(V,) bool: the ids that may be chosen for prediction, every id but the special ones (padding, <unk>, <cls>,
    <bos>, <eos>, <mask>): BERT never predicts its [CLS], [SEP] or [PAD]."""
    maskable = torch.ones(tokenizer.vocab_size, dtype=torch.bool)  # (V,)
    for token in (*SPECIAL_TOKENS, MASK_TOKEN):
        token_id = tokenizer.backend.token_to_id(token)
        if token_id is not None:
            maskable[token_id] = False
    return maskable


@dataclass
class MaskedLMTask:
    """The loop's view of a pretraining run (``attnkit.training.task.Task``). Without held-out lines the last weights
    are the model."""

    train_ids: list[list[int]]
    valid_ids: list[list[int]]
    pad_id: int
    mask_id: int
    maskable: Tensor  # (V,) bool
    cfg: PretrainTrainConfig
    d_model: int
    fingerprint: str
    metric: str = "loss"  # held-out masked-token cross-entropy
    higher_is_better: bool = False
    unit: str = "tokens"  # the chosen (predicted) tokens: the loss is their mean
    stats: tuple[str, ...] = ("accuracy",)
    epoch_seed: int = field(default=0, init=False)

    def epoch_batches(self, generator: torch.Generator | None) -> Batches:
        batches = bucketed_batches(
            sequence_lengths(self.train_ids), self.cfg.batch_size, generator, self.cfg.bucket_factor
        )
        if generator is not None:
            # New masks every epoch (the same text is masked differently each time it is seen; BERT duplicated its
            # data 10 times with different masks for this, appendix A.2). Drawn from the loop's epoch generator,
            # whose state the loop saves with the run: a resumed epoch draws the same seed, hence the same masks.
            self.epoch_seed = int(torch.randint(2**62, (1,), generator=generator))
        return batches

    def _masked(self, indices: list[int], ids_of: list[list[int]], *seed_parts: object) -> Batch:
        """The corrupted inputs (B, S), the flat positions b * S + s of the N chosen tokens (N,), their original ids
        (N,) and the flat positions of the real tokens: every index made here, on the host."""
        seqs = [ids_of[i] for i in indices]
        ids = pad(seqs, self.pad_id)  # (B, S)
        generator = torch.Generator().manual_seed(batch_seed(self.cfg.seed, *seed_parts, indices))
        inputs, chosen = choose_and_corrupt(
            ids, maskable=self.maskable, mask_id=self.mask_id, mask_prob=self.cfg.mask_prob, generator=generator
        )
        positions = torch.from_numpy(np.flatnonzero(chosen.numpy()))  # (N,)
        targets = ids.reshape(-1)[positions]  # (N,)
        rows = real_positions([len(s) for s in seqs], ids.size(1))  # (N_real,)
        return Batch((inputs, positions, targets, rows), len(positions))

    def collate(self, indices: list[int]) -> Batch:
        return self._masked(indices, self.train_ids, self.epoch_seed)

    def loss(self, model: nn.Module, batch: Batch) -> BatchLoss:
        inputs, positions, targets, rows = batch.tensors
        logits = model(inputs, positions, rows=rows)  # (N, V): the chosen positions only (§3.1)
        correct = (logits.detach().argmax(dim=-1) == targets).sum()  # on the device, read with the step's loss
        return BatchLoss(F.cross_entropy(logits.float(), targets, reduction="sum"), sums={"accuracy": correct})

    def evaluate(self, model: nn.Module, device: torch.device) -> dict[str, float] | None:
        """Masked-token loss, accuracy and perplexity on the held-out lines, with the same masks at every evaluation
        (seeded by the run's seed and each batch's lines), so that epochs compare."""
        if not self.valid_ids:
            return None
        sums, count = torch.zeros(2, dtype=torch.float64, device=device), 0  # (loss, correct), read once at the end
        for indices in bucketed_batches(sequence_lengths(self.valid_ids), self.cfg.batch_size, None):
            batch = self._masked(indices, self.valid_ids, "valid")
            inputs, positions, targets, rows = (t.to(device) for t in batch.tensors)
            logits = model(inputs, positions, rows=rows)  # (N, V)
            sums[0] += F.cross_entropy(logits.float(), targets, reduction="sum")
            sums[1] += (logits.argmax(dim=-1) == targets).sum()
            count += batch.size
        total, correct = sums.tolist()
        loss = total / max(1, count)
        return {"loss": loss, "accuracy": correct / max(1, count), "perplexity": math.exp(min(loss, 50.0))}


def _tokenizer_for(texts: list[str], model_cfg: MaskedLMConfig, train_cfg: PretrainTrainConfig) -> Tokenizer:
    """A vocabulary learnt from the texts with a leading <cls> on every encoding (so that a classifier fine-tuned
    from this encoder can pool the first token), plus BERT's <mask> token as the last id."""
    tokenizer = train_tokenizer(
        texts,
        kind=train_cfg.tokenizer,
        vocab_size=model_cfg.vocab_size,
        min_freq=train_cfg.min_freq,
        add_cls=True,
        reserved=1,  # the <mask> added below
    )
    tokenizer.backend.add_special_tokens([MASK_TOKEN])
    return tokenizer


@holds_run_lock
def pretrain_encoder(
    texts: list[str],
    *,
    model_cfg: MaskedLMConfig | None = None,
    train_cfg: PretrainTrainConfig | None = None,
    out_dir: str | Path,
    resume: bool = False,
    on_event: Callable[[Event], None] = warn_only,
    context: TrainContext | None = None,
) -> PretrainSummary:
    """Pretrain an encoder on ``texts`` (one text each), ``train_cfg.valid_fraction`` of them held out, into the run
    directory ``out_dir`` (task "pretrain"; ``classify train --init-from`` and ``export hf`` read it).

    With ``resume``, ``out_dir`` is a run killed part-way, or one to train further: its configs and tokenizer are
    loaded and training continues from the saved step exactly as if it had never stopped (the run's configs rule; a
    larger budget may be given, as ``train_classifier`` says). ``model_cfg`` and ``train_cfg`` default to the
    task's, as ``pretrain`` builds them with no ``--config``; ``on_event``: as ``train_classifier``'s.
    """
    given = model_cfg, train_cfg  # a resumed run checks them against its saved ones
    model_cfg, train_cfg = check_task_configs("pretrain", model_cfg, train_cfg)
    texts = check_texts(texts, "texts item #{}")  # one string is refused, not pretrained on as its characters
    if not texts:
        raise InputError("no text to pretrain on")
    context = context or TrainContext()
    check_where(context, train_cfg.precision)
    run = open_run(out_dir, resume, context, on_event, task="pretrain")
    if run.saved is not None:
        model_cfg, train_cfg = saved_configs(run, "pretrain", *given, context)
    torch.manual_seed(train_cfg.seed)

    order = list(range(len(texts)))
    random.Random(train_cfg.seed).shuffle(order)
    n_valid = int(len(texts) * train_cfg.valid_fraction)
    valid_texts = [texts[i] for i in sorted(order[:n_valid])]
    train_texts = [texts[i] for i in sorted(order[n_valid:])]
    if run.saved is not None:
        tokenizer = Tokenizer.load(run.path / runs.TOKENIZER, run.saved["tokenizer"])
    else:
        tokenizer = _tokenizer_for(train_texts, model_cfg, train_cfg)
        model_cfg = dataclasses.replace(model_cfg, vocab_size=tokenizer.vocab_size)
    mask_id = tokenizer.backend.token_to_id(MASK_TOKEN)
    assert mask_id is not None  # added by _tokenizer_for
    train_ids, truncation = apply_length_policy(
        tokenizer.encode_batch(train_texts, model_cfg.max_len), model_cfg.max_len, train_cfg.max_len_policy, what="text"
    )
    valid_ids, _ = apply_length_policy(
        tokenizer.encode_batch(valid_texts, model_cfg.max_len), model_cfg.max_len, train_cfg.max_len_policy, what="text"
    )
    valid_source = f"{train_cfg.valid_fraction:g} of the lines held out" if valid_texts else "none"
    on_event(
        Prepared(
            len(train_ids),
            len(valid_ids),
            valid_source,
            tokenizer.vocab_size,
            truncation.n_truncated,
            model_cfg.max_len,
            None,
        )
    )

    check_memory(model_cfg, context.device)
    model = build_masked_lm(model_cfg, pad_id=tokenizer.pad_id)
    model.to(context.device)  # before the optimizer is made: its state lives beside the parameters
    optimizer = make_optimizer(model, train_cfg)
    write_run_files(run, "pretrain", model_cfg, train_cfg, tokenizer, context=context, mask_token=MASK_TOKEN)
    task = MaskedLMTask(
        train_ids,
        valid_ids,
        tokenizer.pad_id,
        mask_id,
        maskable_ids(tokenizer),
        train_cfg,
        model_cfg.d_model,
        fingerprint_texts(train_texts, valid_texts),
    )
    result = fit(model, optimizer, task, train_cfg, run.path, resume=run.resume, on_event=on_event, context=context)
    return PretrainSummary(
        run.path,
        result.best_epoch,
        result.best,
        result.epochs,
        result.steps,
        result.seconds,
        truncation,
        len(train_ids),
        len(valid_ids),
        result.stopped_by,
    )
