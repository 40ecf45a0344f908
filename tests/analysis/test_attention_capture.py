"""Attention maps returned as data: equal to the explicit softmax(QK^T / sqrt(d_k)) of the layer, rows summing to 1
over the keys that may be attended, and asking for them changes nothing else."""

from __future__ import annotations

import math
import random

import pytest
import torch

from attnkit.analysis.attention import attention_for_text
from attnkit.cli import main
from attnkit.config import ClassifierConfig, TranslatorConfig
from attnkit.model.build import build_classifier, build_translator
from attnkit.model.classifier import TransformerClassifier
from attnkit.model.masking import padding_mask


def tiny_classifier(norm: str = "post") -> TransformerClassifier:
    cfg = ClassifierConfig(
        vocab_size=40, d_model=32, n_heads=4, d_ff=64, n_layers=3, max_len=64, n_classes=3, norm=norm
    )
    return build_classifier(cfg).eval()


def batch() -> torch.Tensor:
    ids = torch.randint(5, 40, (3, 12))
    ids[1, 7:] = 0
    ids[2, 3:] = 0
    return ids


def test_captured_map_equals_the_explicit_softmax_of_that_layer():
    model, ids = tiny_classifier(), batch()
    _, maps = model.forward_with_attention(ids, (1,))
    assert set(maps.encoder_self) == {1} and not maps.decoder_self and not maps.cross
    # Recompute layer 1's weights by hand from its input: the output of layer 0.
    mask = padding_mask(ids, 0)  # (B, 1, 1, S)
    x = model.embeddings(ids)
    x, _ = model.encoder.layers[0](x, mask)
    attn = model.encoder.layers[1].self_attn
    B, S, _ = x.shape
    q = attn.q_proj(x).view(B, S, 4, 8).transpose(1, 2)
    k = attn.k_proj(x).view(B, S, 4, 8).transpose(1, 2)
    scores = (q @ k.transpose(-2, -1) / math.sqrt(8)).masked_fill(~mask, float("-inf"))
    torch.testing.assert_close(maps.encoder_self[1], scores.softmax(-1), atol=1e-5, rtol=0)


def test_rows_sum_to_one_over_unmasked_keys_and_masked_keys_get_nothing():
    model, ids = tiny_classifier(), batch()
    _, maps = model.forward_with_attention(ids, (0, 2))
    mask = padding_mask(ids, 0)[:, :, 0, :]  # (B, 1, S)
    for weights in maps.encoder_self.values():  # (B, H, S, S)
        torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1]), atol=1e-5, rtol=0)
        assert (weights.masked_select(~mask[:, :, None, :].expand_as(weights)) == 0).all()


def test_capturing_one_layer_leaves_the_outputs_unchanged():
    for norm in ("post", "pre"):
        model, ids = tiny_classifier(norm), batch()
        plain = model(ids)
        with_maps, _ = model.forward_with_attention(ids, (1,))
        torch.testing.assert_close(with_maps, plain, atol=1e-6, rtol=0)


def test_translator_cross_attention_is_captured_without_changing_logits():
    cfg = TranslatorConfig(vocab_size=40, d_model=32, n_heads=4, d_ff=64, n_layers=2, max_len=64)
    model = build_translator(cfg).eval()
    src, tgt = torch.randint(5, 40, (2, 9)), torch.randint(5, 40, (2, 6))
    src[1, 5:] = 0
    memory, src_mask, _ = model.encode(src)
    plain, _, _ = model.decode(tgt, memory, src_mask)
    logits, maps, _ = model.decode(tgt, memory, src_mask, attn_layers=(1,))
    torch.testing.assert_close(logits, plain, atol=1e-6, rtol=0)
    assert set(maps.cross) == set(maps.decoder_self) == {1} and not maps.encoder_self
    cross = maps.cross[1]  # (B, H, T, S)
    assert cross.shape == (2, 4, 6, 9)
    assert (cross[1, :, :, 5:] == 0).all()  # padded source positions get no attention
    torch.testing.assert_close(cross.sum(-1), torch.ones(2, 4, 6), atol=1e-5, rtol=0)
    self_attn = maps.decoder_self[1]  # (B, H, T, T): causal
    assert (self_attn.triu(diagonal=1) == 0).all()


def test_only_the_layers_asked_for_leave_the_fused_kernel(monkeypatch):
    """The explicit softmax path runs in the requested layers alone: once in encoder layer 1, twice (self and
    cross) in decoder layer 1; every other attention call stays on the fused kernel."""
    from attnkit.model import attention

    explicit = attention.scaled_dot_product_attention
    calls = []
    monkeypatch.setattr(attention, "scaled_dot_product_attention", lambda *a: calls.append(1) or explicit(*a))
    tiny_classifier().forward_with_attention(batch(), (1,))
    assert len(calls) == 1
    calls.clear()
    model = build_translator(TranslatorConfig(vocab_size=40, d_model=32, n_heads=4, d_ff=64, n_layers=3, max_len=64))
    src, tgt = torch.randint(5, 40, (2, 9)), torch.randint(5, 40, (2, 6))
    memory, src_mask, _ = model.eval().encode(src)
    _, maps, _ = model.decode(tgt, memory, src_mask, attn_layers=(1,))
    assert len(calls) == 2 and set(maps.cross) == {1}


