"""Training a text classifier: tokenizer, batches, AdamW with warmup and decay, validation each epoch, the best
checkpoint kept by validation accuracy, early stopping, and a metrics log."""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from attnkit.config import ClassifierConfig, TrainConfig
from attnkit.data.batching import Truncation, apply_length_policy, bucketed_batches, pad
from attnkit.data.readers import Example
from attnkit.errors import InputError
from attnkit.evaluation.metrics import accuracy, macro_f1
from attnkit.model.build import build_classifier
from attnkit.model.classifier import TransformerClassifier
from attnkit.tokenization import Tokenizer, train_tokenizer
from attnkit.training import checkpoint
from attnkit.training.losses import classification_loss
from attnkit.training.schedules import learning_rate

Event = dict  # {"event": "step" | "epoch" | "info", ...}: what the CLI shows in its progress bar


@dataclass
class TrainSummary:
    run_dir: Path
    best_epoch: int
    best_valid_accuracy: float
    epochs_run: int
    steps: int
    seconds: float
    truncation: Truncation
    valid_source: str  # "file" or "held out from train"


def make_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """Adam or AdamW (§5.3 betas and eps by default); biases, norms and embeddings get no weight decay."""
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        (no_decay if param.ndim < 2 or "embeddings" in name else decay).append(param)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    optim_cls = torch.optim.AdamW if cfg.optimizer == "adamw" else torch.optim.Adam
    if cfg.optimizer == "adam":
        groups = [{"params": decay + no_decay, "weight_decay": cfg.weight_decay}]
    return optim_cls(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.adam_eps)


def resolve_classes(cfg: ClassifierConfig, labels: list[str]) -> ClassifierConfig:
    """Fix ``n_classes`` from the training labels: 0 means one per label; 1 is a binary single-logit head."""
    if len(labels) < 2:
        raise InputError(f"training data has {len(labels)} distinct label(s) ({labels}); a classifier needs at least 2")
    if cfg.n_classes == 0:
        return dataclasses.replace(cfg, n_classes=len(labels))
    if cfg.n_classes == 1 and len(labels) != 2:
        raise InputError(f"config key n_classes=1 (one binary logit) needs exactly 2 labels; the training data has {len(labels)}")
    if cfg.n_classes not in (1, len(labels)):
        raise InputError(f"config key n_classes={cfg.n_classes} but the training data has {len(labels)} labels: {labels}")
    return cfg


def encode_examples(tokenizer: Tokenizer, texts: list[str], max_len: int, policy: str) -> tuple[list[list[int]], Truncation]:
    return apply_length_policy(tokenizer.encode_batch(texts), max_len, policy)


@torch.no_grad()
def predict_ids(model: TransformerClassifier, seqs: list[list[int]], pad_id: int, batch_size: int = 64) -> torch.Tensor:
    """Logits (N, C) for already-encoded sequences, in input order; batches are length-sorted to save padding."""
    model.eval()
    batches = bucketed_batches([len(s) for s in seqs], batch_size, generator=None, bucket_factor=10**9)
    out = torch.empty(len(seqs), model.head.out_features)
    for batch in batches:
        out[batch] = model(pad([seqs[i] for i in batch], pad_id)).float()
    return out


def predicted_classes(logits: torch.Tensor) -> list[int]:
    if logits.size(-1) == 1:
        return (logits.squeeze(-1) > 0).long().tolist()
    return logits.argmax(dim=-1).tolist()


