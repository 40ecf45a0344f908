"""Greedy and beam search (§6.1): cached equals uncached, batch invariance, exactness, scores, length limits."""

import math
from typing import Any

import pytest
import torch
from torch.testing import assert_close

from attnkit.config import TranslatorConfig
from attnkit.decoding import Hypothesis, beam_search, beam_search_nbest, greedy_decode, length_penalty
from attnkit.model.build import build_translator
from attnkit.model.transformer import Transformer

V, D, H, FF, N, MAX_LEN = 24, 32, 4, 64, 2, 128
PAD, BOS, EOS = 0, 3, 4  # attnkit's tokenizer ids, passed explicitly as the searches require
IDS: dict[str, Any] = dict(bos_id=BOS, eos_id=EOS, max_positions=MAX_LEN)


pytestmark = pytest.mark.usefixtures("one_thread")


def _model(norm: str = "post") -> Transformer:
    """A tiny random translator whose outputs end with EOS at varied lengths.

    Untied: with tied embeddings a random model copies its input token forever (BOS, BOS, ...). The output
    projection is scaled up so that the distributions are peaked and near ties between candidates are rare.
    """
    cfg = TranslatorConfig(
        vocab_size=V, d_model=D, n_heads=H, d_ff=FF, n_layers=N, max_len=MAX_LEN, norm=norm, tie_embeddings=False
    )
    model = build_translator(cfg, pad_id=PAD).eval()
    with torch.no_grad():
        model.output_proj.weight.mul_(3.0)
    return model


def _sources(lengths: list[int]) -> torch.Tensor:
    """(B, max length) random ids that are not special tokens, padded after ``lengths[b]``."""
    src = torch.randint(EOS + 1, V, (len(lengths), max(lengths)))
    for b, length in enumerate(lengths):
        src[b, length:] = PAD
    return src


def _batch(n: int = 32) -> torch.Tensor:
    return _sources(torch.randint(1, 13, (n,)).tolist())


def _unpadded(src: torch.Tensor, b: int) -> torch.Tensor:
    """Sentence b alone, without padding: (1, its length)."""
    return src[b : b + 1, : int((src[b] != PAD).sum())]


def _never_eos(model: Transformer, monkeypatch) -> None:
    """Push the EOS logit to -1e9, so every output runs to its length limit."""
    logits = model.logits
    monkeypatch.setattr(model, "logits", lambda x: logits(x).index_fill(-1, torch.tensor([EOS]), -1e9))


@torch.no_grad()
def _reference_greedy(model, src, steps, *, suppress_eos=False):
    """Greedy without a cache: the whole decoder pass on the prefix at every step.

    Returns tokens (B, steps) and the logits that chose them (B, steps, V), each row running past its EOS.
    """
    memory, src_mask, _ = model.encode(src)
    tgt_in = torch.full((src.size(0), 1), BOS)
    banned = torch.tensor([PAD, BOS, EOS] if suppress_eos else [PAD, BOS])  # never emitted
    all_logits = []
    for _ in range(steps):
        logits, _, _ = model.decode(tgt_in, memory, src_mask)  # (B, t + 1, V), recomputed from scratch
        all_logits.append(logits[:, -1])
        next_token = logits[:, -1].index_fill(1, banned, float("-inf")).argmax(dim=-1, keepdim=True)  # (B, 1)
        tgt_in = torch.cat([tgt_in, next_token], dim=1)
    return tgt_in[:, 1:], torch.stack(all_logits, dim=1)


@torch.no_grad()
def _model_score(model, src_row: torch.Tensor, hyp: Hypothesis) -> float:
    """log P(hyp | src) recomputed by one uncached teacher-forced pass: src_row (1, S)."""
    tgt_in = torch.tensor([[BOS] + hyp.tokens])  # (1, T)
    tgt_out = torch.tensor(hyp.tokens + [EOS])  # (T,)
    log_probs = model(src_row, tgt_in)[0].log_softmax(dim=-1)  # (T, V)
    picked = log_probs[torch.arange(len(tgt_out)), tgt_out]  # (T,)
    return float(picked.sum() if hyp.eos else picked[:-1].sum())  # without EOS the last position predicts nothing


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_cached_greedy_equals_uncached_greedy_step_by_step(norm, monkeypatch):
    model = _model(norm)
    src = _sources([9, 6, 3, 1])
    steps = 12
    recorded = []
    logits = model.logits

    def recording_logits(x):
        recorded.append(logits(x))  # (B, 1, V) per cached step
        return recorded[-1]

    monkeypatch.setattr(model, "logits", recording_logits)

    # A fixed length keeps every row in the batch, so each recorded step is (B, 1, V) in the original row order.
    tokens = greedy_decode(model, src, **IDS, fixed_len=steps)
    cached_logits = torch.cat(recorded, dim=1)  # (B, steps, V)
    ref_tokens, ref_logits = _reference_greedy(model, src, steps, suppress_eos=True)

    assert tokens == ref_tokens.tolist()
    assert_close(cached_logits, ref_logits, atol=1e-5, rtol=0)


