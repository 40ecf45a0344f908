"""``attnkit plot pe | attention | curves``: figures."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from attnkit.cli.arguments import Parser
from attnkit.cli.common import add_device_arg, device_of
from attnkit.errors import InputError


def cmd_plot_pe(args: argparse.Namespace) -> None:
    from attnkit.analysis.plots.positional import plot_positional_encoding

    if args.d_model < 2 or args.max_len < 1:
        raise InputError("plot pe: --d-model must be >= 2 and --max-len >= 1")
    if args.d_model * args.max_len > PE_MAX_CELLS:  # the table is computed whole, then drawn cell by cell
        raise InputError(
            f"plot pe: --d-model {args.d_model} x --max-len {args.max_len} is over {PE_MAX_CELLS:,} cells, far more "
            "than a figure can show"
        )
    print(plot_positional_encoding(args.d_model, args.max_len, args.out))


PE_MAX_CELLS = 2**22  # e.g. d_model 1,024 x 4,096 positions: 16 MiB of float32


def cmd_plot_attention(args: argparse.Namespace) -> None:
    from attnkit.analysis.attention import attention_for_text
    from attnkit.analysis.plots.attention import plot_attention_grid
    from attnkit.analysis.plots.figure import check_format
    from attnkit.analysis.plots.fonts import missing_glyphs

    check_format(args.out)
    captured = attention_for_text(args.model, " ".join(args.text), args.layer, device=device_of(args), heads=args.head)
    if captured.note:
        print(f"note: {captured.note}", file=sys.stderr)
    missing = missing_glyphs(captured.query_tokens + captured.key_tokens)
    if missing:
        shown = "".join(missing[:10]) + ("..." if len(missing) > 10 else "")
        print(
            f"warning: no installed font has {len(missing)} character(s) of the tokens ({shown}); they are drawn as "
            "boxes. Install a font that has them (for Korean, Chinese or Japanese: Noto Sans CJK, e.g. the "
            "fonts-noto-cjk package) and delete matplotlib's font cache (~/.cache/matplotlib)",
            file=sys.stderr,
        )
    print(
        plot_attention_grid(
            captured.maps,
            captured.query_tokens,
            captured.key_tokens,
            args.out,
            heads=list(dict.fromkeys(args.head)) if args.head else None,  # --head 0 --head 0: one panel
            title=f"{captured.kind}, {args.model}",
        )
    )


def cmd_plot_curves(args: argparse.Namespace) -> None:
    from attnkit import runs
    from attnkit.analysis.plots.curves import plot_curves
    from attnkit.analysis.plots.figure import check_format

    check_format(args.out)
    rows = runs.read_metrics(args.run)
    config_path = Path(args.run) / runs.CONFIG
    config = runs.read_json(config_path) if config_path.is_file() else None  # names the schedule, draws the loss floor
    if config is not None and not (
        isinstance(config, dict) and all(isinstance(config.get(key, {}), dict) for key in ("model", "train"))
    ):
        raise InputError(f"{config_path}: not a run's config (expected an object with 'model' and 'train' objects)")
    print(plot_curves(rows, args.out, title=f"training curves, {args.run}", config=config))


def add_commands(commands: argparse._SubParsersAction) -> None:
    plot = commands.add_parser("plot", help="figures")
    plot_cmds = plot.add_subparsers(dest="subcommand", required=True, parser_class=Parser)
    p = plot_cmds.add_parser("pe", help="heatmap of the sinusoidal positional encoding (§3.5)")
    p.add_argument("--d-model", type=int, default=128, help="dimensions, the rows (default %(default)s)")
    p.add_argument("--max-len", type=int, default=100, help="positions, the columns (default %(default)s)")
    p.add_argument("--out", type=Path, required=True, help="figure to write: .png, .svg or .html (inline SVG)")
    p.set_defaults(func=cmd_plot_pe)
    p = plot_cmds.add_parser("attention", help="attention maps of a trained model for one text (layers x heads)")
    p.add_argument(
        "--model",
        type=Path,
        required=True,
        help="run directory (classifier: self-attention; translator: cross-attention of its translation)",
    )
    p.add_argument("--out", type=Path, required=True, help="figure to write: .png, .svg or .html (inline SVG)")
    p.add_argument("--layer", type=int, action="append", help="layer to show (repeatable; default all)")
    p.add_argument("--head", type=int, action="append", help="head to show (repeatable; default all)")
    add_device_arg(p)
    p.add_argument("text", nargs="+", metavar="TEXT")
    p.set_defaults(func=cmd_plot_attention)
    p = plot_cmds.add_parser("curves", help="loss, accuracy / BLEU and learning rate against step, from metrics.jsonl")
    p.add_argument("--run", type=Path, required=True, help="run directory")
    p.add_argument("--out", type=Path, required=True, help="figure to write: .png, .svg or .html (inline SVG)")
    p.set_defaults(func=cmd_plot_curves)
