"""A learning curve on RT polarity: test accuracy against the size of the training split, for any `classify train`
recipe. It tells whether a model is limited by its data (accuracy still rising as the split grows) or by itself
(flat), which is what the README's "what limits it" paragraphs ask of the from-scratch model and of MiniLM.

    attnkit data fetch rt-polarity && attnkit data fetch minilm
    python benchmarks/learning_curve.py --fractions 0.25 0.5 1 --seeds 0 1 2 --json curve.json -- --init-from minilm
    python benchmarks/learning_curve.py --json scratch.json -- --set dropout=0.3 label_smoothing=0.1 weight_decay=0.1

    python benchmarks/learning_curve.py --tfidf --json tfidf.json      # the TF-IDF baseline instead (scikit-learn)

Everything after `--` goes to `attnkit classify train` unchanged. The subsets are nested: the first n sentences of one
fixed shuffle of the training split (shuffle seed 0, independent of the training seeds), so a larger subset holds
every sentence of a smaller one. Each run validates (and so chooses its epoch) on the canonical validation split and
is scored on the canonical test split with `attnkit classify eval`, both in processes of their own, exactly as a user
runs them. Prints one line per run and a table of means; `--json FILE` writes every run and the table.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from attnkit.data.packages import default_cache_dir
from attnkit.data.readers.labeled import read_labeled


def attnkit(*args: str) -> dict:
    """Run one `attnkit` command; its stdout's last line is a JSON object (train's summary, eval's metrics)."""
    done = subprocess.run([sys.executable, "-m", "attnkit", *args], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"attnkit {' '.join(args)} failed ({done.returncode}):\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def tfidf_run(train: Path, splits: Path) -> dict:
    """The brief's baseline trained on the file ``train``: TF-IDF of word 1-2 grams + logistic regression, C chosen
    on the validation split; the files read as ``classify train`` reads them."""
    try:
        from sklearn.feature_extraction.text import TfidfVectorizer
        from sklearn.linear_model import LogisticRegression
    except ImportError:
        sys.exit("error: --tfidf needs scikit-learn (pip install scikit-learn)")
    (train_x, train_y), (valid_x, valid_y), (test_x, test_y) = (
        ([e.text for e in examples], [e.label for e in examples])
        for examples in map(read_labeled, (train, splits / "valid.tsv", splits / "test.tsv"))
    )
    vectorizer = TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True)
    features = vectorizer.fit_transform(train_x)
    best = None
    for c in (1.0, 3.0, 10.0, 30.0, 100.0, 300.0):
        model = LogisticRegression(C=c, max_iter=2000).fit(features, train_y)
        valid = model.score(vectorizer.transform(valid_x), valid_y)
        if best is None or valid > best[0]:
            best = (valid, c, model.score(vectorizer.transform(test_x), test_y))
    assert best is not None
    return {"valid": best[0], "test": best[2], "C": best[1]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fractions", type=float, nargs="+", default=[0.125, 0.25, 0.5, 1.0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--json", metavar="FILE", help="write every run and the table of means here")
    parser.add_argument("--tfidf", action="store_true", help="the TF-IDF + logistic regression baseline instead")
    parser.add_argument("train_args", nargs=argparse.REMAINDER, help="after --: arguments for `classify train`")
    args = parser.parse_args()
    train_args = args.train_args[1:] if args.train_args[:1] == ["--"] else args.train_args

    splits = default_cache_dir() / "rt-polarity"
    lines = (splits / "train.tsv").read_text(encoding="utf-8").splitlines(keepends=True)
    header, rows = lines[0], lines[1:]  # header: text<TAB>label
    random.Random(0).shuffle(rows)
    runs = []
    with tempfile.TemporaryDirectory(prefix="attnkit-curve-") as tmp:
        for fraction in args.fractions:
            n = round(fraction * len(rows))
            subset = Path(tmp) / f"train-{n}.tsv"
            subset.write_text(header + "".join(rows[:n]), encoding="utf-8")
            if args.tfidf:  # deterministic: one run per size
                run = {"fraction": fraction, "sentences": n, "seed": 0, **tfidf_run(subset, splits), "seconds": 0.0}
                runs.append(run)
                print(json.dumps(run), flush=True)
                continue
            for seed in args.seeds:
                out = Path(tmp) / f"run-{n}-{seed}"
                summary = attnkit(
                    "classify", "train", "--train", str(subset), "--valid", str(splits / "valid.tsv"),
                    "--out", str(out), "--seed", str(seed), "--quiet", *train_args,
                )  # fmt: skip
                evaluate = ("classify", "eval", "--model", str(out), "--dataset", "rt-polarity")
                scores = {split: attnkit(*evaluate, "--split", split) for split in ("valid", "test")}
                run = {
                    "fraction": fraction,
                    "sentences": n,
                    "seed": seed,
                    "valid": scores["valid"]["accuracy"],
                    "test": scores["test"]["accuracy"],
                    "best_epoch": summary["best_epoch"],
                    "seconds": summary["seconds"],
                }
                runs.append(run)
                print(json.dumps(run), flush=True)

    table = []
    for fraction in args.fractions:
        these = [run for run in runs if run["fraction"] == fraction]
        tests = [run["test"] for run in these]
        table.append(
            {
                "fraction": fraction,
                "sentences": these[0]["sentences"],
                "valid_mean": statistics.fmean(run["valid"] for run in these),
                "test_mean": statistics.fmean(tests),
                "test_min": min(tests),
                "test_max": max(tests),
                "seconds_mean": statistics.fmean(run["seconds"] for run in these),
            }
        )
    print("TF-IDF + logistic regression" if args.tfidf else f"classify train {' '.join(train_args)}")
    print(f"{'sentences':>9}  {'valid':>6}  {'test (min-max)':>20}  {'seconds':>7}")
    for row in table:
        print(
            f"{row['sentences']:>9,}  {row['valid_mean']:.3f}  {row['test_mean']:.3f} ({row['test_min']:.3f}-"
            f"{row['test_max']:.3f})  {row['seconds_mean']:>7.0f}"
        )
    if args.json:
        document = {"command": sys.argv, "train_args": train_args, "runs": runs, "table": table}
        Path(args.json).write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