def test_greedy_stops_at_eos_like_the_uncached_reference():
    model = _model()
    src = _batch()
    max_extra = 10
    src_lengths = (src != PAD).sum(dim=1).tolist()
    ref_tokens, _ = _reference_greedy(model, src, max(src_lengths) + max_extra)
    expected, eos_steps = [], []
    for row, n in zip(ref_tokens.tolist(), src_lengths):
        row = row[: n + max_extra]
        if EOS in row:
            eos_steps.append(row.index(EOS))
            row = row[: row.index(EOS)]
        expected.append(row)
    # Not vacuous: sentences leave the working batch at varied steps, and some run to their limit.
    assert len(set(eos_steps)) > 3 and len(eos_steps) < len(expected)

    assert greedy_decode(model, src, **IDS, max_extra=max_extra) == expected


def test_beam_of_one_is_greedy():
    model = _model()
    src = _batch()
    # Without a length penalty a one-wide beam takes the argmax at every step and stops at the first EOS.
    beam = beam_search(model, src, **IDS, beam_size=1, length_penalty="none", max_extra=10)
    assert beam == greedy_decode(model, src, **IDS, max_extra=10)


@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_batch_invariance(search):
    model = _model()
    src = _batch()
    if search == "greedy":
        decode = lambda s: greedy_decode(model, s, **IDS, max_extra=10)  # noqa: E731
    else:
        decode = lambda s: beam_search(model, s, **IDS, beam_size=4, alpha=0.6, max_extra=10)  # noqa: E731
    batched = decode(src)
    assert len({len(out) for out in batched}) > 3  # varied output lengths: sentences leave the batch at varied steps
    for b in range(src.size(0)):
        assert decode(_unpadded(src, b)) == [batched[b]], f"sentence {b}"


def test_nbest_scores_are_the_model_scores():
    model = _model()
    src = _batch(8)
    alpha, max_extra = 0.6, 10
    nbest = beam_search_nbest(model, src, **IDS, beam_size=4, alpha=alpha, max_extra=max_extra)
    for b, hyps in enumerate(nbest):
        src_row = _unpadded(src, b)
        assert len(hyps) == 4
        assert [h.normalized for h in hyps] == sorted((h.normalized for h in hyps), reverse=True)
        for hyp in hyps:
            assert hyp.score == pytest.approx(_model_score(model, src_row, hyp), abs=1e-4)
            length = len(hyp.tokens) + hyp.eos  # |Y| counts EOS
            assert hyp.normalized == pytest.approx(hyp.score / length_penalty(length, kind="gnmt", alpha=alpha))
            # A hypothesis without EOS is one that reached the limit.
            assert hyp.eos == (len(hyp.tokens) < src_row.size(1) + max_extra)
    assert any(not h.eos for hyps in nbest for h in hyps) and any(h.eos for hyps in nbest for h in hyps)


def test_wide_beam_is_exact_search():
    """With a beam as wide as the vocabulary, two steps keep every one-token prefix: the n-best list is exact."""
    model = _model()
    src = _sources([7])
    allowed = [v for v in range(V) if v not in (PAD, BOS, EOS)]  # fixed_len bans EOS; PAD and BOS are never emitted
    K = len(allowed)
    nbest = beam_search_nbest(model, src, **IDS, beam_size=K, length_penalty="none", fixed_len=2)[0]

    pairs = torch.tensor([[a, b] for a in allowed for b in allowed])  # (K * K, 2), every two-token output
    with torch.no_grad():
        tgt_in = torch.cat([torch.full((len(pairs), 1), BOS), pairs[:, :1]], dim=1)  # (K * K, 2)
        log_probs = model(src.expand(len(pairs), -1), tgt_in).log_softmax(dim=-1)  # (K * K, 2, V)
    scores = log_probs.gather(2, pairs[:, :, None])[..., 0].sum(dim=1)  # (K * K,)
    best = scores.topk(K)

    assert [h.tokens for h in nbest] == pairs[best.indices].tolist()
    assert_close(torch.tensor([h.score for h in nbest]), best.values, atol=1e-5, rtol=0)


