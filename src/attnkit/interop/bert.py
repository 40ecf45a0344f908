"""Hugging Face BERT folders in and out of attnkit's own encoder (no second encoder class).

A BERT encoder is the paper's post-LN encoder (§3.1) with four traits that ``Embeddings`` and the config already
offer as options: learned positions (Table 3 row E), no sqrt(d_model) scale on the embeddings, token-type
(segment) embeddings, and a LayerNorm after the embedding sum; its FFN uses the exact (erf) GELU.

A folder holds ``config.json``, ``model.safetensors`` (never a pickle) and ``tokenizer.json`` or ``vocab.txt``.
Where each attnkit tensor lives in BERT (``bert.`` prefixes are accepted, pooler / MLM heads ignored):

    embeddings.token.weight               embeddings.word_embeddings.weight
    embeddings.position.embedding.weight  embeddings.position_embeddings.weight
    embeddings.token_type.weight          embeddings.token_type_embeddings.weight
    embeddings.norm                       embeddings.LayerNorm
    encoder.layers.{i}.self_attn.q_proj   encoder.layer.{i}.attention.self.query     (W^Q, §3.2.2; k, v alike)
    encoder.layers.{i}.self_attn.out_proj encoder.layer.{i}.attention.output.dense   (W^O)
    encoder.layers.{i}.norm1              encoder.layer.{i}.attention.output.LayerNorm
    encoder.layers.{i}.ffn.linear1        encoder.layer.{i}.intermediate.dense       (W_1, eq. 2)
    encoder.layers.{i}.ffn.linear2        encoder.layer.{i}.output.dense             (W_2)
    encoder.layers.{i}.norm2              encoder.layer.{i}.output.LayerNorm

Both use ``nn.Linear``'s (out, in) layout, so every tensor is copied unchanged.

An export is a ``BertForSequenceClassification`` folder (``bert.`` prefix, the head as ``bert.pooler.dense`` and
``classifier``, ``id2label`` / ``label2id``) when the classifier pools the first token; a mean-pooling head has no
counterpart in that class, so it exports as the encoder alone (``BertModel``) on request only.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from safetensors.torch import save as safetensors_bytes
from tokenizers import Tokenizer as Backend
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors
from torch import Tensor

from attnkit import runs
from attnkit.atomic import atomic_directory, atomic_write_bytes, atomic_write_json
from attnkit.config import ClassifierConfig
from attnkit.errors import InputError
from attnkit.model.build import build_classifier
from attnkit.model.classifier import TransformerClassifier
from attnkit.tasks.classify import ClassifierRun, Pretrained
from attnkit.tasks.embed import sentence_embeddings
from attnkit.tokenization.tokenizer import SpecialTokens, Tokenizer

log = logging.getLogger(__name__)

_EMBEDDING_NAMES = {
    "embeddings.token.weight": "embeddings.word_embeddings.weight",
    "embeddings.position.embedding.weight": "embeddings.position_embeddings.weight",
    "embeddings.token_type.weight": "embeddings.token_type_embeddings.weight",
    "embeddings.norm.weight": "embeddings.LayerNorm.weight",
    "embeddings.norm.bias": "embeddings.LayerNorm.bias",
}
_LAYER_NAMES = {  # module under attnkit's encoder.layers.{i} -> module under BERT's encoder.layer.{i}
    "self_attn.q_proj": "attention.self.query",
    "self_attn.k_proj": "attention.self.key",
    "self_attn.v_proj": "attention.self.value",
    "self_attn.out_proj": "attention.output.dense",
    "norm1": "attention.output.LayerNorm",
    "ffn.linear1": "intermediate.dense",
    "ffn.linear2": "output.dense",
    "norm2": "output.LayerNorm",
}
# The traits that make an attnkit classifier config a BERT encoder (besides token types and d_head = D / H).
BERT_TRAITS: dict[str, Any] = {
    "positional": "learned",
    "scale_embeddings": False,
    "embedding_norm": True,
    "norm": "post",
    "activation": "gelu",
}


# ---------------------------------------------------------------------------------------------------------------
# config.json


def bert_config(folder: str | Path, *, n_classes: int = 0, pooling: str = "mean") -> ClassifierConfig:
    """The ``ClassifierConfig`` of the BERT encoder described by ``folder/config.json``, with a fresh head."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise InputError(f"{folder}: no config.json (not a Hugging Face model folder)")
    raw = runs.read_json(path)
    model_type, architectures = raw.get("model_type"), raw.get("architectures") or []
    is_bert = model_type == "bert" or (model_type is None and any(str(a).startswith("Bert") for a in architectures))
    if not is_bert:
        raise InputError(
            f"{folder}: model_type {model_type!r} (architectures {architectures}) is not BERT; "
            "attnkit loads BERT-format encoders only"
        )
    missing = [
        k
        for k in ("hidden_size", "num_attention_heads", "intermediate_size", "num_hidden_layers", "vocab_size")
        if k not in raw
    ]
    if missing:
        raise InputError(f"{path}: missing key(s) {', '.join(missing)}")
    # The remaining keys default as in transformers' BertConfig.
    if raw.get("hidden_act", "gelu") != "gelu":
        raise InputError(
            f"{path}: hidden_act {raw['hidden_act']!r} is not supported; attnkit's GELU is the exact "
            "erf form, BERT's 'gelu' (a tanh approximation such as 'gelu_new' would give other outputs)"
        )
    if raw.get("position_embedding_type", "absolute") != "absolute":
        raise InputError(
            f"{path}: position_embedding_type {raw['position_embedding_type']!r} is not supported "
            "(attnkit has absolute learned positions only)"
        )
    if raw.get("is_decoder", False):
        raise InputError(f"{path}: is_decoder is true; attnkit loads bidirectional BERT encoders only")
    try:
        return ClassifierConfig(
            vocab_size=raw["vocab_size"],
            d_model=raw["hidden_size"],
            n_heads=raw["num_attention_heads"],
            d_ff=raw["intermediate_size"],
            n_layers=raw["num_hidden_layers"],
            max_len=raw.get("max_position_embeddings", 512),
            dropout=raw.get("hidden_dropout_prob", 0.1),
            attention_dropout=raw.get("attention_probs_dropout_prob", 0.1),
            layer_norm_eps=raw.get("layer_norm_eps", 1e-12),
            n_token_types=raw.get("type_vocab_size", 2),
            n_classes=n_classes,
            pooling=pooling,
            **BERT_TRAITS,
        )
    except InputError as err:
        raise InputError(f"{path}: {err}") from None


