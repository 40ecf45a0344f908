"""Attention maps returned as data: equal to the explicit softmax(QK^T / sqrt(d_k)) of the layer, rows summing to 1
over the keys that may be attended, and asking for them changes nothing else."""

from __future__ import annotations

import math

import torch

from attnkit.model.classifier import TransformerClassifier
from attnkit.model.masking import padding_mask
from attnkit.model.transformer import Transformer


def tiny_classifier(norm: str = "post") -> TransformerClassifier:
    return TransformerClassifier(vocab_size=40, d_model=32, n_heads=4, d_ff=64, n_layers=3, max_len=64,
                                 n_classes=3, norm=norm).eval()


def batch() -> torch.Tensor:
    ids = torch.randint(5, 40, (3, 12))
    ids[1, 7:] = 0
    ids[2, 3:] = 0
    return ids


def test_captured_map_equals_the_explicit_softmax_of_that_layer():
    model, ids = tiny_classifier(), batch()
    _, maps = model.forward_with_attention(ids, (1,))
    assert set(maps) == {1}
    # Recompute layer 1's weights by hand from its input: the output of layer 0.
    mask = padding_mask(ids, 0)  # (B, 1, 1, S)
    x = model.embeddings(ids)
    x, _ = model.encoder.layers[0](x, mask)
    attn = model.encoder.layers[1].self_attn
    B, S, _ = x.shape
    q = attn.q_proj(x).view(B, S, 4, 8).transpose(1, 2)
    k = attn.k_proj(x).view(B, S, 4, 8).transpose(1, 2)
    scores = (q @ k.transpose(-2, -1) / math.sqrt(8)).masked_fill(~mask, float("-inf"))
    torch.testing.assert_close(maps[1], scores.softmax(-1), atol=1e-5, rtol=0)


def test_rows_sum_to_one_over_unmasked_keys_and_masked_keys_get_nothing():
    model, ids = tiny_classifier(), batch()
    _, maps = model.forward_with_attention(ids, (0, 2))
    mask = padding_mask(ids, 0)[:, :, 0, :]  # (B, 1, S)
    for weights in maps.values():  # (B, H, S, S)
        torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1]), atol=1e-5, rtol=0)
        assert (weights.masked_select(~mask[:, :, None, :].expand_as(weights)) == 0).all()


def test_capturing_one_layer_leaves_the_outputs_unchanged():
    for norm in ("post", "pre"):
        model, ids = tiny_classifier(norm), batch()
        plain = model(ids)
        with_maps, _ = model.forward_with_attention(ids, (1,))
        torch.testing.assert_close(with_maps, plain, atol=1e-6, rtol=0)


def test_translator_cross_attention_is_captured_without_changing_logits():
    model = Transformer(vocab_size=40, d_model=32, n_heads=4, d_ff=64, n_layers=2, max_len=64).eval()
    src, tgt = torch.randint(5, 40, (2, 9)), torch.randint(5, 40, (2, 6))
    src[1, 5:] = 0
    memory, src_mask, _ = model.encode(src)
    plain, _, _ = model.decode(tgt, memory, src_mask)
    logits, maps, _ = model.decode(tgt, memory, src_mask, attn_layers=(1,))
    torch.testing.assert_close(logits, plain, atol=1e-6, rtol=0)
    cross = maps[1].cross_attn  # (B, H, T, S)
    assert cross.shape == (2, 4, 6, 9)
    assert (cross[1, :, :, 5:] == 0).all()  # padded source positions get no attention
    torch.testing.assert_close(cross.sum(-1), torch.ones(2, 4, 6), atol=1e-5, rtol=0)
    self_attn = maps[1].self_attn  # (B, H, T, T): causal
    assert (self_attn.triu(diagonal=1) == 0).all()
