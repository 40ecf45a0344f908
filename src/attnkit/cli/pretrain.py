"""``attnkit pretrain``: an encoder pretrained on your own text with BERT's masked-language-model objective, into a run
that ``classify train --init-from RUN`` fine-tunes and ``export hf`` writes as a BERT folder."""

from __future__ import annotations

import argparse
from pathlib import Path

from attnkit.cli.common import (
    OUT_HELP,
    RESUME_HELP,
    add_budget_args,
    add_config_args,
    add_device_arg,
    apply_flags,
    check_resume,
    check_training_extras,
    config_overrides,
    print_json,
    training_context,
    training_progress,
)


def cmd_pretrain(args: argparse.Namespace) -> None:
    from attnkit.config import MaskedLMConfig, task_configs
    from attnkit.data.readers.texts import read_text_lines, read_texts
    from attnkit.tasks.pretrain import pretrain_encoder

    # Everything is checked before the run is written: a bad key or file leaves nothing behind.
    overrides = config_overrides(args, "pretrain")
    apply_flags(args, overrides, ("epochs", "max_steps", "seed"))
    model_cfg, train_cfg = task_configs("pretrain", None, overrides)
    check_training_extras(train_cfg)
    tabular = args.text.suffix.lower() in (".tsv", ".csv", ".jsonl")  # a labelled file: its text column
    texts = [text for text, _ in (read_texts(args.text) if tabular else read_text_lines(args.text))]
    with training_context(args) as context:
        resuming = check_resume(args, overrides, MaskedLMConfig, {}, context)
        with training_progress(args, context, train_cfg.precision) as progress:
            summary = pretrain_encoder(
                texts,
                model_cfg=None if resuming else model_cfg,  # the run's own, checked above
                train_cfg=None if resuming else train_cfg,
                out_dir=args.out,
                resume=args.resume,
                on_event=progress,
                context=context,
            )
    if context.is_main:
        print_json(
            {
                "run_dir": str(summary.run_dir),
                "best_epoch": summary.best_epoch,
                **{f"valid_{key}": round(value, 4) for key, value in summary.best.items()},
                "train_texts": summary.n_train,
                "valid_texts": summary.n_valid,
                "epochs": summary.epochs_run,
                "steps": summary.steps,
                "stopped_by": summary.stopped_by,
                "seconds": round(summary.seconds, 1),
                "truncated": summary.truncation.n_truncated,
            }
        )


def add_commands(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "pretrain",
        help="pretrain an encoder on plain text (BERT's masked LM) for `classify train --init-from RUN`",
    )
    p.add_argument(
        "--text",
        type=Path,
        required=True,
        help="one text per line (blank lines skipped); a .tsv, .csv or .jsonl file gives its text column",
    )
    p.add_argument("--out", type=Path, required=True, help=OUT_HELP)
    add_budget_args(p)
    p.add_argument("--seed", type=int, help="the config key seed (default 0): initial weights, batch order, masks")
    p.add_argument("--quiet", action="store_true", help="no progress bar or per-epoch lines")
    p.add_argument("--resume", action="store_true", help=RESUME_HELP)
    add_device_arg(p)
    add_config_args(p)
    p.set_defaults(func=cmd_pretrain)