@torch.no_grad()
def _reference_beam_search(model, src_row, *, beam_size, kind, alpha, limit):
    """Beam search written plainly for one sentence (1, S): no cache, no batching, and no early stop: it runs to the
    length limit. Same rules: EOS among the K best candidates ends a hypothesis, the K best others live on."""
    memory, src_mask, _ = model.encode(src_row)
    live: list[tuple[list[int], float]] = [([], 0.0)]  # (tokens, summed log-probability)
    finished = []  # (normalised score, tokens)
    for t in range(limit):
        tgt_in = torch.tensor([[BOS] + tokens for tokens, _ in live])  # (n, t + 1), the whole prefix every step
        n = len(live)
        logits, _, _ = model.decode(tgt_in, memory.expand(n, -1, -1), src_mask.expand(n, -1, -1, -1))
        log_probs = logits[:, -1].log_softmax(dim=-1)  # (n, V)
        log_probs[:, [PAD, BOS]] = float("-inf")  # never emitted
        candidates = [
            (score + lp, tokens, v)
            for (tokens, score), row in zip(live, log_probs.tolist())
            for v, lp in enumerate(row)
        ]
        candidates = sorted(candidates, key=lambda c: c[0], reverse=True)[: 2 * beam_size]
        for score, tokens, v in candidates[:beam_size]:
            if v == EOS:
                finished.append((score / length_penalty(t + 1, kind=kind, alpha=alpha), tokens))
        live = [(tokens + [v], score) for score, tokens, v in candidates if v != EOS][:beam_size]
    finished += [(score / length_penalty(limit, kind=kind, alpha=alpha), tokens) for tokens, score in live]
    return max(finished, key=lambda f: f[0])[1]


@pytest.mark.parametrize(("kind", "alpha"), [("gnmt", 0.6), ("power", 1.0), ("none", 0.0)])
def test_beam_search_equals_a_plain_reference_run_to_the_limit(kind, alpha):
    """Same outputs as the reference, which never stops early: the early stop (nothing live can still beat the best
    finished hypothesis) is exact, and batching, the cache, its reordering and dropping sentences change nothing."""
    model = _model()
    src = _batch(12)
    max_extra = 10
    outputs = beam_search(model, src, **IDS, beam_size=4, alpha=alpha, length_penalty=kind, max_extra=max_extra)
    for b in range(src.size(0)):
        src_row = _unpadded(src, b)
        limit = src_row.size(1) + max_extra
        expected = _reference_beam_search(model, src_row, beam_size=4, kind=kind, alpha=alpha, limit=limit)
        assert outputs[b] == expected, f"sentence {b}"


def test_nbest_and_1best_agree_on_the_best():
    """The 1-best search stops sooner than the 4-best one (it waits for one unbeatable hypothesis, not four)."""
    model = _model()
    src = _batch()
    best = beam_search(model, src, **IDS, beam_size=4, max_extra=10)
    nbest = beam_search_nbest(model, src, **IDS, beam_size=4, n_best=4, max_extra=10)
    assert best == [hyps[0].tokens for hyps in nbest]


@pytest.mark.parametrize("search", [greedy_decode, beam_search])
def test_max_length_is_input_length_plus_max_extra(search, monkeypatch):
    model = _model()
    _never_eos(model, monkeypatch)
    src = _sources([1, 4, 9, 2])
    src_lengths = (src != PAD).sum(dim=1).tolist()

    assert [len(out) for out in search(model, src, **IDS)] == [n + 50 for n in src_lengths]  # §6.1: + 50
    assert [len(out) for out in search(model, src, **IDS, max_extra=3)] == [n + 3 for n in src_lengths]
    # The positional limit caps it: N output tokens are predicted from positions 0 .. N - 1.
    capped = search(model, src, **{**IDS, "max_positions": 8}, max_extra=3)
    assert [len(out) for out in capped] == [min(n + 3, 8) for n in src_lengths]


@pytest.mark.parametrize("search", [greedy_decode, beam_search])
def test_fixed_len_gives_exactly_that_many_tokens(search):
    model = _model()
    src = _batch(8)
    free = search(model, src, **IDS, max_extra=10)
    assert any(len(out) < 16 for out in free)  # EOS ends some of them sooner without it
    outputs = search(model, src, **IDS, fixed_len=16)
    assert [len(out) for out in outputs] == [16] * 8
    assert all(EOS not in out and PAD not in out and BOS not in out for out in outputs)


@pytest.mark.parametrize("search", [greedy_decode, beam_search])
def test_the_start_and_pad_tokens_are_never_emitted_even_when_the_model_ranks_them_first(search, monkeypatch):
    """An undertrained model may rank BOS or padding first; neither is a word of any output (fairseq bans padding
    alike), so the search takes the best other token."""
    model = _model()
    logits = model.logits
    monkeypatch.setattr(model, "logits", lambda x: logits(x).index_fill(-1, torch.tensor([PAD, BOS]), 1e4))
    outputs = search(model, _batch(8), **IDS, max_extra=6)
    assert all(out and PAD not in out and BOS not in out for out in outputs)


