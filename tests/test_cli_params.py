"""``attnkit params`` and ``attnkit plot pe`` in-process: the exact counts of reference notes 000 and 001, the paper's
Table 3 model sizes, and a real PNG."""

from __future__ import annotations

import json

import pytest

from attnkit.cli import main

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# Reference note 001: BERT's vocabulary, d_model 32, one layer, a CLS token and one logit, 400 sinusoidal positions.
SEED001_SET = [
    "vocab_size=30522",
    "d_model=32",
    "n_heads=4",
    "d_ff=32",
    "n_layers=1",
    "max_len=400",
    "n_classes=1",
    "pooling=cls",
    "positional=sinusoidal",
]


def params_json(capsys, *argv: str) -> dict:
    assert main(["params", *argv, "--json"]) == 0
    out = capsys.readouterr().out
    return json.loads(out)


def test_reference_note_001_rows(capsys):
    report = params_json(capsys, "--task", "classify", "--set", *SEED001_SET)
    rows = report["rows"]
    for row in rows:
        assert {"module", "params", "formula", "formula_value"} <= set(row)
        assert row["formula_value"] == row["params"], row  # the closed form agrees with the counted tensors

    def params_of(kind: str) -> list[int]:
        return [row["params"] for row in rows if row["kind"] == kind]

    assert params_of("embedding") == [976_704]  # 30522 x 32
    assert params_of("attention") == [4_224]  # 4 x (32 x 32 + 32)
    assert params_of("layer_norm") == [64, 64]  # gain and bias, twice
    assert params_of("ffn") == [2_112]  # 32 x 32 + 32 + 32 x 32 + 32
    assert params_of("head") == [33]  # 32 x 1 + 1
    # "a 12,800-value positional table with 0 trainable parameters"
    (positional,) = [row for row in rows if row["kind"].startswith("positional")]
    assert (positional["buffers"], positional["params"], positional["trainable"]) == (12_800, 0, False)
    assert report["total"] == sum(row["params"] for row in rows) == 983_201
    assert report["buffers"] == 12_800


def test_reference_note_000_total(capsys):
    assert params_json(capsys, "--task", "classify", "--preset", "vocab10k")["total"] == 1_676_802


def test_presets_are_named_for_what_they_are_and_old_names_still_work(capsys):
    tiny = params_json(capsys, "--task", "classify", "--preset", "tiny-binary")
    assert tiny["total"] == params_json(capsys, "--task", "classify", "--set", *SEED001_SET)["total"] == 983_201
    assert params_json(capsys, "--task", "classify", "--preset", "seed001") == tiny  # the earlier name, an alias
    assert params_json(capsys, "--task", "classify", "--preset", "seed000")["total"] == 1_676_802
    assert main(["params", "--task", "classify", "--preset", "nope"]) == 2
    err = capsys.readouterr().err
    assert "vocab10k" in err and "tiny-binary" in err and "seed00" not in err  # aliases are not advertised
    assert main(["params", "--task", "translate", "--preset", "seed000"]) == 2  # a classifier alias only


@pytest.mark.parametrize(("preset", "paper_total"), [("base", 63.08e6), ("big", 214.2e6)])
def test_translator_sizes_match_table_3(preset, paper_total, capsys):
    report = params_json(capsys, "--task", "translate", "--preset", preset, "--set", "vocab_size=37000")
    assert report["total"] == pytest.approx(paper_total, rel=0.01)
    assert all({"module", "params", "formula", "formula_value"} <= set(row) for row in report["rows"])
    assert report["total"] == sum(row["params"] for row in report["rows"])  # the tied projection counted once


def test_text_table_ends_with_the_total(capsys):
    assert main(["params", "--task", "classify", "--set", *SEED001_SET]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1].startswith("total") and "983,201" in lines[-1]


def test_plot_pe_writes_a_png(tmp_path, capsys):
    out = tmp_path / "pe.png"
    assert main(["plot", "pe", "--d-model", "64", "--max-len", "50", "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    assert out.read_bytes().startswith(PNG_SIGNATURE)


def test_plot_pe_rejects_an_empty_table(tmp_path, capsys):
    assert main(["plot", "pe", "--d-model", "0", "--out", str(tmp_path / "pe.png")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "--d-model" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "pe.png").exists()


@pytest.mark.parametrize("task", ["classify", "translate", "pretrain"])
def test_params_of_a_trained_run_count_its_weights(task, tmp_path, tiny, quietly, capsys):
    """``params --model RUN`` describes the run's own model (it could only describe a config: a trained run with a
    vocabulary of 28 words read as the default's 10,000), a pretraining run's masked-LM head included; its total
    is the number of trainable values in the run's weights."""
    from safetensors.torch import load_file

    run = tmp_path / "run"
    if task == "classify":
        quietly(*tiny.classify_train(run, "max_steps=1"))
    elif task == "translate":
        quietly(*tiny.translate_train(tmp_path, run, "max_steps=1"))
    else:
        (tmp_path / "texts.txt").write_text("a film\nanother film\na good film\n" * 10, encoding="utf-8")
        quietly("pretrain", "--text", str(tmp_path / "texts.txt"), "--out", str(run), "--set", *tiny.SET, "max_steps=1")
    capsys.readouterr()
    assert main(["params", "--model", str(run), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    weights = load_file(str(run / "model.safetensors"))
    shared = 0 if task == "classify" else weights["embeddings.token.weight"].numel()  # tied (§3.4), stored twice
    stored = sum(t.numel() for name, t in weights.items() if "position.table" not in name)  # sinusoids: a buffer
    assert report["total"] == stored - (shared if "output_proj.weight" in weights else 0)
    assert main(["params", "--model", str(run), "--set", "d_model=8"]) == 2
    assert "the run's config fixes the model" in capsys.readouterr().err