# ---------------------------------------------------------------------------------------------------------------
# Weights


def name_pairs(n_layers: int) -> list[tuple[str, str]]:
    """(attnkit name, BERT name) of every encoder tensor, embeddings first, then layer by layer."""
    pairs = list(_EMBEDDING_NAMES.items())
    for i in range(n_layers):
        for ours, theirs in _LAYER_NAMES.items():
            pairs += [(f"encoder.layers.{i}.{ours}.{p}", f"encoder.layer.{i}.{theirs}.{p}") for p in ("weight", "bias")]
    return pairs


def _bert_key(name: str) -> str:
    """``bert.`` prefix dropped; the old TensorFlow names LayerNorm.gamma / beta read as weight / bias."""
    name = name.removeprefix("bert.")
    return name.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")


def bert_state_dict_to_attnkit(
    hf_state: dict[str, Tensor], n_layers: int, *, source: str = "state dict"
) -> dict[str, Tensor]:
    """BERT tensor names -> attnkit's. Pooler, task heads and the ``position_ids`` buffer are ignored; a missing
    encoder tensor, or an encoder tensor with no attnkit counterpart, is an InputError naming it."""
    state = {_bert_key(name): tensor for name, tensor in hf_state.items()}
    encoder = {
        name: t
        for name, t in state.items()
        if name.split(".")[0] in ("embeddings", "encoder") and name != "embeddings.position_ids"
    }
    pairs = name_pairs(n_layers)
    missing = [f"{ours} (BERT: {theirs})" for ours, theirs in pairs if theirs not in encoder]
    if missing:
        more = " ..." if len(missing) > 6 else ""
        raise InputError(f"{source}: missing {len(missing)} tensor(s): {', '.join(missing[:6])}{more}")
    unexpected = sorted(set(encoder) - {theirs for _, theirs in pairs})
    if unexpected:
        raise InputError(
            f"{source}: tensor(s) with no place in a {n_layers}-layer attnkit encoder: {', '.join(unexpected[:6])}"
        )
    return {ours: encoder[theirs] for ours, theirs in pairs}


def attnkit_to_bert_state_dict(state: dict[str, Tensor], n_layers: int) -> dict[str, Tensor]:
    """attnkit encoder tensors -> BERT names (``BertModel`` layout, no prefix); the classifier head is dropped."""
    missing = [ours for ours, _ in name_pairs(n_layers) if ours not in state]
    if missing:
        raise InputError(
            f"attnkit state dict lacks {', '.join(missing[:6])}: not a BERT-shaped {n_layers}-layer encoder"
        )
    return {theirs: state[ours].detach().contiguous() for ours, theirs in name_pairs(n_layers)}


