"""``attnkit classify`` end to end, in-process through ``attnkit.cli.main``: the seed-000 acceptance criterion (100%
training accuracy), predict's JSON lines, run directories that reload exactly, and one ``error:`` line with exit code
2 for every kind of bad input. One test runs the real console script, for the exit code and a traceback-free stderr."""

from __future__ import annotations

import io
import json
import random
import shutil
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
import torch

from attnkit import runs
from attnkit.cli import main
from attnkit.tasks.classify import ClassifierRun

SEED_TSV = Path(__file__).resolve().parents[1] / "examples" / "seed000_train.tsv"
LABELS = ["negative", "positive"]
# The default model (the seed-000 classifier: d_model 128, 4 heads, d_ff 512, 2 layers). Under 100 examples the
# training set is also the validation set, so the kept checkpoint is the first with 100% training accuracy.
TRAIN_ARGS = ["--epochs", "20", "--set", "min_freq=1", "patience=0", "lr=1e-3", "--quiet"]
# A model just big enough to have the structure a test looks at (head width, CLS position).
TINY_SET = ["d_model=16", "n_heads=2", "d_ff=32", "n_layers=1", "min_freq=1"]


def cli(capsys, *argv: object) -> tuple[int, str, str]:
    code = main([str(arg) for arg in argv])
    out, err = capsys.readouterr()
    return code, out, err


def error_line(capsys, *argv: object) -> str:
    """Run a command that must fail on bad input: exit code 2, nothing on stdout, exactly one ``error:`` line."""
    code, out, err = cli(capsys, *argv)
    assert code == 2, err
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def train_quietly(out: Path, *argv: str) -> dict:
    """``classify train`` outside a test's capsys (for module fixtures); returns its one-line JSON summary."""
    stdout, stderr = io.StringIO(), io.StringIO()
    with redirect_stdout(stdout), redirect_stderr(stderr):
        code = main(["classify", "train", "--out", str(out), *argv])
    assert code == 0, stderr.getvalue()
    (line,) = stdout.getvalue().splitlines()
    return json.loads(line)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Models this small spend more on intra-op threading than they gain, most of all on shared cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def seed_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("seed000") / "run"
    summary = train_quietly(out, "--train", str(SEED_TSV), *TRAIN_ARGS)
    assert summary["run_dir"] == str(out)
    assert summary["epochs"] == 20  # patience=0: no early stop
    return out


def predictions(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines()]


def check_prediction(pred: dict, text: str) -> None:
    assert set(pred) == {"text", "label", "probs", "unknown"}
    assert pred["text"] == text
    assert set(pred["probs"]) == set(LABELS)
    # Each printed probability is rounded to 6 decimals, so their sum is 1 within half a unit of the 6th decimal per
    # class (and the float32 softmax's own error).
    assert sum(pred["probs"].values()) == pytest.approx(1.0, abs=len(LABELS) * 5e-7 + 1e-7)
    assert pred["label"] == max(pred["probs"], key=pred["probs"].get)


# ---------------------------------------------------------------------------------------------------------------
# Train, eval, predict


def test_seed_sentences_are_learned_perfectly(seed_run, capsys):
    # The acceptance criterion: 100% accuracy on the 20 training sentences of reference note 000.
    code, out, _ = cli(capsys, "classify", "eval", "--model", seed_run, "--data", SEED_TSV)
    assert code == 0
    assert json.loads(out) == {"accuracy": 1.0, "macro_f1": 1.0, "n": 20}


def test_predict_prints_one_json_object_per_text(seed_run, capsys):
    texts = ["This movie was absolutely amazing", "Terrible, I hated it."]
    code, out, _ = cli(capsys, "classify", "predict", "--model", seed_run, *texts)
    assert code == 0
    preds = predictions(out)
    assert len(preds) == len(texts)
    for pred, text in zip(preds, texts):
        check_prediction(pred, text)


