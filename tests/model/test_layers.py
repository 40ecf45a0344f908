"""Encoder and decoder layers (§3.1) against nn.TransformerEncoderLayer / nn.TransformerDecoderLayer on copied
weights."""

import pytest
import torch
from torch import nn
from torch.testing import assert_close

from attnkit.config import TransformerConfig
from attnkit.interop.torch_nn import (
    decoder_layer_to_torch,
    encoder_layer_to_torch,
    to_torch_attn_mask,
    to_torch_key_padding_mask,
)
from attnkit.model.build import decoder_layer, encoder_layer
from attnkit.model.masking import causal_mask, lengths_to_padding_mask

B, S, T, D, H, FF = 3, 7, 6, 16, 2, 32

NORMS = pytest.mark.parametrize("norm", ["post", "pre"])
ACTIVATIONS = pytest.mark.parametrize("activation", ["relu", "gelu"])
# Both torch.nn code paths: the Python one (grad enabled) and the fused C++ fast path it takes in eval + no_grad.
GRAD_MODES = pytest.mark.parametrize("grad", [True, False], ids=["grad", "no_grad"])


def _cfg(**overrides) -> TransformerConfig:
    return TransformerConfig(**{**dict(d_model=D, n_heads=H, d_ff=FF), **overrides})


def _torch_kwargs(norm: str, activation: str) -> dict:
    return dict(
        d_model=D,
        nhead=H,
        dim_feedforward=FF,
        dropout=0.1,
        activation=activation,
        batch_first=True,
        norm_first=norm == "pre",
    )


@NORMS
@ACTIVATIONS
@GRAD_MODES
def test_encoder_layer_matches_torch(norm, activation, grad):
    ours = encoder_layer(_cfg(activation=activation, norm=norm)).eval()
    ref = nn.TransformerEncoderLayer(**_torch_kwargs(norm, activation)).eval()
    encoder_layer_to_torch(ours, ref)
    x = torch.randn(B, S, D)
    mask = lengths_to_padding_mask(torch.tensor([S, 4, 1]), S)  # (B, 1, 1, S)

    with torch.set_grad_enabled(grad):
        out, _ = ours(x, mask)
        ref_out = ref(x, src_key_padding_mask=to_torch_key_padding_mask(mask))
    # Padded positions too: their queries still attend to the real keys.
    assert_close(out, ref_out, atol=1e-5, rtol=0)


@NORMS
@ACTIVATIONS
@GRAD_MODES
def test_decoder_layer_matches_torch(norm, activation, grad):
    ours = decoder_layer(_cfg(activation=activation, norm=norm)).eval()
    ref = nn.TransformerDecoderLayer(**_torch_kwargs(norm, activation)).eval()
    decoder_layer_to_torch(ours, ref)
    x, memory = torch.randn(B, T, D), torch.randn(B, S, D)
    tgt_mask = lengths_to_padding_mask(torch.tensor([T, 3, 2]), T)  # (B, 1, 1, T); position 0 is always real
    memory_mask = lengths_to_padding_mask(torch.tensor([S, 5, 1]), S)  # (B, 1, 1, S)
    causal = causal_mask(T)  # (1, 1, T, T)

    with torch.set_grad_enabled(grad):
        out, _, _ = ours(x, memory, tgt_mask & causal, memory_mask)
        ref_out = ref(
            x,
            memory,
            tgt_mask=to_torch_attn_mask(causal),
            tgt_key_padding_mask=to_torch_key_padding_mask(tgt_mask),
            memory_key_padding_mask=to_torch_key_padding_mask(memory_mask),
        )
    assert_close(out, ref_out, atol=1e-5, rtol=0)


def test_dropout_is_active_in_train_mode_only():
    # Eval-mode parity above would also pass with dropout wired nowhere; check it is on when training.
    layer = encoder_layer(_cfg(dropout=0.5))
    x = torch.randn(B, S, D)
    assert not torch.equal(layer(x)[0], layer(x)[0])
    layer.eval()
    assert torch.equal(layer(x)[0], layer(x)[0])
