"""``attnkit ablate``: Table 3 on your data."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from attnkit.cli.common import add_config_args, add_device_arg, config_overrides, device_of, fetch_dataset
from attnkit.errors import InputError


def cmd_ablate(args: argparse.Namespace) -> None:
    """Train the base model and one variant per --grid value with the same budget; write ablation.md and .png."""
    from attnkit.analysis.ablation import (
        parse_grid,
        read_results,
        run_ablation,
        train_variant,
        variant_configs,
        write_report,
    )
    from attnkit.data.readers.labeled import read_labeled
    from attnkit.data.readers.parallel import read_parallel_tsv
    from attnkit.training.events import Event, Warned

    if args.report_only:  # everything from OUT/ablation.json: no data, no grid
        results = read_results(args.out)
        if results.task not in (None, args.task):
            raise InputError(f"{args.out / 'ablation.json'}: the results of a {results.task} ablation, not {args.task}")
        budget = args.budget or results.budget or "the defaults"
        table, figure = write_report(results.variants, args.task, budget, args.out, n_valid=results.n_valid)
        print(table)
        print(figure)
        return
    if not args.grid:
        raise InputError("ablate: give at least one --grid KEY=V1,V2 (the variants to train)")
    variants = parse_grid(args.grid)
    base = config_overrides(args, args.task)
    device = device_of(args)
    directory = fetch_dataset(args.dataset, args.pair, task=args.task) if args.dataset else None
    train_path = directory / "train.tsv" if directory else args.train
    valid_path = directory / "valid.tsv" if directory else args.valid
    if train_path is None or valid_path is None:
        raise InputError("ablate: give --dataset NAME, or --train FILE and --valid FILE")
    train: list[Any]
    valid: list[Any]
    if args.task == "classify":
        train, valid = read_labeled(train_path), read_labeled(valid_path)
    else:
        train, valid = read_parallel_tsv(train_path), read_parallel_tsv(valid_path)
    for variant in variants:  # every configuration is checked before the first one trains
        variant_configs(args.task, args.preset, {**base, **variant.overrides})
    budget = args.budget or ", ".join(f"{k}={v}" for k, v in base.items()) or "the defaults"

    said: set[str] = set()

    def warn(event: Event) -> None:  # a `warning:` line, as the train commands print; the same one once, not per run
        if isinstance(event, Warned) and event.message not in said:
            said.add(event.message)
            print(f"warning: {event.message}", file=sys.stderr)

    def train_one(variant, out):
        overrides = {**base, **variant.overrides}
        return train_variant(args.task, args.preset, overrides, train, valid, out, device, on_event=warn)

    def show(variant) -> None:
        print(
            f"{variant.name}: {variant.params:,} params, valid {variant.valid:.4f}"
            + (f", BLEU {variant.bleu}" if variant.bleu is not None else "")
            + f", {variant.seconds:.0f} s",
            file=sys.stderr,
        )

    # Each variant is a whole training run, minutes each on a dataset recipe: say so before the first one starts.
    names = ", ".join(v.name for v in variants)
    print(f"ablate: {len(variants)} runs to train one after another into {args.out} ({names})", file=sys.stderr)
    run_ablation(variants, train_one, args.out, show)
    table, figure = write_report(variants, args.task, budget, args.out, n_valid=len(valid))
    print(table)
    print(figure)


def add_commands(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("ablate", help="Table 3 on your data: a base model and one-change variants, same budget")
    p.add_argument("--task", choices=("classify", "translate"), required=True)
    p.add_argument("--dataset", help="a dataset recipe (rt-polarity, bible, ...) instead of --train/--valid")
    p.add_argument("--pair", help="language pair of --dataset bible, e.g. en-ko (default en-de)")
    p.add_argument("--train", type=Path, help="training file, as classify train or translate train reads it")
    p.add_argument("--valid", type=Path, help="validation file (required with --train: it ranks the variants)")
    p.add_argument("--preset", help="the base model's preset (as classify train or translate train takes it)")
    p.add_argument(
        "--grid",
        action="append",
        metavar="KEY=V1,V2",
        help="one row group: the base with KEY set to each value (repeatable)",
    )
    p.add_argument("--budget", help="how the budget is described in the report (default: the --set values)")
    p.add_argument("--out", type=Path, required=True, help="directory for the variants' runs and the report")
    p.add_argument(
        "--report-only",
        action="store_true",
        help="train nothing: rewrite ablation.md and the figure from OUT/ablation.json (needs no data and no --grid)",
    )
    add_device_arg(p)
    add_config_args(p)
    p.set_defaults(func=cmd_ablate)
