"""What a reduced precision changes in a trained translator's output: BLEU, chrF, identical outputs and time against
float32, on a dataset recipe's split, one process.

    python benchmarks/precision_agreement.py --model runs/bible-en-de-4700 --pair en-de [--precision bf16 int8]
        [--beam 1 4] [--bleu-tokenize 13a] [--latency 40] [--json FILE]

For each search, the split is translated by ``TranslatorRun(precision=p)`` for float32 and each ``--precision``
(batches of 32, as ``attnkit translate eval`` does); each reduced precision's outputs are compared verse by verse
with float32's. ``--latency N`` also times the first N sources one sentence per call (what a service decoding one
request at a time sees), in turns across the precisions, and reports milliseconds per sentence. docs/performance.md
and the README quote its tables.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from attnkit.allocator import tune_malloc
from attnkit.data.readers.parallel import read_parallel_tsv
from attnkit.data.recipes import fetch
from attnkit.evaluation.bleu import corpus_scores
from attnkit.tasks.translate import TranslatorRun


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a translation run directory")
    parser.add_argument("--dataset", default="bible")
    parser.add_argument("--pair", required=True, help="the recipe's language pair, e.g. en-de")
    parser.add_argument("--split", default="test", choices=("train", "valid", "test"))
    parser.add_argument("--precision", nargs="+", default=["bf16", "int8"], help="compared with fp32")
    parser.add_argument("--beam", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--bleu-tokenize", default="13a")
    parser.add_argument("--latency", type=int, default=0, help="also time the first N sources one per call")
    parser.add_argument("--json", help="write the rows to this file")
    args = parser.parse_args()
    tune_malloc()  # as the command line runs
    pairs = read_parallel_tsv(fetch(args.dataset, pair=args.pair) / f"{args.split}.tsv")
    sources, refs = [p.source for p in pairs], [p.target for p in pairs]
    runs = {p: TranslatorRun(args.model, precision=p) for p in ["fp32", *args.precision]}
    rows = []
    for beam in args.beam:
        outputs, seconds = {}, {}
        for precision, run in runs.items():
            start = time.perf_counter()
            outputs[precision], _ = run.translate(sources, beam=beam)
            seconds[precision] = time.perf_counter() - start
        latency: dict[str, list[float]] = {p: [] for p in runs}
        for text in sources[: args.latency]:  # one sentence per call, the precisions in turns
            for precision, run in runs.items():
                start = time.perf_counter()
                run.translate([text], beam=beam, batch_size=1)
                latency[precision].append(time.perf_counter() - start)
        for precision in runs:
            scores = corpus_scores(outputs[precision], refs, tokenize=args.bleu_tokenize)
            same = sum(a == b for a, b in zip(outputs[precision], outputs["fp32"]))
            row = {
                "model": args.model,
                "beam": beam,
                "precision": precision,
                "bleu": round(scores["bleu"], 2),
                "chrf": round(scores["chrf"], 2),
                "identical_to_fp32": same,
                "n": len(sources),
                "seconds": round(seconds[precision], 2),
            }
            if args.latency:
                times = sorted(latency[precision])
                row["latency_ms_median"] = round(times[len(times) // 2] * 1e3, 1)
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(f"\n{args.model}, {args.dataset} {args.pair} {args.split}, torch threads {torch.get_num_threads()}")
    print("| search | precision | BLEU | chrF | identical to fp32 | time | ms per sentence, one per call |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for r in rows:
        search = "greedy" if r["beam"] == 1 else f"beam {r['beam']}"
        ms = r.get("latency_ms_median", "")
        print(
            f"| {search} | {r['precision']} | {r['bleu']:.1f} | {r['chrf']:.1f} | {r['identical_to_fp32']} / {r['n']}"
            f" | {r['seconds']:.1f} s | {ms} |"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
