"""Rebuild every figure of docs/guide.md with the attnkit CLI itself.

    python docs/make_figures.py --classifier RUN_DIR --translator RUN_DIR

RUN_DIRs are trained runs (the README's RT-polarity classifier and Bible translator). Figures go to
docs/figures/; parameter tables to docs/figures/*.txt.
"""

from __future__ import annotations

import argparse
import contextlib
import io
from pathlib import Path

from attnkit.cli import main

FIGURES = Path(__file__).resolve().parent / "figures"


def run(*argv: str) -> str:
    """Run one attnkit command; stop on failure; return what it printed."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(list(argv))
    if code != 0:
        raise SystemExit(f"attnkit {' '.join(argv)} failed with exit code {code}")
    return out.getvalue()


def main_script() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--classifier", type=Path, required=True)
    parser.add_argument("--translator", type=Path, required=True)
    args = parser.parse_args()
    FIGURES.mkdir(exist_ok=True)

    (FIGURES / "params_seed001.txt").write_text(run("params", "--task", "classify", "--preset", "seed001"))
    (FIGURES / "params_base.txt").write_text(run("params", "--task", "translate", "--preset", "base",
                                                 "--set", "vocab_size=37000"))
    run("plot", "pe", "--d-model", "128", "--max-len", "100", "--out", str(FIGURES / "pe.png"))
    run("plot", "attention", "--model", str(args.classifier), "--out", str(FIGURES / "attention_classifier.png"),
        "an utterly gorgeous , moving film that never lets go")
    run("plot", "attention", "--model", str(args.translator), "--out", str(FIGURES / "attention_translator.png"),
        "--layer", "2", "In the beginning was the Word, and the Word was with God.")
    run("plot", "curves", "--run", str(args.classifier), "--out", str(FIGURES / "curves_classifier.png"))
    run("plot", "curves", "--run", str(args.translator), "--out", str(FIGURES / "curves_translator.png"))


if __name__ == "__main__":
    main_script()
