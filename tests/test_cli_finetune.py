"""Fine-tuning a pretrained BERT-format encoder through the CLI (`classify train --init-from`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from attnkit.cli import main
from attnkit.data.recipes import default_cache_dir

MINILM = default_cache_dir() / "minilm"
pytestmark = pytest.mark.skipif(not (MINILM / "model.safetensors").is_file(),
                                reason=f"MiniLM not in the cache ({MINILM}); run `attnkit data fetch minilm`")
EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "seed000_train.tsv"


@pytest.fixture(scope="module")
def finetuned(tmp_path_factory):
    out = tmp_path_factory.mktemp("ft") / "run"
    code = main(["classify", "train", "--train", str(EXAMPLES), "--init-from", "minilm", "--out", str(out),
                 "--epochs", "1", "--quiet"])
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


def test_encoder_starts_from_the_pretrained_weights(tmp_path):
    """Before any step the encoder is MiniLM's: its sentence vectors equal `embed --model minilm`."""
    import torch

    from attnkit.interop.bert import embed, load_bert_classifier

    model, _, tokenizer = load_bert_classifier(MINILM, n_classes=2)
    texts = ["The new movie is awesome", "The dog plays in the garden"]
    from attnkit.interop.bert import sentence_embeddings

    torch.testing.assert_close(sentence_embeddings(model, tokenizer, texts), embed("minilm", texts))


@pytest.mark.parametrize("setting", ["d_model=64", "n_layers=2", "tokenizer=word"])
def test_architecture_keys_are_refused_with_init_from(tmp_path, capsys, setting):
    code = main(["classify", "train", "--train", str(EXAMPLES), "--init-from", "minilm", "--out", str(tmp_path / "r"),
                 "--set", setting])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --init-from") and setting.split("=")[0] in err[0]
