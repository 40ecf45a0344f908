"""`attnkit data prepare` in constant memory (issue 13): peak memory of a corpus 10x larger stays within 10% and
under 300 MB, and opening the prepared corpus (index checks, sizes) is fast.

The synthetic corpus is Bible-like: about 130 characters a side (the en-de Bible recipe has 29,790 pairs in 8 MB),
words drawn from a fixed vocabulary. The test compares the Bible's size (30k pairs) with 10x it (300k pairs); the
same comparison at 300k vs 3M pairs, measured by hand with ``python tests/data/test_prepare_scale.py 300000
3000000``, is reported in the notes (it takes minutes on 2 cores, too long for CI).
"""

import json
import random
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import attnkit

SRC_DIR = str(Path(attnkit.__file__).parents[1])
# The measured process is a grandchild: the wrapper's RUSAGE_CHILDREN is the peak of that one run, not of
# everything the test process has started.
WRAPPER = (
    "import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL); "
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
)


def write_corpus(path: Path, n_pairs: int, seed: int = 0) -> Path:
    """``n_pairs`` lines of ``source<TAB>target``: 4 to 44 words (24 on average) from 8,000 made-up words, drawn
    from pools of 20,000 sentences a side (so writing 3M lines takes seconds, not minutes)."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(rng.choices(letters, k=rng.randint(2, 9))) for _ in range(8000)]
    pools = [[" ".join(rng.choices(words, k=rng.randint(4, 44))) for _ in range(20000)] for _ in range(2)]
    lines = np.array([f"{s}\t{t}\n" for s, t in zip(*pools)] + [f"{t}\t{s}\n" for s, t in zip(*pools)], dtype=object)
    picker = np.random.default_rng(seed)
    with open(path, "w", encoding="utf-8") as f:
        f.write("source\ttarget\n")
        for start in range(0, n_pairs, 100_000):
            f.write("".join(lines[picker.integers(0, len(lines), min(100_000, n_pairs - start))]))
    return path


def prepare_peak_mb(corpus: Path, out: Path) -> float:
    """Peak resident memory (MB) of ``attnkit data prepare`` training a BPE tokenizer on ``corpus`` and writing it."""
    command = [
        sys.executable,
        "-m",
        "attnkit",
        "data",
        "prepare",
        "--task",
        "translate",
        "--train",
        str(corpus),
        "--vocab-size",
        "8000",
        "--out",
        str(out),
    ]
    done = subprocess.run(
        [sys.executable, "-c", WRAPPER, *command],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": SRC_DIR, "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    return int(done.stdout) / 1024  # ru_maxrss is in KiB on Linux


def open_seconds(out: Path) -> tuple[float, int]:
    """Seconds to open the prepared corpus in a fresh process and read every length (what batching needs)."""
    code = (
        "import sys, time; t = time.perf_counter(); from attnkit.data.prepared import open_prepared; "
        "s = open_prepared(sys.argv[1]).split('train'); n = int(s.src.sizes.sum() + s.tgt.sizes.sum()); "
        "print(time.perf_counter() - t, n)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(out)],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": SRC_DIR, "PATH": "/usr/bin:/bin"},
    )
    seconds, n_tokens = done.stdout.split()
    return float(seconds), int(n_tokens)


def measure(tmp: Path, small: int, large: int) -> dict:
    figures = {}
    for n in (small, large):
        corpus = write_corpus(tmp / f"corpus{n}.tsv", n)
        start = time.perf_counter()
        peak = prepare_peak_mb(corpus, tmp / f"prepared{n}")
        seconds = time.perf_counter() - start
        open_s, n_tokens = open_seconds(tmp / f"prepared{n}")
        sidecar = json.loads((tmp / f"prepared{n}" / "prepared.json").read_text())
        assert sidecar["splits"]["train"]["sequences"] == n
        tokens = sidecar["splits"]["train"]["tokens"]
        assert n_tokens == tokens["src"] + tokens["tgt"]
        figures[n] = {
            "peak_mb": round(peak, 1),
            "prepare_s": round(seconds, 1),
            "open_and_sizes_s": round(open_s, 3),
            "corpus_mb": round(corpus.stat().st_size / 2**20, 1),
            "tokens": n_tokens,
        }
        corpus.unlink()
    return figures


@pytest.mark.slow
def test_ten_times_the_corpus_in_the_same_memory_and_a_fast_start(tmp_path):
    figures = measure(tmp_path, 30_000, 300_000)
    small, large = figures[30_000], figures[300_000]
    assert large["tokens"] > 9 * small["tokens"]
    # Constant memory: an in-memory encoder's lists of Python ints would take ~36 bytes a token, ~1 GB here.
    assert large["peak_mb"] <= 1.10 * small["peak_mb"], figures
    assert large["peak_mb"] < 300, figures
    assert large["open_and_sizes_s"] < 5, figures


if __name__ == "__main__":  # by hand: python tests/data/test_prepare_scale.py 300000 3000000 [DIR]
    import tempfile

    small_n, large_n = int(sys.argv[1]), int(sys.argv[2])
    with tempfile.TemporaryDirectory(dir=sys.argv[3] if len(sys.argv) > 3 else None) as tmp:
        print(json.dumps(measure(Path(tmp), small_n, large_n), indent=2))
