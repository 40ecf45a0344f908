"""The translator through the CLI: a synthetic task it must learn, averaging, and bad input."""

from __future__ import annotations

import io
import json
import random
from pathlib import Path
from typing import Any

import pytest
import torch

from attnkit import runs
from attnkit.cli import main
from attnkit.errors import InputError
from attnkit.inference.fused import FusedSelfAttention
from attnkit.inference.quantize import Int8Linear

SYMBOLS = "a b c d e f g h i j k l m n o p".split()


def write_reverse_task(path: Path, n: int, rng: random.Random) -> None:
    """source: up to 20 random symbols; target: the same symbols reversed."""
    with open(path, "w", encoding="utf-8") as f:
        f.write("source\ttarget\n")
        for _ in range(n):
            seq = [rng.choice(SYMBOLS) for _ in range(rng.randint(1, 20))]
            f.write(" ".join(seq) + "\t" + " ".join(reversed(seq)) + "\n")


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def reverse_run(tmp_path_factory):
    """Train the small reverse-a-sequence model once: d_model 64, 2,400 steps of 1,024 tokens, 100% exact match on
    the 300 test sequences, in about 2 minutes on one thread of an AVX2 EPYC (the longest fixture of the suite). Also
    100% with d_ff 256 and lr 2e-3. At d_model 128: 2,048 tokens a step took about three times as long a step for
    99.7%; 1,600 steps of 1,024 tokens reached 99.3%, 2,400 of 512 99.0%."""
    tmp = tmp_path_factory.mktemp("reverse")
    rng = random.Random(0)
    for name, n in (("train", 6000), ("valid", 200), ("test", 300)):
        write_reverse_task(tmp / f"{name}.tsv", n, rng)
    code = main(
        [
            "translate",
            "train",
            "--train",
            str(tmp / "train.tsv"),
            "--valid",
            str(tmp / "valid.tsv"),
            "--out",
            str(tmp / "run"),
            "--max-steps",
            "2400",
            "--max-tokens",
            "1024",
            "--seed",
            "0",
            "--quiet",
            "--set",
            "tokenizer=word",
            "min_freq=1",
            "d_model=64",
            "n_heads=4",
            "d_ff=128",
            "n_layers=2",
            "dropout=0.0",
            "label_smoothing=0.0",
            "schedule=linear",
            "lr=3e-3",
            "warmup_steps=150",
            "checkpoint_every=300",
            "keep_last=3",
            "valid_bleu=false",
        ]
    )
    assert code == 0
    return tmp


@pytest.mark.slow
@pytest.mark.parametrize("beam", ["1", "4"])
def test_reverse_task_is_learned_to_99_percent_exact_match(reverse_run, capsys, beam):
    code, out, _ = run_cli(
        capsys,
        "translate",
        "eval",
        "--model",
        str(reverse_run / "run"),
        "--data",
        str(reverse_run / "test.tsv"),
        "--beam",
        beam,
    )
    assert code == 0
    result = json.loads(out)
    assert result["n"] == 300
    assert result["exact_match"] >= 0.99, result
    assert "nrefs:1" in result["signature"] and "tok:13a" in result["signature"]


@pytest.mark.slow
def test_translate_run_keeps_order_and_line_count(reverse_run, capsys, monkeypatch):
    import io

    lines = ["a b c", "p o n m l k", "d"]
    monkeypatch.setattr("sys.stdin", io.StringIO("\n".join(lines) + "\n"))
    code, out, _ = run_cli(capsys, "translate", "run", "--model", str(reverse_run / "run"), "--beam", "4")
    assert code == 0
    assert out.splitlines() == [" ".join(reversed(line.split())) for line in lines]


@pytest.mark.slow
def test_average_of_last_checkpoints_is_their_mean(reverse_run, capsys, tmp_path):
    from safetensors.torch import load_file

    code, out, _ = run_cli(capsys, "average", "--last", "3", "--out", str(tmp_path / "avg"), str(reverse_run / "run"))
    assert code == 0
    used = json.loads(out)["averaged"]
    assert used == ["step_1800.safetensors", "step_2100.safetensors", "step_2400.safetensors"]
    parts = [load_file(str(reverse_run / "run" / "checkpoints" / name)) for name in used]
    averaged = load_file(str(tmp_path / "avg" / "model.safetensors"))
    for name, tensor in averaged.items():
        torch.testing.assert_close(tensor, sum(p[name].double() for p in parts).div(3).float())
    # The averaged directory is a run of its own: it translates.
    code, _, _ = run_cli(
        capsys,
        "translate",
        "eval",
        "--model",
        str(tmp_path / "avg"),
        "--data",
        str(reverse_run / "test.tsv"),
        "--beam",
        "1",
    )
    assert code == 0


