"""A pretraining run's encoder as the starting point of a classifier (``classify train --init-from RUN``): the same
embeddings and encoder tensors, by name, in a ``TransformerClassifier`` whose head the fine-tuning replaces; the
masked-LM head is left behind, as BERT leaves its own (Devlin et al. 2019, §3.2)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from attnkit import runs
from attnkit.config import ClassifierConfig, MaskedLMConfig
from attnkit.model.build import build_classifier
from attnkit.tasks.classify import Pretrained


def classifier_config(cfg: MaskedLMConfig, *, n_classes: int = 1, pooling: str = "mean") -> ClassifierConfig:
    """The classifier config with ``cfg``'s encoder (every shared key equal) and the given head."""
    shared = {
        f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.name in ClassifierConfig.__dataclass_fields__
    }
    return ClassifierConfig(**shared, n_classes=n_classes, pooling=pooling)


def load_pretrained_run(run_dir: str | Path, *, pooling: str = "mean", source: str | None = None) -> Pretrained:
    """The encoder of the pretraining run at ``run_dir`` (checked against its manifest), under a placeholder
    one-logit head, with the run's tokenizer; ``source`` (default the path) is recorded as the run's init_from."""
    run = runs.load_run(run_dir, task="pretrain")
    assert isinstance(run.model_cfg, MaskedLMConfig)
    cfg = classifier_config(run.model_cfg, pooling=pooling)
    model = build_classifier(cfg, pad_id=run.tokenizer.pad_id)
    encoder = {name: t for name, t in run.model.state_dict().items() if not name.startswith("head.")}
    result = model.load_state_dict(encoder, strict=False)
    assert not result.unexpected_keys and all(name.startswith("head.") for name in result.missing_keys), result
    return Pretrained(model, cfg, run.tokenizer, source=str(source if source is not None else run_dir))
