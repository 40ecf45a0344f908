"""The encoder-decoder (§3.1, §3.4, §3.5): parity with nn.Transformer, cached decoding, causality, tying, sinusoids."""

import itertools
import math
from typing import Any

import pytest
import torch
from torch.testing import assert_close

from attnkit.config import TranslatorConfig
from attnkit.interop.torch_nn import reference_transformer, to_torch_attn_mask, to_torch_key_padding_mask
from attnkit.model.build import build_translator
from attnkit.model.masking import causal_mask, padding_mask
from attnkit.model.positional import sinusoidal_table
from attnkit.model.transformer import Transformer

V, D, H, FF, N, MAX_LEN, PAD = 40, 16, 2, 32, 2, 32, 0
NORMS = pytest.mark.parametrize("norm", ["post", "pre"])


def _model(**overrides) -> Transformer:
    kwargs = dict(vocab_size=V, d_model=D, n_heads=H, d_ff=FF, n_layers=N, max_len=MAX_LEN)
    return build_translator(TranslatorConfig(**{**kwargs, **overrides}), pad_id=PAD).eval()


def _ids(lengths: list[int], width: int) -> torch.Tensor:
    """(B, width) random non-pad ids, padded with PAD after ``lengths[b]`` tokens."""
    ids = torch.randint(1, V, (len(lengths), width))
    for b, length in enumerate(lengths):
        ids[b, length:] = PAD
    return ids


@NORMS
def test_transformer_matches_torch(norm):
    ours = _model(norm=norm)
    ref = reference_transformer(ours)
    src = _ids([7, 4, 2], 7)
    tgt_in = _ids([6, 3, 1], 6)  # position 0 (BOS) is always real, so no query row is fully masked

    src_pad = to_torch_key_padding_mask(padding_mask(src, PAD))  # (B, S)
    ref_hidden = ref(
        ours.embeddings(src),
        ours.embeddings(tgt_in),
        tgt_mask=to_torch_attn_mask(causal_mask(tgt_in.size(1))),
        src_key_padding_mask=src_pad,
        memory_key_padding_mask=src_pad,
        tgt_key_padding_mask=to_torch_key_padding_mask(padding_mask(tgt_in, PAD)),
    )  # (B, T, D)
    # nn.Transformer has no embeddings or output projection: ours wrap it on both sides.
    assert_close(ours(src, tgt_in), ours.logits(ref_hidden), atol=1e-5, rtol=0)


