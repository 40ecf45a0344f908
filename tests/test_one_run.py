"""Runs that are one run: a training holds its directory's lock (a second training into it fails at once, naming the
first; the lock of a killed one is taken over), a finished translator continues to a larger budget, another starts
from its weights (``--init-from``), and progress written to a log is plain lines."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from attnkit.cli import main
from attnkit.training.schedules import plan

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def attnkit(*argv: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "attnkit", *argv], env=ENV, text=True, **kwargs)


def step_rows(run: Path) -> list[dict]:
    metrics = run / "metrics.jsonl"
    lines = metrics.read_text().splitlines() if metrics.is_file() else []
    return [row for row in map(json.loads, lines) if "loss" in row]


# ---------------------------------------------------------------------------------------------------------------
# The lock on --out


def test_a_second_training_into_the_same_directory_fails_at_once_naming_the_first(tmp_path, tiny, capsys):
    run = tmp_path / "run"
    first = attnkit(*tiny.classify_train(run, "--epochs", "10000"), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not step_rows(run):
            assert first.poll() is None, first.communicate()[1]
            time.sleep(0.05)
        started = time.monotonic()
        assert main(tiny.classify_train(run, "--epochs", "1")) == 2
        assert time.monotonic() - started < 10  # at once: not after reading data or training a tokenizer
        (line,) = capsys.readouterr().err.splitlines()
        assert line.startswith(f"error: {run}: another training is writing this run directory (process {first.pid} ")
        assert first.poll() is None, "the first training goes on"

        first.send_signal(signal.SIGKILL)  # no chance to release anything: the lock file stays behind
        first.wait()
        assert (run / ".lock").is_file()
        assert main(tiny.classify_train(run, "--epochs", "1")) == 0  # a new run over the killed one
        err = capsys.readouterr().err
        assert f"note: {run}: taking over the lock left by process {first.pid} " in err
        assert not (run / ".lock").exists()
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()


def test_a_training_refused_before_it_wrote_anything_leaves_no_directory(tmp_path, tiny):
    assert main(tiny.classify_train(tmp_path / "new" / "run", "--set", "lr=nan")) == 2
    assert not (tmp_path / "new" / "run").exists()


# ---------------------------------------------------------------------------------------------------------------
# Continuing a finished translator, and starting another from its weights


def translator_argv(tiny, work: Path, run: Path, *extra: str) -> list[str]:
    """The tiny translator, saving every 20 steps, validated on its training pairs."""
    return tiny.translate_train(work, run, "checkpoint_every=20", "--valid", str(work / "pairs.tsv"), *extra)


@pytest.fixture(scope="module")
def translator(tmp_path_factory, tiny, quietly) -> Path:
    """The tiny translator trained for 40 steps."""
    work = tmp_path_factory.mktemp("translator")
    quietly(*translator_argv(tiny, work, work / "mt", "--max-steps", "40"))
    return work / "mt"


def test_a_finished_translator_continues_to_a_larger_budget_with_its_schedule_planned_again(
    translator, tmp_path, tiny, capsys
):
    run = tmp_path / "mt"
    shutil.copytree(translator, run)
    before = step_rows(run)
    assert [row["step"] for row in before] == list(range(1, 41))
    argv = translator_argv(tiny, tmp_path, run, "--resume")

    assert main([*argv, "--max-steps", "60"]) == 0
    out, err = capsys.readouterr()
    assert "warning: the budget changed from 40 to 60 steps: the learning-rate schedule (linear" in err
    assert json.loads(out)["steps"] == 60
    rows = step_rows(run)
    assert rows[:40] == before and [row["step"] for row in rows[40:]] == list(range(41, 61))
    config = json.loads((run / "config.json").read_text())
    assert config["train"]["max_steps"] == 60
    from attnkit.config import TranslatorTrainConfig

    schedule, _ = plan(TranslatorTrainConfig(**config["train"]), 1, config["model"]["d_model"])
    assert [row["lr"] for row in rows[40:]] == pytest.approx([schedule.lr(step) for step in range(41, 61)])
    assert rows[40]["lr"] > 0 == before[-1]["lr"]  # the old plan had decayed to 0 at its last step

    # The run is whole: its files check, it translates, and the same budget again has nothing left to do.
    assert main(["translate", "eval", "--model", str(run), "--data", str(tmp_path / "pairs.tsv"), "--beam", "1"]) == 0
    capsys.readouterr()
    assert main([*argv, "--max-steps", "60"]) == 0
    assert "nothing to train" in capsys.readouterr().err
    assert main([*argv, "--max-steps", "50"]) == 2
    assert "may grow, not shrink" in capsys.readouterr().err


def test_a_translator_starts_from_another_ones_weights_with_a_new_optimizer(translator, tmp_path, tiny, capsys):
    run = tmp_path / "warm"
    pairs = tmp_path / "pairs.tsv"
    argv = ["translate", "train", "--train", str(pairs), "--out", str(run), "--max-steps", "1", "--quiet"]
    pairs.write_text(tiny.PAIRS_TSV, encoding="utf-8")
    # A learning rate too small to move anything: after one step the weights are still the source's.
    assert main([*argv, "--init-from", str(translator), "--set", "lr=1e-12", "valid_bleu=false", "dropout=0.2"]) == 0
    capsys.readouterr()
    source, warm = load_file(str(translator / "model.safetensors")), load_file(str(run / "model.safetensors"))
    assert source.keys() == warm.keys()
    assert all((source[name] - warm[name]).abs().max() < 1e-6 for name in source)
    config, source_config = (json.loads((path / "config.json").read_text()) for path in (run, translator))
    assert config["init_from"] == str(translator)
    assert config["model"] == {**source_config["model"], "dropout": 0.2}
    assert config["tokenizer"]["fingerprint"] == source_config["tokenizer"]["fingerprint"]
    assert [row["step"] for row in step_rows(run)] == [1]  # a new optimizer and schedule: step 1, not 41

    # Trained from scratch with the same settings instead, one step leaves it far from the source's weights.
    assert main([*argv, "--out", str(tmp_path / "cold"), "--set", "lr=1e-12", "valid_bleu=false", *tiny.SET]) == 0
    capsys.readouterr()
    cold = load_file(str(tmp_path / "cold" / "model.safetensors"))
    assert any(
        cold[name].shape != source[name].shape or (cold[name] - source[name]).abs().max() > 1e-2 for name in source
    )


# ---------------------------------------------------------------------------------------------------------------
# Progress a log can hold


def test_progress_without_a_terminal_is_plain_lines(tmp_path, tiny):
    log = tmp_path / "log"
    argv = [arg for arg in tiny.classify_train(tmp_path / "run") if arg != "--quiet"]
    with open(log, "wb") as stderr:
        proc = attnkit(*argv, stdout=subprocess.DEVNULL, stderr=stderr, stdin=subprocess.DEVNULL)
        assert proc.wait(timeout=300) == 0
    text = log.read_bytes()
    assert b"\r" not in text and b"\x1b" not in text
    lines = text.decode().splitlines()
    progress = [line for line in lines if line.startswith("step ")]
    assert progress[0].startswith("step 8/80 (10%)  loss ") and progress[-1].startswith("step 80/80 (100%)  loss ")
    assert len(progress) == 10 and all(" lr " in line and line.endswith(" steps/s") for line in progress)


def test_the_plan_line_says_when_steps_are_replayed_from_cuda_graphs(capsys):
    """A run whose steps are replayed from CUDA graphs (the default for translate train on one GPU) says so in its
    plan line, which a run without them leaves as it was."""
    from attnkit.cli.progress import TrainingProgress
    from attnkit.training.events import Planned

    for graphed in (False, True):
        TrainingProgress(interactive=False)(Planned(100, 10, 10, "linear", 10, 0, graphed=graphed))
    plain, graphed_line = capsys.readouterr().err.splitlines()
    assert plain == "100 steps (10 an epoch), schedule linear with 10 warmup steps"
    assert graphed_line == plain + "; each step replayed from CUDA graphs, recorded once per batch shape"


def test_only_the_first_rank_reports(capsys):
    """Under torchrun every rank gets the same events; only rank 0's progress writes them (the others wrote the data
    line and warnings too, so a resumed 2-process run said each warning twice)."""
    from attnkit.cli.progress import TrainingProgress
    from attnkit.training.events import Warned

    for muted in (True, False):
        progress = TrainingProgress(quiet=False, interactive=False, muted=muted)
        progress(Warned("the run had already used its budget"))
        progress.close()
    assert capsys.readouterr().err.splitlines() == ["warning: the run had already used its budget"]


def test_only_the_first_rank_writes_progress_lines(capsys):
    """Without a terminal the steps are plain lines; under torchrun rank 1 wrote each of them too, so a 2-process
    run's log held every progress line twice."""
    from attnkit.cli.progress import TrainingProgress
    from attnkit.training.events import Planned, Step

    for muted in (True, False):
        progress = TrainingProgress(quiet=False, interactive=False, muted=muted)
        progress(Planned(2, 2, 2, "linear", 1, 0))
        for step in (1, 2):
            progress(Step(step, 2, 1, step / 2, 0.5, 1e-3, 8, {}, 0.5, {}))
        progress.close()
    lines = capsys.readouterr().err.splitlines()
    assert [line.split("  ")[0] for line in lines[1:]] == ["step 1/2 (50%)", "step 2/2 (100%)"]
    assert len(lines) == 3
