"""Weights and masks between attnkit and PyTorch's ``torch.nn`` Transformer modules.

Why one file of ~370 lines: it is the one boundary to ``torch.nn``'s Transformer: the mask converters (its
opposite convention), the parameter map both ways, and the builders of a same-weights peer. The builders and the
equality tests need the map and the masks together; each part alone is a few short functions per module pair.

Where each attnkit parameter lives in ``torch.nn`` (D = d_model):

    MultiHeadAttention.q_proj / k_proj / v_proj  ->  MultiheadAttention.in_proj_weight, in_proj_bias rows
                                                     [0, D), [D, 2D), [2D, 3D) (PyTorch stacks W^Q, W^K, W^V)
    MultiHeadAttention.out_proj                  ->  MultiheadAttention.out_proj (W^O)
    EncoderLayer.self_attn, ffn.linear1, ffn.linear2, norm1, norm2
                                                 ->  TransformerEncoderLayer.self_attn, linear1, linear2, norm1, norm2
    DecoderLayer.self_attn, cross_attn, ffn.linear1, ffn.linear2, norm1, norm2, norm3
                                                 ->  TransformerDecoderLayer.self_attn, multihead_attn, linear1,
                                                     linear2, norm1, norm2, norm3
    Encoder.final_norm, Decoder.final_norm (pre-LN only)
                                                 ->  TransformerEncoder.norm, TransformerDecoder.norm

``nn.Transformer`` has no embeddings, positional encodings or output projection: a reference forward pass is
``ours.logits(ref(ours.embeddings(src), ours.embeddings(tgt_in), ...masks...))``.

Masks: attnkit's are boolean with True = may attend, broadcastable to (B, H, T, S). PyTorch's are the opposite
(boolean True = may NOT attend, or float with -inf = may not attend) and split in two: a per-sentence
``key_padding_mask`` (B, S) and a shared ``attn_mask`` (T, S), e.g. the causal mask.

Every converter checks that the two modules compute the same function (heads, widths, pre/post-LN, activation,
LayerNorm epsilon) and raises ``ValueError`` naming the mismatch, since copying weights into a module that
differs in structure would silently give a different model. "The same function" holds in eval mode, with dropout
off: in training each side draws its own dropout masks, so outputs differ even with equal weights.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.model.attention import MultiHeadAttention
from attnkit.model.layers import DecoderLayer, EncoderLayer
from attnkit.model.transformer import Decoder, Encoder, Transformer

# ---------------------------------------------------------------------------------------------------------------
# Masks


def to_torch_key_padding_mask(mask: Tensor) -> Tensor:
    """attnkit key mask (B, 1, 1, S) or (B, S), True = real token -> PyTorch ``key_padding_mask`` (B, S), True = pad."""
    _check_bool(mask)
    if mask.dim() == 4:
        if mask.size(1) != 1 or mask.size(2) != 1:
            raise ValueError(f"mask of shape {tuple(mask.shape)} is not a key mask (B, 1, 1, S)")
        mask = mask[:, 0, 0]  # (B, S)
    elif mask.dim() != 2:
        raise ValueError(f"mask of shape {tuple(mask.shape)} is not a key mask (B, 1, 1, S) or (B, S)")
    return ~mask  # (B, S)


def to_torch_attn_mask(mask: Tensor) -> Tensor:
    """attnkit mask shared by all sentences and heads, (1, 1, T, S) or (T, S), True = may attend -> PyTorch
    ``attn_mask`` (T, S), True = may not attend.

    A mask that differs per sentence (B, 1, T, S) has no single PyTorch equivalent: build its two factors (e.g.
    ``causal_mask`` and ``padding_mask``) separately and convert each.
    """
    _check_bool(mask)
    if mask.dim() == 4:
        if mask.size(0) != 1 or mask.size(1) != 1:
            raise ValueError(
                f"mask of shape {tuple(mask.shape)} differs per sentence or head; convert its key padding part with "
                "to_torch_key_padding_mask and its shared part (1, 1, T, S) with to_torch_attn_mask"
            )
        mask = mask[0, 0]  # (T, S)
    elif mask.dim() != 2:
        raise ValueError(f"mask of shape {tuple(mask.shape)} is not (1, 1, T, S) or (T, S)")
    return ~mask  # (T, S)


def from_torch_key_padding_mask(key_padding_mask: Tensor) -> Tensor:
    """PyTorch ``key_padding_mask`` (B, S), True or -inf = pad -> attnkit key mask (B, 1, 1, S), True = real token."""
    if key_padding_mask.dim() != 2:
        raise ValueError(f"key_padding_mask of shape {tuple(key_padding_mask.shape)} is not (B, S)")
    return _may_attend(key_padding_mask)[:, None, None, :]  # (B, 1, 1, S)


def from_torch_attn_mask(attn_mask: Tensor) -> Tensor:
    """PyTorch ``attn_mask`` (T, S), True or -inf = may not attend -> attnkit mask (1, 1, T, S), True = may attend."""
    if attn_mask.dim() != 2:
        raise ValueError(f"attn_mask of shape {tuple(attn_mask.shape)} is not (T, S)")
    return _may_attend(attn_mask)[None, None]  # (1, 1, T, S)


def _check_bool(mask: Tensor) -> None:
    if mask.dtype != torch.bool:
        raise ValueError(f"attnkit masks are boolean (True = may attend), got dtype {mask.dtype}")


def _may_attend(torch_mask: Tensor) -> Tensor:
    """A PyTorch mask (bool True = blocked, or float additive 0 / -inf) as attnkit's True = may attend."""
    if torch_mask.dtype == torch.bool:
        return ~torch_mask
    blocked = torch_mask == float("-inf")
    if not (blocked | (torch_mask == 0)).all():
        # A finite additive bias (e.g. ALiBi) changes the scores rather than masking keys: no boolean equivalent.
        raise ValueError("float mask has values other than 0 and -inf, so it is not a boolean mask")
    return ~blocked


