"""A trained classifier, loaded from its run directory: predict labels with probabilities, evaluate on a file."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from attnkit.config import ClassifierConfig
from attnkit.data.readers import Example
from attnkit.errors import InputError
from attnkit.evaluation.metrics import accuracy, macro_f1
from attnkit.model.build import build_classifier, prepare_for_inference
from attnkit.tokenization import Tokenizer
from attnkit.training import checkpoint
from attnkit.training.classify import encode_examples, predict_ids, predicted_classes
from attnkit.training.losses import autocast, class_probabilities


@dataclass
class Prediction:
    text: str
    label: str
    probs: dict[str, float]


class ClassifierRun:
    """Model, tokenizer and labels of one run directory."""

    def __init__(self, run_dir: str | Path, precision: str = "fp32"):
        """``precision="bf16"``: classify under bfloat16 autocast (faster on CPUs with AMX / AVX512-BF16)."""
        if precision not in ("fp32", "bf16"):
            raise InputError(f"precision {precision!r}; expected fp32 or bf16")
        self.precision = precision
        run_dir = checkpoint.check_run_dir(run_dir)
        config = checkpoint.read_json(run_dir / checkpoint.CONFIG)
        if config.get("task") != "classify":
            raise InputError(f"{run_dir}: is a {config.get('task')!r} run, not a classifier")
        try:
            self.model_cfg = ClassifierConfig(**config["model"])
            self.max_len_policy = config["train"]["max_len_policy"]
            tokenizer_meta = config["tokenizer"]
        except (KeyError, TypeError) as err:
            raise InputError(f"{run_dir / checkpoint.CONFIG}: missing or unknown key ({err})") from None
        self.tokenizer = Tokenizer.load(run_dir / checkpoint.TOKENIZER, tokenizer_meta)
        self.labels: list[str] = checkpoint.read_json(run_dir / checkpoint.LABELS)
        self.model = build_classifier(self.model_cfg, pad_id=self.tokenizer.pad_id)
        checkpoint.load_weights(self.model, run_dir / checkpoint.WEIGHTS)
        prepare_for_inference(self.model)  # eval mode, W^Q W^K W^V fused once the weights are loaded
        self.run_dir = run_dir

    def logits(self, texts: list[str]) -> torch.Tensor:
        seqs, _ = encode_examples(self.tokenizer, texts, self.model_cfg.max_len, self.max_len_policy)
        with autocast(self.precision):
            return predict_ids(self.model, seqs, self.tokenizer.pad_id)

    def predict(self, texts: list[str]) -> list[Prediction]:
        for i, text in enumerate(texts, start=1):
            if not text.strip():
                raise InputError(f"input text #{i} is empty")
        probs = class_probabilities(self.logits(texts))  # (N, C)
        out = []
        for text, row in zip(texts, probs.tolist()):
            best = max(range(len(row)), key=row.__getitem__)
            out.append(Prediction(text, self.labels[best], {label: p for label, p in zip(self.labels, row)}))
        return out

    def evaluate(self, examples: list[Example], source: str = "data") -> dict:
        """Accuracy, macro-F1 and counts on labelled ``examples``; a label unseen in training is an error."""
        label_id = {label: i for i, label in enumerate(self.labels)}
        for ex in examples:
            if ex.label not in label_id:
                raise InputError(f"{source}:{ex.line}: label {ex.label!r} was not seen in training (known: {', '.join(self.labels)})")
        gold = [label_id[ex.label] for ex in examples]
        pred = predicted_classes(self.logits([ex.text for ex in examples]))
        return {"accuracy": accuracy(pred, gold), "macro_f1": macro_f1(pred, gold, len(self.labels)), "n": len(examples)}
