"""Weight-only int8 (``attnkit.inference.quantize``, ``quantize_for_inference``): the rounding is the one documented,
the int8 kernel computes the same product as the bfloat16 copy of the same values, the model keeps its structure and
state-dict keys, and one sentence decodes alike alone and in a batch."""

import copy
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.testing import assert_close

from attnkit.config import TranslatorConfig
from attnkit.decoding import beam_search, greedy_decode
from attnkit.errors import InputError
from attnkit.inference import prepare_for_inference, quantize_for_inference
from attnkit.inference.fused import FusedSelfAttention
from attnkit.inference.quantize import (
    INT8_MAX_ROWS,
    Int8Embedding,
    Int8Linear,
    Int8Weight,
    TiedInt8Output,
    quantize_int8_,
)
from attnkit.model.attention import MultiHeadAttention
from attnkit.model.build import build_translator
from attnkit.model.transformer import Transformer
from attnkit.training.precision import DECODING_PRECISIONS, check_precision

PAD, BOS, EOS = 0, 1, 2
SMALL: dict[str, Any] = dict(vocab_size=50, d_model=32, n_heads=2, d_ff=64, n_layers=2, max_len=40)


def test_rounding_is_per_row_symmetric_and_within_half_a_step():
    torch.manual_seed(0)
    w = torch.randn(24, 48) * torch.logspace(-3, 1, 24)[:, None]  # rows of very different sizes
    int8 = Int8Weight.quantize(w)
    assert int8.q.dtype == torch.int8 and int8.q.shape == w.shape and int8.scale.shape == (24,)
    assert int8.q.abs().amax(dim=1).eq(127).all()  # each row's largest weight maps to +-127
    assert_close(int8.scale, w.abs().amax(dim=1) / 127)
    assert ((int8.dense - w).abs() <= int8.scale[:, None] / 2 + 1e-7).all()  # rounding error <= half a step
    assert Int8Weight.quantize(torch.zeros(3, 16)).dense.eq(0).all()  # an all-zero row: no division by zero


@pytest.mark.parametrize("rows", [1, 2, INT8_MAX_ROWS, INT8_MAX_ROWS + 1, 33])
def test_the_int8_kernel_computes_the_dense_product(rows):
    """Up to INT8_MAX_ROWS rows the int8 kernel runs, beyond them F.linear on ``dense``: the same values, so the two
    agree to bfloat16 rounding of the result (float32 sums in both)."""
    torch.manual_seed(rows)
    int8 = Int8Weight.quantize(torch.randn(40, 64).bfloat16())
    x, bias = torch.randn(rows, 64).bfloat16(), torch.randn(40).bfloat16()
    reference = (x.float() @ int8.dense.float().t() + bias.float()).bfloat16()  # (rows, 40)
    assert_close(int8.linear(x, bias), reference, atol=0.05, rtol=0.02)
    assert_close(int8.linear(x.view(1, rows, 64)), int8.linear(x).view(1, rows, 40))  # any leading shape
    if rows > INT8_MAX_ROWS:
        assert torch.equal(int8.linear(x, bias), F.linear(x, int8.dense, bias))


def test_the_fused_projection_rounds_as_each_projection_alone():
    """W^Q, W^K, W^V stacked into one ``qkv`` and rounded as one matrix: every row has its own scale, so each part is
    rounded exactly as it would be alone."""
    torch.manual_seed(0)
    attention = MultiHeadAttention(d_model=32, n_heads=2).bfloat16()
    fused = FusedSelfAttention(attention)
    assert quantize_int8_(fused) == 2 and isinstance(fused.qkv, Int8Linear)
    alone = [Int8Weight.quantize(p.weight) for p in (attention.q_proj, attention.k_proj, attention.v_proj)]
    assert torch.equal(fused.qkv.q, torch.cat([w.q for w in alone]))
    assert torch.equal(fused.qkv.scale, torch.cat([w.scale for w in alone]))


def test_only_matrices_the_kernel_can_read_are_replaced():
    model = nn.Sequential(nn.Linear(32, 8), nn.Linear(8, 3), nn.Embedding(10, 48), nn.Embedding(10, 20))
    assert quantize_int8_(model) == 2
    assert [type(m) for m in model] == [Int8Linear, nn.Linear, Int8Embedding, nn.Embedding]  # K % 16 == 0 only
    assert quantize_int8_(model) == 0  # idempotent


def _translator() -> Transformer:
    torch.manual_seed(0)
    return build_translator(TranslatorConfig(**SMALL), pad_id=PAD)


