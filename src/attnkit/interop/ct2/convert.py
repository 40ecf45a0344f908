"""An attnkit Transformer as a CTranslate2 model directory: ``attnkit_to_ct2`` and the tensor map it follows.

CTranslate2 (``ctranslate2``, an optional dependency) runs Transformer inference in C++. Its converters fill a
``ctranslate2.specs.TransformerSpec`` with weights and save it; ``attnkit_to_ct2`` fills the same specification from
an ``attnkit.model.transformer.Transformer``, with a vocabulary of one token string per id (``tokenizer_tokens``).

Where each attnkit tensor goes (D = d_model; CTranslate2 stores Linear weights as (out, in), like PyTorch):

    embeddings.token.weight (V, D)          ->  encoder.embeddings[0].weight, decoder.embeddings.weight, and
                                                decoder.projection.weight when tied (§3.4: one shared matrix)
    embeddings.scale (sqrt(D) or 1)         ->  encoder/decoder.scale_embeddings
    positional table (max_len, D)           ->  encoder/decoder.position_encodings.encodings (set explicitly:
                                                CTranslate2's built-in sinusoids put all sines before all cosines,
                                                §3.5 and attnkit interleave them)
    self_attn q_proj, k_proj, v_proj        ->  self_attention.linear[0], stacked (3D, D)
    cross_attn q_proj / k_proj, v_proj      ->  attention.linear[0] / attention.linear[1], (D, D) / (2D, D)
    *_attn.out_proj                         ->  linear[-1]
    norm1, norm2 (, norm3)                  ->  self_attention.layer_norm, (attention.layer_norm,) ffn.layer_norm
    ffn.linear1, ffn.linear2                ->  ffn.linear_0, ffn.linear_1
    encoder/decoder.final_norm (pre-LN)     ->  encoder/decoder.layer_norm

In CTranslate2's post-norm mode (``pre_norm=False``) each ``layer_norm`` is applied after the residual sum, the
paper's order; in pre-norm mode before the sub-layer, with a final LayerNorm per stack, as attnkit's pre-LN.
"""

from __future__ import annotations

from pathlib import Path
from typing import cast

import torch

from attnkit.errors import InputError
from attnkit.inference.fused import FusedSelfAttention
from attnkit.model.attention import MultiHeadAttention
from attnkit.model.layers import DecoderLayer, EncoderLayer, PositionwiseFeedForward
from attnkit.model.positional import LearnedPositionalEmbedding
from attnkit.model.transformer import Embeddings, Transformer
from attnkit.tokenization.tokenizer import SPECIAL_TOKENS, Tokenizer

# Weight types CTranslate2 can store (``ctranslate2.specs.model_spec.ACCEPTED_MODEL_TYPES``). On a CPU without
# efficient 16-bit or int16 kernels (``ctranslate2.get_supported_compute_types("cpu")``, typically int8, int8_float32
# and float32) CTranslate2 converts them when loading: 16-bit floats to float32, int16 and int8_* to int8_float32.
QUANTIZATIONS = ("int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16", "bfloat16", "float32")


def import_ctranslate2():
    """The ``ctranslate2`` module; InputError, naming the package to install, where it is missing."""
    try:
        import ctranslate2
    except ImportError:
        raise InputError("CTranslate2 is not installed (pip install ctranslate2)") from None
    return ctranslate2


def default_tokens(vocab_size: int) -> list[str]:
    """Token strings for a model without a tokenizer: attnkit's special tokens, then ``t<id>`` for every other id."""
    return [*SPECIAL_TOKENS, *(f"t{i}" for i in range(len(SPECIAL_TOKENS), vocab_size))][:vocab_size]


