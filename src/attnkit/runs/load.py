"""Loading a run directory for inference: the one place that dispatches on the run's task.

A run's ``config.json`` names its task; each task has its config class and builder. ``load_run`` checks the files
against the manifest and the format, builds the model the config describes and loads its weights.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from attnkit.config import ClassifierConfig, MaskedLMConfig, TranslatorConfig
from attnkit.errors import InputError
from attnkit.model.build import build_classifier, build_masked_lm, build_translator
from attnkit.runs.files import (
    CONFIG,
    LABELS,
    TOKENIZER,
    WEIGHTS,
    check_format,
    check_run_dir,
    load_weights,
    read_json,
    read_labels,
)
from attnkit.tokenization import Tokenizer

# task -> (config class, builder, what a run of it is called in errors)
TASKS: dict[str, tuple[type[ClassifierConfig | TranslatorConfig | MaskedLMConfig], Callable[..., nn.Module], str]] = {
    "classify": (ClassifierConfig, build_classifier, "a classifier"),
    "translate": (TranslatorConfig, build_translator, "a translator"),
    "pretrain": (MaskedLMConfig, build_masked_lm, "a pretrained encoder (masked LM)"),
}


@dataclass
class LoadedRun:
    """Everything a run directory holds, loaded: the model has its weights and is in eval mode."""

    run_dir: Path
    task: str  # "classify", "translate" or "pretrain"
    config: dict  # config.json as written
    model_cfg: ClassifierConfig | TranslatorConfig | MaskedLMConfig
    model: nn.Module
    tokenizer: Tokenizer
    labels: list[str] | None  # label names in id order (classifier), else None
    max_len_policy: str  # how the run treated over-long inputs in training: "truncate" or "error"


def load_run(run_dir: str | Path, task: str | None = None, device: torch.device | str = "cpu") -> LoadedRun:
    """The run at ``run_dir``, its model on ``device`` (the weights are read straight onto it); with ``task``, a run
    of another task is an InputError saying what it is."""
    run_dir = check_run_dir(run_dir)
    config_path = run_dir / CONFIG
    config = read_json(config_path)
    check_format(config, config_path)
    run_task = config.get("task")
    if task is not None and run_task != task:
        raise InputError(f"{run_dir}: is a {run_task!r} run, not {TASKS[task][2]}")
    if run_task not in TASKS:
        raise InputError(f"{config_path}: unknown task {run_task!r}; expected {' or '.join(TASKS)}")
    config_cls, build, _ = TASKS[run_task]
    try:
        model_cfg = config_cls(**config["model"])
        max_len_policy = config["train"]["max_len_policy"]
        tokenizer_meta = config["tokenizer"]
    except (KeyError, TypeError) as err:
        raise InputError(f"{config_path}: missing or unknown key ({err})") from None
    tokenizer = Tokenizer.load(run_dir / TOKENIZER, tokenizer_meta)
    labels = read_labels(run_dir / LABELS) if run_task == "classify" else None
    model = build(model_cfg, pad_id=tokenizer.pad_id).to(device)
    load_weights(model, run_dir / WEIGHTS)  # onto the model's device
    model.eval()  # inference code swaps in its fused modules itself (attnkit.inference.prepare_for_inference)
    return LoadedRun(run_dir, run_task, config, model_cfg, model, tokenizer, labels, max_len_policy)