def test_average_replaces_only_its_own_output_and_refuses_mixed_checkpoints(reverse_run, capsys, tmp_path):
    """``--out`` onto a trained run wrote the average over it and left the run's checkpoints and state beside the
    new weights (a hybrid that neither predicted nor resumed); an earlier average is replaced. A checkpoint of
    another shape among the last N was a RuntimeError traceback, and one with fewer tensors would have been averaged
    as if it had them all."""
    import shutil

    run = reverse_run / "run"
    argv = ["average", "--last", "2", str(run), "--out"]
    assert run_cli(capsys, *argv, str(tmp_path / "avg"))[0] == 0
    assert run_cli(capsys, *argv, str(tmp_path / "avg"))[0] == 0  # an earlier average: replaced
    trained = tmp_path / "trained"
    shutil.copytree(run, trained)
    code, _, err = run_cli(capsys, *argv, str(trained))
    assert code == 2
    assert_one_error_line(err, f"{trained}: exists and is a run that average did not write; choose a new --out")
    assert sorted(p.name for p in trained.iterdir()) == sorted(p.name for p in run.iterdir())  # untouched
    from safetensors.torch import load_file, save_file

    last = runs.checkpoint_paths(trained)[-1]
    tensors = load_file(str(last))
    save_file({name: t[..., :1].contiguous() if t.dim() else t for name, t in tensors.items()}, str(last))
    code, _, err = run_cli(capsys, "average", "--last", "2", str(trained), "--out", str(tmp_path / "mixed"))
    assert code == 2
    assert_one_error_line(err, f"{last}: holds other tensors (names or shapes) than")


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def assert_one_error_line(err: str, *needles: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


@pytest.mark.parametrize(
    "content, needles",
    [
        ("source\ttarget\nhello\tworld\nno tab here\n", ["bad.tsv:3"]),
        ("hello\tworld\n\tempty source\n", ["bad.tsv:2"]),
    ],
)
def test_bad_parallel_tsv_is_refused_with_its_line(tmp_path, capsys, content, needles):
    bad = write(tmp_path / "bad.tsv", content)
    code, _, err = run_cli(
        capsys, "translate", "train", "--train", str(bad), "--out", str(tmp_path / "run"), "--max-steps", "1"
    )
    assert code == 2
    assert_one_error_line(err, *needles)
    assert not (tmp_path / "run").exists()


def test_mismatched_parallel_files_are_refused(tmp_path, capsys):
    src = write(tmp_path / "a.txt", "one\ntwo\nthree\n")
    tgt = write(tmp_path / "b.txt", "eins\nzwei\n")
    code, _, err = run_cli(
        capsys,
        "translate",
        "train",
        "--train-src",
        str(src),
        "--train-tgt",
        str(tgt),
        "--out",
        str(tmp_path / "run"),
        "--max-steps",
        "1",
    )
    assert code == 2
    assert_one_error_line(err, "a.txt", "b.txt")


def test_over_long_source_is_refused_under_the_error_policy(tmp_path, capsys):
    train = write(tmp_path / "train.tsv", "".join(f"{'a ' * 40}\tb\n" for _ in range(10)))
    code, _, err = run_cli(
        capsys,
        "translate",
        "train",
        "--train",
        str(train),
        "--out",
        str(tmp_path / "run"),
        "--max-steps",
        "1",
        "--set",
        "max_len=16",
        "max_len_policy=error",
        "tokenizer=word",
        "min_freq=1",
    )
    assert code == 2
    assert_one_error_line(err, "max_len=16")


# ---------------------------------------------------------------------------------------------------------------
# A stated step budget sizes the schedule; a warmup that cannot finish inside it is warned about; per-task keys

TINY = [
    "--max-tokens",
    "200",
    "--seed",
    "0",
    "--quiet",
    "--set",
    "d_model=16",
    "n_heads=2",
    "d_ff=32",
    "n_layers=1",
    "tokenizer=word",
    "min_freq=1",
    "valid_bleu=false",
]


@pytest.fixture
def small_task(tmp_path):
    rng = random.Random(1)
    write_reverse_task(tmp_path / "train.tsv", 100, rng)
    write_reverse_task(tmp_path / "valid.tsv", 10, rng)
    return ["--train", str(tmp_path / "train.tsv"), "--valid", str(tmp_path / "valid.tsv")]


def step_rows(run: Path) -> list[dict]:
    return [row for row in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "loss" in row]


def test_a_step_budget_sizes_the_warmup_and_decay(tmp_path, capsys, small_task):
    code, _, err = run_cli(
        capsys, "translate", "train", *small_task, "--out", str(tmp_path / "run"), "--max-steps", "20", *TINY
    )
    assert code == 0, err
    assert "warning" not in err
    lrs = [row["lr"] for row in step_rows(tmp_path / "run")]
    # Linear warmup over 10% of the 20 steps to lr (1e-3), then linear decay to 0 at step 20; eq. 3 with 4,000
    # warmup steps would still be at 1e-5 here.
    assert lrs[1] == pytest.approx(1e-3) and max(lrs) == pytest.approx(1e-3)
    assert lrs[-1] == 0.0 and lrs == sorted(lrs[:2]) + sorted(lrs[2:], reverse=True)


@pytest.mark.parametrize("setting", [["warmup_steps=100"], ["schedule=noam"]])
def test_a_warmup_that_cannot_finish_inside_the_step_budget_is_one_warning_line(tmp_path, capsys, small_task, setting):
    code, _, err = run_cli(
        capsys, "translate", "train", *small_task, "--out", str(tmp_path / "run"), "--max-steps", "10", *TINY, *setting
    )
    assert code == 0, err
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "warmup" in warnings[0] and "10 planned steps" in warnings[0], err


@pytest.mark.parametrize("key", ["batch_size=8", "bucket_factor=2", "layer_lr_decay=0.9"])
def test_a_classifier_key_is_refused_naming_the_key_and_the_task(tmp_path, capsys, small_task, key):
    code, _, err = run_cli(
        capsys, "translate", "train", *small_task, "--out", str(tmp_path / "run"), "--max-steps", "2", *TINY, key
    )
    assert code == 2
    assert_one_error_line(err, f"'{key.split('=')[0]}'", "translate")


def test_patience_stops_the_translator_and_the_best_evaluation_is_the_model(tmp_path, capsys, small_task):
    code, out, err = run_cli(
        capsys,
        "translate",
        "train",
        *small_task,
        "--out",
        str(tmp_path / "run"),
        "--max-steps",
        "400",
        *TINY,
        "eval_every=2",
        "patience=1",
        "lr=0.5",
        "schedule=constant",
    )
    assert code == 0, err
    assert json.loads(out)["steps"] < 400  # a learning rate this high stops improving at once
    evals = [
        row
        for row in map(json.loads, (tmp_path / "run" / "metrics.jsonl").read_text().splitlines())
        if "valid_loss" in row
    ]
    best = min(evals, key=lambda row: row["valid_loss"])
    assert best["best"] and json.loads(out)["valid_loss"] == best["valid_loss"]


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["bf16", "int8"])
def test_reduced_precision_decoding_keeps_the_learned_outputs(reverse_run, capsys, monkeypatch, precision):
    """``--precision bf16`` casts the model (half the bytes a step reads), ``int8`` also rounds its weight matrices
    to int8; both rank float32 log-probabilities: a trained model's outputs stay what float32 decodes, greedy and
    beam (here the reverse task's, 99% exact). int8 decodes one sentence per call (``--batch-size 1``: the int8
    kernel) as in batches of 32 (the bfloat16 copy of the same rounded weights)."""
    from attnkit.training.precision import native_bf16

    run = str(reverse_run / "run")
    lines = [line.split("\t")[0] for line in (reverse_run / "test.tsv").read_text().splitlines()[1:41]]
    for beam in ("1", "4"):
        outputs = {}
        for name, flags in (("fp32", []), (precision, ["--precision", precision])):
            for batch in ("32", "1") if name == "int8" else ("32",):
                monkeypatch.setattr("sys.stdin", io.StringIO("\n".join(lines) + "\n"))
                code, out, err = run_cli(
                    capsys, "translate", "run", "--model", run, "--beam", beam, "--batch-size", batch, *flags
                )
                assert code == 0, err
                outputs[name if batch == "32" else "int8, one per call"] = out.splitlines()
        same = sum(a == b for a, b in zip(outputs["fp32"], outputs[precision], strict=True))
        assert same >= 39, (beam, same)  # 40 sources; one may flip where two continuations nearly tie
        if precision == "int8":
            assert outputs["int8, one per call"] == outputs["int8"], beam
        assert ("no native bfloat16" in err) == (not native_bf16())


