"""The command line of the benchmarks: ``attnkit bench SUITE [--json] [--quick] [--threads N] [--impl NAME ...]``.

Parse, run the suite, print: each result as it arrives (a JSON line on stdout with ``--json``, else a progress line
on stderr), then the table (on stdout, or on stderr with ``--json`` so that stdout stays JSON lines).
"""

from __future__ import annotations

import argparse
import sys

from attnkit.bench import SUITES, suite_module
from attnkit.errors import InputError

IMPL_CHOICES = ("attnkit", "torch.nn", "transformers", "ctranslate2")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``attnkit bench``, for the main CLI's sub-parser."""
    parser.add_argument("suite", choices=SUITES, help="train, classify, decode or scaling")
    parser.add_argument("--json", action="store_true", help="one JSON object per result on stdout (table on stderr)")
    parser.add_argument("--quick", action="store_true", help="smaller sizes and fewer repetitions: a smoke test")
    parser.add_argument("--threads", type=int, default=2, help="intra-op threads for every implementation (default 2)")
    parser.add_argument("--impl", action="append", choices=IMPL_CHOICES,
                        help="only these implementations (repeatable; default: all installed)")


def run_command(args: argparse.Namespace) -> None:
    """Run ``args.suite`` and print its results."""
    from attnkit.bench.common import describe, format_table
    from attnkit.training.losses import SLOW_BF16_NOTE, native_bf16

    if args.threads < 1:
        raise InputError(f"bench: --threads={args.threads} must be >= 1")
    module = suite_module(args.suite)
    kwargs = dict(quick=args.quick, threads=args.threads)
    if args.impl:
        impls = tuple(i for i in args.impl if i in module.IMPLS)
        if not impls:
            raise InputError(f"bench: suite {args.suite} runs {', '.join(module.IMPLS)}; --impl chose none of them")
        kwargs["impls"] = impls
    if args.suite in ("train", "classify") and not native_bf16():
        print(f"note: bfloat16 rows skipped: {SLOW_BF16_NOTE}", file=sys.stderr)
    results = []
    for result in module.iter_results(**kwargs):
        results.append(result)
        if args.json:
            print(result.to_json(), flush=True)
        else:
            print(describe(result), file=sys.stderr, flush=True)
    print(format_table(results), file=sys.stderr if args.json else sys.stdout)


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry point (``benchmarks/run.py``): the same as ``attnkit bench ...``, with the same exit codes."""
    from attnkit.cli import main as attnkit_main

    return attnkit_main(["bench", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
