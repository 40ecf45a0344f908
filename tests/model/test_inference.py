"""QKV fusion for inference (``MultiHeadAttention.fuse_qkv``, ``prepare_for_inference``): the same outputs as
the unfused model, and never a stale copy once the weights can change (train(), load_state_dict, autograd)."""

from typing import Any

import pytest
import torch
from torch.testing import assert_close

from attnkit.config import ClassifierConfig, TranslatorConfig
from attnkit.decoding import greedy_decode
from attnkit.model.attention import MultiHeadAttention
from attnkit.model.build import build_classifier, build_translator, prepare_for_inference

V, PAD, BOS, EOS = 40, 0, 1, 2
SMALL: dict[str, Any] = dict(vocab_size=V, d_model=16, n_heads=2, d_ff=32, n_layers=2, max_len=32)
NORMS = pytest.mark.parametrize("norm", ["post", "pre"])


def _attention_modules(model: torch.nn.Module) -> list[MultiHeadAttention]:
    return [m for m in model.modules() if isinstance(m, MultiHeadAttention)]


def _ids(batch: int, length: int) -> torch.Tensor:
    ids = torch.randint(EOS + 1, V, (batch, length))  # (B, L)
    ids[1, length // 2 :] = PAD
    return ids


def _twins(build):
    """Two models with the same weights: one to fuse, one left unfused."""
    torch.manual_seed(0)
    fused = build()
    torch.manual_seed(0)
    return fused, build()


def test_fused_attention_equals_unfused_and_is_a_snapshot():
    mha = MultiHeadAttention(d_model=16, n_heads=2).eval()
    x, memory = torch.randn(3, 5, 16), torch.randn(3, 7, 16)
    with torch.no_grad():
        plain = mha(x)[0]
        mha.fuse_qkv()
        assert mha.is_fused
        assert_close(mha(x)[0], plain, atol=1e-6, rtol=0)
        assert_close(mha(x, memory)[0], mha.unfuse_qkv() or mha(x, memory)[0], atol=0, rtol=0)  # cross: unaffected
        # The fused path really is the one taken: a weight written by hand does not show until unfuse_qkv().
        mha.fuse_qkv()
        mha.q_proj.weight.add_(1.0)
        assert_close(mha(x)[0], plain, atol=1e-6, rtol=0)
        mha.unfuse_qkv()
        assert not torch.allclose(mha(x)[0], plain, atol=1e-3)


@NORMS
def test_prepared_classifier_gives_the_unfused_logits(norm):
    cfg = ClassifierConfig(**SMALL, n_classes=3, norm=norm)
    fused, plain = _twins(lambda: build_classifier(cfg, pad_id=PAD))
    prepare_for_inference(fused)
    plain.eval()
    assert not fused.training and all(m.is_fused for m in _attention_modules(fused))
    ids = _ids(3, 9)
    with torch.inference_mode():
        assert_close(fused(ids), plain(ids), atol=1e-6, rtol=0)
        # Maps asked for on one layer: the other stays fused, and the logits do not move.
        logits, maps = fused.forward_with_attention(ids, (1,))
    assert_close(logits, plain(ids).detach(), atol=1e-6, rtol=0)
    assert set(maps.encoder_self) == {1} and all(m.is_fused for m in _attention_modules(fused))


@NORMS
def test_prepared_translator_decodes_as_the_unfused_one(norm):
    cfg = TranslatorConfig(**SMALL, norm=norm, tie_embeddings=False)
    fused, plain = _twins(lambda: build_translator(cfg, pad_id=PAD))
    prepare_for_inference(fused)
    plain.eval()
    src, tgt_in = _ids(3, 8), torch.randint(EOS + 1, V, (3, 6))  # (B, S), (B, T): no padding in the prefix
    with torch.inference_mode():
        assert_close(fused(src, tgt_in), plain(src, tgt_in), atol=1e-6, rtol=0)
        # Cached decoding runs every self-attention one position at a time, through the fused weights.
        memory, src_mask, _ = fused.encode(src)
        cache, stepped = fused.start_cache(memory), []
        for t in range(tgt_in.size(1)):
            logits, _, cache = fused.decode(tgt_in[:, t : t + 1], memory, src_mask, cache=cache, offset=t)
            stepped.append(logits)
        assert_close(torch.cat(stepped, dim=1), plain(src, tgt_in), atol=1e-5, rtol=0)
    kwargs = dict(bos_id=BOS, eos_id=EOS, max_positions=cfg.max_len)
    assert greedy_decode(fused, src, **kwargs) == greedy_decode(plain, src, **kwargs)
    assert all(m.is_fused for m in _attention_modules(fused))  # greedy_decode's eval() keeps the fused copies


@NORMS
def test_fused_model_put_back_to_training_trains_as_an_unfused_one(norm):
    """Fused for inference, then trained: train() must drop the stacked copies, or the evaluation after the
    optimizer step would still use the weights from before it."""
    cfg = ClassifierConfig(**SMALL, n_classes=3, norm=norm)
    fused, plain = _twins(lambda: build_classifier(cfg, pad_id=PAD))
    ids, labels = _ids(4, 9), torch.tensor([0, 1, 2, 1])
    prepare_for_inference(fused)
    with torch.inference_mode():
        fused(ids)  # an inference call through the fused copies
    for model in (fused, plain):
        model.train()
        assert not any(m.is_fused for m in _attention_modules(model))  # dropped before any weight can change
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        torch.manual_seed(1)  # the same dropout masks for both
        torch.nn.functional.cross_entropy(model(ids), labels).backward()
        optimizer.step()
        model.eval()
    assert not any(m.is_fused for m in _attention_modules(fused))
    with torch.no_grad():
        assert_close(fused(ids), plain(ids), atol=1e-6, rtol=0)
        prepare_for_inference(fused)  # fused again, from the trained weights
        assert_close(fused(ids), plain(ids), atol=1e-6, rtol=0)


def test_loading_weights_or_a_forward_with_autograd_drops_the_fused_copies():
    cfg = ClassifierConfig(**SMALL, n_classes=3)
    torch.manual_seed(0)
    model, other = build_classifier(cfg), build_classifier(cfg).eval()
    ids = _ids(3, 9)
    prepare_for_inference(model)
    model.load_state_dict(other.state_dict())
    assert not any(m.is_fused for m in _attention_modules(model))
    with torch.no_grad():
        assert_close(model(ids), other(ids), atol=1e-6, rtol=0)
    prepare_for_inference(model)
    model(ids).sum().backward()  # autograd on: gradients an optimizer could step with
    assert not any(m.is_fused for m in _attention_modules(model))
    assert model.encoder.layers[0].self_attn.q_proj.weight.grad is not None


def test_fused_copies_follow_a_dtype_change():
    cfg = ClassifierConfig(**SMALL, n_classes=3)
    fused, plain = _twins(lambda: build_classifier(cfg, pad_id=PAD))
    prepare_for_inference(fused).double()
    plain.double().eval()
    ids = _ids(3, 9)
    with torch.inference_mode():
        out = fused(ids)
        assert out.dtype == torch.float64
        assert_close(out, plain(ids), atol=1e-12, rtol=0)