def tokenizer_tokens(tokenizer: Tokenizer) -> list[str]:
    """The token string of every id, in id order: the vocabulary CTranslate2 gets, so its strings map 1:1 to ids."""
    found = [tokenizer.backend.id_to_token(i) for i in range(tokenizer.vocab_size)]
    tokens = [token for token in found if token is not None]
    if len(tokens) != len(found) or len(set(tokens)) != len(tokens):
        raise InputError(
            "the tokenizer's ids are not one distinct token each, so CTranslate2's strings would not map back to ids"
        )
    return tokens


def attnkit_to_ct2(
    model: Transformer,
    out_dir: str | Path,
    *,
    tokens: list[str] | None = None,
    bos: str = "<bos>",
    eos: str = "<eos>",
    unk: str = "<unk>",
    add_source_eos: bool = True,
    quantization: str | None = None,
) -> Path:
    """Save ``model`` as a CTranslate2 model directory (``model.bin``, ``config.json``, ``shared_vocabulary.json``).

    Args:
        tokens: the vocabulary, token string of each id in order (default ``default_tokens``).
        bos: the decoder start token (attnkit feeds BOS at position 0); eos, unk: as in the tokenizer.
        add_source_eos: CTranslate2 appends ``eos`` to every source, as ``attnkit translate`` does; benchmarks that
            pass complete sources turn it off.
        quantization: weight type to store (None keeps float32; one of ``QUANTIZATIONS``).
            A float32 model can also be quantized when loaded, with ``Translator(compute_type=...)``.
    Returns:
        ``out_dir``.
    Raises:
        ImportError: ``ctranslate2`` is not installed.
        ValueError: the model has a structure CTranslate2's Transformer cannot express, or the vocabulary does not
            match it.
    """
    from ctranslate2.specs import common_spec, transformer_spec

    vocab_size = model.embeddings.token.num_embeddings
    tokens = default_tokens(vocab_size) if tokens is None else list(tokens)
    if len(tokens) != vocab_size:
        raise ValueError(f"{len(tokens)} tokens given for a vocabulary of {vocab_size}")
    for name, token in (("bos", bos), ("eos", eos), ("unk", unk)):
        if token not in tokens:
            raise ValueError(f"{name} token {token!r} is not in the vocabulary")

    # nn.ModuleList items are typed as Module; the stacks hold attnkit's layers.
    encoder_layers = cast("list[EncoderLayer]", model.encoder.layers)
    decoder_layers = cast("list[DecoderLayer]", model.decoder.layers)
    first = encoder_layers[0]
    attn = first.self_attn
    d_model = attn.out_proj.out_features
    if attn.n_heads * attn.d_head != d_model:
        # CTranslate2's TransformerSpec.from_config derives the head width from d_model / heads.
        raise ValueError(f"d_head={attn.d_head} with n_heads={attn.n_heads} is decoupled from d_model={d_model}")
    activations = {"relu": common_spec.Activation.RELU, "gelu": common_spec.Activation.GELU}  # GELU = the erf form

    spec = transformer_spec.TransformerSpec.from_config(
        (len(encoder_layers), len(decoder_layers)),
        attn.n_heads,
        pre_norm=first.residual.pre_norm,
        activation=activations[first.ffn.activation],
    )
    spec.config.layer_norm_epsilon = first.norm1.eps

    weights = _Weights()
    weights.embeddings(spec.encoder, spec.encoder.embeddings[0], model.embeddings)  # a list: one per source feature
    weights.embeddings(spec.decoder, spec.decoder.embeddings, model.embeddings)
    for layer_spec, layer in zip(spec.encoder.layer, encoder_layers):
        weights.attention(layer_spec.self_attention, layer.self_attn, self_attention=True)
        weights.norm(layer_spec.self_attention.layer_norm, layer.norm1)
        weights.ffn(layer_spec.ffn, layer.ffn)
        weights.norm(layer_spec.ffn.layer_norm, layer.norm2)
    for layer_spec, dec_layer in zip(spec.decoder.layer, decoder_layers):
        weights.attention(layer_spec.self_attention, dec_layer.self_attn, self_attention=True)
        weights.norm(layer_spec.self_attention.layer_norm, dec_layer.norm1)
        weights.attention(layer_spec.attention, dec_layer.cross_attn, self_attention=False)
        weights.norm(layer_spec.attention.layer_norm, dec_layer.norm2)
        weights.ffn(layer_spec.ffn, dec_layer.ffn)
        weights.norm(layer_spec.ffn.layer_norm, dec_layer.norm3)
    for stack_spec, stack in ((spec.encoder, model.encoder), (spec.decoder, model.decoder)):
        if stack.final_norm is not None:
            weights.norm(stack_spec.layer_norm, stack.final_norm)
    projection = model.embeddings.token.weight if model.output_proj is None else model.output_proj.weight
    assert isinstance(projection, torch.Tensor)  # an nn.Linear's weight, or the tied embedding's
    spec.decoder.projection.weight = weights.array(projection)  # (V, D), no bias

    spec.register_source_vocabulary(tokens)
    spec.register_target_vocabulary(tokens)
    spec.config.bos_token = bos
    spec.config.eos_token = eos
    spec.config.unk_token = unk
    spec.config.decoder_start_token = bos
    spec.config.add_source_eos = add_source_eos

    spec.validate()
    spec.optimize(quantization=quantization)  # also stores the tied matrix once (aliases equal variables)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    spec.save(str(out_dir))
    return out_dir


