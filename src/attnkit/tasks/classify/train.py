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

from attnkit import runs
from attnkit.config import ClassifierConfig, TrainConfig
from attnkit.data.batching import Truncation, bucketed_batches, pad
from attnkit.data.readers import Example
from attnkit.errors import InputError
from attnkit.evaluation.metrics import accuracy, macro_f1
from attnkit.model.build import build_classifier
from attnkit.model.classifier import TransformerClassifier
from attnkit.tasks.classify.data import encode_examples, resolve_classes
from attnkit.tasks.classify.predict import predict_ids, predicted_classes
from attnkit.tokenization import Tokenizer, train_tokenizer
from attnkit.training.guards import NonFiniteError, check_step
from attnkit.training.losses import autocast, classification_loss
from attnkit.training.optim import make_optimizer, set_learning_rate
from attnkit.training.schedules import learning_rate
from attnkit.training.state import (
    STATE,
    LoopState,
    fingerprint_texts,
    load_state,
    save_state,
)

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


@dataclass
class Pretrained:
    """A pretrained encoder to fine-tune (``interop.bert.load_pretrained`` reads one from a BERT folder): the model
    (its head is replaced), its config and tokenizer, and where it came from (recorded as ``init_from``)."""

    model: TransformerClassifier
    config: ClassifierConfig
    tokenizer: Tokenizer
    source: str


def with_fresh_head(pretrained: Pretrained, *, n_classes: int, pooling: str) -> tuple[TransformerClassifier, ClassifierConfig]:
    """The pretrained encoder under a freshly initialised head of ``n_classes`` outputs."""
    cfg = dataclasses.replace(pretrained.config, n_classes=n_classes, pooling=pooling)
    model = build_classifier(cfg, pad_id=pretrained.tokenizer.pad_id)
    encoder = {name: t for name, t in pretrained.model.state_dict().items() if not name.startswith("head.")}
    result = model.load_state_dict(encoder, strict=False)
    if result.unexpected_keys or any(not name.startswith("head.") for name in result.missing_keys):
        raise ValueError(f"pretrained model does not fit its config (missing: {result.missing_keys}, "
                         f"unexpected: {result.unexpected_keys})")
    return model, cfg