def test_translator_precision_casts_the_model_and_refuses_what_the_device_cannot_run(tiny_translator, capsys):
    from attnkit.serving.models import load_model
    from attnkit.tasks.translate import TranslatorRun

    run = TranslatorRun(tiny_translator, precision="bf16")
    assert {p.dtype for p in run.model.parameters()} == {torch.bfloat16}
    attention = run.model.encoder.layers[0].self_attn
    assert isinstance(attention, FusedSelfAttention) and attention.qkv.weight.dtype == torch.bfloat16
    assert run.translate(["a b c"], beam=2)[0][0] is not None
    assert {p.dtype for p in load_model(tiny_translator, "bf16").model.parameters()} == {torch.bfloat16}  # serve
    code, _, err = run_cli(capsys, "translate", "eval", "--model", str(tiny_translator), "--precision", "fp16")
    assert code == 2
    assert_one_error_line(err, "--precision=fp16 runs on CUDA devices only")
    int8 = TranslatorRun(tiny_translator, precision="int8").model  # bfloat16, every projection rounded to int8
    assert all(isinstance(m, Int8Linear) for m in int8.modules() if isinstance(m, torch.nn.Linear))
    assert {p.dtype for p in int8.parameters()} == {torch.bfloat16}
    with pytest.raises(InputError, match="precision=int8 runs on CPUs"):
        TranslatorRun(tiny_translator, precision="int8", device="meta")
    served = load_model(tiny_translator, "int8")  # serve --precision int8 (thread worker), as /info reports it
    assert served.inference() == {"precision": "int8", "device": "cpu", "engine": "eager"}
    assert isinstance(served.model.decoder.layers[0].ffn.linear1, Int8Linear)
    code, _, err = run_cli(
        capsys, "translate", "run", "--model", str(tiny_translator), "--engine", "ct2", "--precision", "bf16"
    )
    assert code == 2
    assert_one_error_line(err, "--precision bf16", "export ct2 --quantization")