def test_a_quantized_translator_keeps_its_keys_and_runs_every_projection_in_int8():
    model = _translator()
    keys = list(model.state_dict())
    quantize_for_inference(model)
    assert list(model.state_dict()) == keys  # q and scale are not saved: the state dict holds the rounded weights
    assert {t.dtype for t in model.state_dict().values()} == {torch.bfloat16}
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert linears and all(isinstance(m, Int8Linear) for m in linears)
    attention = model.decoder.layers[0].self_attn
    assert isinstance(attention, FusedSelfAttention) and isinstance(attention.qkv, Int8Linear)  # W^Q W^K W^V stacked
    assert isinstance(model.output_proj, TiedInt8Output)  # the tied output projection, on the embedding's int8 copy
    assert model.output_proj.weight is model.embeddings.token.weight  # lookups read the same values
    moved = copy.deepcopy(model).to(torch.float32)  # .to() casts the floating-point tensors, int8 stays int8
    assert moved.embeddings.token.q.dtype == torch.int8 and moved.output_proj.weight.dtype == torch.float32
    assert moved.output_proj.weight is moved.embeddings.token.weight  # still one matrix after a deep copy


def test_a_quantized_translator_decodes_one_sentence_as_in_a_batch():
    """A sentence alone takes the int8 kernel at every step, in a batch of 8 the bfloat16 copy of the same
    weights: the logits agree to their rounding, and greedy and beam search give the same tokens, but where a greedy
    choice is a tie within that rounding (this random model's first choices are as close as 0.008)."""
    model = quantize_for_inference(_translator())
    reference = prepare_for_inference(_translator())
    src = torch.randint(EOS + 1, SMALL["vocab_size"], (8, 11))
    src[3, 7:] = PAD
    tgt = torch.randint(EOS + 1, SMALL["vocab_size"], (8, 1))
    with torch.inference_mode():
        memory, mask, _ = model.encode(src)
        batch = model.decode(tgt, memory, mask, cache=model.start_cache(memory))[0]  # (8, 1, V): dense
        alone = torch.cat(
            [
                model.decode(
                    tgt[i : i + 1], memory[i : i + 1], mask[i : i + 1], cache=model.start_cache(memory[i : i + 1])
                )[0]
                for i in range(8)
            ]
        )  # one row a call: the int8 kernel
        assert_close(alone.float(), batch.float(), atol=0.06, rtol=0.02)
        m32, mask32, _ = reference.encode(src)
        full = reference.decode(tgt, m32, mask32)[0]
        assert_close(batch.float(), full, atol=0.3, rtol=0.05)  # int8 rounding: close to float32, not equal
    ids = dict(bos_id=BOS, eos_id=EOS, max_positions=SMALL["max_len"])
    beams = beam_search(model, src, beam_size=4, **ids)
    assert [beam_search(model, src[i : i + 1], beam_size=4, **ids)[0] for i in range(8)] == beams
    batched = greedy_decode(model, src, **ids)
    for i in range(8):
        one = greedy_decode(model, src[i : i + 1], **ids)[0]
        if one != batched[i]:  # parted at step t: the float32 model's two candidates there are within rounding
            t = next(t for t, (a, b) in enumerate(zip(one + [EOS], batched[i] + [EOS])) if a != b)
            with torch.inference_mode():
                logits = reference.decode(torch.tensor([[BOS] + one[:t]]), m32[i : i + 1], mask32[i : i + 1])[0]
            candidates = (one + [EOS])[t], (batched[i] + [EOS])[t]
            assert abs(float(logits[0, -1, candidates[0]] - logits[0, -1, candidates[1]])) < 0.06, (i, t)


def test_int8_is_a_decoding_precision_for_cpus():
    check_precision("int8", torch.device("cpu"), allowed=DECODING_PRECISIONS)
    with pytest.raises(InputError, match="precision=int8 runs on CPUs"):
        check_precision("int8", torch.device("cuda"), what="precision", allowed=DECODING_PRECISIONS)
    with pytest.raises(InputError, match="int8 is for decoding with a translator"):
        check_precision("int8", torch.device("cpu"), what="precision")  # a classifier's precisions


def test_autograd_multiplies_by_the_rounded_weights():
    layer = Int8Linear.of(nn.Linear(16, 4))
    x = torch.randn(2, 16, requires_grad=True)
    layer(x).sum().backward()
    assert_close(x.grad, layer.weight.sum(dim=0).expand(2, 16))


def test_the_int8_copy_follows_the_weights():
    """``.to()`` moves and casts it with the parameters; loading a state dict rounds the new weights again (a stale
    int8 copy would decode with the old ones)."""
    torch.manual_seed(0)
    layer = Int8Linear.of(nn.Linear(32, 8).bfloat16())
    assert layer.to(torch.float32).int8.scale.dtype == torch.float32 and layer.int8.q.dtype == torch.int8
    layer.to(torch.bfloat16)
    x = torch.randn(1, 32).bfloat16()
    other = nn.Linear(32, 8).bfloat16()
    layer.load_state_dict(other.state_dict())
    assert torch.equal(layer.q, Int8Weight.quantize(other.weight).q)
    with torch.inference_mode():
        assert_close(layer(x), F.linear(x, layer.weight, layer.bias), atol=0.05, rtol=0.02)  # the int8 kernel
        assert_close(layer(x), other(x), atol=0.1, rtol=0.05)  # the new weights, rounded
