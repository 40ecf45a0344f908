"""Hugging Face BERT folders in and out of attnkit's encoder: the same weights in attnkit and in transformers'
``BertModel`` give the same hidden states (a tiny random BERT, and MiniLM when it is cached), MiniLM reproduces its
published similarities, an export loads back into transformers (the encoder as BertModel; a first-token classifier as
BertForSequenceClassification with the same probabilities), and bad folders are refused with clear errors.

transformers is a test-only dependency (never imported by attnkit); the MiniLM tests use the cached recipe and
never download."""

from __future__ import annotations

import copy
import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from attnkit import runs
from attnkit.config import ClassifierConfig
from attnkit.data.batching import pad
from attnkit.data.packages import default_cache_dir
from attnkit.errors import InputError
from attnkit.interop.bert import (
    POOLER_SCALE,
    embed,
    export_bert_folder,
    load_bert_classifier,
    load_bert_tokenizer,
    write_bert_folder,
)
from attnkit.model.build import build_classifier
from attnkit.tasks.classify import ClassifierRun
from attnkit.tasks.embed import sentence_embeddings

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # every folder here is local; never reach for the hub
transformers = pytest.importorskip("transformers")

MINILM = default_cache_dir() / "minilm"
needs_minilm = pytest.mark.skipif(
    not (MINILM / "model.safetensors").is_file(),
    reason=f"MiniLM is not cached at {MINILM} (run `attnkit data fetch minilm` once; tests never download)",
)
SENTENCES = [
    "The new movie is awesome",
    "A cat sat on the mat.",
    "The dog plays in the garden, and the cat watches it from the window all afternoon!",
    "so great",
]
TINY_WORDS = "the cat dog sat on mat plays in garden new movie is so great awesome and it".split()


def _tiny_vocab() -> list[str]:
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", ",", "!"]
    tokens = specials + TINY_WORDS + letters + [f"##{c}" for c in letters]
    return tokens + [f"[unused{i}]" for i in range(100 - len(tokens))]


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory) -> tuple[Path, object]:
    """A random 2-layer BERT saved by transformers (safetensors) with a 100-token vocab.txt, and the model itself.

    Every parameter is perturbed from transformers' init (LayerNorm weights 1, biases 0) so that a mapping that
    swapped two LayerNorms or dropped a bias would show."""
    torch.manual_seed(0)
    config = transformers.BertConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, vocab_size=100
    )
    hf = transformers.BertModel(config).eval()
    with torch.no_grad():
        for param in hf.parameters():
            param.add_(0.1 * torch.randn_like(param))
    folder = tmp_path_factory.mktemp("tiny-bert")
    hf.save_pretrained(folder)
    assert (folder / "model.safetensors").is_file()
    (folder / "vocab.txt").write_text("".join(f"{t}\n" for t in _tiny_vocab()), encoding="utf-8")
    return folder, hf


@pytest.fixture(scope="module")
def minilm():
    if not (MINILM / "model.safetensors").is_file():
        pytest.skip(f"MiniLM is not cached at {MINILM} (run `attnkit data fetch minilm` once; tests never download)")
    return load_bert_classifier(MINILM, n_classes=2)


def _max_diff_real_tokens(model, tokenizer, hf, texts: list[str]) -> float:
    """Largest |attnkit - transformers| over the real (non-pad) positions of a padded batch of ``texts``."""
    ids = pad(tokenizer.encode_batch(texts), tokenizer.pad_id)  # (B, S)
    assert (ids == tokenizer.pad_id).any(), "the batch should contain padding"
    model.eval()
    with torch.no_grad():
        hidden, mask, _ = model.encode(ids)  # (B, S, D)
        real = mask[:, 0, 0]  # (B, S)
        reference = hf(input_ids=ids, attention_mask=real.long()).last_hidden_state  # (B, S, D)
    return (hidden[real] - reference[real]).abs().max().item()


def _copy_folder(src: Path, dst: Path, skip: tuple[str, ...] = ()) -> Path:
    dst.mkdir()
    for path in src.iterdir():
        if path.is_file() and path.name not in skip:
            shutil.copy(path, dst / path.name)
    return dst


def _perturb(model) -> None:
    """Stand-in for fine-tuning: every parameter moves, so an export of the unchanged import would not pass."""
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.02 * torch.randn_like(param))