def test_model_mode_is_restored_and_dropout_is_off():
    model = _model()
    src = _batch(4)
    expected = greedy_decode(model, src, **IDS, max_extra=5), beam_search(model, src, **IDS, max_extra=5)
    model.train()
    assert (greedy_decode(model, src, **IDS, max_extra=5), beam_search(model, src, **IDS, max_extra=5)) == expected
    assert model.training
    model.eval()
    model.decoder.layers[0].train()  # in evaluation mode at the top only: still no dropout anywhere
    assert (greedy_decode(model, src, **IDS, max_extra=5), beam_search(model, src, **IDS, max_extra=5)) == expected


def test_length_penalties():
    assert length_penalty(1, kind="gnmt", alpha=0.6) == pytest.approx(1.0)  # ((5 + 1) / 6)^alpha
    assert length_penalty(10, kind="gnmt", alpha=0.6) == pytest.approx(math.exp(0.6 * math.log(15 / 6)))
    assert length_penalty(9, kind="power", alpha=0.5) == pytest.approx(3.0)
    assert length_penalty(9, kind="none", alpha=0.6) == 1.0
    lengths = torch.tensor([1.0, 10.0])
    assert_close(length_penalty(lengths, kind="gnmt", alpha=0.6), torch.tensor([1.0, (15 / 6) ** 0.6]))
    assert_close(length_penalty(lengths, kind="none", alpha=0.6), torch.ones(2))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(beam_size=0), "beam_size=0"),
        (dict(beam_size=2, n_best=3), "n_best=3"),
        (dict(alpha=-0.1), "alpha=-0.1"),
        (dict(alpha=1000.0), "alpha=1000.0 must be at most 10"),  # |Y|^1000 overflows a float
        (dict(alpha=float("nan")), "alpha=nan must be at most 10"),
        (dict(length_penalty="average"), "length_penalty='average'"),
        (dict(fixed_len=0), "fixed_len=0"),
        (dict(fixed_len=MAX_LEN + 1), f"fixed_len={MAX_LEN + 1}"),
        (dict(max_extra=-1), "max_extra=-1"),
    ],
)
def test_bad_arguments_name_the_value(kwargs, message):
    with pytest.raises(ValueError, match=message):
        beam_search_nbest(_model(), _batch(2), **IDS, **kwargs)


@pytest.mark.parametrize("search", [greedy_decode, beam_search])
def test_the_searches_refuse_bad_arguments_naming_them(search):
    """A float or list ``src`` was a RuntimeError or AttributeError from inside torch, an id outside the vocabulary
    (of ``src``, or ``bos_id``) an IndexError ("index out of range in self"), a classifier an AttributeError
    ('decoder'), and a source or ``max_positions`` past the positional table a ValueError about a position."""
    from attnkit.config import ClassifierConfig
    from attnkit.model.build import build_classifier

    model, src = _model(), _sources([3, 5])
    past_vocab, negative = src.clone(), src.clone()
    past_vocab[1, 2], negative[0, 0] = V, -1
    refused: list[tuple[type[Exception], str, Any, dict[str, Any]]] = [
        (TypeError, r"^src must hold token ids as torch.long \(or torch.int\), got torch.float32$", src.float(), {}),
        (TypeError, r"^src must be a \(B, S\) tensor of token ids, got list$", src.tolist(), {}),
        (ValueError, rf"^src holds token id {V}, outside the model's vocabulary \[0, {V}\)$", past_vocab, {}),
        (ValueError, r"^src holds token id -1, outside", negative, {}),
        (ValueError, rf"^bos_id={V} is not a token id of the model's vocabulary", src, {"bos_id": V}),
        (ValueError, r"^eos_id=-1 is not a token id", src, {"eos_id": -1}),
        (
            ValueError,
            rf"^max_positions={MAX_LEN + 1} is past the model's positional table",
            src,
            {"max_positions": MAX_LEN + 1},
        ),
        (
            ValueError,
            rf"^src has {MAX_LEN + 1} positions, past the model's positional table \(max_len={MAX_LEN}\)$",
            torch.full((1, MAX_LEN + 1), EOS + 1),
            {},
        ),
    ]
    for error, message, source, changed in refused:
        with pytest.raises(error, match=message):
            search(model, source, **{**IDS, **changed})
    classifier = build_classifier(ClassifierConfig(vocab_size=V, d_model=D, n_heads=H, d_ff=FF, n_layers=1))
    with pytest.raises(TypeError, match="^model is a TransformerClassifier, not an encoder-decoder"):
        search(classifier, src, **IDS)
    assert search(model, src.int(), **IDS) == search(model, src, **IDS)  # torch.int ids decode as torch.long
