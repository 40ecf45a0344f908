"""An attnkit classifier or pretraining run written out as a BERT folder.

A classifier's export is a ``BertForSequenceClassification`` folder (``bert.`` prefix, the head as
``bert.pooler.dense`` and ``classifier``, ``id2label`` / ``label2id``) when the classifier pools the first token; a
mean-pooling head has no counterpart in that class, so it exports as the encoder alone (``BertModel``) on request
only. A pretraining run (``attnkit pretrain``) exports as a ``BertForMaskedLM`` (its masked-LM head as
``cls.predictions``, the decoder tied to the word embeddings, so not written), or as the encoder alone.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch
from safetensors.torch import save as safetensors_bytes
from torch import Tensor

from attnkit import runs
from attnkit.atomic import atomic_directory, atomic_write_bytes, atomic_write_json
from attnkit.config import ClassifierConfig, MaskedLMConfig
from attnkit.errors import InputError
from attnkit.interop.bert.config import bert_config_dict, check_bert_shaped
from attnkit.interop.bert.weights import attnkit_to_bert_state_dict
from attnkit.model.classifier import TransformerClassifier
from attnkit.model.masked_lm import MaskedLanguageModel
from attnkit.tasks.classify import ClassifierRun
from attnkit.tasks.pretrain import MASK_TOKEN
from attnkit.tokenization.tokenizer import Tokenizer

# BertForSequenceClassification computes logits = W_c tanh(W_p h_[CLS] + b_p) + b_c (BERT's pooler, then a linear
# layer); attnkit's "cls" head is logits = W h_[CLS] + b. The pooler is written so that it carries the (centred)
# logits scaled by POOLER_SCALE, where tanh is linear to float32 precision, and the classifier scales them back:
# tanh(s z) / s = z (1 - (s z)^2 / 3 + ...), a relative change below 4e-9 for |z| < 1 with s = 1e-4, 4e-7 at |z| = 10.
# Centring (softmax is shift-invariant) keeps |z| small; the labels never change, as tanh is monotone.
POOLER_SCALE = 1e-4


def classification_head_tensors(head_weight: Tensor, head_bias: Tensor, d_model: int) -> dict[str, Tensor]:
    """BERT's pooler and classifier tensors that reproduce attnkit's "cls" head (W (C, D), b (C,)).

    A single binary logit z (sigmoid) becomes the two logits (-z/2, z/2), whose softmax is (1 - sigmoid(z),
    sigmoid(z)); C > 1 logits are centred (the mean logit subtracted, softmax unchanged). Returns tensors for
    ``bert.pooler.dense`` (D, D) and ``classifier`` (C', D), C' = max(C, 2).
    """
    weight, bias = head_weight.detach().double(), head_bias.detach().double()
    if weight.size(0) == 1:
        weight, bias = torch.cat([-weight / 2, weight / 2]), torch.cat([-bias / 2, bias / 2])  # (2, D), (2,)
    else:
        weight, bias = weight - weight.mean(dim=0), bias - bias.mean()  # (C, D), (C,)
    n_labels = weight.size(0)
    pooler_weight = torch.zeros(d_model, d_model, dtype=torch.float64)  # (D, D): rows past C' give tanh(0) = 0
    pooler_bias = torch.zeros(d_model, dtype=torch.float64)
    pooler_weight[:n_labels], pooler_bias[:n_labels] = POOLER_SCALE * weight, POOLER_SCALE * bias
    classifier_weight = torch.zeros(n_labels, d_model, dtype=torch.float64)  # (C', D)
    classifier_weight[:, :n_labels] = torch.eye(n_labels, dtype=torch.float64) / POOLER_SCALE
    dtype = head_weight.dtype
    return {
        "bert.pooler.dense.weight": pooler_weight.to(dtype),
        "bert.pooler.dense.bias": pooler_bias.to(dtype),
        "classifier.weight": classifier_weight.to(dtype),
        "classifier.bias": torch.zeros(n_labels, dtype=dtype),
    }


def masked_lm_head_tensors(model: MaskedLanguageModel) -> dict[str, Tensor]:
    """BERT's ``cls.predictions`` tensors of attnkit's masked-LM head: the transform and the output bias (the decoder
    weight is the word embedding matrix, tied, and transformers ties it again on loading, as it saves it)."""
    head = model.head
    return {
        "cls.predictions.transform.dense.weight": head.dense.weight,
        "cls.predictions.transform.dense.bias": head.dense.bias,
        "cls.predictions.transform.LayerNorm.weight": head.norm.weight,
        "cls.predictions.transform.LayerNorm.bias": head.norm.bias,
        "cls.predictions.bias": head.bias,
    }


def check_exportable_head(cfg: ClassifierConfig, labels: list[str]) -> None:
    """InputError saying why BertForSequenceClassification cannot reproduce this classifier, and what works."""
    if cfg.pooling != "cls":
        raise InputError(
            f"pooling={cfg.pooling!r}: BertForSequenceClassification classifies from the first token ([CLS]) only and "
            "cannot average over the tokens, so its predictions would differ from this model's. What works: "
            "`attnkit export hf --encoder-only` (the fine-tuned encoder as a BertModel; average its last hidden states "
            "over the attention mask and apply the head yourself), `attnkit export onnx` (the whole classifier), or "
            "training with --set pooling=cls, which exports as BertForSequenceClassification"
        )
    n_labels = max(cfg.n_classes or 2, 2)
    if len(labels) != n_labels:
        raise InputError(f"the run has {len(labels)} labels but its head has {n_labels} classes")
    if n_labels > cfg.d_model:
        raise InputError(f"{n_labels} classes exceed d_model={cfg.d_model}: BERT's pooler cannot carry them")


def _vocab_txt(tokenizer: Tokenizer) -> str | None:
    """``vocab.txt`` (tokens in id order) when the tokenizer is a WordPiece model with contiguous ids, else None."""
    if json.loads(tokenizer.backend.to_str())["model"]["type"] != "WordPiece":
        return None
    by_id = sorted(tokenizer.backend.get_vocab(with_added_tokens=True).items(), key=lambda item: item[1])
    if [i for _, i in by_id] != list(range(len(by_id))) or any("\n" in token for token, _ in by_id):
        return None
    return "".join(f"{token}\n" for token, _ in by_id)


# What ``write_bert_folder`` writes: a folder of these files alone is an earlier export, which it may replace.
EXPORT_FILES = frozenset({"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "vocab.txt"})


def _prepare_out(out_dir: Path) -> None:
    """Refuse to replace anything but an earlier export (a BERT config and the files an export writes, nothing
    else): never an attnkit run, a downloaded model folder with files of its own, or an unrelated directory, whose
    contents the replacement would delete."""
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError(f"{out_dir}: exists and is not a directory")
    if not out_dir.is_dir() or not any(out_dir.iterdir()):
        return
    config_path = out_dir / "config.json"
    if not config_path.is_file():
        raise InputError(f"{out_dir}: exists and is not a BERT folder; choose a new --out")
    config = runs.read_json(config_path)
    if "task" in config:
        raise InputError(f"{out_dir}: is an attnkit run directory; choose a new --out")
    others = sorted(path.name for path in out_dir.iterdir() if path.name not in EXPORT_FILES)
    if others or config.get("model_type") != "bert":
        what = (
            f"holds {', '.join(others[:5])}{' ...' if len(others) > 5 else ''}, which an export does not write"
            if others
            else "its config.json is not a BERT model's"
        )
        raise InputError(f"{out_dir}: {what}; an export replaces only an earlier export's folder (choose a new --out)")


def write_bert_folder(
    model: TransformerClassifier | MaskedLanguageModel,
    cfg: ClassifierConfig | MaskedLMConfig,
    tokenizer: Tokenizer,
    out_dir: str | Path,
    *,
    labels: list[str] | None = None,
    masked_lm: bool = False,
) -> Path:
    """Write ``model`` as a BERT folder: config.json, model.safetensors, tokenizer.json, tokenizer_config.json and,
    for WordPiece vocabularies, vocab.txt.

    Without ``labels`` the folder is the encoder alone (``BertModel``; the head is dropped). With ``labels`` (the
    run's class names, in class order) it is a ``BertForSequenceClassification`` with ``id2label`` / ``label2id``
    whose probabilities equal the model's; only "cls" pooling can be written so (``check_exportable_head``). With
    ``masked_lm`` (a ``MaskedLanguageModel``), it is a ``BertForMaskedLM`` whose logits equal the model's.

    The folder is built under a temporary name beside ``out_dir`` and renamed into place, so readers never see a
    config of one export with the weights of another; an earlier BERT folder at ``out_dir`` is replaced.
    """
    check_bert_shaped(cfg)
    if labels is not None:
        assert isinstance(cfg, ClassifierConfig)
        check_exportable_head(cfg, labels)
    out_dir = Path(out_dir)
    _prepare_out(out_dir)
    config = bert_config_dict(cfg, tokenizer.pad_id)
    weights = attnkit_to_bert_state_dict(model.state_dict(), cfg.n_layers)
    roles = {f"{role}_token": token for role, token in dataclasses.asdict(tokenizer.specials).items() if token}
    if masked_lm:
        assert isinstance(model, MaskedLanguageModel)
        config.update(architectures=["BertForMaskedLM"], tie_word_embeddings=True)
        weights = {f"bert.{name}": tensor for name, tensor in weights.items()}
        weights.update({name: t.detach().contiguous() for name, t in masked_lm_head_tensors(model).items()})
        roles["mask_token"] = MASK_TOKEN
    elif labels is not None:
        assert isinstance(model, TransformerClassifier)
        config.update(
            architectures=["BertForSequenceClassification"],
            num_labels=len(labels),
            id2label={str(i): label for i, label in enumerate(labels)},
            label2id={label: i for i, label in enumerate(labels)},
            problem_type="single_label_classification",
        )
        weights = {f"bert.{name}": tensor for name, tensor in weights.items()}
        weights.update(classification_head_tensors(model.head.weight, model.head.bias, cfg.d_model))
    with atomic_directory(out_dir) as work:
        atomic_write_json(work / "config.json", config)
        atomic_write_bytes(work / "model.safetensors", safetensors_bytes(weights, metadata={"format": "pt"}))
        atomic_write_bytes(work / "tokenizer.json", tokenizer.backend.to_str(pretty=True).encode("utf-8"))
        atomic_write_json(
            work / "tokenizer_config.json",
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "model_max_length": cfg.max_len,
                # a lossless (BPE) tokenizer reads "<mask>" typed in a text as text, as attnkit does (tokenizer.json
                # cannot say so: the `tokenizers` library does not save it)
                **({"split_special_tokens": True} if tokenizer.lossless else {}),
                **roles,
            },
        )
        vocab = _vocab_txt(tokenizer)
        if vocab is not None:
            atomic_write_bytes(work / "vocab.txt", vocab.encode("utf-8"))
    return out_dir


def export_bert_folder(run_dir: str | Path, out_dir: str | Path, *, encoder_only: bool = False) -> Path:
    """The attnkit classifier run at ``run_dir`` as a BERT folder at ``out_dir``: a BertForSequenceClassification
    (head and label map) or, with ``encoder_only``, the encoder as a BertModel. A pretraining run is written as a
    BertForMaskedLM, or the encoder alone with ``encoder_only``. The BertModel has no pooler (BERT's tanh layer over
    [CLS], which attnkit's models do not have): transformers initialises ``pooler.dense`` at random on loading it and
    says so, and ``last_hidden_state`` is the encoder's output."""
    config_path = Path(run_dir) / runs.CONFIG
    if config_path.is_file() and runs.read_json(config_path).get("task") == "pretrain":
        pretrained = runs.load_run(run_dir, task="pretrain")
        assert isinstance(pretrained.model, MaskedLanguageModel) and isinstance(pretrained.model_cfg, MaskedLMConfig)
        try:
            check_bert_shaped(pretrained.model_cfg)
        except InputError as err:
            raise InputError(f"{pretrained.run_dir}: {err}") from None
        return write_bert_folder(
            pretrained.model, pretrained.model_cfg, pretrained.tokenizer, out_dir, masked_lm=not encoder_only
        )
    run = ClassifierRun(run_dir)  # checks the files against the manifest and that the run is a classifier
    try:
        check_bert_shaped(run.model_cfg)
        if not encoder_only:
            check_exportable_head(run.model_cfg, run.labels)
    except InputError as err:
        raise InputError(f"{run.run_dir}: {err}") from None
    return write_bert_folder(
        run.model, run.model_cfg, run.tokenizer, out_dir, labels=None if encoder_only else run.labels
    )