def train_classifier(
    train: list[Example],
    valid: list[Example] | None,
    *,
    model_cfg: ClassifierConfig,
    train_cfg: TrainConfig,
    out_dir: str | Path,
    resume: bool = False,
    pretrained: Pretrained | None = None,
    on_event: Callable[[Event], None] = lambda event: None,
) -> TrainSummary:
    """Train on ``train``, select on ``valid`` (10% of ``train`` held out when None), write the run to ``out_dir``.

    With ``pretrained`` (a BERT encoder, see ``interop.bert.load_pretrained``), the encoder and its tokenizer are the
    pretrained ones and only the head starts fresh; ``model_cfg`` then contributes ``n_classes``, ``pooling`` and
    ``dropout``.

    With ``resume``, ``out_dir`` is a run killed part-way: its config, tokenizer and training state are loaded and
    training continues from the saved step exactly as if it had never stopped (``model_cfg`` and ``train_cfg``
    are then taken from the run, not from the arguments).
    """
    start = time.perf_counter()
    out_dir = runs.prepare_run_dir(out_dir, resume)
    saved_config = runs.read_json(out_dir / runs.CONFIG) if resume else None
    if saved_config is not None:
        model_cfg = ClassifierConfig(**saved_config["model"])
        train_cfg = TrainConfig(**saved_config["train"])
    torch.manual_seed(train_cfg.seed)

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

    init_from = pretrained.source if pretrained is not None else None
    initial = None
    if saved_config is not None:
        labels = runs.read_json(out_dir / runs.LABELS)
        tokenizer = Tokenizer.load(out_dir / runs.TOKENIZER, saved_config["tokenizer"])
    elif pretrained is not None:
        labels = sorted({ex.label for ex in train})
        n_classes = resolve_classes(model_cfg, labels).n_classes
        initial, bert_cfg = with_fresh_head(pretrained, n_classes=n_classes, pooling=model_cfg.pooling)
        tokenizer = pretrained.tokenizer
        model_cfg = dataclasses.replace(bert_cfg, dropout=model_cfg.dropout)
    else:
        labels = sorted({ex.label for ex in train})
        model_cfg = resolve_classes(model_cfg, labels)
        tokenizer = train_tokenizer(
            (ex.text for ex in train), kind=train_cfg.tokenizer, vocab_size=model_cfg.vocab_size,
            min_freq=train_cfg.min_freq, add_cls=model_cfg.pooling == "cls",
        )
        model_cfg = dataclasses.replace(model_cfg, vocab_size=tokenizer.vocab_size)
    label_id = {label: i for i, label in enumerate(labels)}
    for ex in train + valid:
        if ex.label not in label_id:
            raise InputError(f"line {ex.line}: label {ex.label!r} is not one of the run's labels {labels}")
    train_ids, truncation = encode_examples(tokenizer, [ex.text for ex in train], model_cfg.max_len,
                                            train_cfg.max_len_policy, [ex.line for ex in train])
    valid_ids, _ = encode_examples(tokenizer, [ex.text for ex in valid], model_cfg.max_len, train_cfg.max_len_policy,
                                   [ex.line for ex in valid])
    train_y = torch.tensor([label_id[ex.label] for ex in train])
    valid_y = [label_id[ex.label] for ex in valid]
    data_fingerprint = fingerprint_texts([ex.text for ex in train], [ex.label for ex in train], [ex.text for ex in valid])
    on_event({"event": "info", "n_train": len(train), "n_valid": len(valid), "valid_source": valid_source,
              "vocab_size": tokenizer.vocab_size, "labels": labels, "truncated": truncation.n_truncated,
              "longest": truncation.longest, "max_len": model_cfg.max_len})

    model = build_classifier(model_cfg, pad_id=tokenizer.pad_id)
    if initial is not None:
        model.load_state_dict(initial.state_dict())  # the same weights, in a model built with this run's dropout
    optimizer = make_optimizer(model, train_cfg)
    steps_per_epoch = -(-len(train) // train_cfg.batch_size)
    total_steps = train_cfg.max_steps or steps_per_epoch * train_cfg.epochs
    warmup = train_cfg.warmup_steps or int(train_cfg.warmup_ratio * total_steps)
    generator = torch.Generator().manual_seed(train_cfg.seed)

    if saved_config is None:
        config = {**runs.config_header("classify"), "model": dataclasses.asdict(model_cfg),
                  "train": dataclasses.asdict(train_cfg), "tokenizer": tokenizer.meta(), "pad_id": tokenizer.pad_id}
        if init_from is not None:
            config["init_from"] = str(init_from)
        for stale_file in (runs.MANIFEST, STATE, runs.WEIGHTS):
            (out_dir / stale_file).unlink(missing_ok=True)  # a run written over an earlier one starts clean
        runs.atomic_write_json(out_dir / runs.CONFIG, config)
        runs.atomic_write_json(out_dir / runs.LABELS, labels)
        tokenizer.save(out_dir / runs.TOKENIZER)
        loop = LoopState(counters={"best_acc": -1.0, "best_epoch": 0, "stale": 0, "seen": 0, "correct": 0,
                                   "loss_sum": 0.0, "skipped": 0})
        log = runs.MetricsLog(out_dir / runs.METRICS, tensorboard=train_cfg.tensorboard)
    else:
        loop = load_state(out_dir / STATE, model=model, optimizer=optimizer, data_fingerprint=data_fingerprint)
        generator.set_state(loop.epoch_generator_state)
        resumed_at = loop
        log = runs.MetricsLog(
            out_dir / runs.METRICS, tensorboard=train_cfg.tensorboard,
            keep=lambda row: row["step"] <= resumed_at.step and ("valid_accuracy" not in row or row["epoch"] < resumed_at.epoch),
        )
        on_event({"event": "resume", "step": loop.step, "epoch": loop.epoch})
    c = loop.counters
    lengths = [len(s) for s in train_ids]

    def save_state_now() -> None:
        """The training state, then the manifest: a run killed after this loads (and resumes) from here."""
        save_state(out_dir / STATE, model=model, optimizer=optimizer, loop=loop, data_fingerprint=data_fingerprint)
        runs.write_manifest(out_dir)

    def run_epoch(batches: list[list[int]]) -> bool:
        """Train on ``batches`` from ``loop.batch_index`` on; False when the step budget ran out first."""
        model.train()  # validation at the end of the previous epoch left it in eval mode
        while loop.batch_index < len(batches):
            batch = batches[loop.batch_index]
            loop.step += 1
            lr = learning_rate(loop.step, schedule=train_cfg.schedule, peak=train_cfg.lr, factor=train_cfg.lr_factor,
                               warmup=warmup, total=total_steps, d_model=model_cfg.d_model)
            set_learning_rate(optimizer, lr)
            ids = pad([train_ids[i] for i in batch], tokenizer.pad_id)  # (B, S)
            y = train_y[batch]  # (B,)
            rng_before = torch.get_rng_state()
            with autocast(train_cfg.precision):
                logits = model(ids)  # (B, C)
            loss = classification_loss(logits.float(), y, train_cfg.label_smoothing)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = nn.utils.clip_grad_norm_(model.parameters(), train_cfg.clip_norm or float("inf"))

            def replay() -> None:
                torch.set_rng_state(rng_before)
                with autocast(train_cfg.precision):
                    model(ids)

            problem = check_step(model, loss.detach(), grad_norm, step=loop.step, replay=replay)
            loop.batch_index += 1
            if problem is not None:
                if not train_cfg.skip_nonfinite:
                    raise NonFiniteError(f"{problem}. The last good checkpoint in {out_dir} is kept; "
                                         f"lower lr or set skip_nonfinite=true to skip such batches")
                c["skipped"] += 1
                optimizer.zero_grad(set_to_none=True)
                log.write({"step": loop.step, "epoch": loop.epoch, "skipped": problem})
                on_event({"event": "skipped", "step": loop.step, "message": problem})
                continue
            optimizer.step()
            batch_correct = sum(p == t for p, t in zip(predicted_classes(logits.detach()), y.tolist()))
            c["seen"] += len(batch)
            c["correct"] += batch_correct
            c["loss_sum"] += loss.item() * len(batch)
            row = {"step": loop.step, "epoch": loop.epoch, "loss": loss.item(), "accuracy": batch_correct / len(batch), "lr": lr}
            log.write(row)
            on_event({"event": "step", **row, "steps_per_epoch": steps_per_epoch,
                      "running_loss": c["loss_sum"] / c["seen"], "running_accuracy": c["correct"] / c["seen"]})
            if loop.step % train_cfg.checkpoint_every == 0:
                save_state_now()
            if train_cfg.max_steps and loop.step >= train_cfg.max_steps:
                return False
        return True

    try:
        while loop.epoch <= train_cfg.epochs:
            if loop.batch_index == 0:
                loop.epoch_generator_state = generator.get_state()
            else:  # resuming inside an epoch: draw the same order again, from the epoch's starting state
                generator.set_state(loop.epoch_generator_state)
            batches = bucketed_batches(lengths, train_cfg.batch_size, generator, train_cfg.bucket_factor)
            finished_epoch = run_epoch(batches)

            valid_pred = predicted_classes(predict_ids(model, valid_ids, tokenizer.pad_id))
            valid_acc = accuracy(valid_pred, valid_y)
            row = {"epoch": loop.epoch, "step": loop.step, "train_loss": c["loss_sum"] / max(1, c["seen"]),
                   "train_accuracy": c["correct"] / max(1, c["seen"]), "valid_accuracy": valid_acc,
                   "valid_macro_f1": macro_f1(valid_pred, valid_y, len(labels))}
            improved = valid_acc > c["best_acc"]
            if improved:
                c.update(best_acc=valid_acc, best_epoch=loop.epoch, stale=0)
                runs.save_weights(out_dir, model)
                runs.write_manifest(out_dir)
            else:
                c["stale"] += 1
            log.write({**row, "best": improved})
            on_event({"event": "epoch", **row, "best": improved})
            loop.epoch, loop.batch_index = loop.epoch + 1, 0
            c.update(seen=0, correct=0, loss_sum=0.0)
            loop.epoch_generator_state = generator.get_state()
            save_state_now()
            if not finished_epoch or (train_cfg.patience and c["stale"] >= train_cfg.patience):
                break
    finally:
        log.close()
    runs.write_manifest(out_dir)
    return TrainSummary(out_dir, c["best_epoch"], c["best_acc"], loop.epoch - 1, loop.step,
                        time.perf_counter() - start, truncation, valid_source)
