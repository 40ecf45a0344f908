"""Commands that make a new run directory from existing weights: ``attnkit average`` and ``attnkit convert``."""

from __future__ import annotations

import argparse
from pathlib import Path

from attnkit.cli.common import note_unfinished, print_json


def cmd_convert(args: argparse.Namespace) -> None:
    from attnkit.interop.pickle_import import import_pickle_into_run

    out = import_pickle_into_run(args.from_pickle, args.model, args.out, trust_pickle=args.trust_pickle)
    print_json({"out": str(out), "from_pickle": str(args.from_pickle), "model": str(args.model)})


def cmd_average(args: argparse.Namespace) -> None:
    from attnkit.training.average import average_checkpoints

    note_unfinished(args.run_dir)  # a run stopped part-way, or being trained now: its checkpoints so far
    used = average_checkpoints(args.run_dir, args.last, args.out)
    print_json({"out": str(args.out), "averaged": [p.name for p in used]})


def add_average_command(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("average", help="average the last N checkpoints of a run into a new run directory (§6.1)")
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="a run trained with --set keep_last=N (N >= --last)")
    p.add_argument("--last", type=int, default=5, help="how many of its last step checkpoints (default %(default)s)")
    p.add_argument("--out", type=Path, required=True, help="the new run directory: RUN_DIR with the averaged weights")
    p.set_defaults(func=cmd_average)


def add_convert_command(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "convert", help="import weights from a PyTorch pickle into a new run directory (safetensors)"
    )
    p.add_argument(
        "--from-pickle",
        type=Path,
        required=True,
        metavar="FILE",
        help="torch.save file (.pt, .pth, .bin) holding a state dict, or a dict with a 'model' or 'state_dict' entry",
    )
    p.add_argument(
        "--model",
        type=Path,
        required=True,
        metavar="RUN",
        help="run directory whose config, tokenizer and labels the weights belong to",
    )
    p.add_argument("--out", type=Path, required=True, metavar="DIR", help="new run directory to write")
    p.add_argument(
        "--trust-pickle",
        action="store_true",
        help="allow unpickling FILE: pickles can run code when loaded, so only for files you trust",
    )
    p.set_defaults(func=cmd_convert)