class _Weights:
    """Copies attnkit tensors into specification fields, as float32 NumPy arrays detached from the model."""

    @staticmethod
    def array(tensor: torch.Tensor):
        return tensor.detach().to(torch.float32).cpu().numpy().copy()

    def embeddings(self, stack_spec, embeddings_spec, embeddings: Embeddings) -> None:
        if embeddings.token_type is not None or embeddings.norm is not None:
            raise ValueError("CTranslate2's TransformerSpec has no token-type embeddings or embedding LayerNorm")
        embeddings_spec.weight = self.array(embeddings.token.weight)  # (V, D)
        stack_spec.scale_embeddings = float(embeddings.scale)
        position = embeddings.position
        if isinstance(position, LearnedPositionalEmbedding):
            table = position.embedding.weight  # (max_len, D)
        else:
            table = position.table  # the sinusoidal buffer
        stack_spec.position_encodings.encodings = self.array(table)  # (max_len, D)

    def linear(self, linear_spec, *linears: torch.nn.Linear) -> None:
        """One Linear, or several stacked along the output dimension (fused q/k/v)."""
        linear_spec.weight = self.array(torch.cat([lin.weight for lin in linears]))  # (sum out, in)
        if linears[0].bias is not None:
            linear_spec.bias = self.array(torch.cat([lin.bias for lin in linears]))  # (sum out,)

    def attention(self, attn_spec, attn: MultiHeadAttention, *, self_attention: bool) -> None:
        if isinstance(attn, FusedSelfAttention):  # a model prepared for inference: W^Q, W^K, W^V already stacked
            self.linear(attn_spec.linear[0], attn.qkv)  # (3D, D)
        elif self_attention:
            self.linear(attn_spec.linear[0], attn.q_proj, attn.k_proj, attn.v_proj)  # (3D, D)
        else:
            self.linear(attn_spec.linear[0], attn.q_proj)  # (D, D), applied to the decoder states
            self.linear(attn_spec.linear[1], attn.k_proj, attn.v_proj)  # (2D, D), applied to the encoder output
        self.linear(attn_spec.linear[-1], attn.out_proj)

    def ffn(self, ffn_spec, ffn: PositionwiseFeedForward) -> None:
        self.linear(ffn_spec.linear_0, ffn.linear1)
        self.linear(ffn_spec.linear_1, ffn.linear2)

    def norm(self, norm_spec, norm: torch.nn.LayerNorm) -> None:
        norm_spec.gamma = self.array(norm.weight)
        norm_spec.beta = self.array(norm.bias)
