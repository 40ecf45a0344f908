"""Training from a prepared corpus (``train --prepared DIR``, issue 13) is training from the text files: the same
tokenizer, the same batches, the same dropout masks, so bitwise the same weights, for both tasks. And a prepared
corpus of the wrong task, without the split asked for, or changed after preparation is refused with one error line.
"""

import json
import random

import pytest
import torch
from safetensors.torch import load_file

from attnkit.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")

WORDS = "the a cat dog sat ran on under mat house big small red blue quickly slowly and but".split()
# A tiny model with dropout on (so that the dropout masks, drawn per step, must be the same too), a few steps.
SET = ("d_model=16", "n_heads=2", "d_ff=32", "n_layers=1", "min_freq=1", "dropout=0.1", "seed=3")
TRANSLATE_SET = ("tokenizer=bpe", "vocab_size=300", "max_len=12", "max_tokens=120", "max_steps=6", "eval_every=3")
CLASSIFY_SET = ("batch_size=8", "bucket_factor=2", "max_len=10", "epochs=2")


def sentence(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 14)))


def write_tsv(path, header: str, rows: list[str]):
    path.write_text(header + "\n" + "".join(row + "\n" for row in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Parallel and labelled train/valid files (some sentences longer than max_len, so truncation is exercised)."""
    rng = random.Random(0)
    root = tmp_path_factory.mktemp("corpus")
    pairs = [f"{sentence(rng)}\t{sentence(rng)}" for _ in range(90)]
    texts = [f"{sentence(rng)}\t{rng.choice(['pos', 'neg', 'mixed'])}" for _ in range(90)]
    return {
        "translate": (
            write_tsv(root / "pairs.tsv", "source\ttarget", pairs[:75]),
            write_tsv(root / "pairs_valid.tsv", "source\ttarget", pairs[75:]),
        ),
        "classify": (
            write_tsv(root / "texts.tsv", "text\tlabel", texts[:75]),
            write_tsv(root / "texts_valid.tsv", "text\tlabel", texts[75:]),
        ),
    }


def train_command(task: str, out, *data) -> list[str]:
    settings = (*SET, *(TRANSLATE_SET if task == "translate" else CLASSIFY_SET))
    return [task, "train", *map(str, data), "--out", str(out), "--quiet", "--set", *settings]


def prepare(task: str, train, valid, out, tokenizer) -> None:
    command = ["data", "prepare", "--task", task, "--train", train, "--out", out, "--tokenizer", tokenizer]
    max_len = "12" if task == "translate" else "10"
    assert main([str(a) for a in [*command, *(["--valid", valid] if valid else []), "--max-len", max_len]]) == 0


@pytest.fixture(scope="module")
def trained(corpus, tmp_path_factory):
    """Per task: the run trained from text, the corpus prepared with that run's tokenizer, the run trained from it."""
    root = tmp_path_factory.mktemp("runs")
    out = {}
    for task, (train, valid) in corpus.items():
        text_run, prepared, prepared_run = root / f"{task}_text", root / f"{task}_prepared", root / f"{task}_run"
        assert main(train_command(task, text_run, "--train", train, "--valid", valid)) == 0
        prepare(task, train, valid, prepared, text_run)
        assert main(train_command(task, prepared_run, "--prepared", prepared)) == 0
        out[task] = (text_run, prepared, prepared_run)
    return out


@pytest.mark.parametrize("task", ["translate", "classify"])
def test_training_from_the_prepared_corpus_gives_bitwise_the_weights_of_training_from_text(trained, task):
    text_run, _, prepared_run = trained[task]
    for name in ("model.safetensors", "tokenizer.json"):
        assert (prepared_run / name).is_file()
    assert (text_run / "tokenizer.json").read_bytes() == (prepared_run / "tokenizer.json").read_bytes()
    text_weights = load_file(text_run / "model.safetensors")
    prepared_weights = load_file(prepared_run / "model.safetensors")
    assert text_weights.keys() == prepared_weights.keys()
    for key, value in text_weights.items():
        assert torch.equal(value, prepared_weights[key]), key
    # The runs did train (the weights moved from the seeded initialisation), and on the same batches (same losses).
    text_log = [json.loads(line) for line in (text_run / "metrics.jsonl").read_text().splitlines()]
    prepared_log = [json.loads(line) for line in (prepared_run / "metrics.jsonl").read_text().splitlines()]
    assert [row.get("loss") for row in text_log] == [row.get("loss") for row in prepared_log]
    assert [row.get("valid_loss") for row in text_log] == [row.get("valid_loss") for row in prepared_log]
    assert any("valid_loss" in row for row in prepared_log)
    assert len({row["loss"] for row in text_log if "loss" in row}) > 2


@pytest.mark.parametrize("task", ["translate", "classify"])
def test_a_prepared_run_interrupted_and_resumed_equals_the_uninterrupted_one(trained, task, tmp_path, monkeypatch):
    """Resume with --prepared: the data fingerprint comes from the sidecar's sha256s, and the run goes on from the
    saved batch of the epoch as if it had never stopped."""
    from attnkit.tasks.classify import ClassificationTask
    from attnkit.tasks.translate import TranslationTask

    _, prepared, uninterrupted = trained[task]
    cls = TranslationTask if task == "translate" else ClassificationTask
    collate, calls = cls.collate, []

    def crash_on_the_fifth_batch(self, indices):
        calls.append(indices)
        if len(calls) == 5:
            raise KeyboardInterrupt  # main() turns it into exit code 130, like a user's Ctrl-C
        return collate(self, indices)

    out = tmp_path / "run"
    command = [*train_command(task, out, "--prepared", prepared), "checkpoint_every=1"]
    monkeypatch.setattr(cls, "collate", crash_on_the_fifth_batch)
    assert main(command) == 130
    monkeypatch.setattr(cls, "collate", collate)
    assert (out / "train_state.safetensors").is_file()
    assert main([*command, "--resume"]) == 0
    resumed, expected = load_file(out / "model.safetensors"), load_file(uninterrupted / "model.safetensors")
    assert all(torch.equal(value, expected[key]) for key, value in resumed.items())


def test_resuming_a_prepared_run_on_the_text_files_is_refused(trained, corpus, capsys):
    """The text's fingerprint is not the corpus's: a resume on other data is not a resume."""
    _, _, prepared_run = trained["translate"]
    train, valid = corpus["translate"]
    command = [*train_command("translate", prepared_run, "--train", train, "--valid", valid), "--resume"]
    assert main(command) == 2
    last = capsys.readouterr().err.splitlines()[-1]  # after the progress's line about the data
    assert last.startswith("error: ") and "training data differs" in last, last


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err


@pytest.mark.parametrize("task", ["translate", "classify"])
def test_prepared_and_text_data_flags_together_are_refused_naming_them(trained, corpus, task, tmp_path, capsys):
    _, prepared, _ = trained[task]
    train, _ = corpus[task]
    command = train_command(task, tmp_path / "run", "--prepared", prepared, "--train", train)
    assert main(command) == 2
    err = one_error_line(capsys)
    assert "--prepared" in err and "--train" in err
    assert not (tmp_path / "run").exists()


def test_a_corpus_of_the_other_task_is_refused(trained, tmp_path, capsys):
    _, classify_corpus, _ = trained["classify"]
    assert main(train_command("translate", tmp_path / "run", "--prepared", classify_corpus)) == 2
    err = one_error_line(capsys)
    assert "prepared.json" in err and "a prepared classify corpus" in err and "--task translate" in err


@pytest.mark.parametrize("task", ["translate", "classify"])
def test_a_corpus_with_a_split_missing_is_refused_naming_the_file(trained, task, tmp_path, capsys):
    import shutil

    _, prepared, _ = trained[task]
    copy = tmp_path / "corpus"
    shutil.copytree(prepared, copy)
    missing = copy / ("valid.tgt.idx" if task == "translate" else "valid.labels.npy")
    missing.unlink()
    assert main(train_command(task, tmp_path / "run", "--prepared", copy)) == 2
    assert str(missing) in one_error_line(capsys)


@pytest.mark.parametrize("task", ["translate", "classify"])
def test_a_corpus_whose_files_changed_size_is_refused(trained, task, tmp_path, capsys):
    """A .bin cut short (a copy that did not finish), and a .bin and .idx swapped for those of another split."""
    import shutil

    _, prepared, _ = trained[task]
    part = "src" if task == "translate" else "text"
    copy = tmp_path / "corpus"
    shutil.copytree(prepared, copy)
    data = copy / f"train.{part}.bin"
    data.write_bytes(data.read_bytes()[:-2])
    assert main(train_command(task, tmp_path / "run", "--prepared", copy)) == 2
    assert str(data) in one_error_line(capsys)
    for suffix in ("bin", "idx"):  # the valid split's files under the train split's names: fewer sequences
        shutil.copy(copy / f"valid.{part}.{suffix}", copy / f"train.{part}.{suffix}")
    assert main(train_command(task, tmp_path / "run2", "--prepared", copy)) == 2
    assert "records" in one_error_line(capsys)


@pytest.mark.parametrize("task", ["translate", "classify"])
def test_batching_reads_no_sentence_and_a_batch_reads_only_its_own(trained, task, monkeypatch):
    """Start-up (both calls for batches the loop makes) reads lengths from the index only; collating a batch reads
    exactly its sentences from the memory map, so each rank of a distributed run reads only its micro-batches."""
    from attnkit.config import ClassifierTrainConfig, TranslatorTrainConfig
    from attnkit.data.indexed import IndexedTokens
    from attnkit.data.prepared import open_prepared
    from attnkit.tasks.classify import ClassificationTask
    from attnkit.tasks.classify.data import prepared_examples
    from attnkit.tasks.translate import TranslationTask
    from attnkit.tasks.translate.train import _prepared_data

    _, prepared, _ = trained[task]
    corpus = open_prepared(prepared)
    read: list[tuple[str, int]] = []
    getitem = IndexedTokens.__getitem__
    monkeypatch.setattr(
        IndexedTokens, "__getitem__", lambda self, i: read.append((self.prefix.name, i)) or getitem(self, i)
    )
    task_: TranslationTask | ClassificationTask
    if task == "translate":
        data = _prepared_data(corpus, corpus.tokenizer)
        read.clear()  # the valid split is read whole, into lists
        task_ = TranslationTask(
            data.train, None, [], corpus.tokenizer, TranslatorTrainConfig(max_tokens=120), 16, "", 12
        )
        parts = ["train.src", "train.tgt"]
    else:
        train_ids, train_y, _, _, _ = prepared_examples(corpus)
        read.clear()
        task_ = ClassificationTask(train_ids, train_y, [], [], 0, ClassifierTrainConfig(batch_size=8), 16, "")
        parts = ["train.text"]
    task_.epoch_batches(None)
    batches = task_.epoch_batches(torch.Generator().manual_seed(0))
    assert read == [] and len(batches) > 3
    task_.collate(batches[2])
    assert sorted(read) == sorted((part, i) for part in parts for i in batches[2])


def test_a_model_too_short_for_the_corpus_is_refused(trained, tmp_path, capsys):
    _, prepared, _ = trained["translate"]  # prepared with max_len 12; its longest pair fills it
    assert main([*train_command("translate", tmp_path / "run", "--prepared", prepared), "max_len=8"]) == 2
    err = one_error_line(capsys)
    assert "longest sequence has 12 tokens" in err and "max_len=8" in err


@pytest.mark.slow
@pytest.mark.parametrize("task", ["translate", "classify"])
def test_two_processes_from_the_prepared_corpus_equal_two_processes_from_text(trained, corpus, task, tmp_path):
    """torchrun, 2 processes on loopback: each rank collates only its own micro-batches from the memory maps, and
    the run equals the 2-process run from the text files bitwise."""
    import os
    import subprocess
    import sys

    text_run, prepared, _ = trained[task]
    train, valid = corpus[task]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "attnkit"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    runs = {}
    for name, data in (("text", ["--train", train, "--valid", valid]), ("prepared", ["--prepared", prepared])):
        runs[name] = tmp_path / name
        done = subprocess.run(
            [*torchrun, *train_command(task, runs[name], *data)], env=env, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr
    text_weights = load_file(runs["text"] / "model.safetensors")
    prepared_weights = load_file(runs["prepared"] / "model.safetensors")
    assert all(torch.equal(value, prepared_weights[key]) for key, value in text_weights.items())
    # and the 2-process runs are not the 1-process ones (2 batches a step): the comparison is of distributed runs
    assert not all(torch.equal(v, load_file(text_run / "model.safetensors")[k]) for k, v in text_weights.items())


def test_settings_that_contradict_the_corpus_are_refused(trained, tmp_path, capsys):
    """A prepared corpus brings its tokenizer: ``--set tokenizer=word`` beside a BPE corpus was ignored while the
    run's config.json said "word"; and a classify command given a translate corpus said "0 distinct labels"."""
    _, translate_corpus, _ = trained["translate"]
    command = train_command("translate", tmp_path / "run", "--prepared", translate_corpus)
    assert main([*command, "tokenizer=word"]) == 2
    err = one_error_line(capsys)
    assert f"{translate_corpus}: the corpus was prepared with a bpe tokenizer, not tokenizer=word" in err
    assert main(train_command("classify", tmp_path / "run", "--prepared", translate_corpus)) == 2
    err = one_error_line(capsys)
    assert "a prepared translate corpus; classify train needs one prepared with --task classify" in err
    assert not (tmp_path / "run").exists()


def test_a_classifier_prepared_without_a_valid_split_reports_no_validation_accuracy(trained, corpus, tmp_path, capsys):
    """Nothing validates it, so its summary's valid_accuracy is null (it read 0.0, as if every answer were wrong),
    as a translator's valid_bleu is."""
    text_run, _, _ = trained["classify"]
    train, _ = corpus["classify"]
    prepare("classify", train, None, tmp_path / "corpus", text_run)
    capsys.readouterr()
    assert main(train_command("classify", tmp_path / "run", "--prepared", tmp_path / "corpus")) == 0
    assert json.loads(capsys.readouterr().out)["valid_accuracy"] is None
