"""Data-parallel training with torchrun, 2 processes on loopback (gloo): N processes compute what one process with N
times the accumulation computes; a killed 2-process run resumes bitwise, also on 1 process; a failing rank ends the
run. Every launch is a real ``torchrun`` (``python -m torch.distributed.run``) of real attnkit code."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

WORKER = Path(__file__).with_name("worker.py")
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}  # the same thread count in every process: the same float reductions
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node"]


def launch(processes: int, *argv: str, **kwargs) -> subprocess.Popen:
    """``torchrun --standalone --nproc-per-node N ARGV`` (N > 1), or ``python ARGV`` for one process."""
    prefix = [*TORCHRUN, str(processes)] if processes > 1 else [sys.executable]
    return subprocess.Popen(
        [*prefix, *argv], env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs
    )


def finish(proc: subprocess.Popen, timeout: float = 300) -> str:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err
    return out


# ---------------------------------------------------------------------------------------------------------------
# 2 processes == 1 process with twice the accumulation, for both tasks, with dropout


@pytest.fixture(scope="module")
def worker_runs(tmp_path_factory) -> dict[str, Path]:
    """The worker (tiny classifier and translator, SGD and Adam, dropout 0.1, 10 steps) on 2 processes with
    accum_steps=1, on 1 process with accum_steps=2, and on 1 process with accum_steps=1 (a different computation)."""
    root = tmp_path_factory.mktemp("worker")
    runs = {"2x1": (2, 1), "1x2": (1, 2), "1x1": (1, 1)}
    for name, (processes, accum) in runs.items():
        finish(launch(processes, str(WORKER), str(root / name), str(accum)))
    return {name: root / name for name in runs}


def by_kind(tensors: dict[str, torch.Tensor], key: str, kind: str) -> dict[str, torch.Tensor]:
    prefix = f"{key}.{kind}."
    return {name[len(prefix) :]: t for name, t in tensors.items() if name.startswith(prefix)}


def max_relative_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys() and a
    return max(((a[k] - b[k]).abs().max() / b[k].abs().max().clamp_min(1e-30)).item() for k in a)


@pytest.mark.parametrize("task", ["classify", "translate"])
def test_two_processes_equal_one_process_with_twice_the_accumulation(worker_runs, task):
    two, one, other = (load_file(str(worker_runs[name] / "rank0.safetensors")) for name in ("2x1", "1x2", "1x1"))
    # The summed gradients of step 1 (SGD run), relative to each tensor's largest entry.
    grads_two, grads_one = by_kind(two, f"{task}.sgd", "grad"), by_kind(one, f"{task}.sgd", "grad")
    assert all(g.abs().max() > 0 for g in grads_one.values()), "a parameter got no gradient: the test would be empty"
    assert max_relative_difference(grads_two, grads_one) <= 1e-5
    # SGD parameters after 10 steps.
    params_two, params_one = by_kind(two, f"{task}.sgd", "param"), by_kind(one, f"{task}.sgd", "param")
    assert max_relative_difference(params_two, params_one) <= 1e-5
    # Adam loss curves.
    losses = {name: json.loads((worker_runs[name] / "losses.json").read_text()) for name in worker_runs}
    curve_two, curve_one = losses["2x1"][f"{task}.adam"], losses["1x2"][f"{task}.adam"]
    assert len(curve_two) == len(curve_one) == 10
    assert max(abs(a - b) / abs(b) for a, b in zip(curve_two, curve_one)) <= 1e-4
    # The comparison can fail: one process without the accumulation trains on other batches.
    assert max_relative_difference(by_kind(other, f"{task}.sgd", "param"), params_one) > 1e-3
    assert losses["1x1"][f"{task}.adam"][1:] != curve_one[1:]


def test_every_rank_holds_the_same_weights(worker_runs):
    rank0, rank1 = (load_file(str(worker_runs["2x1"] / f"rank{r}.safetensors")) for r in (0, 1))
    params = [name for name in rank0 if ".param." in name]
    assert params and all(torch.equal(rank0[name], rank1[name]) for name in params)


def test_only_rank_0_writes_the_run(worker_runs):
    run = worker_runs["2x1"] / "classify.adam"
    single = worker_runs["1x2"] / "classify.adam"
    assert sorted(p.name for p in run.iterdir()) == sorted(p.name for p in single.iterdir())
    assert (run / "metrics.jsonl").read_bytes() == (single / "metrics.jsonl").read_bytes()


# ---------------------------------------------------------------------------------------------------------------
# torchrun through the command line: kill and resume, another world size, a failing rank


def classify_command(tmp_path: Path, out: Path, *extra: str) -> list[str]:
    return [
        "-m",
        "attnkit",
        "classify",
        "train",
        "--train",
        str(tmp_path / "train.tsv"),
        "--valid",
        str(tmp_path / "valid.tsv"),
        "--out",
        str(out),
        "--quiet",
        *extra,
    ]


SETTINGS = ["--epochs", "4", "--seed", "3", "--set", "d_model=32", "n_heads=2", "d_ff=64", "n_layers=1"]
SETTINGS += ["batch_size=16", "checkpoint_every=5", "min_freq=1", "patience=0", "dropout=0.1"]


def step_rows(metrics: Path) -> int:
    return sum('"loss"' in line for line in metrics.read_text().splitlines()) if metrics.is_file() else 0


def kill_after_steps(processes: int, argv: list[str], metrics: Path, steps: int) -> None:
    """Start a run and SIGKILL torchrun and its workers (the whole process group) once ``steps`` steps are logged."""
    proc = launch(processes, *argv, start_new_session=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None and step_rows(metrics) < steps:
        time.sleep(0.01)
    assert proc.poll() is None, "the run finished before it could be killed; make it longer"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()


@pytest.mark.slow
def test_a_killed_two_process_run_resumes_bitwise_and_also_on_one_process(tmp_path, sentiment_file, same_run):
    rng = random.Random(1)
    sentiment_file(tmp_path / "train.tsv", 400, rng)
    sentiment_file(tmp_path / "valid.tsv", 60, rng)
    out = finish(launch(2, *classify_command(tmp_path, tmp_path / "alone", *SETTINGS)))
    assert len(out.strip().splitlines()) == 1, "rank 0 alone prints the summary"
    kill_at = random.Random(13).randint(3, 40)  # 13 steps an epoch (25 batches, 2 a step), 52 in all; seeded
    print(f"killing the 2-process run after step {kill_at}")
    killed = tmp_path / "killed"
    kill_after_steps(2, classify_command(tmp_path, killed, *SETTINGS), killed / "metrics.jsonl", kill_at)
    shutil.copytree(killed, tmp_path / "on_one")

    finish(launch(2, *classify_command(tmp_path, killed, "--resume")))
    same_run(tmp_path / "alone", killed)

    # The same checkpoint on 1 process: it accumulates both batches of each step itself and continues the curve.
    proc = launch(1, *classify_command(tmp_path, tmp_path / "on_one", "--resume"))
    finish(proc)
    alone = [row for row in map(json.loads, (tmp_path / "alone" / "metrics.jsonl").open()) if "loss" in row]
    on_one = [row for row in map(json.loads, (tmp_path / "on_one" / "metrics.jsonl").open()) if "loss" in row]
    assert [row["step"] for row in on_one] == [row["step"] for row in alone]
    assert max(abs(a["loss"] - b["loss"]) / b["loss"] for a, b in zip(on_one, alone)) <= 1e-5
    weights_alone = load_file(str(tmp_path / "alone" / "model.safetensors"))
    weights_one = load_file(str(tmp_path / "on_one" / "model.safetensors"))
    assert max_relative_difference(weights_one, weights_alone) <= 1e-5


def test_resuming_on_a_process_count_that_does_not_share_the_step_is_refused(tmp_path, sentiment_file):
    rng = random.Random(2)
    sentiment_file(tmp_path / "train.tsv", 150, rng)
    sentiment_file(tmp_path / "valid.tsv", 20, rng)
    tiny = ["--epochs", "1", "--set", "d_model=16", "n_heads=2", "d_ff=32", "n_layers=1", "batch_size=16"]
    finish(launch(1, *classify_command(tmp_path, tmp_path / "run", *tiny)))  # 1 batch per step
    proc = launch(2, *classify_command(tmp_path, tmp_path / "run", "--resume"))
    _, err = proc.communicate(timeout=300)
    assert proc.returncode != 0
    assert "error: this run takes 1 batches per optimizer step, which 2 processes cannot share evenly" in err


def worker_pids(parent: int) -> list[int]:
    """The processes whose parent is ``parent`` (torchrun's workers)."""
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == parent:
            children.append(int(stat.parent.name))
    return children


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds torchrun's workers through /proc")
def test_a_failing_rank_ends_the_run_instead_of_hanging(tmp_path, sentiment_file):
    rng = random.Random(3)
    sentiment_file(tmp_path / "train.tsv", 300, rng)
    sentiment_file(tmp_path / "valid.tsv", 20, rng)
    endless = ["--epochs", "10000", "--set", "d_model=16", "n_heads=2", "d_ff=32", "n_layers=1", "patience=0"]
    run = tmp_path / "run"
    proc = launch(2, *classify_command(tmp_path, run, *endless), start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and step_rows(run / "metrics.jsonl") < 3:
            time.sleep(0.05)
        workers = worker_pids(proc.pid)
        assert len(workers) == 2, f"expected torchrun's 2 workers, found {workers}"
        os.kill(workers[1], signal.SIGKILL)  # one rank dies in the middle of training
        _, err = proc.communicate(timeout=120)  # the other must not wait in a collective for ever
        assert proc.returncode != 0
        assert "ChildFailedError" in err or "failed" in err
        assert not [pid for pid in workers if Path(f"/proc/{pid}").exists() and _alive(pid)]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


# ---------------------------------------------------------------------------------------------------------------
# What every rank checks, and torchrun's environment without torchrun


def test_every_rank_refuses_a_precision_its_device_cannot_run(capsys):
    """Rank 0 alone used to check the precision: it refused fp16 on a CPU and left, while rank 1 went on into a
    barrier and died in gloo's 'Connection closed by peer' traceback. Every rank refuses; rank 0 alone notes."""
    import argparse

    from attnkit.cli.common import training_progress
    from attnkit.errors import InputError
    from attnkit.training.task import TrainContext

    for rank in (0, 1):
        context = TrainContext(torch.device("cpu"), rank=rank, world_size=2)
        with pytest.raises(InputError, match="config key precision=fp16 runs on CUDA devices only"):
            with training_progress(argparse.Namespace(quiet=True), context, "fp16"):
                pass


def test_a_rank_0_that_refuses_its_input_leaves_one_error_line_per_rank(tmp_path):
    """Rank 0 fetches a dataset (or takes --out's lock) while the others wait in a barrier; when it refused and
    ended, rank 1 died in gloo's 'Connection closed by peer' traceback below rank 0's error line."""
    argv = ["-m", "attnkit", "classify", "train", "--dataset", "no-such-recipe", "--out", str(tmp_path / "run")]
    proc = launch(2, *argv)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode != 0
    assert "error: unknown dataset recipe 'no-such-recipe'" in err
    assert "[rank1]" not in err, err


@pytest.mark.parametrize(
    "environment, message",
    [
        ({"WORLD_SIZE": "2"}, "WORLD_SIZE=2 is set in the environment but RANK, MASTER_ADDR, MASTER_PORT are not"),
        ({"WORLD_SIZE": "2", "RANK": "0"}, "WORLD_SIZE=2 is set in the environment but MASTER_ADDR, MASTER_PORT are"),
        ({"WORLD_SIZE": "two"}, "WORLD_SIZE='two' in the environment: expected a whole number of at least 1"),
        ({"WORLD_SIZE": "0"}, "WORLD_SIZE='0' in the environment: expected a whole number of at least 1"),
        (
            {"WORLD_SIZE": "2", "RANK": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"},
            r"RANK=2 in the environment is not one of WORLD_SIZE=2 ranks \(0 \.\. 1\)",
        ),
    ],
)
def test_torchruns_environment_without_torchrun_is_one_error(monkeypatch, environment, message):
    """WORLD_SIZE left in a shell used to be a KeyError traceback (no RANK) or torch's ValueError (no MASTER_ADDR)."""
    from attnkit.errors import InputError
    from attnkit.training.distributed import context_from_environment

    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(InputError, match=message):
        context_from_environment(torch.device("cpu"))
