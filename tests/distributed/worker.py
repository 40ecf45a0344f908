"""A data-parallel training worker for the tests of this folder: ``torchrun --nproc-per-node N worker.py OUT ACCUM``
(or plain ``python worker.py OUT ACCUM`` for one process).

It trains a tiny classifier and a tiny translator (dropout 0.1), each with plain SGD and with Adam, for ten steps
through the one training loop (``fit``), on synthetic data, and writes per rank ``OUT/rank{R}.safetensors`` with, for
each (task, optimizer), the parameters after the last step and the summed gradients of step 1, and on rank 0
``OUT/losses.json`` with the loss of every step. Not a test module (pytest collects ``test_*.py`` only).
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_file

from attnkit.config import ClassifierConfig, ClassifierTrainConfig, TranslatorConfig, TranslatorTrainConfig
from attnkit.data.readers.parallel import Pair
from attnkit.model.build import build_classifier, build_translator
from attnkit.tasks.classify.train import ClassificationTask
from attnkit.tasks.translate.data import encode_pairs
from attnkit.tasks.translate.train import TranslationTask
from attnkit.tokenization import train_tokenizer
from attnkit.training.distributed import context_from_environment, end_process_group
from attnkit.training.events import Step
from attnkit.training.loop import fit

STEPS = 10
TINY: dict[str, Any] = {"d_model": 16, "n_heads": 2, "d_ff": 32, "n_layers": 1, "dropout": 0.1}
TRAIN: dict[str, Any] = {
    "max_steps": STEPS,
    "clip_norm": 0.0,
    "schedule": "constant",
    "lr": 1e-2,
    "checkpoint_every": 1000,
}


def classification_task(accum: int) -> tuple[torch.nn.Module, ClassificationTask]:
    rng = random.Random(0)
    ids = [[rng.randrange(3, 50) for _ in range(rng.randint(2, 14))] for _ in range(200)]  # lengths differ
    labels = [int(sum(s) % 3) for s in ids]
    cfg = ClassifierTrainConfig(**TRAIN, accum_steps=accum, batch_size=8)
    model = build_classifier(ClassifierConfig(vocab_size=50, n_classes=3, **TINY), pad_id=0)
    task = ClassificationTask(ids, np.array(labels), ids[:20], labels[:20], 0, cfg, 16, "synthetic")
    return model, task


def translation_task(accum: int) -> tuple[torch.nn.Module, TranslationTask]:
    rng = random.Random(1)
    letters = "a b c d e f g h i j k l".split()
    pairs = []
    for line in range(1, 301):
        words = [rng.choice(letters) for _ in range(rng.randint(2, 10))]
        pairs.append(Pair(" ".join(words), " ".join(reversed(words)), line))
    tokenizer = train_tokenizer(
        (t for p in pairs for t in (p.source, p.target)), kind="word", vocab_size=40, min_freq=1
    )
    cfg = TranslatorTrainConfig(**TRAIN, accum_steps=accum, max_tokens=120, valid_bleu=False)
    model = build_translator(TranslatorConfig(vocab_size=tokenizer.vocab_size, **TINY), pad_id=tokenizer.pad_id)
    data = encode_pairs(tokenizer, pairs, 64, "truncate")
    return model, TranslationTask(data, None, [], tokenizer, cfg, 16, "synthetic", 64)


def main(out: Path, accum: int) -> None:
    context = context_from_environment(torch.device("cpu"))
    tensors, losses = {}, {}
    for task_name, make in (("classify", classification_task), ("translate", translation_task)):
        for optimizer_name in ("sgd", "adam"):
            torch.manual_seed(0)
            model, task = make(accum)
            if optimizer_name == "sgd":
                optimizer: torch.optim.Optimizer = torch.optim.SGD(model.parameters(), lr=task.cfg.lr)
            else:
                optimizer = torch.optim.Adam(model.parameters(), lr=task.cfg.lr, betas=(0.9, 0.98), eps=1e-9)
            key = f"{task_name}.{optimizer_name}"
            curve: list[float] = []

            def on_event(event: object, key: str = key, model: torch.nn.Module = model, curve: list = curve) -> None:
                if isinstance(event, Step):
                    curve.append(event.loss)
                    if event.step == 1:  # the gradients stay on the parameters until the next step zeroes them
                        for name, p in model.named_parameters():
                            tensors[f"{key}.grad.{name}"] = p.grad.detach().clone()

            run_dir = out / key
            run_dir.mkdir(parents=True, exist_ok=True)
            fit(model, optimizer, task, task.cfg, run_dir, on_event=on_event, context=context)
            tensors.update({f"{key}.param.{name}": p.detach().clone() for name, p in model.named_parameters()})
            losses[key] = curve
    save_file(tensors, str(out / f"rank{context.rank}.safetensors"))
    if context.is_main:
        (out / "losses.json").write_text(json.dumps(losses))
    end_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