def test_predict_counts_the_tokens_outside_the_vocabulary(seed_run, capsys):
    # A word the vocabulary lacks is read as <unk>: the output says how many, instead of classifying silently.
    texts = ["This movie was amazing", "zyzzyva movie qwxz"]
    code, out, _ = cli(capsys, "classify", "predict", "--model", seed_run, *texts)
    assert code == 0
    assert [pred["unknown"] for pred in predictions(out)] == [0, 2]


def test_predict_reads_stdin_lines_skipping_blank_ones(seed_run, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("a wonderful film\n\n   \nawful and boring\r\n"))
    code, out, _ = cli(capsys, "classify", "predict", "--model", seed_run)
    assert code == 0
    preds = predictions(out)
    assert [p["text"] for p in preds] == ["a wonderful film", "awful and boring"]
    for pred in preds:
        check_prediction(pred, pred["text"])


def test_predict_and_eval_say_how_many_texts_were_truncated(seed_run, capsys, caplog, tmp_path):
    """A text longer than max_len (128 here) is read only as far as the model can: predict and eval say how many,
    in a ``note:`` line as training and translate do (they cut them silently), and stdout stays the JSON alone."""
    long_text = " ".join(["great"] * 200)
    code, out, err = cli(capsys, "classify", "predict", "--model", seed_run, long_text, "a short one")
    assert code == 0
    assert len(predictions(out)) == 2
    assert "1 of 2 texts truncated to 128 tokens" in caplog.text
    assert err == "note: 1 of 2 texts truncated to 128 tokens\n"  # a note, as translate run's (it was bare)
    caplog.clear()
    data = tmp_path / "long.tsv"
    data.write_text(f"text\tlabel\n{long_text}\tpositive\nawful\tnegative\n", encoding="utf-8")
    code, out, _ = cli(capsys, "classify", "eval", "--model", seed_run, "--data", data)
    assert code == 0
    assert json.loads(out)["n"] == 2
    assert "1 of 2 texts truncated to 128 tokens" in caplog.text


# ---------------------------------------------------------------------------------------------------------------
# The run directory


def test_run_loaded_twice_predicts_identically(seed_run):
    texts = ["great quality", "the worst purchase ever", "an unseen zyzzyva"]
    first, second = ClassifierRun(seed_run), ClassifierRun(seed_run)
    assert first.labels == second.labels == LABELS
    assert torch.equal(first.logits(texts), second.logits(texts))  # dropout is off after loading
    assert [p.probs for p in first.predict(texts)] == [p.probs for p in second.predict(texts)]


def test_run_directory_files(seed_run):
    names = {p.name for p in seed_run.iterdir()}
    expected = {"config.json", "model.safetensors", "tokenizer.json", "labels.json", "metrics.jsonl", "manifest.json"}
    assert expected <= names
    assert not [name for name in names if name.startswith(".")]  # no temporary files left behind
    assert json.loads((seed_run / "labels.json").read_text()) == LABELS
    assert json.loads((seed_run / "config.json").read_text())["task"] == "classify"
    manifest = json.loads((seed_run / "manifest.json").read_text())["sha256"]
    assert set(manifest) == {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "labels.json",
        "train_state.safetensors",
    }
    assert all(runs.sha256_file(seed_run / name) == digest for name, digest in manifest.items())


def test_metrics_log_has_step_and_epoch_rows(seed_run):
    rows = [json.loads(line) for line in (seed_run / "metrics.jsonl").read_text().splitlines()]
    steps = [row for row in rows if "loss" in row]
    epochs = [row for row in rows if "valid_accuracy" in row]
    assert len(steps) + len(epochs) == len(rows)
    assert [row["step"] for row in steps] == list(range(1, len(steps) + 1))
    assert [row["epoch"] for row in epochs] == list(range(1, 21))
    assert epochs[-1]["step"] == steps[-1]["step"]
    assert all(0.0 <= row["accuracy"] <= 1.0 and row["lr"] >= 0.0 for row in steps)
    # A step's accuracy is a count of its sentences (the step's sums and gradient norm come back in one read, in order).
    assert all(
        abs(row["accuracy"] * row["sentences"] - round(row["accuracy"] * row["sentences"])) < 1e-6 for row in steps
    )
    assert max(row["valid_accuracy"] for row in epochs) == 1.0
    assert sum(row["best"] for row in epochs) >= 1


