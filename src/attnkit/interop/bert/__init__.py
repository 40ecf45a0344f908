"""Hugging Face BERT folders in and out of attnkit's own encoder (no second encoder class).

A folder holds ``config.json``, ``model.safetensors`` (never a pickle) and ``tokenizer.json`` or ``vocab.txt``.
One module per part of the folder, read and written: ``config`` (config.json and the BERT traits), ``weights``
(the tensor-name map, both ways), ``tokenizer``; then ``load`` (a folder as a classifier, sentence embeddings) and
``export`` (a run as a folder). The names callers use are importable from here.
"""

from attnkit.interop.bert.config import BERT_TRAITS, bert_config, bert_config_dict, check_bert_shaped
from attnkit.interop.bert.export import (
    POOLER_SCALE,
    check_exportable_head,
    classification_head_tensors,
    export_bert_folder,
    write_bert_folder,
)
from attnkit.interop.bert.load import embed, load_bert_classifier, load_pretrained, resolve_bert_folder
from attnkit.interop.bert.tokenizer import load_bert_tokenizer, wordpiece_from_vocab
from attnkit.interop.bert.weights import (
    attnkit_to_bert_state_dict,
    bert_state_dict_to_attnkit,
    load_encoder_weights,
    name_pairs,
    read_bert_weights,
)

__all__ = [
    "BERT_TRAITS",
    "POOLER_SCALE",
    "attnkit_to_bert_state_dict",
    "bert_config",
    "bert_config_dict",
    "bert_state_dict_to_attnkit",
    "check_bert_shaped",
    "check_exportable_head",
    "classification_head_tensors",
    "embed",
    "export_bert_folder",
    "load_bert_classifier",
    "load_bert_tokenizer",
    "load_encoder_weights",
    "load_pretrained",
    "name_pairs",
    "read_bert_weights",
    "resolve_bert_folder",
    "wordpiece_from_vocab",
    "write_bert_folder",
]
