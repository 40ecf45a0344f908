"""``attnkit params``: the per-module parameter table."""

from __future__ import annotations

import argparse

from attnkit.cli.common import add_config_args, add_device_arg, config_overrides, device_of, print_json


def cmd_params(args: argparse.Namespace) -> None:
    from dataclasses import asdict

    import torch

    from attnkit.analysis.params import format_memory, format_table, memory_estimate, parameter_table, to_json
    from attnkit.config import task_configs
    from attnkit.model.build import build_classifier, build_translator

    with torch.device("meta"):  # shapes only: no memory is allocated, even for the big model
        model_cfg, _ = task_configs(args.task, args.preset, config_overrides(args, args.task))
        build = build_classifier if args.task == "classify" else build_translator
        model: torch.nn.Module = build(model_cfg)
    report = parameter_table(model)
    memory = memory_estimate(report, device_of(args))  # what the model would take on --device
    if args.json:
        print_json({**to_json(report), "memory": asdict(memory)})
    else:
        print(format_memory(memory))  # above the table, which ends with its totals
        print(format_table(report))


def add_commands(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("params", help="per-module parameter table with closed-form formulas")
    p.add_argument("--task", choices=("classify", "translate"), required=True)
    p.add_argument("--preset", help="classify: default, vocab10k, tiny-binary; translate: small, base, big")
    p.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    add_device_arg(p)
    add_config_args(p)
    p.set_defaults(func=cmd_params)
