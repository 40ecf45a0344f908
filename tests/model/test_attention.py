"""Scaled dot-product attention (eq. 1) and multi-head attention (§3.2.2), against the formula and torch.nn."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.testing import assert_close

from attnkit.interop.torch_nn import mha_to_torch, to_torch_key_padding_mask
from attnkit.model.attention import KVCache, MultiHeadAttention, fused_attention, scaled_dot_product_attention
from attnkit.model.masking import cached_causal_mask, causal_mask, lengths_to_padding_mask

B, H, T, S, DH = 3, 2, 5, 7, 4
D = H * DH


def _random_mask(*shape: int) -> torch.Tensor:
    """A random boolean mask whose every query row may attend to at least its first key."""
    mask = torch.rand(*shape) > 0.4
    mask[..., 0] = True
    return mask


def test_sdpa_matches_equation_1():
    q, k, v = torch.randn(B, H, T, DH), torch.randn(B, H, S, DH), torch.randn(B, H, S, DH)
    mask = _random_mask(B, 1, T, S)
    out, weights = scaled_dot_product_attention(q, k, v, mask)

    # softmax(Q K^T / sqrt(d_k)) V, with masked scores at -inf, written independently of the module.
    scores = torch.einsum("bhtd,bhsd->bhts", q, k) / math.sqrt(DH)
    scores = torch.where(mask, scores, torch.tensor(float("-inf")))
    expected_weights = torch.softmax(scores, dim=-1)
    assert_close(weights, expected_weights)
    assert_close(out, torch.einsum("bhts,bhsd->bhtd", expected_weights, v))


def test_sdpa_without_mask_attends_everywhere():
    q, k, v = torch.randn(B, H, T, DH), torch.randn(B, H, S, DH), torch.randn(B, H, S, DH)
    _, weights = scaled_dot_product_attention(q, k, v)
    assert (weights > 0).all()
    assert_close(weights, torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(DH), dim=-1))


def test_weights_sum_to_one_over_unmasked_keys():
    q, k, v = torch.randn(B, H, T, DH), torch.randn(B, H, S, DH), torch.randn(B, H, S, DH)
    mask = _random_mask(B, H, T, S)
    _, weights = scaled_dot_product_attention(q, k, v, mask)
    assert (weights[~mask] == 0).all()
    assert_close(weights.sum(dim=-1), torch.ones(B, H, T))


@pytest.mark.parametrize("d_head", [None, 3])
def test_explicit_path_equals_fused_path(d_head):
    mha = MultiHeadAttention(d_model=D, n_heads=H, d_head=d_head)
    x, memory = torch.randn(B, T, D), torch.randn(B, S, D)
    mask = _random_mask(B, 1, T, S)
    explicit, weights, _ = mha(x, memory, mask, need_weights=True)
    fused, no_weights, _ = mha(x, memory, mask, need_weights=False)
    assert weights is not None and no_weights is None
    assert_close(explicit, fused, atol=1e-6, rtol=0)


@pytest.mark.parametrize("need_weights", [True, False])
def test_fully_masked_query_rows_give_zeros(need_weights):
    # No output bias, so a query that attends to nothing must come out exactly zero.
    mha = MultiHeadAttention(d_model=D, n_heads=H, bias=False)
    x, memory = torch.randn(B, T, D), torch.randn(B, S, D)
    mask = _random_mask(B, 1, T, S)
    mask[0, 0, 2] = False  # one query row of one sentence
    mask[1] = False  # every query row of another sentence (a fully padded source)
    out, weights, _ = mha(x, memory, mask, need_weights=need_weights)
    assert not out.isnan().any()
    assert (out[0, 2] == 0).all() and (out[1] == 0).all()
    assert out[0, 1].abs().sum() > 0  # rows with keys are not zeroed too
    if need_weights:
        assert (weights[0, :, 2] == 0).all() and (weights[1] == 0).all()


def _torch_mha(ours: MultiHeadAttention) -> nn.MultiheadAttention:
    ref = nn.MultiheadAttention(D, H, batch_first=True).eval()
    mha_to_torch(ours, ref)
    return ref


@pytest.mark.parametrize("cross", [False, True], ids=["self", "cross"])
@pytest.mark.parametrize("need_weights", [True, False])
def test_mha_matches_torch(cross, need_weights):
    ours = MultiHeadAttention(d_model=D, n_heads=H).eval()
    ref = _torch_mha(ours)
    x = torch.randn(B, T, D)
    source = torch.randn(B, S, D) if cross else x
    lengths = torch.tensor([source.size(1), 3, 1])  # full, padded, a single real key
    mask = lengths_to_padding_mask(lengths, source.size(1))  # (B, 1, 1, S)

    out, weights, _ = ours(x, source if cross else None, mask, need_weights=need_weights)
    ref_out, ref_weights = ref(
        x, source, source, key_padding_mask=to_torch_key_padding_mask(mask), average_attn_weights=False
    )
    assert_close(out, ref_out, atol=1e-5, rtol=0)
    if need_weights:
        assert weights.shape == (B, H, T, source.size(1))
        assert_close(weights, ref_weights, atol=1e-5, rtol=0)


def test_decoupled_d_head_shapes():
    # Table 3 row (B) varies d_k independently of d_model: projections are D -> H * Dh -> D.
    mha = MultiHeadAttention(d_model=D, n_heads=H, d_head=5)
    assert mha.q_proj.weight.shape == (H * 5, D) and mha.out_proj.weight.shape == (D, H * 5)
    out, weights, _ = mha(torch.randn(B, T, D), torch.randn(B, S, D), need_weights=True)
    assert out.shape == (B, T, D)
    assert weights.shape == (B, H, T, S)


def test_d_model_not_divisible_by_n_heads_raises():
    with pytest.raises(ValueError, match="d_model=10 is not divisible by n_heads=3"):
        MultiHeadAttention(d_model=10, n_heads=3)
    # With d_head given, any combination is valid.
    assert MultiHeadAttention(d_model=10, n_heads=3, d_head=4).q_proj.out_features == 12


def test_kv_cache_writes_positions_in_place_and_a_step_attends_to_the_written_ones():
    """The static cache: each step writes its keys and values at its position in buffers of a fixed length, and a
    self-attention step over the whole buffer under ``cached_causal_mask`` equals attention over the positions
    written so far."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(d_model=D, n_heads=H).eval()
    x = torch.randn(B, T, D)  # T positions, fed one at a time
    cache = KVCache.empty(B, H, DH, T + 3, like=x)  # 3 positions to spare
    buffers = cache.k.data_ptr(), cache.v.data_ptr()
    with torch.no_grad():
        for t in range(T):
            positions = torch.tensor([t])
            step, _, _ = mha(
                x[:, t : t + 1], cache=cache, positions=positions, mask=cached_causal_mask(positions, T + 3)
            )
            full, _, _ = mha(x[:, : t + 1], mask=causal_mask(t + 1))
            assert_close(step[:, 0], full[:, -1], atol=1e-6, rtol=0)
    assert (cache.k.data_ptr(), cache.v.data_ptr()) == buffers  # written in place, never reallocated
    assert not cache.k[:, :, T:].any() and not cache.v[:, :, T:].any()  # unwritten positions stay zero


