"""``attnkit bench SUITE [--json [FILE]] [--quick] [--threads N] [--impl NAME ...] [--compiled]``: the suites.

First a line naming the machine (CPU, features, threads, versions, load). Each result is printed as it arrives (a
JSON line on stdout with ``--json``, else a progress line on stderr), then the table (on stdout, or on stderr with
``--json`` so that stdout stays JSON lines; the first JSON line is ``{"machine": ...}``). ``--json FILE`` writes
instead one JSON document ``{"suite", "command", "machine", "results"}`` to FILE (atomically, at the end) and
prints the table on stdout; the machine record's load average is taken again at the end (``load_average_end``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def cmd_bench(args: argparse.Namespace) -> None:
    from attnkit.atomic import atomic_write_json
    from attnkit.bench import iter_suite
    from attnkit.bench.gpu import gpu_info
    from attnkit.bench.machine import describe_machine, load_average, machine_info
    from attnkit.bench.results import describe, format_table
    from attnkit.devices import resolve_device
    from attnkit.errors import InputError
    from attnkit.training.precision import SLOW_BF16_NOTE, native_bf16

    device = resolve_device(args.device)
    if device.type not in ("cpu", "cuda"):
        raise InputError(f"bench --device {args.device}: the suites time the CPU or a CUDA GPU; use cpu or cuda")
    if args.json and args.json != "-":  # checked before minutes of measuring, not when the results are written
        target = Path(args.json)
        if target.is_dir() or not target.parent.is_dir():
            where = "is a directory" if target.is_dir() else f"its folder {target.parent} does not exist"
            raise InputError(f"--json {target}: {where}; give a file in an existing folder")

    results_iter = iter_suite(
        args.suite, quick=args.quick, threads=args.threads, impls=args.impl, device=device, compiled=args.compiled
    )
    if args.suite in ("train", "classify") and device.type == "cpu" and not native_bf16():
        print(f"note: bfloat16 rows skipped: {SLOW_BF16_NOTE}", file=sys.stderr)
    lines = args.json == "-"  # JSON lines on stdout
    machine = machine_info(threads=args.threads)
    if device.type == "cuda":
        machine["gpu"] = gpu_info(device)
    print(f"machine: {describe_machine(machine)}", file=sys.stderr, flush=True)
    if lines:
        print(json.dumps({"machine": machine}), flush=True)
    results = []
    for result in results_iter:
        results.append(result)
        if lines:
            print(result.to_json(), flush=True)
        else:
            print(describe(result), file=sys.stderr, flush=True)
    if args.json and not lines:
        machine["load_average_end"] = load_average()
        document = {
            "suite": args.suite,
            "command": ["attnkit", *sys.argv[1:]],
            "machine": machine,
            "results": [json.loads(r.to_json()) for r in results],
        }
        atomic_write_json(args.json, document)
    print(format_table(results), file=sys.stderr if lines else sys.stdout)


def add_commands(commands: argparse._SubParsersAction) -> None:
    from attnkit.bench import IMPL_CHOICES, SUITES  # cheap: no torch import

    p = commands.add_parser(
        "bench", help="time attnkit beside torch.nn, Hugging Face and CTranslate2 (benchmarks/README.md)"
    )
    p.add_argument(
        "suite",
        choices=SUITES,
        help="train, classify, decode or scaling; each takes up to 10 minutes on 2 CPU cores (--quick: about a minute)",
    )
    p.add_argument(
        "--json",
        nargs="?",
        const="-",
        metavar="FILE",
        help="alone: a JSON line for the machine, then one per result, on stdout (table on stderr); "
        "with FILE: one JSON document with the machine and every result written to FILE (table on stdout)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="smaller sizes and fewer repetitions, and no compiled decoding engine: a smoke test",
    )
    p.add_argument("--threads", type=int, default=2, help="intra-op threads for every implementation (default 2)")
    p.add_argument(
        "--device",
        default="cpu",
        help="cpu (the default), cuda, cuda:N or auto: every implementation is timed on this device; on a GPU, "
        "batches are larger and MFU is relative to the data sheet's peak of each row's arithmetic (attnkit.bench.gpu)",
    )
    p.add_argument(
        "--impl",
        action="append",
        choices=IMPL_CHOICES,
        help="only these implementations (repeatable; default: all installed)",
    )
    p.add_argument(
        "--compiled",
        action="store_true",
        help="train suite: also attnkit's step compiled as --set compile=true trains it (row 'attnkit compiled', in "
        "bfloat16 where the device has it natively, else float32; its compilation, tens of seconds a row, is timed "
        "apart)",
    )
    p.set_defaults(func=cmd_bench)
