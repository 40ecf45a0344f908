"""Measure what a change did: run one suite on two git revisions of attnkit, in turns, and print the ratio.

    python benchmarks/ab.py --a 01940f9 --b HEAD --suite decode --impl attnkit [--rounds 3] [--quick]

Each revision's ``src/`` is exported with ``git archive`` into a temporary directory; round r runs the suite once
per revision in a fresh process (A then B in even rounds, B then A in odd ones), so that a slow phase of a shared
machine falls on both. For every result of the suite (same impl, config, length, search, dtype, mode and variant)
the table shows the median over rounds of its throughput under A and under B, and B / A.

This is how the "measured" column of docs/performance.md was filled in: predict a change's effect from a profile,
make it, then measure it against the revision before it.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
KEY_FIELDS = ("impl", "config", "seq_len", "search", "dtype", "mode", "variant")
METRICS = ("tgt_tok_per_s", "sentences_per_s")


def export_source(rev: str, into: Path) -> Path:
    """``src/`` of ``rev`` written under ``into``; returns the directory to put on PYTHONPATH."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", rev, "src"], check=True, capture_output=True
    ).stdout
    into.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into / "src"


def run_suite(src: Path, suite_args: list[str]) -> list[dict]:
    """The suite's JSON results, run with ``src`` first on the import path."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    # attnkit.cli.main(["bench", ...]) exists at every revision that has `attnkit bench`
    code = "import sys; from attnkit.cli import main; sys.exit(main(['bench', *sys.argv[1:]]))"
    out = subprocess.run(
        [sys.executable, "-c", code, *suite_args, "--json"], env=env, check=True, capture_output=True, text=True
    ).stdout
    records = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return [r for r in records if "impl" in r]  # newer revisions print a {"machine": ...} line first


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--a", required=True, help="the revision before the change (any git revision)")
    parser.add_argument("--b", default="HEAD", help="the revision with the change (default HEAD)")
    parser.add_argument("--suite", required=True, choices=("train", "classify", "decode", "scaling"))
    parser.add_argument("--impl", action="append", default=None, help="passed to the suite (default: attnkit)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    suite_args = [args.suite, "--threads", str(args.threads)] + (["--quick"] if args.quick else [])
    for impl in args.impl or ["attnkit"]:
        suite_args += ["--impl", impl]
    with tempfile.TemporaryDirectory(prefix="attnkit-ab-") as tmp:
        sources = {"A": export_source(args.a, Path(tmp, "a")), "B": export_source(args.b, Path(tmp, "b"))}
        figures: dict[tuple, dict[str, list[float]]] = {}
        for r in range(args.rounds):
            for side in ("A", "B") if r % 2 == 0 else ("B", "A"):
                for result in run_suite(sources[side], suite_args):
                    metric = next((m for m in METRICS if result.get(m) is not None), None)
                    if metric is None:
                        continue
                    key = (*(result.get(f) for f in KEY_FIELDS), metric)
                    figures.setdefault(key, {"A": [], "B": []})[side].append(result[metric])
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)

    print(f"A = {args.a}, B = {args.b}; {args.suite} {' '.join(suite_args[1:])}; median of {args.rounds} rounds")
    print("| " + " | ".join(KEY_FIELDS) + " | metric | A | B | B / A |")
    print("|" + "---|" * (len(KEY_FIELDS) + 1) + "---:|---:|---:|")
    for key, by_side in figures.items():
        if by_side["A"] and by_side["B"]:
            a, b = statistics.median(by_side["A"]), statistics.median(by_side["B"])
            cells = " | ".join("" if v is None else str(v) for v in key)
            print(f"| {cells} | {a:,.0f} | {b:,.0f} | {b / a:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
