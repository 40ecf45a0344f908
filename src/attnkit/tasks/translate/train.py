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
from attnkit.config import TranslatorConfig, TranslatorTrainConfig, check_task_configs
from attnkit.data.batching import Batches, Truncation, token_budget_batches
from attnkit.data.prepared import ParallelTokens, PreparedCorpus
from attnkit.data.readers.parallel import Pair
from attnkit.data.sequences import MappedSequences, sequence_lengths
from attnkit.decoding.corpus import translate_ids
from attnkit.devices import model_device
from attnkit.errors import InputError, check_records
from attnkit.evaluation.bleu import bleu_metric, corpus_scores
from attnkit.model.build import build_translator
from attnkit.model.transformer import Transformer
from attnkit.tasks.translate.data import ParallelData, encode_pairs, fixed_shape_batch, training_batch
from attnkit.tokenization import Tokenizer, train_tokenizer
from attnkit.training.events import Event, Prepared, warn_only
from attnkit.training.graphs import check_graphs
from attnkit.training.loop import fit
from attnkit.training.losses import sequence_loss
from attnkit.training.optim import make_optimizer
from attnkit.training.run_setup import (
    check_fixed_by_weights,
    check_memory,
    check_where,
    holds_run_lock,
    open_run,
    saved_configs,
    write_run_files,
)
from attnkit.training.state import STATE, fingerprint_texts
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
    """Mean per-token cross-entropy (no label smoothing) on ``data``; exp of it is the perplexity. The sum stays on
    the device until the end (one read)."""
    model.eval()
    device = model_device(model)
    total, n_tokens = torch.zeros((), dtype=torch.float64, device=device), 0
    for indices in token_budget_batches(sequence_lengths(data.src), sequence_lengths(data.tgt) + 1, max_tokens, None):
        batch = training_batch(data, indices, tokenizer)
        src, tgt_in, positions, targets, src_rows = (t.to(device) for t in batch.tensors)
        logits = model(src, tgt_in, positions, src_rows=src_rows)  # (N, V)
        total += sequence_loss(logits, targets, tokenizer.pad_id)[0]
        n_tokens += batch.size
    return total.item() / max(1, n_tokens)


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
    max_positions: int  # the model's max_len: no fixed-shape batch is longer (``fixed_shape_batch``)
    unit: str = "tokens"
    stats: tuple[str, ...] = ()
    metric: str = field(init=False)
    higher_is_better: bool = field(init=False)

    def __post_init__(self) -> None:
        # Greedy BLEU when it is computed; otherwise the validation loss. Ties go to the lower loss either way.
        self.metric, self.higher_is_better = ("bleu", True) if self.cfg.valid_bleu else ("loss", False)

    def epoch_batches(self, generator: torch.Generator | None) -> Batches:
        # A target's length counts the BOS (tgt_in) or EOS (tgt_out) that make_batch adds.
        src, tgt = sequence_lengths(self.data.src), sequence_lengths(self.data.tgt) + 1  # (N,), (N,)
        return token_budget_batches(src, tgt, self.cfg.max_tokens, generator)

    def collate(self, indices: list[int]) -> Batch:
        return training_batch(self.data, indices, self.tokenizer)

    def fixed_shape(self, batch: Batch) -> Batch:
        """``batch`` padded to a bounded set of shapes, for steps replayed from CUDA graphs (``training.graphs``)."""
        return fixed_shape_batch(batch, self.tokenizer.pad_id, self.max_positions)

    def loss(self, model: nn.Module, batch: Batch) -> BatchLoss:
        src, tgt_in, positions, targets, *src_rows = batch.tensors  # no src_rows in a fixed-shape batch
        logits = model(src, tgt_in, positions, src_rows=src_rows[0] if src_rows else None)  # (N, V)
        loss, _ = sequence_loss(logits, targets, self.tokenizer.pad_id, self.cfg.label_smoothing)  # float32
        return BatchLoss(loss)

    def evaluate(self, model: nn.Module, device: torch.device) -> dict[str, float] | None:
        if self.valid is None:
            return None
        assert isinstance(model, Transformer)
        loss = validation_loss(model, self.valid, self.tokenizer, self.cfg.max_tokens)
        metrics = {"loss": loss, "ppl": math.exp(min(loss, 50.0))}
        if self.cfg.valid_bleu:
            hyps = self.tokenizer.decode_batch(translate_ids(model, self.tokenizer, list(self.valid.src), beam=1))
            scores = corpus_scores(hyps, self.valid_targets, tokenize=self.cfg.bleu_tokenize)
            metrics.update({k: v for k, v in scores.items() if k in ("bleu", "chrf")})
        return metrics


