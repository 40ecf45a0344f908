"""The inference engine swaps modules (``attnkit.inference``): a ``FusedSelfAttention`` built from a
``MultiHeadAttention``'s weights computes what it computed, owns its weights (so nothing can go stale: it moves,
casts, loads and trains like the module it replaced) and saves under the paper's keys; the paper's modules keep no
inference machinery."""

import ast
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

import attnkit
from attnkit.config import ClassifierConfig, TranslatorConfig
from attnkit.decoding import greedy_decode
from attnkit.inference import prepare_for_inference
from attnkit.inference.fused import FusedSelfAttention
from attnkit.inference.transposed import TransposedEmbedding
from attnkit.model.attention import MultiHeadAttention
from attnkit.model.build import build_classifier, build_translator
from attnkit.model.masking import lengths_to_padding_mask

V, PAD, BOS, EOS = 40, 0, 1, 2
SMALL: dict[str, Any] = dict(vocab_size=V, d_model=16, n_heads=2, d_ff=32, n_layers=2, max_len=32)
NORMS = pytest.mark.parametrize("norm", ["post", "pre"])


def _fused_modules(model: torch.nn.Module) -> list[FusedSelfAttention]:
    return [m for m in model.modules() if isinstance(m, FusedSelfAttention)]


def _ids(batch: int, length: int) -> torch.Tensor:
    ids = torch.randint(EOS + 1, V, (batch, length))  # (B, L)
    ids[1, length // 2 :] = PAD
    return ids


def _twins(build):
    """Two models with the same weights: one to prepare, one left as built."""
    torch.manual_seed(0)
    fused = build()
    torch.manual_seed(0)
    return fused, build()


def test_fused_self_attention_computes_what_it_replaced_and_owns_its_weights():
    mha = MultiHeadAttention(d_model=16, n_heads=2).eval()
    x = torch.randn(3, 5, 16)
    mask = lengths_to_padding_mask(torch.tensor([5, 3, 1]), 5)  # (B, 1, 1, S)
    fused = FusedSelfAttention(mha)
    assert not hasattr(fused, "q_proj") and fused.qkv.weight.shape == (48, 16)
    with torch.no_grad():
        for need_weights in (False, True):
            out, weights, _ = fused(x, mask=mask, need_weights=need_weights)
            plain, plain_weights, _ = mha(x, mask=mask, need_weights=need_weights)
            assert_close(out, plain, atol=1e-6, rtol=0)
            assert (weights is None) == (plain_weights is None)
        # The stacked matrix is the weights, not a copy of them: writing it changes the output at once.
        fused.qkv.weight[:16].add_(1.0)  # W^Q
        assert not torch.allclose(fused(x)[0], mha(x)[0], atol=1e-3)


def test_fused_self_attention_saves_and_loads_under_the_papers_keys():
    mha = MultiHeadAttention(d_model=16, n_heads=2)
    fused = FusedSelfAttention(mha)
    saved = fused.state_dict()
    assert list(saved) == list(mha.state_dict())  # q_proj.weight, q_proj.bias, k_proj..., out_proj.bias, in order
    assert all(torch.equal(saved[k], v) for k, v in mha.state_dict().items())
    other = MultiHeadAttention(d_model=16, n_heads=2).eval()
    fused.load_state_dict(other.state_dict())  # strict: every key is known
    x = torch.randn(2, 4, 16)
    with torch.no_grad():
        assert_close(fused(x)[0], other(x)[0], atol=1e-6, rtol=0)
    assert saved["q_proj.weight"].data_ptr() != saved["k_proj.weight"].data_ptr()  # own storage (safetensors)


@NORMS
def test_a_prepared_classifier_trains_as_the_unprepared_one(norm):
    """Nothing to invalidate: an optimizer step on the stacked projection is the step on the three it replaced."""
    cfg = ClassifierConfig(**SMALL, n_classes=3, norm=norm)
    fused, plain = _twins(lambda: build_classifier(cfg, pad_id=PAD))
    ids, labels = _ids(4, 9), torch.tensor([0, 1, 2, 1])
    prepare_for_inference(fused)
    assert len(_fused_modules(fused)) == cfg.n_layers
    for model in (fused, plain):
        model.train()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        torch.manual_seed(1)  # the same dropout masks for both
        torch.nn.functional.cross_entropy(model(ids), labels).backward()
        optimizer.step()
        model.eval()
    with torch.no_grad():
        assert_close(fused(ids), plain(ids), atol=1e-5, rtol=0)
    trained = fused.state_dict()
    assert all(torch.allclose(trained[k], v, atol=1e-6) for k, v in plain.state_dict().items())


@NORMS
def test_prepared_classifier_gives_the_unprepared_logits_and_maps(norm):
    cfg = ClassifierConfig(**SMALL, n_classes=3, norm=norm)
    fused, plain = _twins(lambda: build_classifier(cfg, pad_id=PAD))
    prepare_for_inference(fused)
    plain.eval()
    assert not fused.training
    ids = _ids(3, 9)
    with torch.inference_mode():
        assert_close(fused(ids), plain(ids), atol=1e-6, rtol=0)
        logits, maps = fused.forward_with_attention(ids, (1,))
        _, plain_maps = plain.forward_with_attention(ids, (1,))
    assert_close(logits, plain(ids).detach(), atol=1e-6, rtol=0)
    assert set(maps.encoder_self) == {1}
    assert_close(maps.encoder_self[1], plain_maps.encoder_self[1], atol=1e-6, rtol=0)


@NORMS
def test_prepared_translator_decodes_as_the_unprepared_one(norm):
    cfg = TranslatorConfig(**SMALL, norm=norm, tie_embeddings=False)
    fused, plain = _twins(lambda: build_translator(cfg, pad_id=PAD))
    prepare_for_inference(fused)
    plain.eval()
    assert len(_fused_modules(fused)) == 2 * cfg.n_layers  # encoder and decoder self-attention, not cross
    src, tgt_in = _ids(3, 8), torch.randint(EOS + 1, V, (3, 6))  # (B, S), (B, T): no padding in the prefix
    with torch.inference_mode():
        assert_close(fused(src, tgt_in), plain(src, tgt_in), atol=1e-6, rtol=0)
        # Cached decoding runs every self-attention one position at a time, through the fused weights.
        memory, src_mask, _ = fused.encode(src)
        cache, stepped = fused.start_cache(memory), []
        for t in range(tgt_in.size(1)):
            logits, _, cache = fused.decode(tgt_in[:, t : t + 1], None, src_mask, cache=cache, offset=t)
            stepped.append(logits)
        assert_close(torch.cat(stepped, dim=1), plain(src, tgt_in), atol=1e-5, rtol=0)
    kwargs: dict[str, Any] = dict(bos_id=BOS, eos_id=EOS, max_positions=cfg.max_len)
    assert greedy_decode(fused, src, **kwargs) == greedy_decode(plain, src, **kwargs)
    assert prepare_for_inference(fused) is fused and len(_fused_modules(fused)) == 2 * cfg.n_layers  # idempotent


def test_a_prepared_translator_holds_its_tied_matrix_once_and_transposed():
    """The tied embedding matrix E (V, D) becomes one (D, V) parameter: lookups and the output projection read it,
    the logits are F.linear's with E, and it saves and loads as E under the embedding's key."""
    cfg = TranslatorConfig(**SMALL)  # tied (§3.4)
    prepared, plain = _twins(lambda: build_translator(cfg, pad_id=PAD))
    prepare_for_inference(prepared)
    token = prepared.embeddings.token
    assert isinstance(token, TransposedEmbedding) and token.weight_t.shape == (16, V) and token.weight_t.is_contiguous()
    assert sum(p.numel() for p in prepared.parameters()) == sum(p.numel() for p in plain.parameters())  # once
    x, ids = torch.randn(3, 2, 16), _ids(3, 5)
    with torch.no_grad():
        assert_close(prepared.logits(x), F.linear(x, plain.embeddings.token.weight), atol=1e-6, rtol=0)
        assert_close(prepared.embeddings(ids), plain.eval().embeddings(ids), atol=0, rtol=0)
    saved = prepared.state_dict()["embeddings.token.weight"]
    assert saved.shape == (V, 16) and torch.equal(saved, plain.embeddings.token.weight)
    other = build_translator(cfg, pad_id=PAD)
    prepared.load_state_dict(other.state_dict())
    assert torch.equal(prepared.embeddings.token.weight, other.embeddings.token.weight)


def test_a_prepared_model_follows_a_dtype_change():
    cfg = ClassifierConfig(**SMALL, n_classes=3)
    fused, plain = _twins(lambda: build_classifier(cfg, pad_id=PAD))
    prepare_for_inference(fused).double()
    plain.double().eval()
    ids = _ids(3, 9)
    with torch.inference_mode():
        out = fused(ids)
        assert out.dtype == torch.float64
        assert_close(out, plain(ids), atol=1e-12, rtol=0)


MODEL_FILES = ("attention.py", "layers.py", "transformer.py")


@pytest.mark.parametrize("name", MODEL_FILES)
def test_the_papers_modules_hold_no_inference_engine(name):
    """No snapshot kept valid by overriding nn.Module's machinery, and no int8 branch: the engine swaps modules."""
    source = (Path(attnkit.__file__).parent / "model" / name).read_text(encoding="utf-8")
    methods = {node.name for node in ast.walk(ast.parse(source)) if isinstance(node, ast.FunctionDef)}
    assert not methods & {"_apply", "_load_from_state_dict", "train", "state_dict", "load_state_dict"}
    assert "Int8" not in source and "quantize" not in source