# ---------------------------------------------------------------------------------------------------------------
# Weights: each module pair is listed as (attnkit tensor, torch.nn tensor) and copied one way or the other.

Pairs = list[tuple[Tensor, Tensor]]


def _copy(pairs: Pairs, to_torch: bool) -> None:
    with torch.no_grad():
        for ours, ref in pairs:
            if ours.shape != ref.shape:
                raise ValueError(f"shape mismatch: attnkit {tuple(ours.shape)} vs torch.nn {tuple(ref.shape)}")
            (ref if to_torch else ours).copy_(ours if to_torch else ref)


def _linear_pairs(ours: nn.Linear | nn.LayerNorm, ref: nn.Linear | nn.LayerNorm) -> Pairs:
    if (ours.bias is None) != (ref.bias is None):
        raise ValueError(f"bias mismatch: attnkit bias={ours.bias is not None}, torch.nn bias={ref.bias is not None}")
    pairs = [(ours.weight, ref.weight)]
    return pairs + ([(ours.bias, ref.bias)] if ours.bias is not None else [])


def _norm_pairs(ours: nn.LayerNorm, ref: nn.LayerNorm) -> Pairs:
    if ours.eps != ref.eps:
        raise ValueError(f"LayerNorm eps mismatch: attnkit {ours.eps} vs torch.nn {ref.eps}")
    return _linear_pairs(ours, ref)  # same attribute names: weight (gamma) and bias (beta)