@dataclass
class _TrainingData:
    """What the task trains and validates on, however it was read."""

    train: ParallelData
    valid: ParallelData | None
    valid_targets: list[str]  # the references of validation BLEU
    fingerprint: str  # of the training data, for resume
    valid_source: str  # for the Prepared event: "file", "the prepared valid split" or "none"


def _text_data(
    tokenizer: Tokenizer, train: list[Pair], valid: list[Pair] | None, max_len: int, policy: str
) -> _TrainingData:
    """Pairs read from text files, encoded now (every id a Python int in a list)."""
    return _TrainingData(
        encode_pairs(tokenizer, train, max_len, policy),
        encode_pairs(tokenizer, valid, max_len, policy) if valid else None,
        [p.target for p in valid or []],
        fingerprint_texts([p.source for p in train], [p.target for p in train], [p.source for p in valid or []]),
        "file" if valid else "none",
    )


def _prepared_data(corpus: PreparedCorpus, tokenizer: Tokenizer) -> _TrainingData:
    """A prepared corpus: the train split stays in its memory maps (read a batch at a time); the small valid split
    is read into lists, and its references are its target ids decoded (the text files are not needed; BLEU
    against them equals BLEU against the original targets wherever the tokenizer decodes exactly)."""
    train = corpus.split("train")
    assert isinstance(train, ParallelTokens)
    truncation = Truncation(
        corpus.meta["splits"]["train"]["truncated"],
        2 * len(train),  # sentences, as the truncated ones are counted: a pair's source and target
        corpus.meta["splits"]["train"]["longest"],
        corpus.meta["max_len"],
    )
    data = ParallelData(MappedSequences(train.src), MappedSequences(train.tgt), truncation)
    valid, targets = None, []
    if "valid" in corpus.meta["splits"]:
        split = corpus.split("valid")
        assert isinstance(split, ParallelTokens)
        src, tgt = MappedSequences(split.src)[:], MappedSequences(split.tgt)[:]
        valid = ParallelData(src, tgt, Truncation(0, 2 * len(src), 0, corpus.meta["max_len"]))
        targets = tokenizer.decode_batch(tgt)
    valid_source = "the prepared valid split" if valid else "none"
    return _TrainingData(data, valid, targets, corpus.fingerprint("train", "valid"), valid_source)