# ---------------------------------------------------------------------------------------------------------------
# Import: same hidden states as transformers


def test_tiny_random_bert_matches_transformers(tiny_bert):
    folder, hf = tiny_bert
    model, cfg, tokenizer = load_bert_classifier(folder, n_classes=3)
    shape = (cfg.d_model, cfg.n_heads, cfg.d_ff, cfg.n_layers, cfg.vocab_size, cfg.n_token_types)
    assert shape == (32, 4, 64, 2, 100, 2)
    assert (cfg.dropout, cfg.attention_dropout) == (0.1, 0.1)  # hidden and attention-probability dropout, for training
    assert model.pad_id == tokenizer.pad_id == 0
    assert tokenizer.tokens("A cat sat.") == ["[CLS]", "a", "cat", "sat", ".", "[SEP]"]  # built from vocab.txt
    assert _max_diff_real_tokens(model, tokenizer, hf, SENTENCES) < 1e-5


@needs_minilm
def test_minilm_hidden_states_match_transformers(minilm):
    model, cfg, tokenizer = minilm
    assert (cfg.d_model, cfg.n_heads, cfg.d_ff, cfg.n_layers, cfg.layer_norm_eps) == (384, 12, 1536, 6, 1e-12)
    hf = transformers.BertModel.from_pretrained(MINILM, add_pooling_layer=False).eval()
    assert _max_diff_real_tokens(model, tokenizer, hf, SENTENCES) < 1e-4


@needs_minilm
def test_minilm_reproduces_the_published_similarities():
    a, b, c = embed(
        "minilm",
        ["The new movie is awesome", "The new movie is so great", "The dog plays in the garden"],
        pool="mean",
        normalize=True,
    )
    assert abs(float(a @ b) - 0.8939) < 1e-3
    assert abs(float(a @ c) - 0.0543) < 1e-3


@needs_minilm
def test_vocab_txt_fallback_tokenizes_like_tokenizer_json(tmp_path):
    folder = _copy_folder(MINILM, tmp_path / "minilm", skip=("tokenizer.json", "model.safetensors"))
    from_vocab, from_json = load_bert_tokenizer(folder), load_bert_tokenizer(MINILM)
    texts = SENTENCES + ["Crème brûlée, naïve café — 東京 and ünïcödé!", "unaffable antidisestablishmentarianism"]
    assert from_vocab.encode_batch(texts) == from_json.encode_batch(texts)


@needs_minilm
def test_padding_configured_in_tokenizer_json_is_switched_off(minilm):
    _, _, tokenizer = minilm  # MiniLM's tokenizer.json pads to a fixed 128 and truncates at 128
    assert len(tokenizer.encode("short")) == 3
    assert len(tokenizer.encode("word " * 300)) == 302


def test_sentence_embeddings_do_not_depend_on_batching(tiny_bert):
    model, _, tokenizer = load_bert_classifier(tiny_bert[0], n_classes=2)
    alone = torch.cat([sentence_embeddings(model, tokenizer, [text]) for text in SENTENCES])  # (N, D), no padding
    batched = sentence_embeddings(model, tokenizer, SENTENCES, batch_size=8)  # (N, D), padded
    torch.testing.assert_close(batched, alone, atol=1e-5, rtol=0)
    cls = sentence_embeddings(model, tokenizer, SENTENCES, pool="cls", normalize=True)
    torch.testing.assert_close(cls.norm(dim=-1), torch.ones(len(SENTENCES)))


def test_long_text_is_truncated_keeping_the_final_sep(tiny_bert):
    model, _, tokenizer = load_bert_classifier(tiny_bert[0], n_classes=2)
    text = "a " * 600  # [CLS] + 600 + [SEP], past the 512 positions
    ids = tokenizer.encode(text)
    kept = ids[:511] + ids[-1:]  # the text cut, [SEP] kept
    model.eval()
    with torch.no_grad():
        hidden, _, _ = model.encode(torch.tensor([kept]))
    torch.testing.assert_close(sentence_embeddings(model, tokenizer, [text]), hidden.mean(dim=1))


# ---------------------------------------------------------------------------------------------------------------
# Export: attnkit -> BERT folder -> transformers