@NORMS
# One token per step (greedy and beam search), and chunks of several new positions, also after cached ones.
@pytest.mark.parametrize("chunks", [[1] * 6, [2, 3, 1]], ids=["one_by_one", "chunks"])
def test_cached_decoding_equals_full_pass(norm, chunks):
    ours = _model(norm=norm)
    src = _ids([7, 5, 3], 7)
    tgt_in = _ids([6, 6, 6], 6)
    with torch.no_grad():
        memory, src_mask, _ = ours.encode(src)
        full, _, _ = ours.decode(tgt_in, memory, src_mask)  # (B, T, V)

        cache = ours.start_cache(memory, tgt_in.size(1) + 2)  # two positions to spare, never written
        ends = list(itertools.accumulate(chunks))
        for start, end in zip([0] + ends[:-1], ends):
            logits, _, _ = ours.decode(tgt_in[:, start:end], memory, src_mask, cache=cache, offset=start)
            assert_close(logits, full[:, start:end], atol=1e-5, rtol=0)
    assert cache[0].self_kv.k.shape == (3, H, tgt_in.size(1) + 2, D // H)  # preallocated, written in place
    assert not cache[0].self_kv.k[:, :, -2:].any()  # the spare positions were masked, not written


@NORMS
def test_decoder_is_causal(norm):
    ours = _model(norm=norm)
    src = _ids([7, 5, 3], 7)
    tgt_in = _ids([6, 6, 6], 6)
    t = 3
    changed = tgt_in.clone()
    changed[:, t] = tgt_in[:, t] % (V - 1) + 1  # a different non-pad token
    with torch.no_grad():
        before, after = ours(src, tgt_in), ours(src, changed)
    assert_close(before[:, :t], after[:, :t], atol=1e-6, rtol=0)
    # The change is visible from position t on, so the check above is not vacuous.
    assert (before[:, t:] - after[:, t:]).abs().amax(dim=-1).min() > 1e-3


def test_tied_embeddings_are_one_matrix():
    tied, untied = _model(tie_embeddings=True), _model(tie_embeddings=False)
    n_tied = sum(p.numel() for p in tied.parameters())
    n_untied = sum(p.numel() for p in untied.parameters())
    assert tied.output_proj is None
    assert n_untied - n_tied == V * D
    x = torch.randn(2, 3, D)
    assert_close(tied.logits(x), x @ tied.embeddings.token.weight.T)


def test_sinusoidal_table_matches_section_3_5():
    table = sinusoidal_table(50, D)
    # PE(pos, 2i) = sin(pos / 10000^(2i / d)), PE(pos, 2i+1) = cos(pos / 10000^(2i / d)), by hand for d = 16.
    expected = {
        (0, 0): 0.0,
        (0, 1): 1.0,
        (1, 0): 0.8414709848078965,  # sin(1)
        (1, 1): 0.5403023058681398,  # cos(1)
        (3, 2): 0.8126488966420368,  # sin(3 / 10000^(2/16))
        (7, 8): 0.06994284733753277,  # sin(7 / 10000^(8/16)) = sin(0.07)
        (10, 15): 0.9999950000041666,  # cos(10 / 10000^(14/16))
    }
    for (pos, dim), value in expected.items():
        assert_close(table[pos, dim].item(), value, atol=1e-7, rtol=0)
    # Odd d_model: the last dimension is a sine with no cosine partner.
    assert_close(sinusoidal_table(5, 7)[2, 6].item(), math.sin(2 / 10000 ** (6 / 7)), atol=1e-7, rtol=0)


def test_sinusoidal_table_is_a_non_persistent_buffer():
    model = _model()
    position = model.embeddings.position
    assert sum(p.numel() for p in position.parameters()) == 0
    assert "embeddings.position.table" in dict(model.named_buffers())
    assert not any("position" in key for key in model.state_dict())
    # Rebuilt rather than loaded: a state_dict without it still loads strictly.
    _model().load_state_dict(model.state_dict(), strict=True)
    # And it is what the embeddings add: token * sqrt(d_model) + PE (§3.4, §3.5).
    ids = _ids([5], 5)
    assert_close(model.embeddings(ids), model.embeddings.token(ids) * math.sqrt(D) + sinusoidal_table(5, D))


@NORMS
@pytest.mark.parametrize("src_padding", [True, False])
def test_the_training_pass_with_host_made_positions_equals_the_padded_pass(norm, src_padding):
    """The packed training pass (causal self-attention by the kernel's flag, rows made on the host, no source mask
    where the source has no padding) gives the logits of the padded pass at the real target positions."""
    from attnkit.data.batching import real_positions

    torch.manual_seed(0)
    model = _model(norm=norm)
    src_lengths = [6, 3, 5] if src_padding else [6, 6, 6]
    tgt_lengths = [4, 7, 1]
    src, tgt_in = _ids(src_lengths, 6), _ids(tgt_lengths, 7)  # (B, S), (B, T)
    positions = real_positions(tgt_lengths, tgt_in.size(1))  # (N,)
    src_rows = real_positions(src_lengths, src.size(1))  # (N_src,)
    with torch.no_grad():
        packed = model(src, tgt_in, positions, src_rows=src_rows)  # (N, V)
        by_mask = model(src, tgt_in, tgt_in != PAD)  # (N, V)
        padded = model(src, tgt_in)  # (B, T, V)
    assert packed.shape == (sum(tgt_lengths), V)
    assert_close(packed, padded[tgt_in != PAD], atol=1e-5, rtol=1e-5)
    assert_close(by_mask, packed, atol=1e-5, rtol=1e-5)


def test_the_builders_refuse_another_models_config_and_a_pad_id_outside_the_vocabulary():
    """``build_translator(ClassifierConfig())`` was an AttributeError ('tie_embeddings'), ``build_classifier`` of a
    dict or of ``load_config``'s pair another; a pad_id past the vocabulary built a model that failed later."""
    from attnkit.config import ClassifierConfig, MaskedLMConfig
    from attnkit.model.build import build_classifier, build_masked_lm

    small: dict[str, Any] = dict(vocab_size=12, d_model=8, n_heads=2, d_ff=16, n_layers=1)
    with pytest.raises(TypeError, match="^cfg is a ClassifierConfig, not a TranslatorConfig$"):
        build_translator(ClassifierConfig(**small))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="^cfg is a ClassifierConfig, not a MaskedLMConfig$"):
        build_masked_lm(ClassifierConfig(**small))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="^cfg is a tuple, not a ClassifierConfig$"):
        build_classifier((ClassifierConfig(**small), None))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^pad_id=12 must be a token id in \[0, vocab_size=12\)$"):
        build_classifier(ClassifierConfig(**small), pad_id=12)
    with pytest.raises(ValueError, match=r"^pad_id=-1 must be a token id"):
        build_masked_lm(MaskedLMConfig(**small), pad_id=-1)
    assert build_translator(TranslatorConfig(**small), pad_id=11).pad_id == 11