def _mha_pairs(ours: MultiHeadAttention, ref: nn.MultiheadAttention) -> Pairs:
    D = ref.embed_dim
    if not ref._qkv_same_embed_dim or ref.bias_k is not None:
        raise ValueError("torch.nn.MultiheadAttention with kdim/vdim or add_bias_kv has no attnkit equivalent")
    if ours.n_heads != ref.num_heads or ours.n_heads * ours.d_head != D or ours.q_proj.in_features != D:
        # nn.MultiheadAttention ties d_head to embed_dim / num_heads; a decoupled d_head (Table 3 B) cannot be copied.
        raise ValueError(
            f"attnkit attention (d_model={ours.q_proj.in_features}, n_heads={ours.n_heads}, d_head={ours.d_head}) "
            f"does not match torch.nn (embed_dim={D}, num_heads={ref.num_heads})"
        )
    has_bias = ref.in_proj_bias is not None
    if (ours.q_proj.bias is not None) != has_bias:
        raise ValueError(f"bias mismatch: attnkit bias={ours.q_proj.bias is not None}, torch.nn bias={has_bias}")
    pairs = []
    for i, proj in enumerate((ours.q_proj, ours.k_proj, ours.v_proj)):
        rows = slice(i * D, (i + 1) * D)  # views into the stacked (3D, D) weight, so copy_ writes through
        pairs.append((proj.weight, ref.in_proj_weight[rows]))
        if has_bias:
            pairs.append((proj.bias, ref.in_proj_bias[rows]))
    return pairs + _linear_pairs(ours.out_proj, ref.out_proj)


def _activation_name(fn: object) -> str | None:
    if fn is F.relu or isinstance(fn, nn.ReLU):
        return "relu"
    if fn is F.gelu or (isinstance(fn, nn.GELU) and fn.approximate == "none"):
        return "gelu"
    return None


def _check_layer(
    ours: EncoderLayer | DecoderLayer, ref: nn.TransformerEncoderLayer | nn.TransformerDecoderLayer
) -> None:
    pre_norm = ours.residual.pre_norm
    if pre_norm != ref.norm_first:
        raise ValueError(f"norm mismatch: attnkit pre-LN={pre_norm}, torch.nn norm_first={ref.norm_first}")
    if ours.ffn.activation != _activation_name(ref.activation):
        raise ValueError(f"activation mismatch: attnkit {ours.ffn.activation!r} vs torch.nn {ref.activation!r}")
    if not ref.self_attn.batch_first:
        # Weights would copy fine, but every caller here passes (B, L, D) tensors.
        raise ValueError("torch.nn layer must be built with batch_first=True")


def _encoder_layer_pairs(ours: EncoderLayer, ref: nn.TransformerEncoderLayer) -> Pairs:
    _check_layer(ours, ref)
    return (
        _mha_pairs(ours.self_attn, ref.self_attn)
        + _linear_pairs(ours.ffn.linear1, ref.linear1)
        + _linear_pairs(ours.ffn.linear2, ref.linear2)
        + _norm_pairs(ours.norm1, ref.norm1)
        + _norm_pairs(ours.norm2, ref.norm2)
    )


def _decoder_layer_pairs(ours: DecoderLayer, ref: nn.TransformerDecoderLayer) -> Pairs:
    _check_layer(ours, ref)
    return (
        _mha_pairs(ours.self_attn, ref.self_attn)
        + _mha_pairs(ours.cross_attn, ref.multihead_attn)
        + _linear_pairs(ours.ffn.linear1, ref.linear1)
        + _linear_pairs(ours.ffn.linear2, ref.linear2)
        + _norm_pairs(ours.norm1, ref.norm1)
        + _norm_pairs(ours.norm2, ref.norm2)
        + _norm_pairs(ours.norm3, ref.norm3)
    )


def _stack_pairs(ours: Encoder | Decoder, ref: nn.TransformerEncoder | nn.TransformerDecoder, layer_pairs) -> Pairs:
    if len(ours.layers) != len(ref.layers):
        raise ValueError(f"layer count mismatch: attnkit {len(ours.layers)} vs torch.nn {len(ref.layers)}")
    if (ours.final_norm is None) != (ref.norm is None):
        # Post-LN stacks (the paper's) end normalised and have no final LayerNorm; nn.Transformer always adds one.
        raise ValueError(
            f"final LayerNorm mismatch: attnkit has {'none' if ours.final_norm is None else 'one'}, torch.nn has "
            f"{'none' if ref.norm is None else 'one'} (set the torch.nn stack's .norm = None for a post-LN model)"
        )
    pairs = [p for mine, theirs in zip(ours.layers, ref.layers) for p in layer_pairs(mine, theirs)]
    if ours.final_norm is None:
        return pairs
    return pairs + _norm_pairs(ours.final_norm, cast(nn.LayerNorm, ref.norm))  # present in both, checked above


