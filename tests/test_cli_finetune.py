"""Fine-tuning a pretrained BERT-format encoder through the CLI (`classify train --init-from`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from attnkit.cli import main
from attnkit.data.packages import default_cache_dir

MINILM = default_cache_dir() / "minilm"
pytestmark = pytest.mark.skipif(
    not (MINILM / "model.safetensors").is_file(),
    reason=f"MiniLM not in the cache ({MINILM}); run `attnkit data fetch minilm`",
)
EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "seed000_train.tsv"


@pytest.fixture(scope="module")
def finetuned(tmp_path_factory):
    out = tmp_path_factory.mktemp("ft") / "run"
    code = main(
        [
            "classify",
            "train",
            "--train",
            str(EXAMPLES),
            "--init-from",
            "minilm",
            "--out",
            str(out),
            "--epochs",
            "1",
            "--quiet",
        ]
    )
    assert code == 0
    return out


def test_run_is_self_contained_and_predicts(finetuned, tmp_path, capsys):
    """The run directory alone (moved elsewhere, no pretrained folder needed) predicts, with the BERT tokenizer."""
    moved = tmp_path / "moved"
    shutil.copytree(finetuned, moved)
    capsys.readouterr()
    assert main(["classify", "predict", "--model", str(moved), "a wonderful, moving film"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert abs(sum(row["probs"].values()) - 1.0) < 1e-6
    config = json.loads((moved / "config.json").read_text())
    assert config["model"]["d_model"] == 384 and config["model"]["positional"] == "learned"
    assert config["tokenizer"]["specials"]["pad"] == "[PAD]"
    assert config["init_from"] == "minilm"


def test_a_run_killed_before_its_first_save_resumes_from_the_pretrained_encoder(finetuned, tmp_path):
    """A kill before the first save leaves the run's config, tokenizer and labels but no weights or state: --resume
    starts it again from MiniLM (not from random weights) and ends where the uninterrupted run ended."""
    from attnkit import runs

    killed = tmp_path / "run"
    killed.mkdir()
    for name in (runs.CONFIG, runs.TOKENIZER, runs.LABELS):
        shutil.copy(finetuned / name, killed / name)
    argv = ["classify", "train", "--train", str(EXAMPLES), "--init-from", "minilm", "--out", str(killed)]
    assert main([*argv, "--epochs", "1", "--quiet", "--resume"]) == 0
    assert (killed / runs.WEIGHTS).read_bytes() == (finetuned / runs.WEIGHTS).read_bytes()


def test_encoder_starts_from_the_pretrained_weights(tmp_path):
    """Before any step the encoder is MiniLM's: its sentence vectors equal `embed --model minilm`."""
    import torch

    from attnkit.interop.bert import embed, load_bert_classifier

    model, _, tokenizer = load_bert_classifier(MINILM, n_classes=2)
    texts = ["The new movie is awesome", "The dog plays in the garden"]
    from attnkit.tasks.embed import sentence_embeddings

    torch.testing.assert_close(sentence_embeddings(model, tokenizer, texts), embed("minilm", texts))


@pytest.mark.parametrize("setting", ["d_model=64", "n_layers=2", "tokenizer=word"])
def test_architecture_keys_are_refused_with_init_from(tmp_path, capsys, setting):
    code = main(
        [
            "classify",
            "train",
            "--train",
            str(EXAMPLES),
            "--init-from",
            "minilm",
            "--out",
            str(tmp_path / "r"),
            "--set",
            setting,
        ]
    )
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --init-from") and setting.split("=")[0] in err[0]


def test_embed_command_reproduces_the_published_similarities(capsys):
    """DATA.md: cos("The new movie is awesome", "... so great") = 0.8939, with "The dog plays in the garden" 0.0543."""
    texts = ["The new movie is awesome", "The new movie is so great", "The dog plays in the garden"]
    assert main(["embed", "--model", "minilm", "--normalize", *texts]) == 0
    vectors = [json.loads(line)["vector"] for line in capsys.readouterr().out.splitlines()]
    dot = lambda a, b: sum(x * y for x, y in zip(a, b))  # noqa: E731 - unit vectors: the dot product is the cosine
    assert abs(dot(vectors[0], vectors[1]) - 0.8939) < 1e-3
    assert abs(dot(vectors[0], vectors[2]) - 0.0543) < 1e-3


@pytest.mark.parametrize("problem", ["no-weights", "gpt2", "wrong-shape"])
def test_bad_pretrained_folders_give_exit_2(tmp_path, capsys, problem):
    import shutil

    from safetensors.torch import load_file, save_file

    folder = tmp_path / "bert"
    shutil.copytree(MINILM, folder)
    if problem == "no-weights":
        (folder / "model.safetensors").unlink()
    elif problem == "gpt2":
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(
            json.dumps({**config, "model_type": "gpt2", "architectures": ["GPT2Model"]})
        )
    else:
        state = load_file(str(folder / "model.safetensors"))
        name = next(k for k in state if k.endswith("attention.self.query.weight"))
        state[name] = state[name][:, :100].contiguous()
        save_file(state, str(folder / "model.safetensors"))
    code = main(
        ["classify", "train", "--train", str(EXAMPLES), "--init-from", str(folder), "--out", str(tmp_path / "r")]
    )
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:")
    assert {"no-weights": "model.safetensors", "gpt2": "gpt2", "wrong-shape": "query"}[problem] in err[0]


def test_fine_tuning_from_python_takes_the_same_defaults(finetuned, tmp_path):
    """``attnkit.train_classifier(examples, pretrained=attnkit.load_pretrained("minilm"), out_dir=...)`` trains with
    ``--init-from``'s defaults (lr 5e-5, warmup, weight decay; they were from-scratch training's lr 5e-4), and a path
    where the ``Pretrained`` belongs is a TypeError that says what to pass."""
    import attnkit

    examples = attnkit.read_labeled(EXAMPLES)
    with pytest.raises(TypeError, match=r"pass attnkit.load_pretrained\('minilm'\)"):
        attnkit.train_classifier(examples, out_dir=tmp_path / "run", pretrained="minilm")  # type: ignore[arg-type]
    attnkit.train_classifier(examples, out_dir=tmp_path / "run", pretrained=attnkit.load_pretrained("minilm"))
    ours, cli = (json.loads((run / "config.json").read_text()) for run in (tmp_path / "run", finetuned))
    assert ours["train"] == {**cli["train"], "epochs": 3}  # the fixture's command gave --epochs 1
    assert ours["model"] == cli["model"]