# ---------------------------------------------------------------------------------------------------------------
# Configuration errors: exit 2, one line naming the key, and no run directory started


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("colour=red", "'colour'"),  # unknown key
        ("d_model=65", "d_model=65"),  # not divisible by the 4 heads
        ("dropout=-0.1", "dropout=-0.1"),
        ("d_model=abc", "d_model='abc'"),
    ],
)
def test_bad_config_value(override, named, tmp_path, capsys):
    out = tmp_path / "run"
    line = error_line(capsys, "classify", "train", "--train", SEED_TSV, "--out", out, "--set", override)
    assert named in line
    assert not out.exists()


# ---------------------------------------------------------------------------------------------------------------
# Bad input files and run directories


@pytest.mark.parametrize(
    ("name", "content", "named"),
    [
        ("missing.tsv", None, ["missing.tsv", "no such file"]),
        ("empty.tsv", b"", ["empty.tsv:1", "empty"]),
        ("fields.tsv", b"text\tlabel\ngood\tpositive\nbad\tnegative\textra\n", ["fields.tsv:3", "found 3"]),
        ("latin1.tsv", b"text\tlabel\ngood\tpositive\ncaf\xe9 bad\tnegative\n", ["latin1.tsv:3", "UTF-8"]),
    ],
    ids=["missing", "empty", "field_count", "not_utf8"],
)
def test_bad_training_file(name, content, named, tmp_path, capsys):
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    out = tmp_path / "run"
    line = error_line(capsys, "classify", "train", "--train", path, "--out", out, "--quiet")
    assert all(part in line for part in named), line
    assert not out.exists()


def test_train_needs_train_or_dataset(tmp_path, capsys):
    line = error_line(capsys, "classify", "train", "--out", tmp_path / "run")
    assert "--train" in line and "--dataset" in line


def test_eval_names_a_label_unseen_in_training(seed_run, tmp_path, capsys):
    data = tmp_path / "unseen.tsv"
    data.write_text("text\tlabel\ngreat movie\tpositive\nso-so\tneutral\n", encoding="utf-8")
    line = error_line(capsys, "classify", "eval", "--model", seed_run, "--data", data)
    assert "unseen.tsv:3" in line and "'neutral'" in line


def test_train_names_the_file_and_line_of_a_label_unseen_in_training(tmp_path, capsys):
    """A --valid label the training file lacks, and on --resume a training label the run lacks: the error names the
    file as well as the line (it said only "line 3")."""
    valid = tmp_path / "valid.tsv"
    valid.write_text("text\tlabel\ngreat movie\tpositive\nso-so\tneutral\n", encoding="utf-8")
    line = error_line(capsys, "classify", "train", "--train", SEED_TSV, "--valid", valid, "--out", tmp_path / "run",
                      "--epochs", "1", "--quiet", "--set", *TINY_SET)  # fmt: skip
    assert line.startswith(f"error: {valid}:3: label 'neutral' ")
    assert not (tmp_path / "run").exists()
    run = tmp_path / "trained"
    train_quietly(run, "--train", str(SEED_TSV), "--max-steps", "1", "--quiet", "--set", *TINY_SET)
    more = tmp_path / "more.tsv"
    more.write_text(SEED_TSV.read_text(encoding="utf-8") + "so-so\tneutral\n", encoding="utf-8")
    line = error_line(capsys, "classify", "train", "--train", more, "--out", run, "--resume", "--max-steps", "2")
    assert line.startswith(f"error: {more}:22: label 'neutral' ")


