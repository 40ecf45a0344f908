"""Opening a training run's directory, shared by every task: a fresh run, a resumed one, or a resumed one that was
killed before it saved anything (which simply starts)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from attnkit import runs
from attnkit.config import TrainConfig, TransformerConfig
from attnkit.errors import InputError
from attnkit.tokenization import Tokenizer


@dataclass(frozen=True)
class RunDir:
    path: Path
    saved: dict | None  # the run's config.json when resuming a run that wrote one; its configs then rule
    resume: bool


def open_run(out_dir: str | Path, resume: bool) -> RunDir:
    """The directory to train into. Resuming removes what atomic writes killed part-way left behind; a run killed
    before it wrote its config has nothing to continue, so it starts from the beginning (as it would have)."""
    out_dir = Path(out_dir)
    if resume:
        if not out_dir.is_dir():
            raise InputError(f"--resume: {out_dir} does not exist; there is no run to continue")
        runs.remove_temporary_files(out_dir)
        if (out_dir / runs.CONFIG).is_file():
            path = runs.prepare_run_dir(out_dir, resume=True)
            return RunDir(path, runs.read_json(path / runs.CONFIG), True)
    return RunDir(runs.prepare_run_dir(out_dir, resume=False), None, resume)


def write_run_files(
    run: RunDir, task: str, model_cfg: TransformerConfig, train_cfg: TrainConfig, tokenizer: Tokenizer, **extra: object
) -> None:
    """config.json (task, format, both configs, tokenizer roles, ``extra``) and tokenizer.json of a run that starts;
    nothing when resuming a run that has them."""
    if run.saved is not None:
        return
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