def test_export_through_a_run_directory_loads_in_transformers(tiny_bert, tmp_path, write_run):
    model, cfg, tokenizer = load_bert_classifier(tiny_bert[0], n_classes=2)
    _perturb(model)
    run_dir = write_run(tmp_path / "run", "classify", model, cfg, tokenizer, ["neg", "pos"])

    out = export_bert_folder(run_dir, tmp_path / "bert", encoder_only=True)
    exported = json.loads((out / "config.json").read_text())
    assert (exported["model_type"], exported["architectures"]) == ("bert", ["BertModel"])
    assert (exported["hidden_dropout_prob"], exported["attention_probs_dropout_prob"]) == (0.1, 0.1)
    assert (out / "vocab.txt").read_text(encoding="utf-8").splitlines() == _tiny_vocab()
    hf = transformers.BertModel.from_pretrained(out, add_pooling_layer=False).eval()
    assert _max_diff_real_tokens(model, tokenizer, hf, SENTENCES) < 1e-5

    reloaded, _, reloaded_tokenizer = load_bert_classifier(out, n_classes=2)  # and back into attnkit, exactly
    for name, tensor in reloaded.state_dict().items():
        if not name.startswith("head."):
            assert torch.equal(tensor, model.state_dict()[name]), name
    assert reloaded_tokenizer.encode_batch(SENTENCES) == tokenizer.encode_batch(SENTENCES)
    vectors = embed(run_dir, SENTENCES)  # embed reads the run's encoder too
    torch.testing.assert_close(vectors, sentence_embeddings(model, tokenizer, SENTENCES))


@needs_minilm
def test_exported_minilm_loads_in_transformers(minilm, tmp_path):
    model, cfg, tokenizer = minilm
    model = copy.deepcopy(model)  # the fixture is shared; perturb a copy
    _perturb(model)
    out = write_bert_folder(model, cfg, tokenizer, tmp_path / "bert")
    assert (out / "vocab.txt").read_bytes() == (MINILM / "vocab.txt").read_bytes()
    hf = transformers.BertModel.from_pretrained(out, add_pooling_layer=False).eval()
    assert _max_diff_real_tokens(model, tokenizer, hf, SENTENCES) < 1e-4


def test_export_refuses_a_model_that_is_not_bert_shaped(tiny_bert, tmp_path, write_run):
    _, _, tokenizer = load_bert_classifier(tiny_bert[0], n_classes=2)
    # the paper's encoder
    cfg = ClassifierConfig(vocab_size=100, d_model=32, n_heads=4, d_ff=64, n_layers=1, n_classes=2)
    run_dir = write_run(tmp_path / "run", "classify", build_classifier(cfg), cfg, tokenizer, ["neg", "pos"])
    with pytest.raises(InputError, match=r"only BERT-shaped encoders.*positional='sinusoidal'"):
        export_bert_folder(run_dir, tmp_path / "bert")
    assert not (tmp_path / "bert").exists()


def test_export_refuses_to_overwrite_a_run_directory(tiny_bert, tmp_path, write_run):
    model, cfg, tokenizer = load_bert_classifier(tiny_bert[0], n_classes=2, pooling="cls")
    run_dir = write_run(tmp_path / "run", "classify", model, cfg, tokenizer, ["neg", "pos"])
    with pytest.raises(InputError, match="is an attnkit run directory"):
        export_bert_folder(run_dir, run_dir)
    runs.check_run_dir(run_dir)  # untouched: still matches its manifest


