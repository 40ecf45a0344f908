"""``attnkit translate train | run | eval``: the paper's encoder-decoder."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from attnkit.cli.arguments import Parser, length_penalty_alpha, positive_int, thread_count
from attnkit.cli.common import (
    OUT_HELP,
    RESUME_HELP,
    add_budget_args,
    add_config_args,
    add_device_arg,
    add_precision_arg,
    apply_flags,
    check_init_from,
    check_no_split,
    check_precision,
    check_prepared,
    check_resume,
    check_training_extras,
    config_overrides,
    device_of,
    eval_file,
    fetch_dataset,
    main_rank_first,
    note_unfinished,
    print_json,
    stdin_lines,
    training_context,
    training_progress,
)
from attnkit.config import BLEU_TOKENIZERS
from attnkit.errors import InputError

# What --init-from leaves to the new training: the rest of the model is the run's.
INIT_SETTABLE_KEYS = ("dropout", "attention_dropout")
TEXT_DATA_FLAGS = ("train", "train_src", "train_tgt", "valid", "valid_src", "valid_tgt", "dataset", "pair")


def _read_pairs(tsv: Path | None, src: Path | None, tgt: Path | None, what: str):
    from attnkit.data.readers.parallel import read_parallel_files, read_parallel_tsv

    if tsv and (src or tgt):
        raise InputError(f"give --{what} FILE or --{what}-src A --{what}-tgt B, not both")
    if tsv:
        return read_parallel_tsv(tsv)
    if src or tgt:
        if not (src and tgt):
            raise InputError(f"--{what}-src and --{what}-tgt go together")
        return read_parallel_files(src, tgt)
    return None


def cmd_translate_train(args: argparse.Namespace) -> None:
    from attnkit.config import TRANSLATOR_PRESETS, TranslatorConfig, task_configs
    from attnkit.tasks.translate import train_translator

    text_flags = [f"--{flag.replace('_', '-')}" for flag in TEXT_DATA_FLAGS if getattr(args, flag)]
    if args.prepared and text_flags:
        raise InputError(f"translate train: give --prepared DIR or text data ({', '.join(text_flags)}), not both")
    with training_context(args) as context:
        if args.prepared:
            from attnkit.data.prepared import open_prepared

            train, valid = open_prepared(args.prepared, task="translate"), None
        elif args.dataset:
            with main_rank_first(context):
                directory = fetch_dataset(args.dataset, args.pair, task="translate")
            train, valid = (
                _read_pairs(directory / "train.tsv", None, None, "train"),
                _read_pairs(directory / "valid.tsv", None, None, "valid"),
            )
        else:
            train = _read_pairs(args.train, args.train_src, args.train_tgt, "train")
            if train is None:
                raise InputError(
                    "translate train: give --train FILE, --train-src A --train-tgt B, --dataset NAME or --prepared DIR"
                )
            valid = _read_pairs(args.valid, args.valid_src, args.valid_tgt, "valid")
        overrides = config_overrides(args, "translate")
        apply_flags(args, overrides, ("epochs", "max_steps", "max_tokens", "seed"))
        if args.init_from:
            check_init_from(args, overrides, TranslatorConfig, INIT_SETTABLE_KEYS, "the run")
        model_cfg, train_cfg = task_configs("translate", args.preset, overrides)
        check_training_extras(train_cfg)
        check_prepared(train, overrides, train_cfg)
        resuming = check_resume(args, overrides, TranslatorConfig, TRANSLATOR_PRESETS, context)
        with training_progress(args, context, train_cfg.precision) as progress:
            summary = train_translator(
                train,
                valid,
                model_cfg=None if resuming else model_cfg,  # the run's own, checked above
                train_cfg=None if resuming else train_cfg,
                out_dir=args.out,
                resume=args.resume,
                init_from=args.init_from,
                on_event=progress,
                context=context,
            )
    if not context.is_main:
        return
    print_json(
        {
            "run_dir": str(summary.run_dir),
            "steps": summary.steps,
            "stopped_by": summary.stopped_by,
            "epochs": summary.epochs,
            "seconds": round(summary.seconds, 1),
            "valid_loss": summary.valid_loss,
            "valid_bleu": summary.valid_bleu,
            "truncated": summary.truncation.n_truncated,
        }
    )


PRECISION_HELP = (
    "bf16: decode in bfloat16 (GPUs, and CPUs with AMX or AVX512-BF16), fp16: in float16 (CUDA only); weights and "
    "activations in that type, the search on float32 log-probabilities. int8 (CPUs): bf16 with the weights rounded "
    "to int8, ~2x faster than bf16 one sentence at a time"
)


def cmd_translate_run(args: argparse.Namespace) -> None:
    device = device_of(args)
    if args.engine == "ct2":
        from attnkit.interop.ct2.translator import CT2Translator

        if args.precision != "fp32":  # refused before check_precision's notes about attnkit's own precisions
            raise InputError(
                f"--precision {args.precision} is attnkit's; a CTranslate2 model's weight type is chosen when it is "
                "exported (attnkit export ct2 --quantization)"
            )
        check_precision(args.precision, device, what="--precision")
        ct2 = CT2Translator(args.model, device=device, threads=args.threads or 0)
        run: CT2Translator | TranslatorRun = ct2
        max_len = ct2.max_len
    else:
        import torch

        from attnkit.tasks.translate import TranslatorRun

        check_precision(args.precision, device, what="--precision")
        if args.threads:
            torch.set_num_threads(args.threads)
        run = TranslatorRun(args.model, precision=args.precision, device=device)
        note_unfinished(args.model)
        max_len = run.model_cfg.max_len
    lines = stdin_lines()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            raise InputError(f"<stdin>:{number}: empty source line")
    outputs, n_truncated = run.translate(
        lines, beam=args.beam, alpha=args.alpha, length_penalty=args.length_penalty, batch_size=args.batch_size
    )
    if n_truncated:
        print(
            f"note: {n_truncated} source line(s) longer than max_len={max_len} tokens were truncated", file=sys.stderr
        )
    n_unknown = run.tokenizer.count_unknown(lines, max_len)
    if n_unknown:
        print(
            f"note: {n_unknown} source token(s) are not in the vocabulary and were read as <unk>; an unknown token in "
            "the output is written <unk>",
            file=sys.stderr,
        )
    for out in outputs:
        print(out)


def cmd_translate_eval(args: argparse.Namespace) -> None:
    from attnkit.tasks.translate import TranslatorRun

    device = device_of(args)
    check_precision(args.precision, device, what="--precision")
    run = TranslatorRun(args.model, precision=args.precision, device=device)
    note_unfinished(args.model)
    if args.dataset:
        pairs = _read_pairs(eval_file(args, "translate"), None, None, "data")
    else:
        check_no_split(args)
        pairs = _read_pairs(args.data, args.data_src, args.data_tgt, "data")
    if pairs is None:
        raise InputError("translate eval: give --data FILE, --data-src A --data-tgt B, or --dataset NAME")
    print_json(
        run.evaluate(
            pairs,
            beam=args.beam,
            alpha=args.alpha,
            length_penalty=args.length_penalty,
            bleu_tokenize=args.bleu_tokenize,
        )
    )


def add_commands(commands: argparse._SubParsersAction) -> None:
    translate = commands.add_parser(
        "translate", help="train, run and evaluate translators (the paper's encoder-decoder)"
    )
    translate_cmds = translate.add_subparsers(dest="subcommand", required=True, parser_class=Parser)
    p = translate_cmds.add_parser("train", help="train on parallel text (TSV source<TAB>target, or two aligned files)")
    p.add_argument("--train", type=Path, help="TSV of source<TAB>target lines (optional header: source<TAB>target)")
    p.add_argument("--train-src", type=Path, help="plain-text source file, one sentence per line")
    p.add_argument("--train-tgt", type=Path, help="plain-text target file, aligned with --train-src")
    p.add_argument("--valid", type=Path, help="validation TSV (loss, perplexity and BLEU at each checkpoint)")
    p.add_argument("--valid-src", type=Path, help="validation source sentences, one a line (with --valid-tgt)")
    p.add_argument("--valid-tgt", type=Path, help="validation target sentences, aligned with --valid-src")
    p.add_argument("--dataset", help="a dataset recipe instead of files (e.g. bible)")
    p.add_argument("--pair", help="language pair of --dataset bible, e.g. en-ko (default en-de)")
    p.add_argument(
        "--prepared",
        type=Path,
        metavar="DIR",
        help="a corpus written by `attnkit data prepare --task translate` instead of text: its tokenizer, its train "
        "split (read through memory maps) and its valid split",
    )
    p.add_argument("--out", type=Path, required=True, help=OUT_HELP)
    p.add_argument("--preset", help="small (CPU-sized, the default), base or big (Table 3)")
    add_budget_args(p)
    p.add_argument(
        "--max-tokens", type=int, help="source + target tokens per batch (accumulate with --set accum_steps=N)"
    )
    p.add_argument("--seed", type=int, help="the config key seed (default 0): initial weights, batch order, dropout")
    p.add_argument("--quiet", action="store_true", help="no progress bar or per-evaluation lines")
    p.add_argument("--resume", action="store_true", help=RESUME_HELP)
    p.add_argument(
        "--init-from",
        type=Path,
        metavar="RUN",
        help="start from the weights of a translator run (its architecture and tokenizer; a new optimizer and "
        "schedule); only dropout and attention_dropout of the model may be set",
    )
    add_device_arg(p)
    add_config_args(p)
    p.set_defaults(func=cmd_translate_train)

    def add_decoding_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--beam", type=positive_int, default=4, help="beam size; 1 = greedy (default 4, §6.1)")
        p.add_argument(
            "--alpha",
            type=length_penalty_alpha,
            default=0.6,
            help="length penalty exponent, 0 to 10 (default 0.6, §6.1)",
        )
        p.add_argument(
            "--length-penalty",
            choices=("gnmt", "power", "none"),
            default="gnmt",
            help="the score's divisor: gnmt ((5+|Y|)/6)^alpha, power |Y|^alpha, none (default %(default)s)",
        )

    p = translate_cmds.add_parser("run", help="translate stdin to stdout, one line each, same order")
    p.hints = {"TEXT": "it reads sentences from stdin, one a line: echo TEXT | attnkit translate run --model RUN"}
    p.add_argument(
        "--model",
        type=Path,
        required=True,
        help="run directory; with --engine ct2, a directory written by `attnkit export ct2`",
    )
    p.add_argument(
        "--engine",
        choices=("attnkit", "ct2"),
        default="attnkit",
        help="attnkit (PyTorch, default) or ct2 (CTranslate2: pip install ctranslate2)",
    )
    p.add_argument("--batch-size", type=positive_int, default=32, help="sentences decoded together (default 32)")
    p.add_argument(
        "--threads",
        type=thread_count,
        help="CPU threads of one decoding call: PyTorch's intra-op threads, or CTranslate2's intra_threads with "
        "--engine ct2 (default: the library's own choice, about one per core). CTranslate2 can be faster with 1 "
        "on a small virtual machine (docs/speed.md)",
    )
    add_decoding_args(p)
    add_precision_arg(p, PRECISION_HELP, int8=True)
    add_device_arg(p)
    p.set_defaults(func=cmd_translate_run)

    p = translate_cmds.add_parser("eval", help="sacreBLEU BLEU and chrF (detokenized) with signatures")
    p.add_argument("--model", type=Path, required=True, help="run directory")
    p.add_argument("--data", type=Path, help="TSV of source<TAB>target")
    p.add_argument("--data-src", type=Path, help="plain text, one source sentence a line (with --data-tgt)")
    p.add_argument("--data-tgt", type=Path, help="its reference translations, line by line")
    p.add_argument("--dataset", help="a dataset recipe instead of --data (e.g. bible)")
    p.add_argument("--pair", help="language pair of --dataset bible, e.g. en-ko (default en-de)")
    p.add_argument("--split", choices=("train", "valid", "test"), help="split of --dataset (default test)")
    p.add_argument(
        "--bleu-tokenize",
        choices=BLEU_TOKENIZERS,
        default="13a",
        help="sacreBLEU's tokenizer for BLEU (default 13a); for a Korean target use ko-mecab "
        "(pip install 'attnkit[ko]'), Japanese ja-mecab, Chinese zh. chrF needs none",
    )
    add_decoding_args(p)
    add_precision_arg(p, PRECISION_HELP, int8=True)
    add_device_arg(p)
    p.set_defaults(func=cmd_translate_eval)