def read_bert_weights(folder: str | Path) -> dict[str, Tensor]:
    """The tensors of ``folder/model.safetensors`` (or of its shards). Pickled weights are refused, not opened."""
    folder = Path(folder)
    index = folder / "model.safetensors.index.json"
    if (folder / "model.safetensors").is_file():
        files = [folder / "model.safetensors"]
    elif index.is_file():
        shards = sorted(set(runs.read_json(index).get("weight_map", {}).values()))
        if not shards or any(Path(name).name != name for name in shards):
            raise InputError(f"{index}: expected a weight_map of shard file names inside {folder}")
        files = [folder / name for name in shards]
    elif (folder / "pytorch_model.bin").is_file() or (folder / "pytorch_model.bin.index.json").is_file():
        raise InputError(
            f"{folder}: has pytorch_model.bin but no model.safetensors; attnkit does not unpickle weights (a pickle "
            "can run code when loaded). Convert it to safetensors where you trust it, e.g. "
            "BertModel.from_pretrained(folder)"
            ".save_pretrained(folder, safe_serialization=True) with transformers"
        )
    else:
        raise InputError(f"{folder}: no model.safetensors (a BERT folder needs config.json and model.safetensors)")
    state: dict[str, Tensor] = {}
    for path in files:
        try:
            state.update(load_file(str(path)))
        except (SafetensorError, OSError) as err:
            raise InputError(f"{path}: not a readable safetensors file ({err})") from None
    return state


def load_encoder_weights(model: TransformerClassifier, state: dict[str, Tensor], *, source: str) -> None:
    """Copy attnkit-named encoder tensors into ``model`` (its head keeps its own initialisation); a tensor whose
    shape differs from the model's is an InputError naming it (both names) and both shapes."""
    expected = model.state_dict()
    bert_name = dict(name_pairs(len(model.encoder.layers)))
    for name, tensor in state.items():
        if tensor.shape != expected[name].shape:
            raise InputError(
                f"{source}: tensor {bert_name.get(name, name)} (attnkit {name}) has shape "
                f"{tuple(tensor.shape)}, config.json implies {tuple(expected[name].shape)}"
            )
    result = model.load_state_dict(state, strict=False)
    not_loaded = [name for name in result.missing_keys if not name.startswith("head.")]
    if not_loaded or result.unexpected_keys:
        raise InputError(
            f"{source}: weights do not fit the encoder (not loaded: {not_loaded}, unexpected: {result.unexpected_keys})"
        )


# ---------------------------------------------------------------------------------------------------------------
# Tokenizer


def _special_token_names(folder: Path) -> dict[str, str]:
    """Which strings are [PAD], [UNK], [CLS], [SEP]: special_tokens_map.json / tokenizer_config.json, else BERT's."""
    names = {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]"}
    for filename in ("tokenizer_config.json", "special_tokens_map.json"):  # the second wins, as in transformers
        path = folder / filename
        if path.is_file():
            raw = runs.read_json(path)
            for role in names:
                value = raw.get(f"{role}_token")
                value = value.get("content") if isinstance(value, dict) else value
                if isinstance(value, str):
                    names[role] = value
    return names


def wordpiece_from_vocab(
    vocab_path: Path,
    *,
    lowercase: bool,
    names: dict[str, str],
    strip_accents: bool | None = None,
    chinese_chars: bool = True,
) -> Backend:
    """BERT's tokenizer rebuilt from ``vocab.txt`` (one token per line, id = line number) with the `tokenizers`
    components of its BertWordPieceTokenizer: BertNormalizer, BertPreTokenizer, WordPiece, [CLS] $A [SEP]."""
    lines = vocab_path.read_text(encoding="utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    vocab: dict[str, int] = {}
    for i, token in enumerate(lines):
        vocab.setdefault(token.rstrip("\r"), i)
    for role in ("unk", "cls", "sep"):
        if names[role] not in vocab:
            raise InputError(f"{vocab_path}: no {names[role]} token")
    backend = Backend(models.WordPiece(vocab, unk_token=names["unk"], max_input_chars_per_word=100))
    specials = (names["pad"], names["unk"], names["cls"], names["sep"], "[MASK]")
    backend.add_special_tokens([t for t in specials if t in vocab])
    backend.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=chinese_chars, strip_accents=strip_accents, lowercase=lowercase
    )
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    cls, sep = names["cls"], names["sep"]
    backend.post_processor = processors.TemplateProcessing(
        single=f"{cls} $A {sep}",
        pair=f"{cls} $A {sep} $B:1 {sep}:1",
        special_tokens=[(cls, vocab[cls]), (sep, vocab[sep])],
    )
    backend.decoder = decoders.WordPiece(prefix="##")
    return backend