def test_export_replaces_an_earlier_export_and_nothing_else(tiny_bert, tmp_path, write_run):
    """An export replaces the folder it writes into: an earlier export's, yes; a folder with a config.json and files
    of its own (a project, a downloaded model with its README and pooling config) is refused, untouched (it was
    emptied and replaced whole)."""
    model, cfg, tokenizer = load_bert_classifier(tiny_bert[0], n_classes=2, pooling="cls")
    run_dir = write_run(tmp_path / "run", "classify", model, cfg, tokenizer, ["neg", "pos"])
    out = export_bert_folder(run_dir, tmp_path / "hf")
    assert export_bert_folder(run_dir, out) == out  # again: an earlier export is replaced
    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    (project / "config.json").write_text('{"name": "app"}', encoding="utf-8")
    (project / "src" / "main.py").write_text("x", encoding="utf-8")
    with pytest.raises(InputError, match=r"project: holds src, which an export does not write; .* new --out"):
        export_bert_folder(run_dir, project)
    downloaded = _copy_folder(tiny_bert[0], tmp_path / "downloaded")
    (downloaded / "README.md").write_text("a model card", encoding="utf-8")
    with pytest.raises(InputError, match=r"downloaded: holds README.md, which an export does not write"):
        export_bert_folder(run_dir, downloaded)
    assert (project / "src" / "main.py").is_file() and (downloaded / "README.md").is_file()
    (out / "config.json").write_text('{"model_type": "gpt2"}', encoding="utf-8")
    with pytest.raises(InputError, match=r"hf: its config.json is not a BERT model's; an export replaces only"):
        export_bert_folder(run_dir, out)


