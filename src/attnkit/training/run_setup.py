"""Opening a training run's directory, shared by every task: a fresh run, a resumed one, or a resumed one that was
killed before it saved anything (which simply starts).

In a data-parallel run, rank 0 alone prepares the directory, trains the tokenizer and writes the run's files; the
other ranks wait in ``open_run`` until ``write_run_files`` has written them, then read them as a resumed run reads
its own (so that every rank has the very same tokenizer, labels and configs).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from attnkit import runs
from attnkit.config import TrainConfig, TransformerConfig
from attnkit.errors import InputError
from attnkit.tokenization import Tokenizer
from attnkit.training.distributed import main_done, wait_for_main
from attnkit.training.task import TrainContext


@dataclass(frozen=True)
class RunDir:
    path: Path
    saved: dict | None  # the run's config.json when resuming a run that wrote one; its configs then rule
    resume: bool


def open_run(out_dir: str | Path, resume: bool, context: TrainContext | None = None) -> RunDir:
    """The directory to train into. Resuming removes what atomic writes killed part-way left behind; a run killed
    before it wrote its config has nothing to continue, so it starts from the beginning (as it would have).

    On ranks other than 0: once rank 0 has written the run's files, the run as rank 0 wrote it (``saved`` set)."""
    out_dir = Path(out_dir)
    if context is not None and not context.is_main:
        wait_for_main(context)
        return RunDir(out_dir, runs.read_json(out_dir / runs.CONFIG), resume)
    if resume:
        if not out_dir.is_dir():
            raise InputError(f"--resume: {out_dir} does not exist; there is no run to continue")
        runs.remove_temporary_files(out_dir)
        if (out_dir / runs.CONFIG).is_file():
            path = runs.prepare_run_dir(out_dir, resume=True)
            return RunDir(path, runs.read_json(path / runs.CONFIG), True)
    return RunDir(runs.prepare_run_dir(out_dir, resume=False), None, resume)


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
