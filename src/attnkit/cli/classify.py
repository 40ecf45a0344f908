"""``attnkit classify train | predict | eval``: text classifiers."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from attnkit.cli.arguments import Parser
from attnkit.cli.common import (
    OUT_HELP,
    RESUME_HELP,
    add_budget_args,
    add_config_args,
    add_device_arg,
    add_precision_arg,
    apply_flags,
    check_init_from,
    check_precision,
    check_prepared,
    check_resume,
    check_training_extras,
    config_overrides,
    dataset_splits,
    device_of,
    eval_file,
    main_rank_first,
    note_unfinished,
    print_json,
    texts_from,
    training_context,
    training_progress,
)
from attnkit.errors import InputError

if TYPE_CHECKING:
    from attnkit.tasks.classify import TrainSummary
    from attnkit.training.task import TrainContext


def cmd_classify_train(args: argparse.Namespace) -> None:
    text_flags = [f"--{flag}" for flag in ("train", "valid", "dataset") if getattr(args, flag)]
    if args.prepared and text_flags:
        raise InputError(f"classify train: give --prepared DIR or text data ({', '.join(text_flags)}), not both")
    if not args.prepared and bool(args.train) == bool(args.dataset):
        raise InputError("classify train: give --train FILE, --dataset NAME or --prepared DIR (one of them)")
    with training_context(args) as context:
        train_path, valid_path = None, None
        if not args.prepared:
            with main_rank_first(context):
                if args.train:
                    train_path, valid_path = args.train, args.valid
                else:
                    train_path, valid_path = dataset_splits(args.dataset, "classify")
        summary = _train_classifier(args, train_path, valid_path, context)
    if context.is_main:
        print_json(
            {
                "run_dir": str(summary.run_dir),
                "best_epoch": summary.best_epoch,
                "valid_accuracy": summary.best_valid_accuracy,
                "epochs": summary.epochs_run,
                "steps": summary.steps,
                "stopped_by": summary.stopped_by,
                "seconds": round(summary.seconds, 1),
                "truncated": summary.truncation.n_truncated,
            }
        )


def _train_classifier(
    args: argparse.Namespace, train_path: Path | None, valid_path: Path | None, context: TrainContext
) -> TrainSummary:
    from attnkit.config import (
        CLASSIFIER_PRESETS,
        FINE_TUNE_SETTABLE_MODEL_KEYS,
        FINE_TUNE_TRAIN_DEFAULTS,
        ClassifierConfig,
        task_configs,
    )
    from attnkit.data.prepared import PreparedCorpus, open_prepared
    from attnkit.data.readers.labeled import Example, read_labeled
    from attnkit.tasks.classify import train_classifier
    from attnkit.training.state import STATE

    overrides = config_overrides(args, "classify")
    apply_flags(args, overrides, ("epochs", "max_steps", "seed"))
    if args.init_from:
        check_init_from(args, overrides, ClassifierConfig, FINE_TUNE_SETTABLE_MODEL_KEYS, "the pretrained encoder")
    train_base = dict(FINE_TUNE_TRAIN_DEFAULTS) if args.init_from else {}
    model_cfg, train_cfg = task_configs("classify", args.preset, overrides, train_base)
    check_training_extras(train_cfg)
    resuming = check_resume(args, overrides, ClassifierConfig, CLASSIFIER_PRESETS, context)
    train: list[Example] | PreparedCorpus
    if args.prepared:
        train, valid = open_prepared(args.prepared, task="classify"), None
        check_prepared(train, overrides, train_cfg)
    else:
        assert train_path is not None
        train = read_labeled(train_path)
        valid = read_labeled(valid_path) if valid_path else None

    pretrained = None
    if args.init_from and not (args.resume and (Path(args.out) / STATE).is_file()):  # else the saved state has it
        from attnkit.interop.bert import load_pretrained

        pretrained = load_pretrained(args.init_from)
    with training_progress(args, context, train_cfg.precision) as progress:
        return train_classifier(
            train,
            valid,
            model_cfg=None if resuming else model_cfg,  # the run's own, checked above
            train_cfg=None if resuming else train_cfg,
            out_dir=args.out,
            resume=args.resume,
            pretrained=pretrained,
            on_event=progress,
            context=context,
            train_file=str(train_path or "train"),
            valid_file=str(valid_path or "valid"),
        )


def cmd_classify_predict(args: argparse.Namespace) -> None:
    from attnkit.tasks.classify import ClassifierRun

    device = device_of(args)
    check_precision(args.precision, device, what="--precision")
    run = ClassifierRun(args.model, precision=args.precision, device=device)
    note_unfinished(args.model)
    texts = texts_from(args.texts)
    if not texts:
        raise InputError("classify predict: no text given (pass TEXT arguments or lines on stdin)")
    for pred in run.predict(texts):
        probs = {k: round(v, 6) for k, v in pred.probs.items()}
        # "unknown": how many of the text's tokens the vocabulary lacks (read as <unk>), so a shaky input shows.
        print_json({"text": pred.text, "label": pred.label, "probs": probs, "unknown": pred.unknown})


def cmd_classify_eval(args: argparse.Namespace) -> None:
    from attnkit.data.readers.labeled import read_labeled
    from attnkit.tasks.classify import ClassifierRun

    device = device_of(args)
    check_precision(args.precision, device, what="--precision")
    run = ClassifierRun(args.model, precision=args.precision, device=device)
    note_unfinished(args.model)
    data = eval_file(args, "classify")
    print_json(run.evaluate(read_labeled(data), source=str(data)))


PRECISION_HELP = "bf16: bfloat16 autocast (GPUs, and CPUs with AMX or AVX512-BF16); fp16: float16 autocast (CUDA only)"


def add_commands(commands: argparse._SubParsersAction) -> None:
    classify = commands.add_parser("classify", help="train, run and evaluate text classifiers")
    classify_cmds = classify.add_subparsers(dest="subcommand", required=True, parser_class=Parser)
    p = classify_cmds.add_parser("train", help="train a classifier on a TSV / CSV / JSONL file with text and label")
    p.add_argument("--train", type=Path, help="training file (.tsv, .csv or .jsonl with text and label)")
    p.add_argument("--valid", type=Path, help="validation file (default: 10%% of --train held out)")
    p.add_argument(
        "--dataset",
        help="a dataset recipe instead of files (e.g. rt-polarity, bible-genre/ko; see `attnkit data list`)",
    )
    p.add_argument(
        "--prepared",
        type=Path,
        metavar="DIR",
        help="a corpus written by `attnkit data prepare --task classify` instead of files: its tokenizer, labels, "
        "train split (read through memory maps) and valid split",
    )
    p.add_argument("--out", type=Path, required=True, help=OUT_HELP)
    p.add_argument("--preset", help="model preset: default (the default), vocab10k, tiny-binary (docs/params.md)")
    add_budget_args(p)
    p.add_argument(
        "--seed",
        type=int,
        help="the config key seed (default 0): initial weights, held-out tenth, batch order, dropout",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar or per-epoch lines")
    p.add_argument("--resume", action="store_true", help=RESUME_HELP)
    p.add_argument(
        "--init-from",
        metavar="DIR|minilm",
        help="fine-tune a pretrained encoder (a Hugging Face BERT folder, minilm, or an attnkit pretrain run): its "
        "tokenizer and weights, a fresh head",
    )
    add_device_arg(p)
    add_config_args(p)
    p.set_defaults(func=cmd_classify_train)

    p = classify_cmds.add_parser("predict", help="predict labels with probabilities, one JSON object per text")
    p.add_argument("--model", type=Path, required=True, help="run directory")
    p.add_argument("texts", nargs="*", metavar="TEXT", help="texts (default: one per stdin line)")
    add_precision_arg(p, PRECISION_HELP)
    add_device_arg(p)
    p.set_defaults(func=cmd_classify_predict)

    p = classify_cmds.add_parser("eval", help="accuracy and macro-F1 on a labelled file")
    p.add_argument("--model", type=Path, required=True, help="run directory")
    p.add_argument("--data", type=Path, help="labelled file (.tsv, .csv or .jsonl)")
    p.add_argument("--dataset", help="a dataset recipe instead of --data (e.g. rt-polarity)")
    p.add_argument("--split", choices=("train", "valid", "test"), help="split of --dataset (default test)")
    add_precision_arg(p, PRECISION_HELP)
    add_device_arg(p)
    p.set_defaults(func=cmd_classify_eval)