def test_stacked_qkv_follows_weight_updates_and_keeps_gradients():
    """In the paper's module (no ``FusedSelfAttention``), W^Q, W^K, W^V are stacked afresh at every call: an
    optimizer step or a loaded state must show in the next output, and with autograd every projection gets its
    gradient."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(d_model=8, n_heads=2)
    x = torch.randn(2, 3, 8)

    def reference() -> Tensor:  # the three projections run separately
        q, k, v = (mha._split_heads(proj(x)) for proj in (mha.q_proj, mha.k_proj, mha.v_proj))
        out = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(2, 3, 8)
        return mha.out_proj(out)

    with torch.inference_mode():
        before = mha(x)[0]
    optimizer = torch.optim.SGD(mha.parameters(), lr=0.5)
    mha(x)[0].square().sum().backward()
    assert all(p.grad is not None for p in (mha.q_proj.weight, mha.k_proj.weight, mha.v_proj.bias))
    optimizer.step()
    with torch.no_grad():
        after_step = mha(x)[0]
        torch.testing.assert_close(after_step, reference())
        assert not torch.allclose(after_step, before)
        mha.load_state_dict({name: torch.randn_like(p) for name, p in mha.state_dict().items()})
        torch.testing.assert_close(mha(x)[0], reference())


@pytest.mark.parametrize("need_weights", [False, True])
def test_attention_dropout_only_in_training_and_weights_stay_whole(need_weights):
    """BERT-family dropout on attention weights: active in training only; eval equals no dropout; the returned
    maps are the computed weights (rows sum to 1), not the dropped-out ones."""
    torch.manual_seed(0)
    plain = MultiHeadAttention(d_model=D, n_heads=H)
    dropped = MultiHeadAttention(d_model=D, n_heads=H, dropout=0.5)
    dropped.load_state_dict(plain.state_dict())
    x = torch.randn(B, T, D)
    plain.eval(), dropped.eval()
    assert_close(dropped(x, need_weights=need_weights)[0], plain(x, need_weights=need_weights)[0])
    dropped.train()
    first, weights, _ = dropped(x, need_weights=need_weights)
    second = dropped(x, need_weights=need_weights)[0]
    assert not torch.allclose(first, second)  # fresh masks each call
    assert not torch.allclose(first, plain(x)[0])
    if need_weights:
        assert_close(weights.sum(-1), torch.ones(B, H, T))


def test_fused_attention_trains_in_float32_under_cpu_half_autocast():
    """Training under bfloat16 autocast on a CPU: eq. 1 is computed from the bfloat16 q, k, v in float32 (the result
    rounded once, gradients flowing back to bfloat16); without gradients the bfloat16 kernel runs."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 5, 8, generator=gen).bfloat16().requires_grad_() for _ in range(3))
    mask = torch.tensor([True, True, True, False, False])[None, None, None, :]  # (1, 1, 1, S)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = fused_attention(q, k, v, mask, 0.0)
        with torch.no_grad():
            inference = fused_attention(q, k, v, mask, 0.0)
    exact = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask)
    assert out.dtype == inference.dtype == torch.bfloat16
    assert torch.equal(out, exact.bfloat16())
    torch.testing.assert_close(inference.float(), exact, atol=2e-2, rtol=2e-2)
    out.float().sum().backward()
    assert q.grad is not None and q.grad.dtype == torch.bfloat16 and q.grad.abs().sum() > 0


def test_a_bfloat16_decoding_step_of_many_rows_attends_in_float32(monkeypatch):
    """One query per row (a decoding step) over 8 rows or more: eq. 1 in float32 from the bfloat16 q, k, v, the
    result rounded once; a whole sequence, or a step of few rows, keeps the bfloat16 kernel."""
    real, seen = F.scaled_dot_product_attention, []

    def recording(q, *args, **kwargs):
        seen.append(q.dtype)
        return real(q, *args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", recording)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(8, 2, n, 16, generator=gen).bfloat16() for n in (1, 6, 6))  # (B, H, T, Dh), T = 1
    mask = torch.ones(8, 1, 1, 6, dtype=torch.bool)
    mask[3, ..., 4:] = False
    with torch.inference_mode():
        out = fused_attention(q, k, v, mask, 0.0)
        assert seen == [torch.float32] and out.dtype == torch.bfloat16
        assert torch.equal(out, real(q.float(), k.float(), v.float(), attn_mask=mask).bfloat16())
        fused_attention(q[:4], k[:4], v[:4], mask[:4], 0.0)  # four rows
        fused_attention(k, k, v, None, 0.0)  # a whole sequence of 6 queries
    assert seen[1:] == [torch.bfloat16, torch.bfloat16]
