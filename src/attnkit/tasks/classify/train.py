"""Training a text classifier: the tokenizer, the label set, the encoded data, and the classification task the one
training loop (``attnkit.training.loop.fit``) runs: length-bucketed sentence batches, the mean cross-entropy per
sentence, validation accuracy (ties broken by validation loss) deciding the best epoch."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from attnkit import runs
from attnkit.config import FINE_TUNE_SETTABLE_MODEL_KEYS, ClassifierConfig, ClassifierTrainConfig, check_task_configs
from attnkit.data.batching import Batches, Truncation, bucketed_batches, pad, real_positions
from attnkit.data.prepared import PreparedCorpus
from attnkit.data.readers.labeled import Example
from attnkit.data.sequences import sequence_lengths
from attnkit.errors import InputError, check_records
from attnkit.evaluation.metrics import accuracy, macro_f1
from attnkit.model.build import build_classifier
from attnkit.model.classifier import TransformerClassifier
from attnkit.tasks.classify.data import (
    check_labels,
    conflicting_labels,
    encode_examples,
    hold_out_tenth,
    lookalike_labels,
    prepared_examples,
    repeated_in_train,
    resolve_classes,
)
from attnkit.tasks.classify.predict import predict_ids, predicted_class_ids, predicted_classes
from attnkit.tasks.classify.pretrained import Pretrained, fine_tuning_train_config, with_fresh_head
from attnkit.tokenization import Tokenizer, train_tokenizer
from attnkit.training.events import Event, Prepared, Warned, warn_only
from attnkit.training.loop import fit
from attnkit.training.losses import classification_loss
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
class TrainSummary:
    run_dir: Path
    best_epoch: float
    best_valid_accuracy: float | None  # None: nothing validated (a prepared corpus without a valid split)
    epochs_run: float
    steps: int
    seconds: float
    truncation: Truncation
    valid_source: str  # "file", "held out from train" or the training set itself
    stopped_by: str


@dataclass
class ClassificationTask:
    """The loop's view of a classifier run (``attnkit.training.loop.Task``). The training texts and labels are lists
    and arrays in memory, or a prepared corpus's memory maps read a batch at a time; no validation set (a prepared
    corpus without a valid split): the last weights are the model."""

    train_ids: Sequence[list[int]]
    train_y: np.ndarray  # (N,) int64 label ids (memory-mapped from a prepared corpus)
    valid_ids: list[list[int]]
    valid_y: list[int]
    pad_id: int
    cfg: ClassifierTrainConfig
    d_model: int
    fingerprint: str
    metric: str = "accuracy"
    higher_is_better: bool = True
    unit: str = "sentences"
    stats: tuple[str, ...] = ("accuracy",)

    def epoch_batches(self, generator: torch.Generator | None) -> Batches:
        lengths = sequence_lengths(self.train_ids)  # (N,)
        return bucketed_batches(lengths, self.cfg.batch_size, generator, self.cfg.bucket_factor)

    def collate(self, indices: list[int]) -> Batch:
        seqs = [self.train_ids[i] for i in indices]
        ids = pad(seqs, self.pad_id)  # (B, S)
        y = torch.from_numpy(np.asarray(self.train_y[indices], dtype=np.int64))  # (B,)
        rows = real_positions([len(s) for s in seqs], ids.size(1))  # (N,) the real tokens, known here
        return Batch((ids, y, rows), len(indices))

    def loss(self, model: nn.Module, batch: Batch) -> BatchLoss:
        ids, y, rows = batch.tensors
        logits = model(ids, rows=rows)  # (B, C)
        correct = (predicted_class_ids(logits.detach()) == y).sum()  # on the device, read with the step's loss
        # The mean over the batch's sentences, as before the one loop (bitwise: one batch a step is weighted by 1.0).
        return BatchLoss(
            classification_loss(logits.float(), y, self.cfg.label_smoothing), mean=True, sums={"accuracy": correct}
        )

    def evaluate(self, model: nn.Module, device: torch.device) -> dict[str, float] | None:
        assert isinstance(model, TransformerClassifier)
        if not self.valid_ids:
            return None
        logits = predict_ids(model, self.valid_ids, self.pad_id)  # (N, C)
        predicted = predicted_classes(logits)
        loss = classification_loss(logits, torch.tensor(self.valid_y)).item()  # no smoothing: the plain NLL
        return {
            "accuracy": accuracy(predicted, self.valid_y),
            "macro_f1": macro_f1(predicted, self.valid_y),
            "loss": loss,
        }


@holds_run_lock
def train_classifier(
    train: list[Example] | PreparedCorpus,
    valid: list[Example] | None = None,
    *,
    model_cfg: ClassifierConfig | None = None,
    train_cfg: ClassifierTrainConfig | None = None,
    out_dir: str | Path,
    resume: bool = False,
    pretrained: Pretrained | None = None,
    on_event: Callable[[Event], None] = warn_only,
    context: TrainContext | None = None,
    train_file: str = "train",
    valid_file: str = "valid",
) -> TrainSummary:
    """Train on ``train``, select on ``valid`` (10% of ``train`` held out when None), write the run to ``out_dir``.
    ``train_file`` and ``valid_file`` name where the examples were read from, in errors beside their lines.
    ``model_cfg`` and ``train_cfg`` default to the task's, as ``classify train`` builds them with no ``--config``
    (with ``pretrained``, ``train_cfg`` to fine-tuning's, as ``--init-from`` has it: ``FINE_TUNE_TRAIN_DEFAULTS``).

    ``train`` may be a prepared corpus (``data.prepared.open_prepared``; ``valid`` is then None): its tokenizer and
    labels are the run's, its train split is read from the memory maps a batch at a time, and its valid split (if
    any; none is held out) selects the best epoch.

    With ``pretrained`` (``attnkit.load_pretrained`` of a BERT folder, "minilm" or a pretrain run), the encoder and
    its tokenizer are the pretrained ones and only the head starts fresh; ``model_cfg`` then contributes
    ``n_classes``, ``pooling`` and ``dropout``.

    With ``resume``, ``out_dir`` is a run killed part-way, or one to train further: its config, tokenizer and
    training state are loaded and training continues from the saved step exactly as if it had never stopped. The
    run's configs rule; what ``model_cfg`` and ``train_cfg`` set must agree with them, except a larger budget
    (``epochs``, ``max_steps``, ``max_minutes``), which the run continues under (``run_setup.saved_configs``).

    ``context`` says where to train (``attnkit.TrainContext(device="cuda")``: the device, default the CPU, and the
    process's rank in a data-parallel run; see ``fit``); the run directory it writes does not depend on it.
    ``on_event`` receives the progress events (``training.events``); by default a ``Warned`` one is a
    ``UserWarning`` and the rest are dropped.
    """
    prepared = train if isinstance(train, PreparedCorpus) else None
    if prepared is not None and valid is not None:
        raise ValueError("a prepared corpus brings its own valid split; pass valid=None")
    given = model_cfg, train_cfg  # a resumed run checks them against its saved ones
    train_cfg = fine_tuning_train_config(pretrained, train_cfg)
    model_cfg, train_cfg = check_task_configs("classify", model_cfg, train_cfg)
    if not isinstance(train, PreparedCorpus):  # checked before the run directory is made
        train = check_records(train, Example, "train", reader="attnkit.read_labeled", file=train_file)
        if valid is not None:
            valid = check_records(
                valid, Example, "valid", reader="attnkit.read_labeled", empty_ok=True, file=valid_file
            )
    context = context or TrainContext()
    check_where(context, train_cfg.precision)
    run = open_run(out_dir, resume, context, on_event, task="classify")
    if run.saved is not None:
        model_cfg, train_cfg = saved_configs(run, "classify", *given, context)
    torch.manual_seed(train_cfg.seed)

    valid_source, valid_is_train = "file", False
    if isinstance(train, list) and (note := conflicting_labels(train, train_file)):
        on_event(Warned(note))
    if prepared is None and not valid:
        valid_file = train_file  # the examples that validate are the training file's, with its line numbers
        assert isinstance(train, list)
        # Hold out 10% for model selection; below 100 examples that would be too few to mean anything, so the
        # training set itself is used (and said to be).
        if len(train) >= 100:
            train, valid = hold_out_tenth(train, train_cfg.seed)
            valid_source = "held out from train"
        else:
            # The training set itself selects the epoch. Early stopping on it would measure nothing (training data
            # cannot be overfitted away from), so every epoch runs; and batches of at most a quarter of the set give
            # an epoch 4 steps rather than 1, so that the default 20 epochs fit 20 sentences (100% training accuracy).
            quarter = -(-len(train) // 4)
            train_cfg = dataclasses.replace(train_cfg, patience=0, batch_size=min(train_cfg.batch_size, quarter))
            valid, valid_is_train = list(train), True
            valid_source = (
                f"the training set: under 100 examples, none held out, no early stopping, batches of "
                f"{train_cfg.batch_size}"
            )

    initial = None
    labels: list[str]
    if prepared is not None:
        labels = list(prepared.labels or [])
    else:
        assert isinstance(train, list)
        labels = sorted({ex.label for ex in train})
        if note := lookalike_labels(labels):
            on_event(Warned(note))
    if run.saved is not None:
        saved_labels = runs.read_labels(run.path / runs.LABELS)
        if prepared is not None and saved_labels != labels:
            raise InputError(f"{prepared.directory}: labels {labels} differ from the run's {saved_labels}")
        labels = saved_labels
        tokenizer = Tokenizer.load(run.path / runs.TOKENIZER, run.saved["tokenizer"])
        if pretrained is not None and not (run.path / STATE).is_file():
            # Killed before its first save: it starts again from the pretrained encoder, with the same fresh head
            # (drawn after the same seeding), as the translator's --init-from does.
            initial, _ = with_fresh_head(pretrained, n_classes=model_cfg.n_classes, pooling=model_cfg.pooling)
    elif pretrained is not None:
        check_fixed_by_weights("classify", given, pretrained.config, FINE_TUNE_SETTABLE_MODEL_KEYS, "pretrained")
        n_classes = resolve_classes(model_cfg, labels, train_file).n_classes
        initial, bert_cfg = with_fresh_head(pretrained, n_classes=n_classes, pooling=model_cfg.pooling)
        tokenizer = pretrained.tokenizer
        model_cfg = dataclasses.replace(bert_cfg, dropout=model_cfg.dropout)
    elif prepared is not None:
        model_cfg = resolve_classes(model_cfg, labels, str(prepared.directory))
        tokenizer = prepared.tokenizer  # the corpus's ids are this vocabulary's
        model_cfg = dataclasses.replace(model_cfg, vocab_size=tokenizer.vocab_size)
    else:
        assert isinstance(train, list)
        model_cfg = resolve_classes(model_cfg, labels, train_file)
        tokenizer = train_tokenizer(
            (ex.text for ex in train),
            kind=train_cfg.tokenizer,
            vocab_size=model_cfg.vocab_size,
            min_freq=train_cfg.min_freq,
            add_cls=model_cfg.pooling == "cls",
            pretokenize=train_cfg.pretokenize,
        )
        model_cfg = dataclasses.replace(model_cfg, vocab_size=tokenizer.vocab_size)

    train_ids: Sequence[list[int]]
    if prepared is not None:
        if prepared.tokenizer.fingerprint() != tokenizer.fingerprint():
            owner = f"the run in {run.path}" if run.saved is not None else "the pretrained encoder"
            raise InputError(
                f"{prepared.directory}: prepared with another tokenizer (fingerprint "
                f"{prepared.tokenizer.fingerprint()[:12]}) than {owner} ({tokenizer.fingerprint()[:12]}); "
                "prepare the corpus with that tokenizer (--tokenizer)"
            )
        prepared.check("classify", model_cfg.max_len)
        if model_cfg.pooling == "cls" and tokenizer.cls_id is None:
            raise InputError(
                f"{prepared.directory}: pooling=cls reads a first <cls> token, which this corpus's texts do not "
                "have; prepare it with --pooling cls, or train with --set pooling=mean"
            )
        train_ids, train_y, valid_ids, valid_y, truncation = prepared_examples(prepared)
        fingerprint = prepared.fingerprint("train", "valid")
        valid_source = "the prepared valid split" if valid_ids else "none"
        n_train, n_valid = len(train_ids), len(valid_ids)
    else:
        assert isinstance(train, list) and valid is not None
        label_id = {label: i for i, label in enumerate(labels)}
        files = ((train, train_file), (valid, valid_file))
        check_labels(files, labels)  # every label, before any text is tokenised
        if not valid_is_train and (note := repeated_in_train(train, valid, valid_file)):
            on_event(Warned(note))
        (train_ids, truncation), (valid_ids, _) = (
            encode_examples(
                tokenizer,
                [ex.text for ex in examples],
                model_cfg.max_len,
                train_cfg.max_len_policy,
                [ex.line for ex in examples],
                where,
            )
            for examples, where in files
        )
        train_y = np.array([label_id[ex.label] for ex in train], dtype=np.int64)
        valid_y = [label_id[ex.label] for ex in valid]
        texts = [ex.text for ex in train]
        fingerprint = fingerprint_texts(texts, [ex.label for ex in train], [ex.text for ex in valid])
        n_train, n_valid = len(train), len(valid)
    vocab_size, n_truncated = tokenizer.vocab_size, truncation.n_truncated
    on_event(Prepared(n_train, n_valid, valid_source, vocab_size, n_truncated, model_cfg.max_len, labels))

    check_memory(model_cfg, context.device)
    model = build_classifier(model_cfg, pad_id=tokenizer.pad_id)
    if initial is not None:
        model.load_state_dict(initial.state_dict())  # the same weights, in a model built with this run's dropout
    model.to(context.device)  # before the optimizer is made: its state lives beside the parameters
    optimizer = make_optimizer(model, train_cfg, layer_lr_decay=train_cfg.layer_lr_decay)
    extra = {"init_from": pretrained.source} if pretrained is not None else {}
    write_run_files(
        run, "classify", model_cfg, train_cfg, tokenizer, files={runs.LABELS: labels}, context=context, **extra
    )
    task = ClassificationTask(
        train_ids, train_y, valid_ids, valid_y, tokenizer.pad_id, train_cfg, model_cfg.d_model, fingerprint
    )
    result = fit(model, optimizer, task, train_cfg, run.path, resume=run.resume, on_event=on_event, context=context)
    return TrainSummary(
        run.path,
        result.best_epoch,
        result.best.get("accuracy"),
        result.epochs,
        result.steps,
        result.seconds,
        truncation,
        valid_source,
        result.stopped_by,
    )