@pytest.fixture(scope="module")
def tiny_translator(tmp_path_factory):
    """A translator trained for 2 steps: enough to load and decode (the decoding options are what is tested)."""
    tmp = tmp_path_factory.mktemp("tiny_translator")
    write_reverse_task(tmp / "train.tsv", 50, random.Random(2))
    out = tmp / "run"
    assert (
        main(["translate", "train", "--train", str(tmp / "train.tsv"), "--out", str(out), "--max-steps", "2", *TINY])
        == 0
    )
    return out


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["run", "--beam", "0"], "--beam"),
        (["run", "--beam", "-3"], "--beam"),
        (["run", "--batch-size", "0"], "--batch-size"),
        (["run", "--alpha", "-1"], "--alpha"),
        (["run", "--alpha", "nan"], "--alpha"),
        (["eval", "--beam", "0"], "--beam"),
    ],
)
def test_impossible_decoding_options_are_one_error_line(tiny_translator, tmp_path, capsys, monkeypatch, argv, needle):
    # Before: a traceback and exit code 1 from inside the search (beam 0 selects no hypothesis).
    monkeypatch.setattr("sys.stdin", io.StringIO("a b c\n"))
    data = write(tmp_path / "data.tsv", "a b c\tc b a\n")
    extra = ["--data", str(data)] if argv[0] == "eval" else []
    code, _, err = run_cli(capsys, "translate", argv[0], "--model", str(tiny_translator), *argv[1:], *extra)
    assert code == 2
    assert_one_error_line(err, needle)


def test_the_library_refuses_impossible_decoding_options_by_name(tiny_translator):
    from attnkit.errors import InputError
    from attnkit.tasks.translate import TranslatorRun

    run = TranslatorRun(tiny_translator)
    cases: list[tuple[dict[str, Any], str]] = [
        ({"beam": 0}, "beam=0"),
        ({"batch_size": 0}, "batch_size=0"),
        ({"alpha": -1.0}, "alpha=-1.0"),
    ]
    for options, name in cases:
        with pytest.raises(InputError, match=name):
            run.translate(["a b c"], **options)


def test_cuda_graphs_without_a_gpu_is_refused_before_training(tmp_path, capsys, tiny):
    """``--set cuda_graphs=true`` names what it needs (a CUDA device) in one error line, and writes no run."""
    argv = tiny.translate_train(tmp_path, tmp_path / "run", "cuda_graphs=true", "max_steps=2")
    code, _, err = run_cli(capsys, *argv)
    assert code == 2
    assert_one_error_line(err, "cuda_graphs=true", "CUDA")
    assert not (tmp_path / "run" / "model.safetensors").exists()


def test_empty_translations_are_noted_not_left_as_silent_blank_lines(tiny_translator, capsys, monkeypatch):
    """A model that puts the end token first (after a few hundred steps, often) answers with blank lines, which look
    like the tool's fault; `translate run` and `eval` say what they are."""
    monkeypatch.setattr("attnkit.tasks.translate.predict.translate_ids", lambda model, tok, ids, **kw: [[], [5], []])
    monkeypatch.setattr("sys.stdin", io.StringIO("a b c\nd e\nf\n"))
    code, out, err = run_cli(capsys, "translate", "run", "--model", str(tiny_translator))
    assert code == 0
    assert len(out.splitlines()) == 3 and out.splitlines()[0] == out.splitlines()[2] == ""
    assert err == (
        "note: 2 of 3 translations are empty: the model put the end token first (an undertrained model's usual "
        "answer)\n"
    )
