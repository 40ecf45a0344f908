"""A BERT folder loaded as an attnkit classifier (config, weights, tokenizer), and sentence embeddings from one."""

from __future__ import annotations

import functools
from collections.abc import Iterable
from pathlib import Path

import torch
from torch import Tensor

from attnkit import runs
from attnkit.config import ClassifierConfig
from attnkit.devices import check_device
from attnkit.errors import InputError, check_texts
from attnkit.interop.bert.config import bert_config
from attnkit.interop.bert.tokenizer import load_bert_tokenizer
from attnkit.interop.bert.weights import bert_state_dict_to_attnkit, load_encoder_weights, read_bert_weights
from attnkit.model.build import build_classifier
from attnkit.model.classifier import TransformerClassifier
from attnkit.tasks.classify import ClassifierRun, Pretrained
from attnkit.tasks.embed import sentence_embeddings
from attnkit.tasks.pretrain import load_pretrained_run
from attnkit.tokenization.tokenizer import Tokenizer


def resolve_bert_folder(spec: str | Path) -> Path:
    """A BERT folder from ``spec``: the word ``minilm`` (the cached recipe, fetched on first use) or a directory."""
    if str(spec) == "minilm":
        from attnkit.data.recipes import fetch

        return fetch("minilm")
    folder = Path(spec)
    if not folder.is_dir():
        raise InputError(f"{folder}: no such directory (expected a BERT folder or 'minilm')")
    return folder


def load_bert_classifier(
    folder: str | Path, *, n_classes: int, pooling: str = "mean"
) -> tuple[TransformerClassifier, ClassifierConfig, Tokenizer]:
    """attnkit's classifier with the folder's pretrained encoder, a freshly initialised head, and its tokenizer."""
    folder = Path(folder)
    cfg = bert_config(folder, n_classes=n_classes, pooling=pooling)
    tokenizer = load_bert_tokenizer(folder)
    if tokenizer.vocab_size > cfg.vocab_size:
        raise InputError(
            f"{folder}: the tokenizer has {tokenizer.vocab_size} tokens but config.json vocab_size is {cfg.vocab_size}"
        )
    state = bert_state_dict_to_attnkit(read_bert_weights(folder), cfg.n_layers, source=str(folder))
    model = build_classifier(cfg, pad_id=tokenizer.pad_id)
    load_encoder_weights(model, state, source=str(folder))
    return model, cfg, tokenizer


def load_pretrained(spec: str | Path, *, pooling: str = "mean") -> Pretrained:
    """The encoder to fine-tune from ``spec`` (a BERT folder, "minilm", or an ``attnkit pretrain`` run directory),
    for ``train_classifier(pretrained=...)``; the one-logit head it comes with is replaced by the training's own."""
    folder = resolve_bert_folder(spec)
    task = _run_task(folder)
    if task == "pretrain":
        return load_pretrained_run(folder, pooling=pooling, source=str(spec))
    if task is not None:
        raise InputError(
            f"{spec}: an attnkit {task} run; --init-from takes a BERT folder, minilm or an attnkit pretrain run (a "
            "classifier run continues with --resume and a larger budget)"
        )
    model, cfg, tokenizer = load_bert_classifier(folder, n_classes=1, pooling=pooling)
    return Pretrained(model, cfg, tokenizer, source=str(spec))


def _run_task(folder: Path) -> str | None:
    """The task of an attnkit run directory (its config.json names one); None for a Hugging Face folder."""
    config_path = folder / runs.CONFIG
    return runs.read_json(config_path).get("task") if config_path.is_file() else None


def embed(
    model_spec: str | Path,
    texts: Iterable[str],
    *,
    pool: str | None = None,
    normalize: bool = False,
    batch_size: int = 32,
    device: torch.device | str = "cpu",
) -> Tensor:
    """Sentence vectors (N, D), on the CPU, from a BERT folder, the word ``minilm``, or an attnkit classifier or
    pretraining run directory, computed on ``device``. ``pool`` (``sentence_embeddings``): by default a classifier
    run's own pooling, else "mean" (sentence-transformers' for MiniLM)."""
    texts = check_texts(texts)
    device = check_device(device)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise InputError(f"batch_size={batch_size!r}: must be an integer >= 1")
    pooled = functools.partial(sentence_embeddings, normalize=normalize, batch_size=batch_size)
    folder = resolve_bert_folder(model_spec)
    task = _run_task(folder)
    if task == "pretrain":
        pretrained = load_pretrained_run(folder)
        pretrained.model.to(device)
        return sentence_embeddings(
            pretrained.model,
            pretrained.tokenizer,
            texts,
            pool=pool or "mean",
            normalize=normalize,
            batch_size=batch_size,
        )
    if task is not None:
        run = ClassifierRun(folder, device=device)
        return pooled(
            run.model, run.tokenizer, texts, pool=pool or run.model_cfg.pooling, max_len_policy=run.max_len_policy
        )
    model, _, tokenizer = load_bert_classifier(folder, n_classes=1)
    model.to(device)
    return pooled(model, tokenizer, texts, pool=pool or "mean")