def test_a_text_with_two_labels_and_validation_texts_that_are_training_texts_are_warned_of(tmp_path, capsys):
    """Neither stops the run (a corpus may hold a few), but a user should know: no model fits a text labelled both
    ways, and validation on training texts flatters the model and the epoch it picks."""
    train, valid = tmp_path / "train.tsv", tmp_path / "valid.tsv"
    twice = "The performance was outstanding and truly inspiring"  # line 3, positive
    train.write_text(SEED_TSV.read_text(encoding="utf-8") + f"{twice}\tnegative\n", encoding="utf-8")
    valid.write_text(f"text\tlabel\nan unseen sentence\tpositive\n{twice}\tpositive\n", encoding="utf-8")
    args = ["classify", "train", "--train", str(train), "--epochs", "1", "--quiet", "--set", *TINY_SET]
    assert main([*args, "--valid", str(valid), "--out", str(tmp_path / "run")]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert warnings == [
        f"warning: {train}: 1 text appears with more than one label (the first: line 3 'positive', line 22 "
        "'negative'); no model fits both",
        f"warning: {valid}: 1 of the 2 validation texts (50.0%) is a training text too (the first: line 3); accuracy "
        "on it measures memory, not generalisation",
    ]
    # Under 100 examples the training set itself validates, as the run's summary says: no warning for that.
    assert main(["classify", "train", "--train", str(SEED_TSV), "--epochs", "1", "--quiet", "--set", *TINY_SET,
                 "--out", str(tmp_path / "seed")]) == 0  # fmt: skip
    assert "warning:" not in capsys.readouterr().err


def test_labels_that_differ_only_in_case_are_warned_of_and_a_class_count_error_names_the_file_and_labels(
    tmp_path, capsys
):
    """ "Pos" beside "pos" trains as a class of its own, silently; and ``n_classes=1`` on three labels said "needs
    exactly 2 labels; the training data has 3" with neither the file nor the labels that make the third."""
    train = tmp_path / "train.tsv"
    train.write_text("text\tlabel\ngood film\tpos\nbad film\tneg\ngreat\tPos\nawful\tneg\n", encoding="utf-8")
    args = ["classify", "train", "--train", str(train), "--max-steps", "1", "--quiet", "--set", *TINY_SET]
    assert main([*args, "--out", str(tmp_path / "run")]) == 0
    warning = (
        "warning: labels 'Pos' and 'pos' differ only in case or spaces: each is a class of its own; make them one "
        "label in the data if they mean one class"
    )
    assert [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")] == [warning]
    assert main([*args, "n_classes=1", "--out", str(tmp_path / "binary")]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"error: {train}: config key n_classes=1 (one binary logit) needs exactly 2 labels; the data has 3: 'Pos', "
        "'neg', 'pos'"
    )


def test_train_names_the_file_of_a_text_too_long(tmp_path, capsys):
    valid = tmp_path / "valid.tsv"
    valid.write_text("text\tlabel\ngreat movie\tpositive\n" + "bad " * 20 + "\tnegative\n", encoding="utf-8")
    line = error_line(capsys, "classify", "train", "--train", SEED_TSV, "--valid", valid, "--out", tmp_path / "run",
                      "--epochs", "1", "--quiet", "--set", *TINY_SET, "max_len=16", "max_len_policy=error")  # fmt: skip
    assert f"(first: {valid}:3, 20 tokens)" in line


def test_a_label_whose_examples_are_all_held_out_is_trained_on(tmp_path):
    """Without --valid, a tenth of a file of 100 or more examples validates. A label with one example there used to
    fail the training with "line N: label ... is not one of the run's labels", for a label of the training file
    itself; its examples now train, and the run has the label."""
    lines = SEED_TSV.read_text(encoding="utf-8").splitlines()[1:] * 5  # 100 examples, two labels
    examples = [*lines, "one of a kind\trare"]
    # A seed whose held-out tenth (the split of classify train) takes the one "rare" example.
    seed = next(s for s in range(100) if len(examples) - 1 in _held_out(len(examples), s))
    train = tmp_path / "rare.tsv"
    train.write_text("text\tlabel\n" + "\n".join(examples) + "\n", encoding="utf-8")
    run = tmp_path / "run"
    train_quietly(run, "--train", str(train), "--epochs", "1", "--seed", str(seed), "--quiet", "--set", *TINY_SET)
    assert json.loads((run / "labels.json").read_text()) == [*LABELS, "rare"]


def _held_out(n: int, seed: int) -> set[int]:
    """The indices ``classify train`` holds out of ``n`` examples with ``seed`` when no --valid is given."""
    order = list(range(n))
    random.Random(seed).shuffle(order)
    return set(order[: n // 10])


def test_model_that_is_not_a_run_directory(tmp_path, capsys):
    not_a_run = tmp_path / "notes"
    not_a_run.mkdir()
    (not_a_run / "readme.txt").write_text("hello")
    line = error_line(capsys, "classify", "predict", "--model", not_a_run, "some text")
    assert str(not_a_run) in line and "not a run directory" in line


def test_flipped_byte_in_the_weights_is_caught_by_the_manifest(seed_run, tmp_path, capsys):
    run = shutil.copytree(seed_run, tmp_path / "run")
    weights = run / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0x01  # inside the tensor data: the file still parses, only the hash can tell
    weights.write_bytes(bytes(data))
    line = error_line(capsys, "classify", "predict", "--model", run, "some text")
    assert str(weights) in line and "manifest.json" in line


def test_console_script_reports_one_error_line_without_traceback(tmp_path):
    script = Path(sys.executable).with_name("attnkit")
    if not script.exists():
        script = Path(shutil.which("attnkit") or pytest.skip("the attnkit console script is not installed"))
    data = tmp_path / "fields.tsv"
    data.write_text("text\tlabel\ngood\tpositive\nbad\tnegative\textra\n", encoding="utf-8")
    result = subprocess.run(
        [str(script), "classify", "train", "--train", str(data), "--out", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), result.stderr
    assert "fields.tsv:3" in lines[0]
    assert "Traceback" not in result.stderr


# ---------------------------------------------------------------------------------------------------------------
# Model variants through --set


def test_cls_pooling_prepends_the_cls_token(tmp_path):
    out = tmp_path / "run"
    train_quietly(out, "--train", str(SEED_TSV), "--epochs", "1", "--quiet", "--set", *TINY_SET, "pooling=cls")
    run = ClassifierRun(out)
    assert run.model_cfg.pooling == "cls"
    assert run.tokenizer.cls_id is not None
    assert run.tokenizer.encode("x")[0] == run.tokenizer.cls_id
    assert run.tokenizer.encode_batch(["amazing movie"])[0][0] == run.tokenizer.cls_id


def test_single_logit_head_still_gives_two_probabilities(tmp_path, capsys):
    out = tmp_path / "run"
    train_quietly(out, "--train", str(SEED_TSV), "--epochs", "2", "--quiet", "--set", *TINY_SET, "n_classes=1")
    assert ClassifierRun(out).model.head.out_features == 1
    texts = ["loved it", "hated it"]
    code, stdout, _ = cli(capsys, "classify", "predict", "--model", out, *texts)
    assert code == 0
    for pred, text in zip(predictions(stdout), texts, strict=True):
        check_prediction(pred, text)


@pytest.mark.parametrize("native", [True, False])
def test_predict_in_bf16_agrees_and_notes_a_cpu_without_native_bfloat16(seed_run, capsys, monkeypatch, native):
    from attnkit.training import precision

    monkeypatch.setattr(precision, "native_bf16", lambda: native)
    text = "This movie was absolutely amazing"
    _, fp32_out, _ = cli(capsys, "classify", "predict", "--model", seed_run, text)
    code, out, err = cli(capsys, "classify", "predict", "--model", seed_run, "--precision", "bf16", text)
    assert code == 0
    (fp32,), (bf16,) = predictions(fp32_out), predictions(out)
    assert bf16["label"] == fp32["label"]
    assert abs(bf16["probs"]["positive"] - fp32["probs"]["positive"]) < 0.05  # bfloat16 keeps ~3 digits
    assert ("note: precision=bf16: your CPU has no native bfloat16" in err) == (not native)


def test_int8_is_refused_for_a_classifier(seed_run, capsys):
    """int8 weights are a translator's (decoding one sentence at a time); a classifier's commands and a served
    classifier say so in one error line, exit 2, before anything binds."""
    code, _, err = cli(capsys, "classify", "predict", "--model", seed_run, "--precision", "int8", "good")
    assert code == 2 and "--precision" in err and "int8" in err
    code, _, err = cli(capsys, "serve", seed_run, "--precision", "int8", "--port", "0")
    assert code == 2
    assert err.strip().splitlines()[-1].startswith("error: --precision int8 is for translators")


# ---------------------------------------------------------------------------------------------------------------
# Small data with the defaults; keys of the other task; loop keys that used to be ignored


@pytest.mark.parametrize("epochs", [[], ["--epochs", "80"]])
def test_twenty_sentences_are_learned_with_the_default_settings(tmp_path, capsys, epochs):
    """Under 100 examples the training set selects the epoch: no early stopping on it, batches of a quarter of it,
    ties between epochs broken by the lower loss. The defaults then fit the 20 sentences."""
    out = tmp_path / "run"
    summary = train_quietly(out, "--train", str(SEED_TSV), "--quiet", *epochs)
    assert summary["epochs"] == (int(epochs[1]) if epochs else 20)  # every epoch ran
    code, stdout, _ = cli(capsys, "classify", "eval", "--model", out, "--data", SEED_TSV)
    assert code == 0
    assert json.loads(stdout)["accuracy"] == 1.0


@pytest.mark.parametrize("key", ["max_tokens=100", "valid_bleu=false"])
def test_a_translator_key_is_refused_naming_the_key_and_the_task(tmp_path, capsys, key):
    line = error_line(capsys, "classify", "train", "--train", SEED_TSV, "--out", tmp_path / "run", "--set", key)
    assert f"'{key.split('=')[0]}'" in line and "classify" in line
    assert not (tmp_path / "run").exists()


def test_accumulation_and_a_time_budget_are_used_not_ignored(tmp_path):
    out = tmp_path / "run"
    summary = train_quietly(
        out,
        "--train",
        str(SEED_TSV),
        "--epochs",
        "3",
        "--quiet",
        "--set",
        *TINY_SET,
        "batch_size=2",
        "accum_steps=2",
        "max_minutes=5",
    )
    # 20 sentences in batches of 2: 10 batches an epoch, 5 optimizer steps of 2 batches (4 sentences) each
    assert summary["steps"] == 15
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [row["sentences"] for row in rows if "loss" in row] == [4] * 15


def test_the_average_of_a_classifiers_checkpoints_is_a_classifier_run(tmp_path, capsys):
    """``attnkit average`` writes a run every command can use: a classifier's keeps its labels (it used to lose
    labels.json, and predict, eval and export then failed on it)."""
    run, averaged = tmp_path / "run", tmp_path / "avg"
    train_quietly(run, "--train", str(SEED_TSV), "--max-steps", "6", "--quiet", "--set", *TINY_SET,
                  "checkpoint_every=2", "keep_last=3")  # fmt: skip
    code, out, err = cli(capsys, "average", "--last", "2", "--out", averaged, run)
    assert code == 0, err
    assert json.loads(out)["averaged"] == ["step_4.safetensors", "step_6.safetensors"]
    assert (averaged / "labels.json").read_bytes() == (run / "labels.json").read_bytes()
    code, out, err = cli(capsys, "classify", "predict", "--model", averaged, "a good film")
    assert code == 0, err
    assert set(json.loads(out)["probs"]) == set(LABELS)
    code, out, err = cli(capsys, "average", "--last", "5", "--out", tmp_path / "avg5", run)
    assert code == 2 and "cannot average the last 5: average fewer (--last 3), or train with" in err
    # A damaged step checkpoint (the manifest does not cover them) is named; it was a safetensors traceback.
    with (run / "checkpoints" / "step_6.safetensors").open("ab") as f:
        f.write(b"x")
    code, out, err = cli(capsys, "average", "--last", "2", "--out", tmp_path / "avg-damaged", run)
    assert code == 2 and err.startswith(f"error: {run / 'checkpoints' / 'step_6.safetensors'}: not a readable")
    assert len(err.splitlines()) == 1 and err.rstrip().endswith("damaged or cut short")


def test_train_flags_and_repeated_set_add_up(tmp_path, capsys):
    """--max-steps is a flag of every train command (as --resume's help says), and a second --set adds its keys to
    the first's instead of replacing them (which silently trained the default model)."""
    run = tmp_path / "run"
    summary = train_quietly(run, "--train", str(SEED_TSV), "--max-steps", "3", "--set", "d_model=16", "n_heads=2",
                            "--set", "d_ff=32", "n_layers=1", "min_freq=1")  # fmt: skip
    assert summary["steps"] == 3
    model = json.loads((run / "config.json").read_text())["model"]
    assert (model["d_model"], model["n_heads"], model["d_ff"], model["n_layers"]) == (16, 2, 32, 1)
    # Both budgets are upper bounds, as the config keys max_steps and epochs are (the flags together were refused,
    # the keys accepted): the run ends at whichever comes first. Batches of 5: 4 steps an epoch.
    for flags, steps, stopped_by in ((["--max-steps", "3", "--epochs", "2"], 3, "max_steps"),
                                     (["--max-steps", "30", "--epochs", "2"], 8, "epochs")):  # fmt: skip
        summary = train_quietly(tmp_path / "both", "--train", str(SEED_TSV), *flags, "--set", *TINY_SET)
        assert (summary["steps"], summary["stopped_by"]) == (steps, stopped_by), flags


def test_resume_into_a_run_of_another_task_names_both(tmp_path, capsys):
    """``translate train --resume`` pointed at a classifier's run: one line naming what the run is (it used to be a
    budget error, and classify-into-pretrain a TypeError)."""
    run = tmp_path / "run"
    train_quietly(run, "--train", str(SEED_TSV), "--max-steps", "2", "--quiet", "--set", *TINY_SET)
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("source\ttarget\na b\tb a\n", encoding="utf-8")
    line = error_line(capsys, "translate", "train", "--train", pairs, "--out", run, "--max-steps", "4", "--resume")
    assert line == (
        f"error: {run}: --resume: it holds a 'classify' run, not a 'translate' one; resume it with its own command, "
        "or train into another --out"
    )
    line = error_line(capsys, "pretrain", "--text", SEED_TSV, "--out", run, "--resume")
    assert "it holds a 'classify' run, not a 'pretrain' one" in line


def test_tensorboard_missing_is_refused_before_the_run_directory_is_made(tmp_path, capsys, monkeypatch):
    """``--set tensorboard=true`` without the package: one line, and no half-written run (it wrote config.json,
    labels.json and tokenizer.json before the metrics log found out)."""
    import sys

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # importing it raises ImportError
    line = error_line(capsys, "classify", "train", "--train", SEED_TSV, "--out", tmp_path / "run", "--max-steps", "2",
                      "--set", *TINY_SET, "tensorboard=true")  # fmt: skip
    assert line == "error: config key tensorboard=true needs the tensorboard package: pip install tensorboard"
    assert not (tmp_path / "run").exists()


def test_a_new_run_over_a_trained_one_says_it_replaces_it(tmp_path, capsys):
    run = tmp_path / "run"
    argv = ("classify", "train", "--train", SEED_TSV, "--out", run, "--epochs", "1", "--set", *TINY_SET)
    code, _, err = cli(capsys, *argv)
    assert code == 0 and "warning:" not in err  # a new directory: nothing to say
    code, _, err = cli(capsys, *argv)
    assert code == 0
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert warnings == [f"warning: {run} holds a trained run: this run replaces it (--resume continues it instead)"]


def test_a_translator_over_a_classifier_run_leaves_none_of_its_files(tmp_path, tiny, quietly, capsys):
    """The replaced classifier's labels.json stayed beside the translator's files (and in its manifest). The warning
    names the task of the run it replaces: a mistyped --out is the likelier story."""
    run = tmp_path / "run"
    quietly(*tiny.classify_train(run, "max_steps=1"))
    assert (run / "labels.json").is_file()
    code, _, err = cli(capsys, *tiny.translate_train(tmp_path, run, "max_steps=1"))
    assert code == 0
    assert f"warning: {run} holds a trained classify run: this translate run replaces it" in err.splitlines()
    assert not (run / "labels.json").exists()
    assert "labels.json" not in json.loads((run / "manifest.json").read_text())["sha256"]


def test_embed_pools_as_the_run_does_and_refuses_cls_without_a_cls_token(tmp_path, tiny, quietly, capsys):
    """``embed`` of a classifier run pools as the run was trained to (``pooling=cls`` took the mean by default),
    and ``--pool cls`` on a tokenizer that prepends no [CLS] token is refused (it took the first word's vector)."""
    import torch

    from attnkit import embed
    from attnkit.tasks.classify import ClassifierRun
    from attnkit.tasks.embed import sentence_embeddings

    texts = ["a wonderful film", "dull"]
    quietly(*tiny.classify_train(tmp_path / "cls", "pooling=cls", "max_steps=2"))
    run = ClassifierRun(tmp_path / "cls")
    expected = sentence_embeddings(run.model, run.tokenizer, texts, pool="cls")
    torch.testing.assert_close(embed(tmp_path / "cls", texts), expected)
    quietly(*tiny.classify_train(tmp_path / "mean", "max_steps=2"))  # a word tokenizer: no [CLS] prepended
    capsys.readouterr()
    assert main(["embed", "--model", str(tmp_path / "mean"), "--pool", "cls", "a film"]) == 2
    assert capsys.readouterr().err == (
        "error: pool='cls' takes the [CLS] token, which this model's tokenizer does not prepend; use mean\n"
    )


def test_an_encoder_exported_from_a_word_tokenized_run_embeds_and_fine_tunes(tmp_path, tiny, quietly, capsys):
    """``export hf --encoder-only`` of a BERT-shaped run whose word tokenizer prepends no [CLS]: ``embed`` and
    ``--init-from`` read the folder back (they failed: "tokenizer has no special token '[CLS]'"), with the run's
    own vectors."""
    import torch

    from attnkit import embed

    bert_shaped = [
        "max_steps=2",
        "activation=gelu",
        "positional=learned",
        "scale_embeddings=false",
        "embedding_norm=true",
        "n_token_types=2",
    ]
    quietly(*tiny.classify_train(tmp_path / "run", *bert_shaped))
    quietly("export", "hf", "--model", str(tmp_path / "run"), "--out", str(tmp_path / "bert"), "--encoder-only")
    texts = ["a wonderful film", "dull"]
    torch.testing.assert_close(embed(tmp_path / "bert", texts), embed(tmp_path / "run", texts))
    init = ["--init-from", str(tmp_path / "bert"), "--max-steps", "1"]
    assert main(["classify", "train", "--train", str(tiny.SEED_TSV), "--out", str(tmp_path / "ft"), *init]) == 0