def _transformer_pairs(ours: Transformer, ref: nn.Transformer) -> Pairs:
    return _stack_pairs(ours.encoder, ref.encoder, _encoder_layer_pairs) + _stack_pairs(
        ours.decoder, ref.decoder, _decoder_layer_pairs
    )


def mha_to_torch(ours: MultiHeadAttention, ref: nn.MultiheadAttention) -> None:
    """Copy q/k/v/out projections of ``ours`` into ``ref`` (in_proj_weight, in_proj_bias, out_proj)."""
    _copy(_mha_pairs(ours, ref), to_torch=True)


def mha_from_torch(ref: nn.MultiheadAttention, ours: MultiHeadAttention) -> None:
    """Copy ``ref``'s stacked in-projection and out_proj into the q/k/v/out projections of ``ours``."""
    _copy(_mha_pairs(ours, ref), to_torch=False)


def encoder_layer_to_torch(ours: EncoderLayer, ref: nn.TransformerEncoderLayer) -> None:
    _copy(_encoder_layer_pairs(ours, ref), to_torch=True)


def encoder_layer_from_torch(ref: nn.TransformerEncoderLayer, ours: EncoderLayer) -> None:
    _copy(_encoder_layer_pairs(ours, ref), to_torch=False)


def decoder_layer_to_torch(ours: DecoderLayer, ref: nn.TransformerDecoderLayer) -> None:
    _copy(_decoder_layer_pairs(ours, ref), to_torch=True)


def decoder_layer_from_torch(ref: nn.TransformerDecoderLayer, ours: DecoderLayer) -> None:
    _copy(_decoder_layer_pairs(ours, ref), to_torch=False)


def encoder_to_torch(ours: Encoder, ref: nn.TransformerEncoder) -> None:
    """Every layer, and the final LayerNorm of a pre-LN stack (``ref.norm`` must be None for post-LN)."""
    _copy(_stack_pairs(ours, ref, _encoder_layer_pairs), to_torch=True)


def encoder_from_torch(ref: nn.TransformerEncoder, ours: Encoder) -> None:
    _copy(_stack_pairs(ours, ref, _encoder_layer_pairs), to_torch=False)


def decoder_to_torch(ours: Decoder, ref: nn.TransformerDecoder) -> None:
    """Every layer, and the final LayerNorm of a pre-LN stack (``ref.norm`` must be None for post-LN)."""
    _copy(_stack_pairs(ours, ref, _decoder_layer_pairs), to_torch=True)


def decoder_from_torch(ref: nn.TransformerDecoder, ours: Decoder) -> None:
    _copy(_stack_pairs(ours, ref, _decoder_layer_pairs), to_torch=False)


def transformer_to_torch(ours: Transformer, ref: nn.Transformer) -> None:
    """Encoder and decoder stacks; embeddings and the output projection stay with ``ours`` (nn.Transformer has none)."""
    _copy(_transformer_pairs(ours, ref), to_torch=True)


def transformer_from_torch(ref: nn.Transformer, ours: Transformer) -> None:
    _copy(_transformer_pairs(ours, ref), to_torch=False)


# ---------------------------------------------------------------------------------------------------------------
# Builders: a torch.nn peer with the same structure and weights