# ---------------------------------------------------------------------------------------------------------------
# `plot attention` on a translator whose greedy output runs to the length limit (no EOS): the decoder rows are
# the output tokens, one per position it has; BOS + the whole output would need one position more.

SYMBOLS = ["a", "b", "c", "d", "e", "f", "g", "h"]
LONG_TEXT = " ".join(SYMBOLS * 3)  # 24 tokens, longer than max_len=16


@pytest.fixture(scope="module", params=["sinusoidal", "learned"])
def barely_trained_translator(request, tmp_path_factory, quietly):
    """Two steps of training on a reverse task: far too few to learn to stop, so greedy output runs to its limit."""
    tmp = tmp_path_factory.mktemp(f"translator-{request.param}")
    rng = random.Random(0)
    lines = ["source\ttarget"]
    for _ in range(40):
        seq = [rng.choice(SYMBOLS) for _ in range(rng.randint(1, 6))]
        lines.append(" ".join(seq) + "\t" + " ".join(reversed(seq)))
    (tmp / "train.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    quietly(
        "translate",
        "train",
        "--train",
        str(tmp / "train.tsv"),
        "--out",
        str(tmp / "run"),
        "--max-steps",
        "2",
        "--seed",
        "0",
        "--quiet",
        "--set",
        "tokenizer=word",
        "min_freq=1",
        "d_model=16",
        "n_heads=2",
        "d_ff=32",
        "n_layers=1",
        "max_len=16",
        f"positional={request.param}",
        "valid_bleu=false",
    )
    return tmp / "run", request.param


def test_attention_of_an_output_that_runs_to_the_length_limit(barely_trained_translator, tmp_path, capsys):
    run, positional = barely_trained_translator
    captured = attention_for_text(run, LONG_TEXT)
    n_src = len(SYMBOLS) * 3 + 1  # + EOS
    # Sinusoids are extended to input + 50 positions (§6.1's limit); learned positions stop at max_len = 16.
    limit = n_src + 50 if positional == "sinusoidal" else 16
    assert captured.query_tokens[-1] != "</s>" and len(captured.query_tokens) == limit  # ran to the limit, no EOS
    assert len(captured.key_tokens) == (n_src if positional == "sinusoidal" else 16)
    for weights in captured.maps.values():  # (H, T, S): one row per output token, one column per source token
        assert weights.shape[1:] == (len(captured.query_tokens), len(captured.key_tokens))
        torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:2]), atol=1e-5, rtol=0)
    capsys.readouterr()

    out = tmp_path / "cross.png"
    assert main(["plot", "attention", "--model", str(run), "--out", str(out), LONG_TEXT]) == 0
    assert out.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    err = capsys.readouterr().err
    assert ("extended" if positional == "sinusoidal" else "truncated") in err


def test_maps_too_large_to_compute_are_refused_before_decoding(barely_trained_translator, monkeypatch):
    """An input whose maps would pass ``MAX_WEIGHTS`` is refused before the greedy search (up to S + 50 steps) and
    the explicit attention run: a 20,000-token text asked for 12 GiB of weights and died in the allocator."""
    import attnkit.analysis.attention as attention
    import attnkit.decoding as decoding
    from attnkit.errors import InputError

    run, positional = barely_trained_translator
    n_src = len(SYMBOLS) * 3 + 1 if positional == "sinusoidal" else 16  # + EOS; learned positions truncate at 16
    n_out = n_src + 50 if positional == "sinusoidal" else 16
    monkeypatch.setattr(attention, "MAX_WEIGHTS", 2 * n_out * n_src - 1)  # 1 layer x 2 heads, one weight too many

    def no_decoding(*args, **kwargs):
        raise AssertionError("decoded before the size was checked")

    monkeypatch.setattr(decoding, "greedy_decode", no_decoding)
    with pytest.raises(InputError, match=rf"1 layer\(s\) x 2 heads x {n_out} x {n_src} = {2 * n_out * n_src:,} "):
        attention_for_text(run, LONG_TEXT)


def test_a_head_the_model_lacks_is_refused_before_decoding(barely_trained_translator, monkeypatch, capsys):
    """``plot attention --head 2`` on a 2-head translator is one ``error:`` line, given before the greedy search
    (up to S + 50 steps), where it came after the decoding and the explicit attention run."""
    import attnkit.decoding as decoding

    def no_decoding(*args, **kwargs):
        raise AssertionError("decoded before the head was checked")

    monkeypatch.setattr(decoding, "greedy_decode", no_decoding)
    run, _ = barely_trained_translator
    argv = ["plot", "attention", "--model", str(run), "--out", "x.png", "--head", "0", "--head", "2", "a b"]
    assert main(argv) == 2
    assert capsys.readouterr().err == "error: --head 2: the model has heads 0..1\n"
