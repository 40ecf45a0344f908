"""Weights and masks between attnkit and ``torch.nn``: a round trip through ``nn.Transformer`` reproduces the logits
exactly, structural mismatches are refused, and masks convert both ways between the two opposite conventions."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attnkit.config import TranslatorConfig
from attnkit.interop.torch_nn import (
    from_torch_attn_mask,
    from_torch_key_padding_mask,
    reference_transformer,
    to_torch_attn_mask,
    to_torch_key_padding_mask,
    transformer_from_torch,
)
from attnkit.model.build import build_translator
from attnkit.model.masking import causal_mask, padding_mask
from attnkit.model.transformer import Transformer

V, D, H, FF, N, MAX_LEN, PAD = 40, 16, 2, 32, 2, 32, 0


def _model(**overrides) -> Transformer:
    kwargs = dict(vocab_size=V, d_model=D, n_heads=H, d_ff=FF, n_layers=N, max_len=MAX_LEN)
    return build_translator(TranslatorConfig(**{**kwargs, **overrides}), pad_id=PAD).eval()


def _ids(lengths: list[int], width: int) -> torch.Tensor:
    """(B, width) random non-pad ids, padded with PAD after ``lengths[b]`` tokens."""
    ids = torch.randint(1, V, (len(lengths), width))
    for b, length in enumerate(lengths):
        ids[b, length:] = PAD
    return ids


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: t.clone() for name, t in model.state_dict().items()}


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_round_trip_through_nn_transformer_gives_identical_logits(norm):
    ours = _model(norm=norm)
    src, tgt_in = _ids([7, 4, 2], 7), _ids([6, 3, 1], 6)
    with torch.no_grad():
        expected = ours(src, tgt_in)  # (B, T, V)
    ref = reference_transformer(ours)

    torch.manual_seed(1)
    fresh = _model(norm=norm)
    # nn.Transformer has no embeddings (and the output projection is tied to them): those come from ours directly.
    fresh.embeddings.load_state_dict(ours.embeddings.state_dict())
    with torch.no_grad():
        assert not torch.allclose(fresh(src, tgt_in), expected)  # the copy below has something to do
        transformer_from_torch(ref, fresh)
        assert torch.equal(fresh(src, tgt_in), expected)
    assert all(torch.equal(t, ours.state_dict()[name]) for name, t in fresh.state_dict().items())


@pytest.mark.parametrize(
    ("target", "message"),
    [
        (dict(n_heads=4), "n_heads=4"),  # same widths, different split into heads: shapes alone would not tell
        (dict(norm="pre"), "LayerNorm"),
        (dict(activation="gelu"), "activation"),
        (dict(n_layers=3), "layer count"),
    ],
    ids=["n_heads", "norm", "activation", "n_layers"],
)
def test_structural_mismatch_is_refused(target, message):
    ref = reference_transformer(_model())
    other = _model(**target)
    before = _state(other)
    with pytest.raises(ValueError, match=message):
        transformer_from_torch(ref, other)
    assert all(torch.equal(before[name], t) for name, t in other.state_dict().items())  # left untouched


def test_post_ln_layers_do_not_load_into_pre_ln_layers():
    ref = reference_transformer(_model())
    ref.encoder.norm = nn.LayerNorm(D)  # even with the final norms aligned, the layers' norm order differs
    ref.decoder.norm = nn.LayerNorm(D)
    with pytest.raises(ValueError, match="norm mismatch"):
        transformer_from_torch(ref, _model(norm="pre"))


# ---------------------------------------------------------------------------------------------------------------
# Masks: attnkit True = may attend; torch.nn True (or -inf) = may not


def test_key_padding_mask_round_trip():
    ids = _ids([5, 3, 1], 5)
    ours = padding_mask(ids, PAD)  # (B, 1, 1, S)
    theirs = to_torch_key_padding_mask(ours)  # (B, S)
    assert torch.equal(theirs, ids == PAD)
    assert torch.equal(to_torch_key_padding_mask(ours[:, 0, 0]), theirs)  # (B, S) input too
    assert torch.equal(from_torch_key_padding_mask(theirs), ours)
    additive = torch.zeros(ids.shape).masked_fill(ids == PAD, float("-inf"))  # the float form
    assert torch.equal(from_torch_key_padding_mask(additive), ours)


def test_causal_mask_matches_pytorch_and_round_trips():
    T = 6
    pytorch_causal = nn.Transformer.generate_square_subsequent_mask(T)  # (T, T) float, -inf above the diagonal
    assert torch.equal(to_torch_attn_mask(causal_mask(T)), pytorch_causal == float("-inf"))
    assert torch.equal(from_torch_attn_mask(pytorch_causal), causal_mask(T))
    assert torch.equal(from_torch_attn_mask(to_torch_attn_mask(causal_mask(T))), causal_mask(T))


def test_masks_without_an_equivalent_are_refused():
    with pytest.raises(ValueError, match="differs per sentence"):
        to_torch_attn_mask(padding_mask(_ids([3, 2], 3), PAD) & causal_mask(3))  # (B, 1, T, T)
    with pytest.raises(ValueError, match="boolean"):
        to_torch_key_padding_mask(torch.ones(2, 3))
    with pytest.raises(ValueError, match="0 and -inf"):
        from_torch_attn_mask(torch.tensor([[0.0, -1.5], [0.0, 0.0]]))  # a finite bias is not a mask