@holds_run_lock
def train_translator(
    train: list[Pair] | PreparedCorpus,
    valid: list[Pair] | None = None,
    *,
    model_cfg: TranslatorConfig | None = None,
    train_cfg: TranslatorTrainConfig | None = None,
    out_dir: str | Path,
    resume: bool = False,
    init_from: str | Path | None = None,
    on_event: Callable[[Event], None] = warn_only,
    context: TrainContext | None = None,
) -> TranslateSummary:
    """Train on ``train`` and write the run (config, shared BPE, weights, checkpoints, metrics) to ``out_dir``.

    ``train`` is parallel text, or a prepared corpus (``data.prepared.open_prepared``; ``valid`` is then None and
    the corpus's valid split, if any, validates): its tokenizer is the run's, and its train split is read from the
    memory maps a batch at a time. With ``resume``, continue a killed run from its last saved state, bit-exactly
    (the run's configs rule; a larger budget may be given, as ``train_classifier`` says). ``init_from``, a
    translator's run directory: start from its weights (fairseq's ``--restore-file --reset-optimizer``),
    architecture and tokenizer, with a new optimizer and schedule; ``model_cfg`` then gives only the dropout.
    ``context`` says where to train (the device, default the CPU, and the process's rank in a data-parallel run; see
    ``fit``); the run directory it writes does not depend on it. ``model_cfg`` and ``train_cfg`` default to the
    task's (the ``small`` preset), as ``translate train`` builds them. ``on_event``: as ``train_classifier``'s.
    """
    prepared = train if isinstance(train, PreparedCorpus) else None
    if prepared is not None and valid is not None:
        raise ValueError("a prepared corpus brings its own valid split; pass valid=None")
    given = model_cfg, train_cfg  # a resumed run checks them against its saved ones
    model_cfg, train_cfg = check_task_configs("translate", model_cfg, train_cfg)
    if not isinstance(train, PreparedCorpus):  # checked before the run directory is made
        train = check_records(train, Pair, "train", reader="attnkit.read_parallel_tsv")
        if valid is not None:
            valid = check_records(valid, Pair, "valid", reader="attnkit.read_parallel_tsv", empty_ok=True)
    context = context or TrainContext()
    check_where(context, train_cfg.precision)
    if train_cfg.cuda_graphs:  # asked for: what it needs, before any work (``fit`` decides on the run's own settings)
        check_graphs(train_cfg, TranslationTask, context)
    run = open_run(out_dir, resume, context, on_event, task="translate")
    source = runs.read_run(init_from, task="translate") if init_from is not None else None
    if run.saved is not None:
        model_cfg, train_cfg = saved_configs(run, "translate", *given, context)
        tokenizer = Tokenizer.load(run.path / runs.TOKENIZER, run.saved["tokenizer"])
    elif source is not None:
        assert isinstance(source.model_cfg, TranslatorConfig)  # read_run checked the task
        check_fixed_by_weights(
            "translate",
            given,
            source.model_cfg,
            ("dropout", "attention_dropout"),
            f"init_from {init_from}",
            source.config.get("train"),
        )
        tokenizer = source.tokenizer
        model_cfg = dataclasses.replace(
            source.model_cfg, dropout=model_cfg.dropout, attention_dropout=model_cfg.attention_dropout
        )
    elif prepared is not None:
        tokenizer = prepared.tokenizer  # the corpus's ids are this vocabulary's
        model_cfg = dataclasses.replace(model_cfg, vocab_size=tokenizer.vocab_size)
    else:
        assert isinstance(train, list)
        # §5.1: a shared source-target vocabulary of byte-pair encodings.
        tokenizer = train_tokenizer(
            (text for pair in train for text in (pair.source, pair.target)),
            kind=train_cfg.tokenizer,
            vocab_size=model_cfg.vocab_size,
            min_freq=train_cfg.min_freq,
            pretokenize=train_cfg.pretokenize,
        )
        model_cfg = dataclasses.replace(model_cfg, vocab_size=tokenizer.vocab_size)
    if prepared is not None and prepared.tokenizer.fingerprint() != tokenizer.fingerprint():
        owner = f"the run in {run.path}" if run.saved is not None else f"the run {init_from} (--init-from)"
        raise InputError(
            f"{prepared.directory}: prepared with another tokenizer than {owner}; prepare it with that run's "
            "tokenizer (attnkit data prepare --tokenizer RUN)"
        )
    if train_cfg.valid_bleu:
        bleu_metric(train_cfg.bleu_tokenize)  # a missing analyser (ko-mecab) fails now, not at the first evaluation
    torch.manual_seed(train_cfg.seed)
    if prepared is not None:
        prepared.check("translate", model_cfg.max_len)
        data = _prepared_data(prepared, tokenizer)
    else:
        assert isinstance(train, list)
        data = _text_data(tokenizer, train, valid, model_cfg.max_len, train_cfg.max_len_policy)
    on_event(
        Prepared(
            len(data.train.src),
            len(data.valid.src) if data.valid else 0,
            data.valid_source,
            tokenizer.vocab_size,
            data.train.truncation.n_truncated,
            model_cfg.max_len,
            None,
        )
    )

    check_memory(model_cfg, context.device)
    model = build_translator(model_cfg, pad_id=tokenizer.pad_id).to(
        context.device
    )  # before the optimizer: its state too
    if source is not None and not (run.resume and (run.path / STATE).is_file()):  # weights only, no optimizer state
        runs.load_weights(model, source.run_dir / runs.WEIGHTS)
    optimizer = make_optimizer(model, train_cfg)
    extra = {"init_from": str(init_from)} if init_from is not None else {}
    write_run_files(run, "translate", model_cfg, train_cfg, tokenizer, files=None, context=context, **extra)
    task = TranslationTask(
        data.train,
        data.valid,
        data.valid_targets,
        tokenizer,
        train_cfg,
        model_cfg.d_model,
        data.fingerprint,
        model_cfg.max_len,
    )
    result = fit(model, optimizer, task, train_cfg, run.path, resume=run.resume, on_event=on_event, context=context)
    return TranslateSummary(
        run.path,
        result.steps,
        result.epochs,
        result.seconds,
        result.best.get("loss"),
        result.best.get("bleu"),
        data.train.truncation,
        result.stopped_by,
    )
