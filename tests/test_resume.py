"""Crash safety: a run killed with SIGKILL at a random step and resumed ends bitwise identical to the same run left
alone (same seed, same machine, same thread count). Also: the NaN guard names the module and keeps the checkpoint."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}  # the same thread count in every run: the same float reductions


def attnkit(*argv: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "attnkit.cli", *argv],
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


def run_to_end(*argv: str) -> None:
    proc = attnkit(*argv)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err


def kill_after_steps(argv: list[str], metrics: Path, steps: int) -> None:
    """Start a run and SIGKILL it once its metrics log has ``steps`` step rows (no chance to clean up)."""
    proc = attnkit(*argv)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if metrics.is_file() and sum('"loss"' in line for line in metrics.read_text().splitlines()) >= steps:
            break
        time.sleep(0.01)
    assert proc.poll() is None, "the run finished before it could be killed; make it longer"
    proc.send_signal(signal.SIGKILL)
    proc.wait()


@pytest.mark.slow
def test_classifier_killed_and_resumed_equals_uninterrupted(tmp_path, sentiment_file, same_run):
    rng = random.Random(1)
    sentiment_file(tmp_path / "train.tsv", 400, rng)
    sentiment_file(tmp_path / "valid.tsv", 60, rng)
    common = [
        "classify",
        "train",
        "--train",
        str(tmp_path / "train.tsv"),
        "--valid",
        str(tmp_path / "valid.tsv"),
        "--epochs",
        "4",
        "--seed",
        "3",
        "--quiet",
        "--set",
        "d_model=32",
        "n_heads=2",
        "d_ff=64",
        "n_layers=1",
        "batch_size=16",
        "checkpoint_every=7",
        "min_freq=1",
        "patience=0",
    ]
    run_to_end(*common, "--out", str(tmp_path / "alone"))
    kill_at = random.Random(11).randint(3, 90)  # 25 steps an epoch, 100 in all; seeded, so a failure reproduces
    print(f"killing the run after step {kill_at}")
    kill_after_steps([*common, "--out", str(tmp_path / "killed")], tmp_path / "killed" / "metrics.jsonl", kill_at)
    resume = [
        "classify",
        "train",
        "--train",
        str(tmp_path / "train.tsv"),
        "--valid",
        str(tmp_path / "valid.tsv"),
        "--out",
        str(tmp_path / "killed"),
        "--resume",
        "--quiet",
    ]
    run_to_end(*resume)
    same_run(tmp_path / "alone", tmp_path / "killed")


def write_reverse(path: Path, n: int, rng: random.Random) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(n):
            seq = [rng.choice("abcdefgh") for _ in range(rng.randint(1, 8))]
            f.write(" ".join(seq) + "\t" + " ".join(reversed(seq)) + "\n")


@pytest.mark.slow
def test_translator_killed_and_resumed_equals_uninterrupted(tmp_path, same_run):
    rng = random.Random(2)
    write_reverse(tmp_path / "train.tsv", 600, rng)
    write_reverse(tmp_path / "valid.tsv", 30, rng)
    common = [
        "translate",
        "train",
        "--train",
        str(tmp_path / "train.tsv"),
        "--valid",
        str(tmp_path / "valid.tsv"),
        "--max-steps",
        "60",
        "--max-tokens",
        "400",
        "--seed",
        "5",
        "--quiet",
        "--set",
        "d_model=32",
        "n_heads=2",
        "d_ff=64",
        "n_layers=1",
        "tokenizer=word",
        "min_freq=1",
        "checkpoint_every=6",
        "keep_last=3",
        "warmup_steps=10",
    ]
    run_to_end(*common, "--out", str(tmp_path / "alone"))
    kill_at = random.Random(12).randint(3, 55)  # seeded, so a failure reproduces
    print(f"killing the run after step {kill_at}")
    kill_after_steps([*common, "--out", str(tmp_path / "killed")], tmp_path / "killed" / "metrics.jsonl", kill_at)
    resume = [
        "translate",
        "train",
        "--train",
        str(tmp_path / "train.tsv"),
        "--valid",
        str(tmp_path / "valid.tsv"),
        "--out",
        str(tmp_path / "killed"),
        "--resume",
        "--quiet",
    ]
    run_to_end(*resume)
    same_run(tmp_path / "alone", tmp_path / "killed")
    alone = sorted(p.name for p in (tmp_path / "alone" / "checkpoints").iterdir())
    assert alone == sorted(p.name for p in (tmp_path / "killed" / "checkpoints").iterdir())
    for name in alone:
        assert (tmp_path / "alone" / "checkpoints" / name).read_bytes() == (
            tmp_path / "killed" / "checkpoints" / name
        ).read_bytes()


def test_resume_of_a_run_killed_before_its_directory_existed_starts_it(tmp_path, capsys, sentiment_file, same_run):
    from attnkit.cli import main

    sentiment_file(tmp_path / "train.tsv", 40, random.Random(0))
    argv = ["classify", "train", "--train", str(tmp_path / "train.tsv"), *TINY_CLASSIFIER]
    assert main([*argv, "--out", str(tmp_path / "alone")]) == 0
    assert main([*argv, "--out", str(tmp_path / "never" / "made"), "--resume"]) == 0, capsys.readouterr().err
    same_run(tmp_path / "alone", tmp_path / "never" / "made")


def test_nan_guard_stops_the_run_naming_the_module_and_keeps_the_checkpoint(
    tmp_path, capsys, monkeypatch, sentiment_file
):
    """A NaN injected into one FFN's output from epoch 2 on: the run stops at that step, names the module, and the
    best checkpoint of epoch 1 is left as it was."""
    import torch

    from attnkit.cli import main
    from attnkit.model.layers import PositionwiseFeedForward

    rng = random.Random(0)
    sentiment_file(tmp_path / "train.tsv", 64, rng)
    argv = [
        "classify",
        "train",
        "--train",
        str(tmp_path / "train.tsv"),
        "--out",
        str(tmp_path / "run"),
        "--quiet",
        "--epochs",
        "3",
        "--set",
        "d_model=16",
        "n_heads=2",
        "d_ff=32",
        "n_layers=2",
        "batch_size=16",
        "min_freq=1",
    ]
    calls = {"n": 0}
    original = PositionwiseFeedForward.forward

    def poisoned(self, x):
        out = original(self, x)
        if self.training and self is first_layer_ffn[0]:
            calls["n"] += 1
            if calls["n"] > 4:  # 4 training steps an epoch: epoch 1 is clean
                out = out + float("nan")
        return out

    first_layer_ffn: list = []
    real_init = PositionwiseFeedForward.__init__

    def remember(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        if len(first_layer_ffn) < 2:
            first_layer_ffn.append(self)
        if len(first_layer_ffn) == 2:  # the second layer's FFN is the one poisoned
            first_layer_ffn[:] = [first_layer_ffn[1]]

    monkeypatch.setattr(PositionwiseFeedForward, "__init__", remember)
    monkeypatch.setattr(PositionwiseFeedForward, "forward", poisoned)
    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1
    assert err[-1].startswith("error: step 5: non-finite loss"), err
    assert "encoder.layers.1.ffn" in err[-1]
    weights = tmp_path / "run" / "model.safetensors"
    from safetensors.torch import load_file

    state = load_file(str(weights))
    assert all(torch.isfinite(t).all() for t in state.values())  # the epoch-1 checkpoint, intact


# ---------------------------------------------------------------------------------------------------------------
# Resuming with the command's own flags, leftovers of a kill, a run killed before its first save

TINY_CLASSIFIER = [
    "--epochs",
    "2",
    "--seed",
    "1",
    "--quiet",
    "--set",
    "d_model=16",
    "n_heads=2",
    "d_ff=32",
    "n_layers=1",
    "min_freq=1",
]


def test_the_same_command_with_resume_appended_is_accepted(tmp_path, capsys, sentiment_file):
    from attnkit.cli import main

    sentiment_file(tmp_path / "train.tsv", 40, random.Random(0))
    argv = [
        "classify",
        "train",
        "--train",
        str(tmp_path / "train.tsv"),
        "--out",
        str(tmp_path / "run"),
        *TINY_CLASSIFIER,
    ]
    assert main(argv) == 0
    capsys.readouterr()
    assert main([*argv, "--resume"]) == 0, capsys.readouterr().err


@pytest.mark.parametrize(
    ("changed", "named"),
    [
        (["--seed", "2"], ["seed=2", "seed=1"]),
        (["--set", "d_model=32"], ["d_model=32", "d_model=16"]),
        (["--epochs", "1"], ["epochs=1", "epochs=2", "may grow, not shrink"]),
    ],
)
def test_resume_refuses_a_setting_that_differs_from_the_saved_one_naming_both_values(
    tmp_path, capsys, changed, named, sentiment_file
):
    from attnkit.cli import main

    sentiment_file(tmp_path / "train.tsv", 40, random.Random(0))
    argv = [
        "classify",
        "train",
        "--train",
        str(tmp_path / "train.tsv"),
        "--out",
        str(tmp_path / "run"),
        *TINY_CLASSIFIER,
    ]
    assert main(argv) == 0
    capsys.readouterr()
    assert main([*argv, *changed, "--resume"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("error: --resume") and all(value in line for value in named), line


TINY_TRANSLATOR = [
    "--max-steps",
    "12",
    "--max-tokens",
    "200",
    "--seed",
    "5",
    "--quiet",
    "--set",
    "d_model=16",
    "n_heads=2",
    "d_ff=32",
    "n_layers=1",
    "tokenizer=word",
    "min_freq=1",
    "checkpoint_every=4",
    "keep_last=2",
    "warmup_steps=3",
    "valid_bleu=false",
]


def test_resume_removes_leftover_temporary_files_and_starts_a_run_killed_before_its_first_save(tmp_path, same_run):
    """A run killed after writing its config and tokenizer but before its first save holds those two files (and
    perhaps half-written temporary ones): resuming it trains from the beginning, to the same bytes as a run left
    alone, and removes the leftovers."""
    from attnkit.cli import main

    rng = random.Random(3)
    write_reverse(tmp_path / "train.tsv", 120, rng)
    write_reverse(tmp_path / "valid.tsv", 10, rng)
    data = ["--train", str(tmp_path / "train.tsv"), "--valid", str(tmp_path / "valid.tsv")]
    assert main(["translate", "train", *data, "--out", str(tmp_path / "alone"), *TINY_TRANSLATOR]) == 0
    killed = tmp_path / "killed"
    assert main(["translate", "train", *data, "--out", str(killed), *TINY_TRANSLATOR]) == 0
    for name in ("train_state.safetensors", "model.safetensors", "manifest.json", "metrics.jsonl"):
        (killed / name).unlink()
    for checkpoint in (killed / "checkpoints").iterdir():
        checkpoint.unlink()
    leftovers = [
        killed / f".model.safetensors.{'a' * 32}.tmp",
        killed / "checkpoints" / f".step_4.safetensors.{'b' * 32}.tmp",
    ]
    for path in leftovers:
        path.write_bytes(b"half a file")
    assert main(["translate", "train", *data, "--out", str(killed), *TINY_TRANSLATOR, "--resume"]) == 0
    assert not any(path.exists() for path in leftovers)
    same_run(tmp_path / "alone", killed)
    assert sorted(p.name for p in (killed / "checkpoints").iterdir()) == ["step_12.safetensors", "step_8.safetensors"]


def test_a_run_stopped_part_way_says_so_when_it_predicts(tmp_path, capsys):
    """A run interrupted after its first save (a closed terminal, ``| head``) holds its best weights so far and looked
    finished: ``eval`` scored it silently (0.55 where the whole run gives 1.0). It now notes the stop on stderr, and
    says nothing once ``--resume`` has finished it. Interrupted after an evaluation had kept new weights and before
    the next save, it was refused as "changed or corrupted" (the manifest had the old weights' hash)."""
    import attnkit
    from attnkit.cli import main
    from attnkit.training.events import Evaluated

    examples = Path(__file__).resolve().parents[1] / "examples" / "seed000_train.tsv"
    run = tmp_path / "run"
    evaluations = []

    def interrupt_at_the_second_evaluation(event):  # the first one's save is on disk
        if isinstance(event, Evaluated):
            evaluations.append(event)
            if len(evaluations) == 2:
                raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        attnkit.train_classifier(
            attnkit.read_labeled(examples), out_dir=run, on_event=interrupt_at_the_second_evaluation
        )
    capsys.readouterr()
    evaluate = ["classify", "eval", "--model", str(run), "--data", str(examples)]
    assert main(evaluate) == 0
    assert capsys.readouterr().err == (
        f"note: {run} trained 4 of its 80 planned steps and was stopped (killed or interrupted): these are its best "
        "weights so far; the same train command with --resume finishes it\n"
    )
    assert main(["classify", "train", "--train", str(examples), "--out", str(run), "--resume", "--quiet"]) == 0
    capsys.readouterr()
    assert main(evaluate) == 0
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("batches", [1, 6])
def test_ctrl_c_during_training_says_what_the_run_directory_keeps(tmp_path, capsys, monkeypatch, batches):
    """Interrupted before its first save, a run keeps nothing to resume, and `error: interrupted` alone let the user
    think otherwise; interrupted later, the note names the step `--resume` continues from."""
    from attnkit.cli import main
    from attnkit.tasks.classify import ClassificationTask

    examples = Path(__file__).resolve().parents[1] / "examples" / "seed000_train.tsv"
    run = tmp_path / "run"
    collate, calls = ClassificationTask.collate, []

    def interrupt(self, indices):
        calls.append(indices)
        if len(calls) == batches:
            raise KeyboardInterrupt  # as a user's Ctrl-C would, in the middle of a step
        return collate(self, indices)

    monkeypatch.setattr(ClassificationTask, "collate", interrupt)
    assert main(["classify", "train", "--train", str(examples), "--out", str(run), "--quiet"]) == 130
    err = capsys.readouterr().err.splitlines()
    assert err[-2] == "error: interrupted"
    if batches == 1:
        assert err[-1] == (
            f"note: {run} holds nothing to resume: the run was stopped before its first save (every 500 steps and at "
            "each evaluation)"
        )
    else:  # 4 batches an epoch, each evaluated and saved
        assert err[-1] == (
            f"note: {run} keeps the run as saved at step 4 of 80: the same train command with --resume continues "
            "from there"
        )


def test_a_run_that_diverged_before_its_first_save_starts_again_under_the_resumed_commands_settings(tmp_path, capsys):
    """Nothing saved but its config: the error said "the last good checkpoint ... is kept" (there was none), and
    `--resume` then took the saved lr=1e30 and diverged again (and refused a smaller --max-steps as a smaller
    budget)."""
    from attnkit.cli import main

    examples = Path(__file__).resolve().parents[1] / "examples" / "seed000_train.tsv"
    run = tmp_path / "run"
    tiny = ["--set", "d_model=16", "n_heads=2", "d_ff=32", "n_layers=1", "min_freq=1"]
    train = ["classify", "train", "--train", str(examples), "--out", str(run), "--quiet", *tiny]
    assert main([*train, "lr=1e30", "warmup_steps=1", "--max-steps", "40"]) == 1
    err = capsys.readouterr().err
    assert f"Nothing was saved in {run} yet (--resume starts it again)" in err and "is kept" not in err
    assert main([*train, "--max-steps", "8", "--resume"]) == 0
    out, err = capsys.readouterr()
    assert f"warning: {run} holds no saved run to resume: training starts from the beginning" in err.splitlines()
    assert json.loads(out)["steps"] == 8
    assert json.loads((run / "config.json").read_text())["train"]["lr"] == 5e-4  # the command's, not the saved 1e30


def test_a_training_stopped_by_a_closed_pipe_does_not_exit_0(tmp_path):
    """`attnkit classify train ... 2>&1 | head -2`: the reader goes away, the training stops part-way, and it exited
    0, which a script reads as a finished run. It exits 141 (128 + SIGPIPE), as a tool killed by the pipe would."""
    examples = Path(__file__).resolve().parents[1] / "examples" / "seed000_train.tsv"
    argv = ["classify", "train", "--train", str(examples), "--out", str(tmp_path / "run")]
    proc = attnkit(*argv, "--set", "d_model=16", "n_heads=2", "d_ff=32", "n_layers=1", "epochs=200")
    assert proc.stderr is not None
    proc.stderr.readline()  # the data line: the run has started
    proc.stderr.close()
    assert proc.wait(timeout=300) == 141


def test_sigterm_during_training_says_what_the_run_directory_keeps(tmp_path, capsys, monkeypatch):
    """SIGTERM (a scheduler's preemption, ``kill``) ended a training with Python's silent exit 143: it is told as
    Ctrl-C is, with the note of what ``--resume`` continues from, and exits 143; the handler before is restored."""
    import os
    import signal

    from attnkit.cli import main
    from attnkit.tasks.classify import ClassificationTask

    examples = Path(__file__).resolve().parents[1] / "examples" / "seed000_train.tsv"
    run = tmp_path / "run"
    collate, calls = ClassificationTask.collate, []

    def terminate(self, indices):
        calls.append(indices)
        if len(calls) == 6:
            os.kill(os.getpid(), signal.SIGTERM)  # delivered to the main thread at its next bytecode
        return collate(self, indices)

    monkeypatch.setattr(ClassificationTask, "collate", terminate)
    before = signal.getsignal(signal.SIGTERM)
    assert main(["classify", "train", "--train", str(examples), "--out", str(run), "--quiet"]) == 143
    assert signal.getsignal(signal.SIGTERM) is before
    assert capsys.readouterr().err.splitlines()[-2:] == [
        "error: terminated",
        f"note: {run} keeps the run as saved at step 4 of 80: the same train command with --resume continues from "
        "there",
    ]


def test_resume_with_the_default_preset_is_refused_on_a_run_of_another_shape(tmp_path, capsys):
    """``--preset default`` stands for the default shape, though it sets no key: on a ``tiny-binary`` run it was
    silently ignored, while ``--preset tiny-binary`` on a default-shaped run was refused."""
    from attnkit.cli import main

    examples = str(Path(__file__).resolve().parents[1] / "examples" / "seed000_train.tsv")
    run = str(tmp_path / "run")
    train = ["classify", "train", "--train", examples, "--out", run, "--quiet", "--set", "min_freq=1"]
    assert main([*train, "--preset", "tiny-binary", "--max-steps", "2"]) == 0
    capsys.readouterr()
    assert main([*train, "--preset", "default", "--max-steps", "3", "--resume"]) == 2
    assert (
        capsys.readouterr()
        .err.splitlines()[-1]
        .startswith("error: --resume: d_model=128 differs from the run's saved d_model=32")
    )
    assert main([*train, "--preset", "tiny-binary", "--max-steps", "3", "--resume"]) == 0


def test_under_torchrun_only_rank_0_says_it_was_stopped(tmp_path, capsys, monkeypatch):
    """Ctrl-C and torchrun's SIGTERM reach every rank: each printed `error: terminated` and the note, and a rank
    stopped after rank 0 refused the command said the run could be continued with it."""
    from attnkit.cli import main
    from attnkit.tasks.classify import ClassificationTask

    def interrupt(self, indices):
        raise KeyboardInterrupt

    monkeypatch.setattr(ClassificationTask, "collate", interrupt)
    monkeypatch.setenv("RANK", "1")  # a rank's own number (no process group: the training itself runs alone)
    examples = str(Path(__file__).resolve().parents[1] / "examples" / "seed000_train.tsv")
    assert main(["classify", "train", "--train", examples, "--out", str(tmp_path / "run"), "--quiet"]) == 130
    assert "error:" not in capsys.readouterr().err


def test_a_lost_peer_is_one_error_line_and_the_note_not_a_gloo_traceback(tmp_path, capsys, monkeypatch):
    """Under torchrun, a rank killed mid-run made rank 0's next collective raise gloo's DistBackendError, printed as
    a 35-line traceback, without the note of what the run keeps."""
    from attnkit.cli import main
    from attnkit.tasks.classify import ClassificationTask
    from attnkit.training import distributed
    from attnkit.training.task import TrainContext

    collate, calls = ClassificationTask.collate, []

    def lose_the_peer(self, indices):
        calls.append(indices)
        if len(calls) == 6:  # after the first epoch's save
            raise RuntimeError(  # what gloo raises (not DistBackendError), as rank 0 met it when rank 1 was killed
                "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:37261: "
                "Connection reset by peer. This is typically caused by a remote worker hanging. GLHF!"
            )
        return collate(self, indices)

    monkeypatch.setattr(ClassificationTask, "collate", lose_the_peer)
    monkeypatch.setenv("WORLD_SIZE", "1")  # one process: the error is told as any other
    examples = str(Path(__file__).resolve().parents[1] / "examples" / "seed000_train.tsv")
    with pytest.raises(RuntimeError, match="Connection reset by peer"):
        main(["classify", "train", "--train", examples, "--out", str(tmp_path / "alone"), "--quiet"])
    calls.clear()
    monkeypatch.setattr(distributed, "context_from_environment", lambda device: TrainContext(device))  # rank 0 of 2
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    examples = str(Path(__file__).resolve().parents[1] / "examples" / "seed000_train.tsv")
    run = tmp_path / "run"
    assert main(["classify", "train", "--train", examples, "--out", str(run), "--quiet"]) == 1
    assert capsys.readouterr().err.splitlines()[-2:] == [
        "error: another process of this run ended or stopped answering (Read error [127.0.0.1]:37261: Connection "
        "reset by peer)",
        f"note: {run} keeps the run as saved at step 4 of 80: the same train command with --resume continues from "
        "there",
    ]


def test_a_run_being_trained_now_is_said_to_be_not_said_stopped(tmp_path):
    """``predict``, ``eval`` and the exports of a run whose training is going on said it "was stopped (killed or
    interrupted)" and told the user to --resume it; its lock file names a live process: it is being trained."""
    import json
    import os
    import socket
    import subprocess

    import attnkit
    from attnkit.training.events import Evaluated
    from attnkit.training.state import unfinished

    examples = Path(__file__).resolve().parents[1] / "examples" / "seed000_train.tsv"
    run = tmp_path / "run"

    evaluations = []

    def stop_after_the_first_save(event):  # at the second evaluation: the first one's save is on disk
        if isinstance(event, Evaluated):
            evaluations.append(event)
            if len(evaluations) == 2:
                raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        attnkit.train_classifier(attnkit.read_labeled(examples), out_dir=run, on_event=stop_after_the_first_save)
    assert "was stopped (killed or interrupted)" in (unfinished(run) or "")
    lock = {"pid": os.getpid(), "host": socket.gethostname(), "started": "2026-11-28 00:00:00"}
    (run / ".lock").write_text(json.dumps(lock), encoding="utf-8")  # as a training holding the lock writes it
    assert unfinished(run) == (
        f"{run} is being trained (process {os.getpid()} on {socket.gethostname()}, started 2026-11-28 00:00:00): "
        "these are its best weights as of step 4 of 80"
    )
    gone = subprocess.Popen(["true"])  # a process that has ended: the lock file a SIGKILL leaves names one
    gone.wait()
    (run / ".lock").write_text(json.dumps({**lock, "pid": gone.pid}), encoding="utf-8")
    assert "was stopped (killed or interrupted)" in (unfinished(run) or "")
