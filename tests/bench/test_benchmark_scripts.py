"""The measurement scripts in benchmarks/ run end to end, at their smallest, and print what the README quotes from
them (each in a process of its own, as a user runs it)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from attnkit.data.packages import default_cache_dir

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
RT = default_cache_dir() / "rt-polarity"


def run_script(name: str, *args: str) -> str:
    done = subprocess.run([sys.executable, str(BENCHMARKS / name), *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.mark.slow
def test_profile_classify_prints_the_floor_and_the_ratio_to_bert():
    pytest.importorskip("transformers")
    out = run_script("profile_classify.py", "--reps", "2", "--threads", "1", "--batch", "4", "--length", "16")
    assert "floor: products + attention alone" in out and "BERT / floor = " in out and "malloc: " in out


@pytest.mark.slow
def test_profile_train_splits_both_steps_by_category():
    pytest.importorskip("transformers")
    out = run_script("profile_train.py", "--threads", "1", "--tokens", "512")  # the script's logic, not its figures
    assert "matrix multiplication" in out and "wall (profiled)" in out
    assert "attnkit" in out and "transformers" in out


@pytest.mark.slow
@pytest.mark.skipif(
    not (RT / "train.tsv").is_file(), reason="RT polarity is not cached (`attnkit data fetch rt-polarity`)"
)
def test_learning_curve_trains_on_nested_subsets_and_writes_every_run(tmp_path):
    out_json = tmp_path / "curve.json"
    out = run_script(
        "learning_curve.py", "--fractions", "0.02", "0.04", "--seeds", "0", "--json", str(out_json),
        "--", "--epochs", "1", "--set", "d_model=16", "n_heads=2", "d_ff=32", "n_layers=1",
    )  # fmt: skip
    document = json.loads(out_json.read_text())
    assert [run["sentences"] for run in document["runs"]] == [169, 338]
    assert all(0.0 <= run["test"] <= 1.0 and 0.0 <= run["valid"] <= 1.0 for run in document["runs"])
    assert [row["sentences"] for row in document["table"]] == [169, 338] and "338" in out


@pytest.mark.skipif(
    not (RT / "train.tsv").is_file(), reason="RT polarity is not cached (`attnkit data fetch rt-polarity`)"
)
def test_learning_curve_reports_a_failed_training_with_its_error():
    script = str(BENCHMARKS / "learning_curve.py")
    done = subprocess.run(
        [sys.executable, script, "--fractions", "0.02", "--seeds", "0", "--", "--set", "nosuch=1"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode != 0 and "unknown config key 'nosuch'" in done.stderr


@pytest.mark.skipif(
    not (RT / "train.tsv").is_file(), reason="RT polarity is not cached (`attnkit data fetch rt-polarity`)"
)
def test_learning_curve_tfidf_baseline_scores_every_size(tmp_path):
    pytest.importorskip("sklearn")
    out_json = tmp_path / "tfidf.json"
    run_script("learning_curve.py", "--tfidf", "--fractions", "0.05", "0.1", "--json", str(out_json))
    runs = json.loads(out_json.read_text())["runs"]
    assert [run["sentences"] for run in runs] == [423, 846]
    assert all(0.55 < run["test"] < 1.0 and run["C"] > 0 for run in runs)  # above chance (0.5) at 423 sentences


@pytest.mark.slow
def test_the_gpu_check_runs_the_bible_recipe_from_carried_data_and_summarises_it(tmp_path):
    """benchmarks/gpu_check.py at its smallest on a CPU (``--device cpu``), on a Bible of a few verses in a folder
    shaped like attnkit's cache (what a machine without network is given): the recipe trains, John is scored, the
    trained translator is served and timed with one client, and the figures land in the output folder."""
    data = tmp_path / "data" / "bible" / "en-de"
    data.mkdir(parents=True)
    verses = [f"In the beginning {i} was the Word.\tIm Anfang {i} war das Wort." for i in range(12)]
    for split, lines in (("train", verses), ("valid", verses[:3]), ("test", verses[3:6])):
        (data / f"{split}.tsv").write_text("source\ttarget\n" + "\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    printed = run_script(
        "gpu_check.py", str(out), "--device", "cpu", "--parts", "bible", "serve", "--data", str(tmp_path / "data")
    )
    assert "steps in" in printed and "John, beam 1: BLEU" in printed
    assert re.search(r"serve     beam 1, one client, .*: p50 [\d.]+ ms, .*errors none\); the library alone", printed)
    assert sorted(p.name for p in out.iterdir()) == [
        "bible_eval.json", "bible_metrics.jsonl", "check.log", "gpu.txt", "summary.txt",
    ]  # fmt: skip
    assert json.loads((out / "bible_eval.json").read_text())["bleu"] >= 0


def test_the_gpu_check_ends_with_its_summary_when_its_minutes_are_spent(tmp_path):
    """A lent machine runs one command for at most 10 minutes: past ``--minutes`` every part left is skipped, said
    in the summary, and the check ends with exit 0 and its files (the parts' output files empty)."""
    out = tmp_path / "out"
    printed = run_script("gpu_check.py", str(out), "--device", "cpu", "--minutes", "0", "--parts", "train", "tests")
    assert printed.splitlines() == [
        "train     skipped (the check's --minutes spent)      0 s",
        "tests     skipped (the check's --minutes spent)      0 s  (no output)",
    ]
    assert sorted(p.name for p in out.iterdir()) == [
        "bench_train.jsonl",
        "check.log",
        "gpu.txt",
        "summary.txt",
        "tests.txt",
    ]


def test_the_gpu_check_skips_the_bible_without_its_data(tmp_path):
    printed = run_script(
        "gpu_check.py", str(tmp_path / "out"), "--device", "cpu", "--parts", "bible", "--data", str(tmp_path)
    )
    assert "bible     skipped: no " in printed and "attnkit data fetch bible --pair en-de" in printed
