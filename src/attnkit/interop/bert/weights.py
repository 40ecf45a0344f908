"""BERT's tensors in attnkit's names and back, and reading / loading them (``model.safetensors``, never a pickle).

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
"""

from __future__ import annotations

from pathlib import Path

from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import Tensor

from attnkit import runs
from attnkit.errors import InputError
from attnkit.model.classifier import TransformerClassifier

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
