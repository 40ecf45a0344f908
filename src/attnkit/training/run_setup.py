"""Opening a training run's directory, shared by every task: a fresh run, a resumed one, or a resumed one that was
killed before it saved anything (which simply starts), a resumed one given a larger budget; and whether the model
to train fits the device's memory.

In a data-parallel run, rank 0 alone prepares the directory, trains the tokenizer and writes the run's files; the
other ranks wait in ``open_run`` until ``write_run_files`` has written them, then read them as a resumed run reads
its own (so that every rank has the very same tokenizer, labels and configs).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

import torch

from attnkit import runs
from attnkit.config import (
    TASK_PRESETS,
    TASK_TRAIN_CONFIGS,
    TrainConfig,
    TransformerConfig,
    check_resume_settings,
    task_configs,
)
from attnkit.devices import available_memory, check_device
from attnkit.errors import InputError
from attnkit.model.size import model_size
from attnkit.tokenization import Tokenizer
from attnkit.training.distributed import main_done, wait_for_main
from attnkit.training.events import Event, Warned, warn_only
from attnkit.training.precision import check_precision
from attnkit.training.state import STATE
from attnkit.training.task import TrainContext

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class RunDir:
    path: Path
    saved: dict | None  # the run's config.json when resuming a run that wrote one; its configs then rule
    resume: bool


def open_run(
    out_dir: str | Path,
    resume: bool,
    context: TrainContext | None = None,
    on_event: Callable[[Event], None] = lambda event: None,
    task: str | None = None,
) -> RunDir:
    """The directory to train into. Resuming removes what atomic writes killed part-way left behind; a run killed
    before it wrote its config (or before it made its directory) has nothing to continue, so it starts from the
    beginning, as it would have. A new run over a trained one replaces it, and says so (``Warned``) first, naming
    the trained run's task when it is not ``task`` (a mistyped ``--out`` is the likelier story).

    On ranks other than 0: once rank 0 has written the run's files, the run as rank 0 wrote it (``saved`` set)."""
    out_dir = Path(out_dir)
    if context is not None and not context.is_main:
        wait_for_main(context)
        return RunDir(out_dir, runs.read_json(out_dir / runs.CONFIG), resume)
    if resume and out_dir.is_dir():
        runs.remove_temporary_files(out_dir)
        # A config alone (a run stopped before its first save) holds nothing to continue, and its settings do not
        # rule: the run starts again from the command's (a diverged first try is resumed with a lower lr).
        if (out_dir / runs.CONFIG).is_file() and (out_dir / STATE).is_file():
            path = runs.prepare_run_dir(out_dir, resume=True)
            return RunDir(path, runs.read_json(path / runs.CONFIG), True)
    if resume:
        on_event(Warned(f"{out_dir} holds no saved run to resume: training starts from the beginning"))
    if not resume and (out_dir / runs.CONFIG).is_file() and (out_dir / runs.WEIGHTS).is_file():
        try:
            saved = runs.read_json(out_dir / runs.CONFIG)
        except (InputError, OSError):
            saved = None
        other = saved.get("task") if isinstance(saved, dict) else None
        if task and other and other != task:
            on_event(Warned(f"{out_dir} holds a trained {other} run: this {task} run replaces it"))
        else:
            on_event(Warned(f"{out_dir} holds a trained run: this run replaces it (--resume continues it instead)"))
    path = runs.prepare_run_dir(out_dir, resume=False)
    (path / runs.LABELS).unlink(missing_ok=True)  # an earlier classifier's, over which a translator would train
    return RunDir(path, None, resume)


def saved_configs(
    run: RunDir,
    task: str,
    model_cfg: TransformerConfig | None,
    train_cfg: TrainConfig | None,
    context: TrainContext | None = None,
) -> tuple:
    """(model config, training config) of a run that has saved them (``run.saved``): they rule. When resuming, what
    a config passed explicitly (not None) sets, i.e. each key where it differs from the task's default, must equal
    the saved value (as ``--resume`` checks the ``--set`` keys), except for a larger budget (``BUDGET_KEYS``), which
    is written into the run, and the run continues under it: ``resume=True`` with a larger ``max_steps`` trains on,
    as ``--resume --max-steps N`` does. A key that differs otherwise is an ``InputError`` naming it and both values;
    so is a run of another task."""
    assert run.saved is not None
    saved = run.saved
    if saved.get("task") != task:
        raise InputError(
            f"{run.path}: holds a {saved.get('task')!r} run, not a {task!r} one; resume it with its own task, or "
            "train into another directory"
        )
    model_cls, train_cls = TASK_PRESETS[task][0], TASK_TRAIN_CONFIGS[task]
    if run.resume:
        requested = set_keys(task, model_cfg, train_cfg)
        grown = check_resume_settings(saved, requested, model_cls)
        if grown and (context is None or context.is_main):
            grow_budget(run.path, grown)
        if grown:
            saved = {**saved, "train": {**saved["train"], **grown}}
    return model_cls(**saved["model"]), train_cls(**saved["train"])


def set_keys(task: str, model_cfg: TransformerConfig | None, train_cfg: TrainConfig | None) -> dict[str, object]:
    """What configs passed explicitly set: each key of one that is not None where it differs from the task's
    default (the Python counterpart of the ``--set`` keys of a command)."""
    requested: dict[str, object] = {}
    for cfg, default in zip((model_cfg, train_cfg), task_configs(task, None, {})):
        if cfg is not None:
            defaults = dataclasses.asdict(default)
            requested |= {key: v for key, v in dataclasses.asdict(cfg).items() if v != defaults[key]}
    return requested


TOKENIZER_KEYS = ("tokenizer", "min_freq", "pretokenize")  # training keys that make the tokenizer