def _layer_kwargs(layer: EncoderLayer) -> dict:
    attn = layer.self_attn
    d_model = attn.q_proj.in_features
    if attn.n_heads * attn.d_head != d_model:
        raise ValueError(
            f"d_head={attn.d_head} with n_heads={attn.n_heads} is decoupled from d_model={d_model}; "
            "torch.nn.MultiheadAttention requires d_model = n_heads * d_head"
        )
    return dict(
        d_model=d_model,
        nhead=attn.n_heads,
        dim_feedforward=layer.ffn.linear1.out_features,
        dropout=layer.residual.dropout.p,
        activation=layer.ffn.activation,
        layer_norm_eps=layer.norm1.eps,
        batch_first=True,
        norm_first=layer.residual.pre_norm,
    )


def _final_norm(ours: Encoder | Decoder) -> nn.LayerNorm | None:
    norm = ours.final_norm
    return None if norm is None else nn.LayerNorm(norm.normalized_shape, eps=norm.eps)


def reference_encoder(ours: Encoder, *, enable_nested_tensor: bool = False) -> nn.TransformerEncoder:
    """An ``nn.TransformerEncoder`` (batch_first) with the structure and weights of ``ours``: equal outputs in eval
    mode (dropout off; in training the two draw different dropout masks).

    ``enable_nested_tensor`` is off by default: PyTorch's nested-tensor fast path (eval, no grad, post-LN) returns
    zeros at padded positions where attnkit computes them; benchmarks may turn it on to time that path.
    """
    kwargs = _layer_kwargs(cast(EncoderLayer, ours.layers[0]))  # nn.ModuleList items are typed as Module
    ref = nn.TransformerEncoder(
        nn.TransformerEncoderLayer(**kwargs),
        len(ours.layers),
        norm=_final_norm(ours),
        enable_nested_tensor=enable_nested_tensor,
    )
    return _finish(ours, ref, lambda: encoder_to_torch(ours, ref))


def reference_transformer(ours: Transformer, *, enable_nested_tensor: bool = False) -> nn.Transformer:
    """An ``nn.Transformer`` (batch_first) with the dimensions, norm order, activation, epsilon, dropout and weights of
    ``ours``: equal outputs in eval mode (dropout off; in training the two draw different dropout masks).

    Post-LN (the paper's order): the encoder and decoder get no final LayerNorm, since a post-LN stack already ends
    with one while ``nn.Transformer`` always appends another. Pre-LN: ``ours``'s final norms are copied.
    See ``reference_encoder`` for ``enable_nested_tensor``.
    """
    kwargs = _layer_kwargs(cast(EncoderLayer, ours.encoder.layers[0]))  # nn.ModuleList items are typed as Module
    encoder = nn.TransformerEncoder(
        nn.TransformerEncoderLayer(**kwargs),
        len(ours.encoder.layers),
        norm=_final_norm(ours.encoder),
        enable_nested_tensor=enable_nested_tensor,
    )
    decoder = nn.TransformerDecoder(
        nn.TransformerDecoderLayer(**kwargs), len(ours.decoder.layers), norm=_final_norm(ours.decoder)
    )
    ref = nn.Transformer(
        d_model=kwargs["d_model"],
        nhead=kwargs["nhead"],
        num_encoder_layers=len(ours.encoder.layers),
        num_decoder_layers=len(ours.decoder.layers),
        dim_feedforward=kwargs["dim_feedforward"],
        dropout=kwargs["dropout"],
        activation=kwargs["activation"],
        custom_encoder=encoder,
        custom_decoder=decoder,
        layer_norm_eps=kwargs["layer_norm_eps"],
        batch_first=True,
        norm_first=kwargs["norm_first"],
    )
    return _finish(ours, ref, lambda: transformer_to_torch(ours, ref))


_Reference = TypeVar("_Reference", bound=nn.Module)


def _finish(ours: nn.Module, ref: _Reference, copy_weights: Callable[[], object]) -> _Reference:
    """Same device, dtype and train/eval mode as ``ours``, then the weights."""
    param = next(ours.parameters())
    ref.to(device=param.device, dtype=param.dtype)
    copy_weights()
    return ref.train(ours.training)
