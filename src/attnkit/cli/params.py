"""``attnkit params``: the per-module parameter table."""

from __future__ import annotations

import argparse
from pathlib import Path

from attnkit.cli.common import add_config_args, add_device_arg, config_overrides, device_of, print_json
from attnkit.errors import InputError


def cmd_params(args: argparse.Namespace) -> None:
    from dataclasses import asdict

    import torch

    from attnkit.analysis.params import format_memory, format_table, memory_estimate, parameter_table, to_json
    from attnkit.config import task_configs
    from attnkit.model.build import build_classifier, build_masked_lm, build_translator
    from attnkit.runs.load import read_run

    if args.model is not None:  # a trained run: its config says what the model is
        if args.task or args.preset or args.overrides or args.config:
            raise InputError("params --model: the run's config fixes the model; drop --task, --preset, --set, --config")
        run = read_run(args.model)
        task, model_cfg = run.task, run.model_cfg
    elif args.task is None:
        raise InputError("params: give --task classify|translate (with --preset, --set), or --model RUN_DIR")
    else:
        task = args.task
        model_cfg, _ = task_configs(task, args.preset, config_overrides(args, task))
    build = {"classify": build_classifier, "translate": build_translator, "pretrain": build_masked_lm}[task]
    with torch.device("meta"):  # shapes only: no memory is allocated, even for the big model
        model: torch.nn.Module = build(model_cfg)  # type: ignore[operator]
    report = parameter_table(model)
    memory = memory_estimate(report, device_of(args))  # what the model would take on --device
    if args.json:
        print_json({**to_json(report), "memory": asdict(memory)})
    else:
        print(format_memory(memory))  # above the table, which ends with its totals
        print(format_table(report))


def add_commands(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("params", help="per-module parameter table with closed-form formulas")
    p.add_argument("--task", choices=("classify", "translate"), help="the model a config describes (or --model)")
    p.add_argument("--model", type=Path, metavar="RUN_DIR", help="a trained run's model instead of --task's")
    p.add_argument("--preset", help="classify: default, vocab10k, tiny-binary; translate: small, base, big")
    p.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    add_device_arg(p)
    add_config_args(p)
    p.set_defaults(func=cmd_params)