def train_classifier(
    train: list[Example],
    valid: list[Example] | None,
    *,
    model_cfg: ClassifierConfig,
    train_cfg: TrainConfig,
    out_dir: str | Path,
    on_event: Callable[[Event], None] = lambda event: None,
) -> TrainSummary:
    """Train on ``train``, select on ``valid`` (10% of ``train`` held out when None), write the run to ``out_dir``."""
    start = time.perf_counter()
    torch.manual_seed(train_cfg.seed)
    random.seed(train_cfg.seed)
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()) and not (out_dir / checkpoint.CONFIG).is_file():
        raise InputError(f"{out_dir}: exists and is not an attnkit run directory; choose a new --out")
    out_dir.mkdir(parents=True, exist_ok=True)

    valid_source = "file"
    if not valid:
        # Hold out 10% for model selection; below 100 examples that would be too few to mean anything, so the
        # training set itself is used (and said to be).
        if len(train) >= 100:
            shuffled = list(train)
            random.Random(train_cfg.seed).shuffle(shuffled)
            n_valid = len(shuffled) // 10
            valid, train = shuffled[:n_valid], shuffled[n_valid:]
            valid_source = "held out from train"
        else:
            valid, valid_source = list(train), "the training set (under 100 examples: none held out)"

    labels = sorted({ex.label for ex in train})
    model_cfg = resolve_classes(model_cfg, labels)
    label_id = {label: i for i, label in enumerate(labels)}
    for ex in valid:
        if ex.label not in label_id:
            raise InputError(f"validation line {ex.line}: label {ex.label!r} never occurs in the training data")

    tokenizer = train_tokenizer(
        (ex.text for ex in train), kind=train_cfg.tokenizer, vocab_size=model_cfg.vocab_size,
        min_freq=train_cfg.min_freq, add_cls=model_cfg.pooling == "cls",
    )
    model_cfg = dataclasses.replace(model_cfg, vocab_size=tokenizer.vocab_size)
    train_ids, truncation = encode_examples(tokenizer, [ex.text for ex in train], model_cfg.max_len, train_cfg.max_len_policy)
    valid_ids, _ = encode_examples(tokenizer, [ex.text for ex in valid], model_cfg.max_len, train_cfg.max_len_policy)
    train_y = torch.tensor([label_id[ex.label] for ex in train])
    valid_y = [label_id[ex.label] for ex in valid]
    on_event({"event": "info", "n_train": len(train), "n_valid": len(valid), "valid_source": valid_source,
              "vocab_size": tokenizer.vocab_size, "labels": labels, "truncated": truncation.n_truncated,
              "longest": truncation.longest, "max_len": model_cfg.max_len})

    model = build_classifier(model_cfg, pad_id=tokenizer.pad_id)
    optimizer = make_optimizer(model, train_cfg)
    steps_per_epoch = -(-len(train) // train_cfg.batch_size)
    total_steps = train_cfg.max_steps or steps_per_epoch * train_cfg.epochs
    warmup = train_cfg.warmup_steps or int(train_cfg.warmup_ratio * total_steps)

    config = {**checkpoint.config_header("classify"), "model": dataclasses.asdict(model_cfg),
              "train": dataclasses.asdict(train_cfg), "tokenizer": tokenizer.meta(), "pad_id": tokenizer.pad_id}
    checkpoint.atomic_write_json(out_dir / checkpoint.CONFIG, config)
    checkpoint.atomic_write_json(out_dir / checkpoint.LABELS, labels)
    tokenizer.save(out_dir / checkpoint.TOKENIZER)
    (out_dir / checkpoint.METRICS).unlink(missing_ok=True)
    log = checkpoint.MetricsLog(out_dir / checkpoint.METRICS)

    generator = torch.Generator().manual_seed(train_cfg.seed)
    lengths = [len(s) for s in train_ids]
    step, best_acc, best_epoch, stale, epoch = 0, -1.0, 0, 0, 0
    try:
        for epoch in range(1, train_cfg.epochs + 1):
            model.train()
            seen = correct = 0
            loss_sum = 0.0
            for batch in bucketed_batches(lengths, train_cfg.batch_size, generator):
                step += 1
                lr = learning_rate(step, schedule=train_cfg.schedule, peak=train_cfg.lr, factor=train_cfg.lr_factor,
                                   warmup=warmup, total=total_steps, d_model=model_cfg.d_model)
                for group in optimizer.param_groups:
                    group["lr"] = lr
                ids = pad([train_ids[i] for i in batch], tokenizer.pad_id)  # (B, S)
                y = train_y[batch]  # (B,)
                logits = model(ids)  # (B, C)
                loss = classification_loss(logits, y, train_cfg.label_smoothing)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                if train_cfg.clip_norm:
                    nn.utils.clip_grad_norm_(model.parameters(), train_cfg.clip_norm)
                optimizer.step()
                batch_correct = sum(p == t for p, t in zip(predicted_classes(logits.detach()), y.tolist()))
                seen += len(batch)
                correct += batch_correct
                loss_sum += loss.item() * len(batch)
                row = {"step": step, "epoch": epoch, "loss": loss.item(), "accuracy": batch_correct / len(batch), "lr": lr}
                log.write(row)
                on_event({"event": "step", **row, "steps_per_epoch": steps_per_epoch,
                          "running_loss": loss_sum / seen, "running_accuracy": correct / seen})
                if train_cfg.max_steps and step >= train_cfg.max_steps:
                    break

            valid_pred = predicted_classes(predict_ids(model, valid_ids, tokenizer.pad_id))
            valid_acc = accuracy(valid_pred, valid_y)
            row = {"epoch": epoch, "step": step, "train_loss": loss_sum / max(1, seen), "train_accuracy": correct / max(1, seen),
                   "valid_accuracy": valid_acc, "valid_macro_f1": macro_f1(valid_pred, valid_y, len(labels))}
            improved = valid_acc > best_acc
            if improved:
                best_acc, best_epoch, stale = valid_acc, epoch, 0
                checkpoint.save_weights(out_dir, model)
            else:
                stale += 1
            log.write({**row, "best": improved})
            on_event({"event": "epoch", **row, "best": improved})
            if train_cfg.patience and stale >= train_cfg.patience:
                break
            if train_cfg.max_steps and step >= train_cfg.max_steps:
                break
    finally:
        log.close()
    checkpoint.write_manifest(out_dir)
    return TrainSummary(out_dir, best_epoch, best_acc, epoch, step, time.perf_counter() - start, truncation, valid_source)