def load_bert_tokenizer(folder: str | Path) -> Tokenizer:
    """The folder's tokenizer (``tokenizer.json``, else ``vocab.txt``), roles [PAD] / [UNK] / [CLS], no BOS / EOS."""
    folder = Path(folder)
    names = _special_token_names(folder)
    if (folder / "tokenizer.json").is_file():
        try:
            backend = Backend.from_file(str(folder / "tokenizer.json"))
        except Exception as err:  # the Rust side raises plain Exceptions on malformed files
            raise InputError(f"{folder / 'tokenizer.json'}: not a valid tokenizer file ({err})") from None
    elif (folder / "vocab.txt").is_file():
        settings = (
            runs.read_json(folder / "tokenizer_config.json") if (folder / "tokenizer_config.json").is_file() else {}
        )
        backend = wordpiece_from_vocab(
            folder / "vocab.txt",
            lowercase=settings.get("do_lower_case", True),
            names=names,
            strip_accents=settings.get("strip_accents"),
            chinese_chars=settings.get("tokenize_chinese_chars", True),
        )
    else:
        raise InputError(f"{folder}: no tokenizer.json or vocab.txt")
    # attnkit pads and truncates itself (``data.batching``); a fixed padding saved in the file would add pad tokens.
    backend.no_padding()
    backend.no_truncation()
    try:
        roles = SpecialTokens(pad=names["pad"], unk=names["unk"], cls=names["cls"], bos=None, eos=None)
        return Tokenizer(backend, "wordpiece", roles)
    except InputError as err:
        raise InputError(f"{folder}: {err}") from None


# ---------------------------------------------------------------------------------------------------------------
# Loading a folder, sentence embeddings


def resolve_bert_folder(spec: str | Path) -> Path:
    """A BERT folder from ``spec``: the word ``minilm`` (the cached recipe, fetched on first use) or a directory."""
    if str(spec) == "minilm":
        from attnkit.data.recipes import fetch

        return fetch("minilm")
    folder = Path(spec)
    if not folder.is_dir():
        raise InputError(f"{folder}: no such directory (expected a BERT folder or 'minilm')")
    return folder


def load_bert_classifier(
    folder: str | Path, *, n_classes: int, pooling: str = "mean"
) -> tuple[TransformerClassifier, ClassifierConfig, Tokenizer]:
    """attnkit's classifier with the folder's pretrained encoder, a freshly initialised head, and its tokenizer."""
    folder = Path(folder)
    cfg = bert_config(folder, n_classes=n_classes, pooling=pooling)
    tokenizer = load_bert_tokenizer(folder)
    if tokenizer.vocab_size > cfg.vocab_size:
        raise InputError(
            f"{folder}: the tokenizer has {tokenizer.vocab_size} tokens but config.json vocab_size is {cfg.vocab_size}"
        )
    state = bert_state_dict_to_attnkit(read_bert_weights(folder), cfg.n_layers, source=str(folder))
    model = build_classifier(cfg, pad_id=tokenizer.pad_id)
    load_encoder_weights(model, state, source=str(folder))
    return model, cfg, tokenizer


def load_pretrained(spec: str | Path, *, pooling: str = "mean") -> Pretrained:
    """The encoder to fine-tune from ``spec`` (a BERT folder, or "minilm"), for ``train_classifier(pretrained=...)``;
    the one-logit head it comes with is replaced by the training's own."""
    model, cfg, tokenizer = load_bert_classifier(resolve_bert_folder(spec), n_classes=1, pooling=pooling)
    return Pretrained(model, cfg, tokenizer, source=str(spec))


def embed(
    model_spec: str | Path, texts: Iterable[str], *, pool: str = "mean", normalize: bool = False, batch_size: int = 32
) -> Tensor:
    """Sentence vectors (N, D) from a BERT folder, the word ``minilm``, or an attnkit classifier run directory."""
    folder = resolve_bert_folder(model_spec)
    config_path = folder / runs.CONFIG
    if config_path.is_file() and "task" in runs.read_json(config_path):
        run = ClassifierRun(folder)
        return sentence_embeddings(
            run.model,
            run.tokenizer,
            texts,
            pool=pool,
            normalize=normalize,
            batch_size=batch_size,
            max_len_policy=run.max_len_policy,
        )
    model, _, tokenizer = load_bert_classifier(folder, n_classes=1)
    return sentence_embeddings(model, tokenizer, texts, pool=pool, normalize=normalize, batch_size=batch_size)


