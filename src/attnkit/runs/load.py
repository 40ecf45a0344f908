"""Loading a run directory for inference: the one place that dispatches on the run's task.

A run's ``config.json`` names its task; each task has its config class and builder. ``read_run`` checks the files
against the manifest and the format, the config's values, the tokenizer and the labels, and that the weights file
holds the model the config describes, all before anything is built: a run directory from anywhere (a server's
``--model``) cannot make attnkit allocate more than the weights it ships. ``load_run`` then builds the model and
loads its weights.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from torch import nn

from attnkit.config import ClassifierConfig, MaskedLMConfig, TransformerConfig, TranslatorConfig
from attnkit.devices import check_device
from attnkit.errors import InputError
from attnkit.model.build import build_classifier, build_masked_lm, build_translator
from attnkit.model.size import model_size
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
class RunFiles:
    """A run directory's files, read and checked, before any model is built: its files match the manifest, its
    config is valid, its tokenizer is the one it was trained with, and its weights file holds the model its config
    describes (so building that model allocates what the file holds, no more)."""

    run_dir: Path
    task: str  # "classify", "translate" or "pretrain"
    config: dict  # config.json as written
    model_cfg: ClassifierConfig | TranslatorConfig | MaskedLMConfig
    tokenizer: Tokenizer
    labels: list[str] | None  # label names in id order (classifier), else None
    max_len_policy: str  # how the run treated over-long inputs in training: "truncate" or "error"


@dataclass
class LoadedRun(RunFiles):
    """Everything a run directory holds, loaded: the model has its weights and is in eval mode."""

    model: nn.Module


def read_run(run_dir: str | Path, task: str | None = None) -> RunFiles:
    """The run at ``run_dir``, checked; with ``task``, a run of another task is an InputError saying what it is."""
    run_dir = check_run_dir(run_dir)
    config_path = run_dir / CONFIG
    config = read_json(config_path)
    check_format(config, config_path)
    run_task = config.get("task")
    if task is not None and task not in TASKS:
        raise InputError(f"task={task!r}; expected one of {', '.join(TASKS)} (or None: the run's own)")
    if task is not None and run_task != task:
        raise InputError(f"{run_dir}: is a {run_task!r} run, not {TASKS[task][2]}")
    if run_task not in TASKS:
        raise InputError(f"{config_path}: unknown task {run_task!r}; expected {' or '.join(TASKS)}")
    config_cls = TASKS[run_task][0]
    try:
        model_cfg = config_cls(**config["model"])
        max_len_policy = config["train"]["max_len_policy"]
        tokenizer_meta = config["tokenizer"]
    except (KeyError, TypeError) as err:
        raise InputError(f"{config_path}: missing or unknown key ({err})") from None
    except InputError as err:  # an impossible value (a NaN, a size past its ceiling)
        raise InputError(f"{config_path}: {err}") from None
    check_weights_size(run_dir / WEIGHTS, model_cfg, config_path)
    tokenizer = Tokenizer.load(run_dir / TOKENIZER, tokenizer_meta)
    labels = None
    if run_task == "classify":
        assert isinstance(model_cfg, ClassifierConfig)
        labels = read_labels(run_dir / LABELS)
        check_labels(labels, model_cfg.n_classes, run_dir / LABELS)
    return RunFiles(run_dir, run_task, config, model_cfg, tokenizer, labels, max_len_policy)


def load_run(run_dir: str | Path, task: str | None = None, device: torch.device | str = "cpu") -> LoadedRun:
    """The run at ``run_dir``, its model on ``device`` (the weights are read straight onto it); with ``task``, a run
    of another task is an InputError saying what it is, and so is a device this machine does not have."""
    device = check_device(device)
    files = read_run(run_dir, task)
    build = TASKS[files.task][1]
    model = build(files.model_cfg, pad_id=files.tokenizer.pad_id).to(device)
    load_weights(model, files.run_dir / WEIGHTS)  # onto the model's device
    model.eval()  # inference code swaps in its fused modules itself (attnkit.inference.prepare_for_inference)
    return LoadedRun(**vars(files), model=model)


def check_weights_size(path: Path, model_cfg: TransformerConfig, config_path: Path) -> None:
    """The weights file at ``path`` holds as many numbers as the model ``model_cfg`` describes: read from the file's
    header alone (no tensor is read), before the model is built."""
    try:
        with safe_open(str(path), framework="pt") as f:
            held = sum(math.prod(f.get_slice(name).get_shape()) for name in f.keys())
    except (SafetensorError, OSError) as err:
        raise InputError(f"{path}: not a readable safetensors file ({err})") from None
    described = model_size(model_cfg).params
    if held != described:
        raise InputError(
            f"{config_path}: describes a model of {described:,} parameters, but {path.name} holds {held:,}; the "
            "config and the weights do not belong together"
        )


def check_labels(labels: list[str], n_classes: int, path: Path) -> None:
    """A classifier's label names: one per class (two for a single binary logit), each once."""
    expected = 2 if n_classes == 1 else n_classes
    if len(labels) != expected:
        raise InputError(f"{path}: {len(labels)} label names for a model of {expected} classes")
    repeated = sorted({label for label in labels if labels.count(label) > 1})
    if repeated:
        raise InputError(f"{path}: label names must differ; repeated: {', '.join(map(repr, repeated))}")