def _hf_probabilities(folder: Path, texts: list[str]) -> torch.Tensor:
    """Softmax of AutoModelForSequenceClassification on ``folder``, tokenized by AutoTokenizer, padded batch."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(folder).eval()
    assert type(hf).__name__ == "BertForSequenceClassification"
    inputs = tokenizer(texts, padding=True, return_tensors="pt")
    assert (inputs["attention_mask"] == 0).any(), "the batch should contain padding"
    with torch.no_grad():
        return hf(**inputs).logits.softmax(dim=-1)  # (N, C)


def _classifier_run(write_run, tiny_bert, tmp_path, n_classes: int, labels: list[str], head_scale: float = 1.0) -> Path:
    model, cfg, tokenizer = load_bert_classifier(tiny_bert[0], n_classes=n_classes, pooling="cls")
    _perturb(model)
    with torch.no_grad():
        model.head.weight.mul_(head_scale)  # confident heads: logits of several units, where tanh is far from linear
    return write_run(tmp_path / "run", "classify", model, cfg, tokenizer, labels)


@pytest.mark.parametrize(
    ("n_classes", "labels", "head_scale"),
    [
        (3, ["anger", "joy", "fear"], 1.0),
        (3, ["anger", "joy", "fear"], 8.0),
        (1, ["neg", "pos"], 8.0),  # a single sigmoid logit becomes two softmax logits
    ],
)
def test_classifier_exports_as_bert_for_sequence_classification(
    tiny_bert, tmp_path, n_classes, labels, head_scale, write_run
):
    run_dir = _classifier_run(write_run, tiny_bert, tmp_path, n_classes, labels, head_scale)
    run = ClassifierRun(run_dir)
    out = export_bert_folder(run_dir, tmp_path / "hf")
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["BertForSequenceClassification"]
    assert config["num_labels"] == len(labels)
    assert config["id2label"] == {str(i): label for i, label in enumerate(labels)}
    assert config["label2id"] == {label: i for i, label in enumerate(labels)}

    ours = torch.tensor([[p.probs[label] for label in labels] for p in run.predict(SENTENCES)])  # (N, C)
    theirs = _hf_probabilities(out, SENTENCES)  # (N, C)
    logits = run.logits(SENTENCES)
    print(
        f"largest |logit| {logits.abs().max():.2f}, "
        f"largest |p_attnkit - p_transformers| {(ours - theirs).abs().max():.2e}"
    )
    if head_scale > 1:
        assert logits.abs().max() > 1.0, "the confident head should give logits far from 0"
    torch.testing.assert_close(theirs, ours, atol=1e-5, rtol=0)
    hf_config = transformers.AutoConfig.from_pretrained(out)
    assert [hf_config.id2label[i] for i in theirs.argmax(dim=-1).tolist()] == [p.label for p in run.predict(SENTENCES)]


def test_exported_pooler_is_not_linear_by_accident(tiny_bert, tmp_path, write_run):
    """The check above can fail: without the scale (tanh of the raw logits) the probabilities differ."""
    run_dir = _classifier_run(write_run, tiny_bert, tmp_path, 3, ["a", "b", "c"], head_scale=8.0)
    out = export_bert_folder(run_dir, tmp_path / "hf")
    state = load_file(str(out / "model.safetensors"))
    state["bert.pooler.dense.weight"] /= POOLER_SCALE
    state["bert.pooler.dense.bias"] /= POOLER_SCALE
    state["classifier.weight"] *= POOLER_SCALE
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    ours = torch.tensor([[p.probs[c] for c in "abc"] for p in ClassifierRun(run_dir).predict(SENTENCES)])
    assert (_hf_probabilities(out, SENTENCES) - ours).abs().max() > 1e-2


def test_mean_pooling_classifier_is_refused_with_what_works(tiny_bert, tmp_path, write_run):
    model, cfg, tokenizer = load_bert_classifier(tiny_bert[0], n_classes=2)  # pooling="mean", --init-from's default
    run_dir = write_run(tmp_path / "run", "classify", model, cfg, tokenizer, ["neg", "pos"])
    with pytest.raises(InputError, match=r"pooling='mean'.*BertForSequenceClassification.*--encoder-only.*export onnx"):
        export_bert_folder(run_dir, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()
    out = export_bert_folder(run_dir, tmp_path / "hf", encoder_only=True)
    assert json.loads((out / "config.json").read_text())["architectures"] == ["BertModel"]


def test_cli_export_hf_exit_codes(tiny_bert, tmp_path, capsys, write_run):
    from attnkit.cli import main

    model, cfg, tokenizer = load_bert_classifier(tiny_bert[0], n_classes=2)
    run_dir = write_run(tmp_path / "run", "classify", model, cfg, tokenizer, ["neg", "pos"])
    assert main(["export", "hf", "--model", str(run_dir), "--out", str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "--encoder-only" in err[0]
    assert main(["export", "hf", "--model", str(run_dir), "--out", str(tmp_path / "hf"), "--encoder-only"]) == 0
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["architectures"] == ["BertModel"]


# ---------------------------------------------------------------------------------------------------------------
# Bad input


def test_folder_without_weights_is_refused(tiny_bert, tmp_path):
    folder = _copy_folder(tiny_bert[0], tmp_path / "no-weights", skip=("model.safetensors",))
    with pytest.raises(InputError, match=f"{folder}: no model.safetensors"):
        load_bert_classifier(folder, n_classes=2)
    (folder / "pytorch_model.bin").write_bytes(b"not opened")
    with pytest.raises(InputError, match="does not unpickle.*safetensors"):
        load_bert_classifier(folder, n_classes=2)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"model_type": "gpt2", "architectures": ["GPT2Model"]}, "model_type 'gpt2'.*not BERT"),
        ({"hidden_act": "gelu_new"}, "hidden_act 'gelu_new' is not supported"),
        ({"position_embedding_type": "relative_key"}, "position_embedding_type 'relative_key'"),
    ],
)
def test_config_of_another_architecture_is_refused(tiny_bert, tmp_path, change, message):
    folder = _copy_folder(tiny_bert[0], tmp_path / "other")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(InputError, match=message) as err:
        load_bert_classifier(folder, n_classes=2)
    assert str(folder) in str(err.value)


def test_tensor_of_the_wrong_shape_is_named(tiny_bert, tmp_path):
    folder = _copy_folder(tiny_bert[0], tmp_path / "bad-shape")
    state = load_file(str(folder / "model.safetensors"))
    state["encoder.layer.1.intermediate.dense.weight"] = torch.zeros(48, 32)
    save_file(state, str(folder / "model.safetensors"))
    with pytest.raises(InputError, match=r"encoder\.layer\.1\.intermediate\.dense\.weight .*\(48, 32\).*\(64, 32\)"):
        load_bert_classifier(folder, n_classes=2)


def test_missing_tensors_are_listed_with_both_names(tiny_bert, tmp_path):
    folder = _copy_folder(tiny_bert[0], tmp_path / "missing")
    state = load_file(str(folder / "model.safetensors"))
    del state["encoder.layer.0.attention.output.LayerNorm.bias"], state["embeddings.token_type_embeddings.weight"]
    save_file(state, str(folder / "model.safetensors"))
    with pytest.raises(InputError, match="missing 2 tensor") as err:
        load_bert_classifier(folder, n_classes=2)
    for name in (
        "encoder.layers.0.norm1.bias",
        "encoder.layer.0.attention.output.LayerNorm.bias",
        "embeddings.token_type.weight",
        "embeddings.token_type_embeddings.weight",
    ):
        assert name in str(err.value)
