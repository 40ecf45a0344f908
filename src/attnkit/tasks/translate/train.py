"""Training the encoder-decoder on parallel text with the paper's recipe (§5): shared BPE, token-budget batches
with gradient accumulation, Adam(0.9, 0.98, 1e-9), the warmup schedule of eq. 3, label smoothing 0.1, periodic
checkpoints (the last K kept, for averaging), validation loss and BLEU at each checkpoint."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from attnkit import runs
from attnkit.config import TrainConfig, TranslatorConfig
from attnkit.data.batching import Truncation, token_budget_batches
from attnkit.data.readers import Pair
from attnkit.decoding.corpus import translate_ids
from attnkit.errors import InputError
from attnkit.evaluation.bleu import corpus_scores
from attnkit.model.build import build_translator
from attnkit.model.transformer import Transformer
from attnkit.runs import CHECKPOINTS, checkpoint_paths
from attnkit.tasks.translate.data import ParallelData, encode_pairs, make_batch
from attnkit.tokenization import Tokenizer, train_tokenizer
from attnkit.training.guards import NonFiniteError, check_step
from attnkit.training.losses import autocast, sequence_loss
from attnkit.training.optim import make_optimizer, set_learning_rate
from attnkit.training.schedules import learning_rate
from attnkit.training.state import (
    STATE,
    LoopState,
    fingerprint_texts,
    load_state,
    save_state,
)


@dataclass
class TranslateSummary:
    run_dir: Path
    steps: int
    epochs: float
    seconds: float
    valid_loss: float | None
    valid_bleu: float | None
    truncation: Truncation


@torch.no_grad()
def validation_loss(model: Transformer, data: ParallelData, tokenizer: Tokenizer, max_tokens: int) -> float:
    """Mean per-token cross-entropy (no label smoothing) on ``data``; exp of it is the perplexity."""
    model.eval()
    total, n_tokens = 0.0, 0
    for batch in token_budget_batches([len(s) for s in data.src], [len(t) + 1 for t in data.tgt], max_tokens, None):
        src, tgt_in, tgt_out = make_batch(data, batch, tokenizer)
        loss, n = sequence_loss(model(src, tgt_in), tgt_out, tokenizer.pad_id)
        total, n_tokens = total + loss.item(), n_tokens + n
    return total / max(1, n_tokens)


def train_translator(
    train: list[Pair],
    valid: list[Pair] | None,
    *,
    model_cfg: TranslatorConfig,
    train_cfg: TrainConfig,
    out_dir: str | Path,
    resume: bool = False,
    on_event: Callable[[dict], None] = lambda event: None,
) -> TranslateSummary:
    """Train on ``train`` and write the run (config, shared BPE, weights, checkpoints, metrics) to ``out_dir``.

    With ``resume``, continue a killed run from its last saved state, bit-exactly (configs come from the run).
    """
    if train_cfg.layer_lr_decay != 1.0:
        raise InputError("config key layer_lr_decay applies to fine-tuning a classifier's pretrained encoder; "
                         "a translator trains with one learning rate (set it to 1)")
    start = time.perf_counter()
    out_dir = runs.prepare_run_dir(out_dir, resume)
    saved_config = runs.read_json(out_dir / runs.CONFIG) if resume else None
    if saved_config is not None:
        model_cfg = TranslatorConfig(**saved_config["model"])
        train_cfg = TrainConfig(**saved_config["train"])
        tokenizer = Tokenizer.load(out_dir / runs.TOKENIZER, saved_config["tokenizer"])
    else:
        # §5.1: a shared source-target vocabulary of byte-pair encodings.
        tokenizer = train_tokenizer(
            (text for pair in train for text in (pair.source, pair.target)), kind=train_cfg.tokenizer,
            vocab_size=model_cfg.vocab_size, min_freq=train_cfg.min_freq,
        )
        model_cfg = dataclasses.replace(model_cfg, vocab_size=tokenizer.vocab_size)
    torch.manual_seed(train_cfg.seed)
    data = encode_pairs(tokenizer, train, model_cfg.max_len, train_cfg.max_len_policy)
    valid_data = encode_pairs(tokenizer, valid, model_cfg.max_len, train_cfg.max_len_policy) if valid else None
    data_fingerprint = fingerprint_texts([p.source for p in train], [p.target for p in train], [p.source for p in valid or []])
    on_event({"event": "info", "n_train": len(train), "n_valid": len(valid or []), "vocab_size": tokenizer.vocab_size,
              "truncated": data.truncation.n_truncated, "max_len": model_cfg.max_len})

    model = build_translator(model_cfg, pad_id=tokenizer.pad_id)
    optimizer = make_optimizer(model, train_cfg)
    generator = torch.Generator().manual_seed(train_cfg.seed)
    src_lengths, tgt_lengths = [len(s) for s in data.src], [len(t) + 1 for t in data.tgt]
    batches_per_epoch = len(token_budget_batches(src_lengths, tgt_lengths, train_cfg.max_tokens, None))
    steps_per_epoch = max(1, batches_per_epoch // train_cfg.accum_steps)
    total_steps = train_cfg.max_steps or steps_per_epoch * train_cfg.epochs
    warmup = train_cfg.warmup_steps or max(1, int(train_cfg.warmup_ratio * total_steps))

    if saved_config is None:
        config = {**runs.config_header("translate"), "model": dataclasses.asdict(model_cfg),
                  "train": dataclasses.asdict(train_cfg), "tokenizer": tokenizer.meta(), "pad_id": tokenizer.pad_id}
        for stale_file in (runs.MANIFEST, STATE, runs.WEIGHTS):
            (out_dir / stale_file).unlink(missing_ok=True)  # a run written over an earlier one starts clean
        for old in checkpoint_paths(out_dir):
            old.unlink()
        (out_dir / CHECKPOINTS).mkdir(exist_ok=True)
        runs.atomic_write_json(out_dir / runs.CONFIG, config)
        tokenizer.save(out_dir / runs.TOKENIZER)
        loop = LoopState(counters={"skipped": 0, "last_checkpoint": {}})
        log = runs.MetricsLog(out_dir / runs.METRICS, tensorboard=train_cfg.tensorboard)
    else:
        loop = load_state(out_dir / STATE, model=model, optimizer=optimizer, data_fingerprint=data_fingerprint)
        generator.set_state(loop.epoch_generator_state)
        resumed_step = loop.step
        log = runs.MetricsLog(out_dir / runs.METRICS, keep=lambda row: row["step"] <= resumed_step,
                                     tensorboard=train_cfg.tensorboard)
        on_event({"event": "resume", "step": loop.step, "epoch": loop.epoch})
    c = loop.counters

    def save_checkpoint(epoch: float) -> None:
        """Write step_N.safetensors (dropping the oldest beyond keep_last), model.safetensors and the training
        state; validate."""
        step = loop.step
        runs.save_weights(out_dir / CHECKPOINTS, model, f"step_{step}.safetensors")
        for old in checkpoint_paths(out_dir)[: -train_cfg.keep_last]:
            old.unlink()
        runs.save_weights(out_dir, model)
        row: dict = {"step": step, "epoch": round(epoch, 3), "checkpoint": f"step_{step}"}
        if valid_data is not None:
            row["valid_loss"] = validation_loss(model, valid_data, tokenizer, train_cfg.max_tokens)
            row["valid_ppl"] = math.exp(min(row["valid_loss"], 50.0))
            if train_cfg.valid_bleu:
                hyps = tokenizer.decode_batch(translate_ids(model, tokenizer, valid_data.src, beam=1))
                row.update({f"valid_{k}": v for k, v in corpus_scores(hyps, [p.target for p in valid]).items()
                            if k in ("bleu", "chrf")})
        model.train()
        c["last_checkpoint"] = row
        save_state(out_dir / STATE, model=model, optimizer=optimizer, loop=loop, data_fingerprint=data_fingerprint)
        runs.write_manifest(out_dir)  # a run killed after this loads (and resumes) from this checkpoint
        log.write(row)
        on_event({"event": "checkpoint", **row})

    out_of_time = False
    model.train()
    try:
        while loop.step < total_steps and not out_of_time:
            if loop.batch_index == 0:
                loop.epoch_generator_state = generator.get_state()
            else:  # resuming inside an epoch: draw the same order again, from the epoch's starting state
                generator.set_state(loop.epoch_generator_state)
            batches = token_budget_batches(src_lengths, tgt_lengths, train_cfg.max_tokens, generator)
            # Whole optimizer steps only: the accumulated batches of one step are consecutive in this list.
            while loop.batch_index + train_cfg.accum_steps <= len(batches):
                first = loop.batch_index
                group = [make_batch(data, b, tokenizer) for b in batches[first : first + train_cfg.accum_steps]]
                n_tokens = sum(int((tgt_out != tokenizer.pad_id).sum()) for _, _, tgt_out in group)
                loop.step += 1
                loop.batch_index += train_cfg.accum_steps
                lr = learning_rate(loop.step, schedule=train_cfg.schedule, peak=train_cfg.lr, factor=train_cfg.lr_factor,
                                   warmup=warmup, total=total_steps, d_model=model_cfg.d_model)
                set_learning_rate(optimizer, lr)
                optimizer.zero_grad(set_to_none=True)
                rng_before = torch.get_rng_state()
                loss_sum = torch.zeros(())
                for src, tgt_in, tgt_out in group:
                    with autocast(train_cfg.precision):
                        logits = model(src, tgt_in)  # (B, T, V)
                    loss, _ = sequence_loss(logits.float(), tgt_out, tokenizer.pad_id, train_cfg.label_smoothing)
                    (loss / n_tokens).backward()  # the step's gradient is the mean over all its target tokens
                    loss_sum += loss.detach()
                grad_norm = nn.utils.clip_grad_norm_(model.parameters(), train_cfg.clip_norm or float("inf"))

                def replay() -> None:
                    torch.set_rng_state(rng_before)
                    with autocast(train_cfg.precision):
                        for src, tgt_in, _ in group:
                            model(src, tgt_in)

                problem = check_step(model, loss_sum, grad_norm, step=loop.step, replay=replay)
                epoch_pos = round(loop.epoch - 1 + loop.batch_index / len(batches), 3)
                if problem is not None:
                    if not train_cfg.skip_nonfinite:
                        raise NonFiniteError(f"{problem}. The last good checkpoint in {out_dir} is kept; "
                                             f"lower lr_factor/lr or set skip_nonfinite=true to skip such batches")
                    c["skipped"] += 1
                    optimizer.zero_grad(set_to_none=True)
                    log.write({"step": loop.step, "epoch": epoch_pos, "skipped": problem})
                    on_event({"event": "skipped", "step": loop.step, "message": problem})
                else:
                    optimizer.step()
                    row = {"step": loop.step, "loss": loss_sum.item() / n_tokens, "lr": lr, "tokens": n_tokens,
                           "epoch": epoch_pos}
                    log.write(row)
                    on_event({"event": "step", **row, "total_steps": total_steps})
                out_of_time = bool(train_cfg.max_minutes) and time.perf_counter() - start > 60 * train_cfg.max_minutes
                if loop.step % train_cfg.checkpoint_every == 0 or loop.step >= total_steps or out_of_time:
                    save_checkpoint(epoch_pos)
                if loop.step >= total_steps or out_of_time:
                    break
            else:
                loop.epoch, loop.batch_index = loop.epoch + 1, 0
                continue
            break
        if c["last_checkpoint"].get("step") != loop.step:
            save_checkpoint(float(loop.epoch))
    finally:
        log.close()
    runs.write_manifest(out_dir)
    last = c["last_checkpoint"]
    return TranslateSummary(out_dir, loop.step, last.get("epoch", 0.0), time.perf_counter() - start,
                            last.get("valid_loss"), last.get("valid_bleu"), data.truncation)
