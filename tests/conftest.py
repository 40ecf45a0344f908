"""Shared fixtures. Every test starts from the same random state, so a failure reproduces exactly.

Also the boilerplate of tests that drive the command line or read runs: one torch thread for a module
(``one_thread``), running ``attnkit.cli.main`` quietly in a module fixture (``quietly``), the command lines that train
the tiny classifier and translator runs many tests start from (``tiny``), and a run directory written by hand from
a model and a tokenizer (``write_run``). Tests marked ``cuda`` are skipped on machines without a GPU.
"""

from __future__ import annotations

import dataclasses
import io
import random
from collections.abc import Callable
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Files that hold a ``slow`` test run first, each file's tests in their order: with pytest-xdist handing out
    whole files (``.ci/run``: ``-n 2 --dist loadfile``), the longest files start at once instead of last.

    Tests marked ``cuda`` need a GPU: skipped, saying why, where torch sees none (they run wherever one is lent)."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: item.path not in slow_files)  # stable: each file's tests stay together, in order
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA: torch.cuda.is_available() is False on this machine")
    for item in items:
        if item.get_closest_marker("cuda") is not None:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def seed():
    """Seed torch and random before each test (weights and inputs are drawn from them)."""
    torch.manual_seed(0)
    random.seed(0)


@pytest.fixture(scope="module")
def one_thread():
    """Torch on one intra-op thread for a whole module (``pytestmark = pytest.mark.usefixtures("one_thread")``):
    the tensors are tiny, and with the cores shared with other jobs, intra-op threads that wait for each other made
    such modules up to ten times slower. The previous thread count is restored after the module."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def run_quietly(*argv: str) -> None:
    """``attnkit.cli.main(argv)`` with stdout and stderr captured (usable where ``capsys`` is not: module fixtures);
    the command must succeed, and its stderr is the assertion message if it does not."""
    from attnkit.cli import main  # imported when a test runs a command, not when every test module is collected

    with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()) as err:
        code = main(list(argv))
    assert code == 0, err.getvalue()


@pytest.fixture(scope="session")
def quietly() -> Callable[..., None]:
    """``quietly(*argv)``: the command run with its output captured; it must exit 0 (stderr shown if not)."""
    return run_quietly


class TinyRuns:
    """Command lines that train the tiny runs many tests start from: a classifier on the 20 sentences of
    ``examples/seed000_train.tsv`` and a translator on four reversed word sequences, each trained in a second."""

    SEED_TSV = ROOT / "examples" / "seed000_train.tsv"
    # A model that trains in a second; min_freq=1 keeps every word of the tiny data in the vocabulary.
    SET = ("d_model=16", "n_heads=2", "d_ff=32", "n_layers=1", "min_freq=1")
    PAIRS_TSV = "source\ttarget\na b c\tc b a\nd e\te d\nf g h i\ti h g f\n"
    # The translator's settings for such data: a word tokenizer, no BLEU on validation, a checkpoint every step.
    TRANSLATE_SET = ("tokenizer=word", "valid_bleu=false", "checkpoint_every=1", "max_len=16")

    @classmethod
    def classify_train(cls, out: Path, *extra: str) -> list[str]:
        """``classify train`` of the tiny classifier into ``out``; ``extra``: more ``--set`` values or flags."""
        command = ["classify", "train", "--train", str(cls.SEED_TSV), "--out", str(out), "--quiet"]
        return [*command, "--set", *cls.SET, *extra]

    @classmethod
    def translate_train(cls, work: Path, out: Path, *extra: str) -> list[str]:
        """``translate train`` of the tiny translator into ``out`` (its pairs written to ``work/pairs.tsv``);
        ``extra``: more ``--set`` values or flags."""
        pairs = work / "pairs.tsv"
        pairs.write_text(cls.PAIRS_TSV, encoding="utf-8")
        command = ["translate", "train", "--train", str(pairs), "--out", str(out), "--quiet"]
        return [*command, "--set", *cls.SET, *cls.TRANSLATE_SET, *extra]


@pytest.fixture(scope="session")
def tiny() -> type[TinyRuns]:
    """The command lines of the tiny runs (``TinyRuns``)."""
    return TinyRuns


def write_run_dir(
    run_dir: Path,
    task: str,
    model: torch.nn.Module,
    cfg: Any,  # the model's config dataclass
    tokenizer,
    labels: list[str] | None = None,
    edit: Callable[[dict], None] = lambda config: None,
) -> Path:
    """A run directory at ``run_dir`` as the training entries write one (the current format), with the default
    training config and ``edit`` applied to the config before it is written; ``labels`` for a classifier."""
    from attnkit import runs
    from attnkit.config import TrainConfig

    run_dir.mkdir()
    config = {
        **runs.config_header(task),
        "model": dataclasses.asdict(cfg),
        "train": dataclasses.asdict(TrainConfig()),
        "tokenizer": tokenizer.meta(),
        "pad_id": tokenizer.pad_id,
    }
    edit(config)
    runs.atomic_write_json(run_dir / runs.CONFIG, config)
    if labels is not None:
        runs.atomic_write_json(run_dir / runs.LABELS, labels)
    tokenizer.save(run_dir / runs.TOKENIZER)
    runs.save_weights(run_dir, model)
    runs.write_manifest(run_dir)
    return run_dir


@pytest.fixture(scope="session")
def write_run() -> Callable[..., Path]:
    """``write_run(run_dir, task, model, cfg, tokenizer, labels=None, edit=...)``: a hand-built run directory."""
    return write_run_dir


def write_sentiment(path: Path, n: int, rng: random.Random) -> None:
    """A labelled TSV of ``n`` short synthetic reviews (filler words and one word of the label's polarity)."""
    good, bad = ["good", "great", "fine", "lovely"], ["bad", "awful", "poor", "dull"]
    filler = ["the", "film", "was", "plot", "and", "very", "quite", "a"]
    with open(path, "w", encoding="utf-8") as f:
        f.write("text\tlabel\n")
        for _ in range(n):
            label = rng.random() < 0.5
            words = rng.choices(filler, k=rng.randint(2, 10)) + [rng.choice(good if label else bad)]
            rng.shuffle(words)
            f.write(" ".join(words) + "\t" + ("pos" if label else "neg") + "\n")


@pytest.fixture(scope="session")
def sentiment_file() -> Callable[[Path, int, random.Random], None]:
    """``write_sentiment``, for the kill-and-resume tests of one process and of several."""
    return write_sentiment


def assert_same_run(a: Path, b: Path) -> None:
    for name in ("model.safetensors", "train_state.safetensors", "metrics.jsonl"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), f"{name} differs after resume"


@pytest.fixture(scope="session")
def same_run() -> Callable[[Path, Path], None]:
    """``assert_same_run``: weights, training state and metrics log of two runs are byte for byte the same."""
    return assert_same_run


@pytest.fixture(scope="session")
def replayed_step() -> type:
    """``training.graphs.GraphedStep`` with each recording standing in for itself: a "replay" runs the recorded work
    again (what a CUDA graph's replay computes), and warming up runs it once, so that a recorded step's bookkeeping
    (inputs, held gradients, scale, values, updates) runs on a CPU."""
    from attnkit.training.graphs import GraphedStep

    class Replayed(GraphedStep):
        def _warm_up(self, work):
            work()

        def _capture(self, work):
            return work

    return Replayed