# ---------------------------------------------------------------------------------------------------------------
# Export


def check_bert_shaped(cfg: ClassifierConfig) -> None:
    """InputError listing what keeps ``cfg`` from being a BERT encoder (only those can be written as BERT folders)."""
    problems = [
        f"{key}={getattr(cfg, key)!r} (BERT: {value!r})"
        for key, value in BERT_TRAITS.items()
        if getattr(cfg, key) != value
    ]
    if cfg.n_token_types < 1:
        problems.append("n_token_types=0 (BERT: at least 1)")
    if cfg.d_head is not None and cfg.d_head * cfg.n_heads != cfg.d_model:
        problems.append(f"d_head={cfg.d_head} (BERT: d_model / n_heads = {cfg.d_model / cfg.n_heads:g})")
    if problems:
        raise InputError(
            "only BERT-shaped encoders can be exported as BERT folders; this model has "
            + ", ".join(problems)
            + ". Train with these keys set as BERT has them, or start from --init-from"
        )


def bert_config_dict(cfg: ClassifierConfig, pad_id: int) -> dict:
    """``config.json`` of the BERT folder for ``cfg``, every field written out."""
    return {
        "architectures": ["BertModel"],
        "model_type": "bert",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "intermediate_size": cfg.d_ff,
        "hidden_act": "gelu",
        "hidden_dropout_prob": cfg.dropout,
        "attention_probs_dropout_prob": cfg.attention_dropout,
        "max_position_embeddings": cfg.max_len,
        "type_vocab_size": cfg.n_token_types,
        "initializer_range": 0.02,
        "layer_norm_eps": cfg.layer_norm_eps,
        "pad_token_id": pad_id,
        "position_embedding_type": "absolute",
        "use_cache": False,
    }


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


def _prepare_out(out_dir: Path) -> None:
    """Refuse to replace anything but an earlier BERT folder (never an attnkit run or an unrelated directory)."""
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError(f"{out_dir}: exists and is not a directory")
    if not out_dir.is_dir() or not any(out_dir.iterdir()):
        return
    config_path = out_dir / "config.json"
    if not config_path.is_file():
        raise InputError(f"{out_dir}: exists and is not a BERT folder; choose a new --out")
    if "task" in runs.read_json(config_path):
        raise InputError(f"{out_dir}: is an attnkit run directory; choose a new --out")


def write_bert_folder(
    model: TransformerClassifier,
    cfg: ClassifierConfig,
    tokenizer: Tokenizer,
    out_dir: str | Path,
    *,
    labels: list[str] | None = None,
) -> Path:
    """Write ``model`` as a BERT folder: config.json, model.safetensors, tokenizer.json, tokenizer_config.json and,
    for WordPiece vocabularies, vocab.txt.

    Without ``labels`` the folder is the encoder alone (``BertModel``; the head is dropped). With ``labels`` (the
    run's class names, in class order) it is a ``BertForSequenceClassification`` with ``id2label`` / ``label2id``
    whose probabilities equal the model's; only "cls" pooling can be written so (``check_exportable_head``).

    The folder is built under a temporary name beside ``out_dir`` and renamed into place, so readers never see a
    config of one export with the weights of another; an earlier BERT folder at ``out_dir`` is replaced.
    """
    check_bert_shaped(cfg)
    if labels is not None:
        check_exportable_head(cfg, labels)
    out_dir = Path(out_dir)
    _prepare_out(out_dir)
    config = bert_config_dict(cfg, tokenizer.pad_id)
    weights = attnkit_to_bert_state_dict(model.state_dict(), cfg.n_layers)
    if labels is not None:
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
        roles = {f"{role}_token": token for role, token in dataclasses.asdict(tokenizer.specials).items() if token}
        atomic_write_json(
            work / "tokenizer_config.json",
            {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": cfg.max_len, **roles},
        )
        vocab = _vocab_txt(tokenizer)
        if vocab is not None:
            atomic_write_bytes(work / "vocab.txt", vocab.encode("utf-8"))
    return out_dir


def export_bert_folder(run_dir: str | Path, out_dir: str | Path, *, encoder_only: bool = False) -> Path:
    """The attnkit classifier run at ``run_dir`` as a BERT folder at ``out_dir``: a BertForSequenceClassification
    (head and label map) or, with ``encoder_only``, the encoder as a BertModel."""
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
