"""A trained classifier, loaded from its run directory: predict labels with probabilities, evaluate on a file."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from attnkit.config import ClassifierConfig
from attnkit.data.batching import bucketed_batches, pad
from attnkit.data.readers.labeled import Example
from attnkit.devices import check_device, model_device
from attnkit.errors import InputError, check_records, check_texts
from attnkit.evaluation.metrics import accuracy, macro_f1
from attnkit.inference import prepare_for_inference
from attnkit.model.classifier import TransformerClassifier
from attnkit.runs import load_run
from attnkit.tasks.classify.data import encode_examples
from attnkit.training.losses import class_probabilities
from attnkit.training.precision import autocast, check_precision

log = logging.getLogger(__name__)


@torch.no_grad()
def predict_ids(model: TransformerClassifier, seqs: list[list[int]], pad_id: int, batch_size: int = 64) -> torch.Tensor:
    """Logits (N, C) on the CPU for already-encoded sequences, in input order, computed on the model's device;
    batches are length-sorted to save padding."""
    if model.training:  # eval() walks every module: a noticeable share of a small batch (the server calls this a lot)
        model.eval()
    device = model_device(model)
    batches = bucketed_batches([len(s) for s in seqs], batch_size, generator=None, bucket_factor=10**9)
    out = torch.empty(len(seqs), model.head.out_features)
    for batch in batches:
        out[batch] = model(pad([seqs[i] for i in batch], pad_id).to(device)).float().cpu()  # (B, C)
    return out


def predicted_classes(logits: torch.Tensor) -> list[int]:
    """(B, C) logits -> the B predicted class ids, on the host."""
    return predicted_class_ids(logits).tolist()


def predicted_class_ids(logits: torch.Tensor) -> torch.Tensor:
    """(B, C) logits -> (B,) predicted class ids where the logits are; a single logit is class 1 when positive."""
    if logits.size(-1) == 1:
        return (logits.squeeze(-1) > 0).long()  # (B,)
    return logits.argmax(dim=-1)  # (B,)


@dataclass
class Prediction:
    """One classified text: its label (the most probable class), every label's probability, and how many of its
    tokens the vocabulary lacks."""

    text: str
    label: str
    probs: dict[str, float]
    unknown: int = 0  # tokens of ``text`` outside the vocabulary, which the model read as <unk>


class ClassifierRun:
    """Model, tokenizer and labels of one run directory."""

    def __init__(self, run_dir: str | Path, precision: str = "fp32", device: torch.device | str = "cpu"):
        """The run's model on ``device``. ``precision="bf16"``: classify under bfloat16 autocast (GPUs, CPUs with
        AMX / AVX512-BF16); ``"fp16"``: float16 autocast (CUDA only)."""
        self.device = check_device(device)
        check_precision(precision, self.device, what="precision")
        self.precision = precision
        loaded = load_run(run_dir, task="classify", device=self.device)
        self.max_len_policy = loaded.max_len_policy
        self.tokenizer = loaded.tokenizer
        self.labels: list[str] = loaded.labels or []
        if not isinstance(loaded.model, TransformerClassifier) or not isinstance(loaded.model_cfg, ClassifierConfig):
            raise TypeError(f"load_run(task='classify') returned a {type(loaded.model).__name__}")
        self.model_cfg: ClassifierConfig = loaded.model_cfg
        self.model: TransformerClassifier = prepare_for_inference(loaded.model)
        self.run_dir = loaded.run_dir

    def _ids(self, texts: list[str]) -> list[list[int]]:
        """The ids the model reads; texts longer than ``max_len`` are cut and logged, or refused, as the run says."""
        seqs, cut = encode_examples(self.tokenizer, texts, self.model_cfg.max_len, self.max_len_policy)
        if cut.n_truncated:  # the model read only their start: never silently (embed logs the same)
            log.warning("%d of %d texts truncated to %d tokens", cut.n_truncated, cut.n_total, cut.limit)
        return seqs

    def _logits(self, seqs: list[list[int]]) -> torch.Tensor:
        with autocast(self.precision, self.device):
            return predict_ids(self.model, seqs, self.tokenizer.pad_id)

    def logits(self, texts: list[str]) -> torch.Tensor:
        """The classifier's logits of ``texts``: (N, C), a row of C class scores per text, in input order (a binary
        classifier trained with ``n_classes=1`` has one column, the positive class's logit)."""
        return self._logits(self._ids(check_texts(texts)))

    def predict(self, texts: list[str]) -> list[Prediction]:
        """A ``Prediction`` per text, in input order: the most probable label, every label's probability (they sum
        to 1) and how many of its tokens the vocabulary lacks."""
        texts = check_texts(texts)
        seqs = self._ids(texts)
        probs = class_probabilities(self._logits(seqs))  # (N, C)
        out = []
        for text, ids, row in zip(texts, seqs, probs.tolist()):
            best = max(range(len(row)), key=row.__getitem__)
            unknown = ids.count(self.tokenizer.unk_id)  # of the tokens the model read
            out.append(Prediction(text, self.labels[best], {label: p for label, p in zip(self.labels, row)}, unknown))
        return out

    def evaluate(self, examples: list[Example], source: str = "data") -> dict:
        """``{"accuracy", "macro_f1", "n"}`` on labelled ``examples``; a label unseen in training is an error."""
        examples = check_records(examples, Example, "examples", reader="attnkit.read_labeled")
        label_id = {label: i for i, label in enumerate(self.labels)}
        for ex in examples:
            if ex.label not in label_id:
                raise InputError(
                    f"{source}:{ex.line}: label {ex.label!r} was not seen in training (known: {', '.join(self.labels)})"
                )
        gold = [label_id[ex.label] for ex in examples]
        pred = predicted_classes(self.logits([ex.text for ex in examples]))
        return {
            "accuracy": accuracy(pred, gold),
            "macro_f1": macro_f1(pred, gold),
            "n": len(examples),
        }