def check_fixed_by_weights(
    task: str,
    given: tuple[TransformerConfig | None, TrainConfig | None],
    weights_cfg: TransformerConfig,
    settable: tuple[str, ...],
    source: str,
    weights_train: dict | None = None,
) -> None:
    """Weights to start from (``source``: a pretrained encoder, a run to ``init_from``) fix the architecture and the
    tokenizer. Of what the configs passed set (``set_keys``), a model key other than ``settable`` must equal the
    weights' config (``weights_cfg``; ``vocab_size``, the tokenizer's most, may be larger than it reached), and a
    tokenizer key must equal the training config that made the tokenizer (``weights_train``, a run's config.json
    ``train``; with none known, it may not be set): else an ``InputError`` naming each such key, as ``--init-from``
    refuses ``--set d_model`` (it was dropped without a word)."""
    weights = {key: v for key, v in dataclasses.asdict(weights_cfg).items() if key not in settable}
    if weights_train is not None:
        weights |= {key: weights_train[key] for key in TOKENIZER_KEYS if key in weights_train}
    fixed = [
        f"{key}={value!r} (the weights': {weights[key]!r})" if key in weights else f"{key}={value!r}"
        for key, value in set_keys(task, *given).items()
        if (key in weights and value != weights[key] and not (key == "vocab_size" and value > weights[key]))
        or (key in TOKENIZER_KEYS and key not in weights)
    ]
    if fixed:
        raise InputError(
            f"{source} fixes the architecture and tokenizer, which the configs passed set: {', '.join(fixed)}; "
            f"of the model's keys only {', '.join(settable)} may be set"
        )


def check_where(context: TrainContext, precision: str) -> None:
    """Before any work: the context's device is one this machine has, and the training's ``precision`` runs on it
    (an ``InputError`` each, as the train commands check them; torch raised an AssertionError part-way)."""
    check_device(context.device)
    check_precision(precision, context.device, what="train_cfg.precision")


def holds_run_lock(train: F) -> F:
    """A train function (``out_dir=``, ``context=``, ``on_event=`` keywords) that holds the lock of its run directory
    for the whole training (``runs.run_lock``; rank 0 of a data-parallel run alone writes it, and alone takes it):
    a second training into the same directory is refused at once, naming this one, and a training refused before
    it wrote anything leaves no directory behind. The lock nests within a thread: a caller that holds it already (a
    train command, which checks ``--resume`` under it) is not refused by its own training."""

    @functools.wraps(train)
    def locked(*args, **kwargs):
        context, on_event = kwargs.get("context") or TrainContext(), kwargs.get("on_event", warn_only)
        out_dir = kwargs.get("out_dir")
        if not context.is_main or out_dir is None:  # no out_dir: the function's own TypeError says it is required
            return train(*args, **kwargs)

        def taken_over(holder: runs.Holder) -> None:
            on_event(Warned(f"{out_dir}: taking over the lock left by {holder}, which has ended"))

        with runs.run_lock(out_dir, on_stale=taken_over):
            return train(*args, **kwargs)

    return cast(F, locked)


def write_run_files(
    run: RunDir,
    task: str,
    model_cfg: TransformerConfig,
    train_cfg: TrainConfig,
    tokenizer: Tokenizer,
    *,
    files: dict[str, object] | None = None,
    context: TrainContext | None = None,
    **extra: object,
) -> None:
    """config.json (task, format, both configs, tokenizer roles, ``extra``), tokenizer.json and the task's own JSON
    ``files`` (name -> value) of a run that starts; nothing when resuming a run that has them. Then, on rank 0 of a
    data-parallel run, lets the other ranks (waiting in ``open_run``) read them."""
    if run.saved is None:
        _write_run_files(run, task, model_cfg, train_cfg, tokenizer, files or {}, extra)
    if context is not None and context.is_main:
        main_done(context)


def _write_run_files(
    run: RunDir,
    task: str,
    model_cfg: TransformerConfig,
    train_cfg: TrainConfig,
    tokenizer: Tokenizer,
    files: dict[str, object],
    extra: dict[str, object],
) -> None:
    config = {
        **runs.config_header(task),
        "model": dataclasses.asdict(model_cfg),
        "train": dataclasses.asdict(train_cfg),
        "tokenizer": tokenizer.meta(),
        "pad_id": tokenizer.pad_id,
        **extra,
    }
    runs.atomic_write_json(run.path / runs.CONFIG, config)
    tokenizer.save(run.path / runs.TOKENIZER)
    for name, value in files.items():
        runs.atomic_write_json(run.path / name, value)


def grow_budget(run_dir: Path, grown: dict[str, object]) -> None:
    """Write a resumed run's larger budget (``config.check_resume_settings`` allowed it) into its config.json, and
    that file's new hash into the manifest: the run continues under it, and its files still check."""
    config = runs.read_json(run_dir / runs.CONFIG)
    config["train"].update(grown)
    runs.atomic_write_json(run_dir / runs.CONFIG, config)
    runs.record_hash(run_dir, runs.CONFIG)


def check_memory(model_cfg: TransformerConfig, device: torch.device) -> None:
    """Before the model is built: its weights, gradients and Adam's two moments must fit the memory ``device`` has
    left (activations come on top), or the training is refused now rather than killed by the kernel later."""
    size, free = model_size(model_cfg), available_memory(device)
    if free is not None and size.training_bytes > free:
        raise InputError(
            f"the model ({size.params:,} parameters) needs {size.training_bytes / 2**30:.1f} GiB to train (weights, "
            f"gradients and Adam's two moments) but {device} has {free / 2**30:.1f} GiB available; make it smaller "
            f"(vocab_size, d_model, d_ff, n_layers, max_len)"
        )
