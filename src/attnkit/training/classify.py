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
from attnkit.training.guards import NonFiniteError, check_step
from attnkit.training.losses import autocast, classification_loss
from attnkit.training.schedules import learning_rate
from attnkit.training.state import STATE, LoopState, fingerprint_texts, load_state, save_state

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
    """Adam or AdamW (§5.3 betas and eps by default); biases, norms and embeddings get no weight decay.

    Every group carries an ``lr_scale`` that the training loop multiplies the scheduled learning rate by. It is 1
    unless ``cfg.layer_lr_decay`` < 1 (layer-wise decay for fine-tuning, as in ELECTRA and BEiT): with N encoder
    layers, the head learns at lr, layer i (0 = the lowest) at lr * decay^(N - i), the embeddings at
    lr * decay^(N + 1), so the pretrained lower layers move least.
    """
    n_layers = len(model.encoder.layers) if cfg.layer_lr_decay != 1.0 else 0
    groups: dict[tuple[float, float], list[nn.Parameter]] = {}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        weight_decay = 0.0 if param.ndim < 2 or "embeddings" in name else cfg.weight_decay
        groups.setdefault((weight_decay, cfg.layer_lr_decay ** _depth(name, n_layers)), []).append(param)
    param_groups = [{"params": params, "weight_decay": wd, "lr_scale": scale} for (wd, scale), params in groups.items()]
    optim_cls = torch.optim.AdamW if cfg.optimizer == "adamw" else torch.optim.Adam  # Adam: decay as an L2 term
    return optim_cls(param_groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.adam_eps)


def _depth(name: str, n_layers: int) -> int:
    """How many layers below the head a parameter sits: head 0, encoder layer i at n_layers - i, embeddings n + 1."""
    if not n_layers:
        return 0
    if name.startswith("embeddings."):
        return n_layers + 1
    if name.startswith("encoder.layers."):
        return n_layers - int(name.split(".")[2])
    return 0


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """The scheduled learning rate, times each group's ``lr_scale`` (layer-wise decay)."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)


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


def encode_examples(
    tokenizer: Tokenizer, texts: list[str], max_len: int, policy: str, lines: list[int] | None = None
) -> tuple[list[list[int]], Truncation]:
    """Ids of ``texts``, cut to ``max_len`` (keeping a trailing [SEP]) or refused, as ``policy`` says."""
    return apply_length_policy(tokenizer.encode_batch(texts), max_len, policy, what="text",
                               keep_last=tokenizer.n_trailing_specials or None, lines=lines)


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
    resume: bool = False,
    init_from: str | Path | None = None,
    on_event: Callable[[Event], None] = lambda event: None,
) -> TrainSummary:
    """Train on ``train``, select on ``valid`` (10% of ``train`` held out when None), write the run to ``out_dir``.

    With ``init_from`` (a BERT-format folder, or "minilm"), the encoder and its tokenizer are the pretrained ones and
    only the head starts fresh; ``model_cfg`` then contributes ``n_classes``, ``pooling`` and ``dropout``.

    With ``resume``, ``out_dir`` is a run killed part-way: its config, tokenizer and training state are loaded and
    training continues from the saved step exactly as if it had never stopped (``model_cfg`` and ``train_cfg``
    are then taken from the run, not from the arguments).
    """
    start = time.perf_counter()
    out_dir = checkpoint.prepare_run_dir(out_dir, resume)
    saved_config = checkpoint.read_json(out_dir / checkpoint.CONFIG) if resume else None
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

    pretrained = None
    if saved_config is not None:
        labels = checkpoint.read_json(out_dir / checkpoint.LABELS)
        tokenizer = Tokenizer.load(out_dir / checkpoint.TOKENIZER, saved_config["tokenizer"])
    elif init_from is not None:
        from attnkit.interop.bert import load_bert_classifier, resolve_bert_folder

        labels = sorted({ex.label for ex in train})
        n_classes = resolve_classes(model_cfg, labels).n_classes
        pretrained, bert_cfg, tokenizer = load_bert_classifier(resolve_bert_folder(init_from), n_classes=n_classes,
                                                               pooling=model_cfg.pooling)
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
    if pretrained is not None:
        model.load_state_dict(pretrained.state_dict())  # the same weights, in a model built with this run's dropout
    optimizer = make_optimizer(model, train_cfg)
    steps_per_epoch = -(-len(train) // train_cfg.batch_size)
    total_steps = train_cfg.max_steps or steps_per_epoch * train_cfg.epochs
    warmup = train_cfg.warmup_steps or int(train_cfg.warmup_ratio * total_steps)
    generator = torch.Generator().manual_seed(train_cfg.seed)

    if saved_config is None:
        config = {**checkpoint.config_header("classify"), "model": dataclasses.asdict(model_cfg),
                  "train": dataclasses.asdict(train_cfg), "tokenizer": tokenizer.meta(), "pad_id": tokenizer.pad_id}
        if init_from is not None:
            config["init_from"] = str(init_from)
        for stale_file in (checkpoint.MANIFEST, STATE, checkpoint.WEIGHTS):
            (out_dir / stale_file).unlink(missing_ok=True)  # a run written over an earlier one starts clean
        checkpoint.atomic_write_json(out_dir / checkpoint.CONFIG, config)
        checkpoint.atomic_write_json(out_dir / checkpoint.LABELS, labels)
        tokenizer.save(out_dir / checkpoint.TOKENIZER)
        loop = LoopState(counters={"best_acc": -1.0, "best_epoch": 0, "stale": 0, "seen": 0, "correct": 0,
                                   "loss_sum": 0.0, "skipped": 0})
        log = checkpoint.MetricsLog(out_dir / checkpoint.METRICS, tensorboard=train_cfg.tensorboard)
    else:
        loop = load_state(out_dir / STATE, model=model, optimizer=optimizer, data_fingerprint=data_fingerprint)
        generator.set_state(loop.epoch_generator_state)
        resumed_at = loop
        log = checkpoint.MetricsLog(
            out_dir / checkpoint.METRICS, tensorboard=train_cfg.tensorboard,
            keep=lambda row: row["step"] <= resumed_at.step and ("valid_accuracy" not in row or row["epoch"] < resumed_at.epoch),
        )
        on_event({"event": "resume", "step": loop.step, "epoch": loop.epoch})
    c = loop.counters
    lengths = [len(s) for s in train_ids]

    def save_state_now() -> None:
        """The training state, then the manifest: a run killed after this loads (and resumes) from here."""
        save_state(out_dir / STATE, model=model, optimizer=optimizer, loop=loop, data_fingerprint=data_fingerprint)
        checkpoint.write_manifest(out_dir)

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
                checkpoint.save_weights(out_dir, model)
                checkpoint.write_manifest(out_dir)
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
    checkpoint.write_manifest(out_dir)
    return TrainSummary(out_dir, c["best_epoch"], c["best_acc"], loop.epoch - 1, loop.step,
                        time.perf_counter() - start, truncation, valid_source)
