"""Making a loaded model ready for inference by replacing modules, never by keeping copies inside the paper's.

``prepare_for_inference`` puts a model in eval mode, swaps every self-attention for a ``FusedSelfAttention`` (one Q,
K, V projection) and a translator's tied embedding for a ``TransposedEmbedding``; ``quantize_for_inference`` rounds
every weight matrix to int8 instead (``quantize``). Both keep the state-dict keys and shapes, so a prepared model
saves and loads as the model it came from.
"""

from __future__ import annotations

from typing import TypeVar

import torch
from torch import nn

from attnkit.inference.fused import FusedSelfAttention
from attnkit.inference.onednn import use_onednn_
from attnkit.inference.quantize import Int8Embedding, TiedInt8Output, quantize_int8_
from attnkit.inference.transposed import TiedTransposedOutput, TransposedEmbedding
from attnkit.model.attention import MultiHeadAttention
from attnkit.model.layers import DecoderLayer, EncoderLayer
from attnkit.model.transformer import Transformer

M = TypeVar("M", bound=nn.Module)


def prepare_for_inference(model: M) -> M:
    """Put ``model`` in eval mode (no dropout, §5.4 applies it in training only), replace the self-attention of
    every encoder and decoder layer by a ``FusedSelfAttention`` with the same weights, hold an encoder-decoder's
    tied embedding matrix transposed (``TransposedEmbedding``: the output projection's faster layout, read by a
    ``TiedTransposedOutput``), and every linear layer as a ``OneDNNLinear`` (the same parameters; products of a few
    rows on oneDNN where that pays, ``attnkit.inference.onednn``). Idempotent; returns ``model``."""
    model.eval()
    _fuse_self_attention(model)
    if isinstance(model, Transformer) and model.output_proj is None and type(model.embeddings.token) is nn.Embedding:
        transposed = TransposedEmbedding(model.embeddings.token)
        model.embeddings.register_module("token", transposed)  # replaces it
        model.output_proj = TiedTransposedOutput(transposed)
    use_onednn_(model)
    return model


def quantize_for_inference(model: M) -> M:
    """``prepare_for_inference`` with every weight matrix rounded to int8 (``attnkit.inference.quantize``): the model
    is cast to bfloat16, each ``nn.Linear`` and ``nn.Embedding`` whose input size is a multiple of 16 (the stacked
    Q, K, V projections included) is replaced by its int8 counterpart, and a tied output projection reads the
    embedding's int8 copy (``TiedInt8Output``) instead of a transposed matrix. Products of one to four rows (decoding
    a sentence at a time) then read one byte per weight. For inference on a CPU only: the state dict of the result
    holds the rounded weights in bfloat16, under the same keys. Returns ``model``."""
    model.to(torch.bfloat16).eval()
    _fuse_self_attention(model)
    quantize_int8_(model)
    if isinstance(model, Transformer) and model.output_proj is None:  # tied (§3.4)
        token = model.embeddings.token
        if isinstance(token, Int8Embedding):
            model.output_proj = TiedInt8Output(token)
    return model


def _fuse_self_attention(model: nn.Module) -> None:
    for layer in model.modules():
        attention = getattr(layer, "self_attn", None) if isinstance(layer, EncoderLayer | DecoderLayer) else None
        if type(attention) is MultiHeadAttention:
            layer.self_attn = FusedSelfAttention(attention)
