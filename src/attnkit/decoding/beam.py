"""Beam search, batched over sentences (§6.1: "beam search with a beam size of 4 and length penalty alpha = 0.6").

Each sentence keeps K live hypotheses ("beams"). At each step every beam is extended by every token, and the K best
of the K * V extensions by summed log-probability survive; a hypothesis that emits EOS leaves the beam and joins the
sentence's finished ones, which are ranked by score / lp(|Y|) (``length_penalty``).

The step (``beam_step``) has the same shapes at every position: a sentence that stopped stays in the batch, inactive,
and adds nothing to its finished hypotheses (``attnkit.decoding.static``). State, A sentences (B, then copies that
fill a bucket), K beams each, R = A * K rows (row a * K + k is beam k of sentence a), L steps at most, before step t:
    t           (1,)              the position being decoded, on the device
    active      (A,)              False once a sentence stopped; stop: no sentence is active (0-d)
    limit       (A,)              maximum number of output tokens of each (§6.1: input length + 50)
    max_lp      (A,)              lp(limit), the largest penalty any of its hypotheses can get
    lp          (L + 1,) float64  lp(n) for every length n, made on the host as the ranking has always used it
    scores      (A, K)            summed log-probabilities of the live hypotheses, best first
    history     (A, K, L)         their tokens so far (BOS not included) in columns 0 .. t - 1
    last        (R, 1)            token each row feeds at position t (BOS at t = 0)
    cache       n_layers x DecoderLayerCache with R rows: self-attention K/V of positions 0 .. t - 1, and the
                cross-attention K/V of the source (computed once, repeated per beam); src_mask (R, 1, 1, S)
    fin_*       (A, n, ...)       the n best finished hypotheses of each sentence, best first: tokens (A, n, L),
                length, score (float32, as summed), normalized (float64; -inf where fewer than n), eos

One step: log-probabilities (R, V) are added to ``scores`` and the 2K best of the (A, K * V) candidates are taken
with one ``topk``. EOS candidates among the best K end (fairseq and Hugging Face do the same; those ranked lower
would not have entered the beam anyway); the K best non-EOS candidates are the new beams. 2K candidates always hold
K non-EOS ones, since each beam contributes at most one EOS. The cache is then reordered by the new beams' parents.

Stopping rule. A sentence stops when no live hypothesis can still enter its n best finished ones (n = 1 for
``beam_search``), or at its length limit, where its live hypotheses are finished as they are, without EOS.
Log-probabilities are <= 0, so a live hypothesis's score can only fall as it grows, and lp grows with length
(alpha >= 0), so no continuation of any live hypothesis can reach a normalised score above
scores[a, 0] / lp(limit[a]). Once the n-th best finished normalised score is >= that bound, decoding on to the
limit would not change the result: stopping is exact, not a heuristic. This is tensor2tensor's bound
(``lower_bound_alive_scores`` in its ``beam_search.py``, the implementation the paper used). The bound is tested
on the device at every step; the host reads whether every sentence stopped once every ``check_every`` steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from attnkit.decoding.limits import output_limits

# Aliased: ``length_penalty`` is also the name of the public argument that chooses the kind.
from attnkit.decoding.penalty import check_length_penalty
from attnkit.decoding.penalty import length_penalty as penalty
from attnkit.decoding.static import (
    Plan,
    banned_tokens,
    check_call,
    empty_cache,
    encode,
    evaluating,
    fill_cross,
    fill_source_mask,
    pad_sources,
    plan,
    run_steps,
    written,
    zeros,
)
from attnkit.inference.programs import Engine, running
from attnkit.model.layers import DecoderLayerCache
from attnkit.model.transformer import Transformer


@dataclass(frozen=True)
class Hypothesis:
    """One finished beam-search output."""

    tokens: list[int]  # output ids, without BOS and EOS
    score: float  # log P(tokens, then EOS if emitted | source): the summed log-probabilities
    normalized: float  # score / lp(|Y|), |Y| counting EOS if emitted; hypotheses are ranked by it
    eos: bool  # False if it stopped at the length limit without emitting EOS


@dataclass
class BeamState:
    """The tensors a beam step reads and writes (shapes in the module docstring)."""

    t: Tensor
    active: Tensor
    stop: Tensor
    limit: Tensor
    max_lp: Tensor
    lp: Tensor
    scores: Tensor
    history: Tensor
    last: Tensor
    cache: list[DecoderLayerCache]
    src_mask: Tensor | None  # None: no padding (``static.fill_source_mask``)
    banned: Tensor
    fin_tokens: Tensor
    fin_length: Tensor
    fin_score: Tensor
    fin_normalized: Tensor
    fin_eos: Tensor


@dataclass(frozen=True)
class BeamOptions:
    beam_size: int
    n_best: int
    eos_id: int
    prefix: bool  # attend over and reorder the written positions only (``Engine.prefix``)


def beam_step(model: Transformer, s: BeamState, o: BeamOptions) -> None:
    """One position for every beam of every sentence, in place (the step and the stopping rule of the module
    docstring)."""
    A, K, n, L = s.scores.size(0), o.beam_size, o.n_best, s.history.size(2)
    cache, offset = written(s.cache, s.t, o.prefix)  # (R, H, t + 1 or L, Dh) self-attention keys and values
    logits, _, _ = model.decode(s.last, None, s.src_mask, cache=cache, offset=offset)  # (R, 1, V)
    log_probs = logits[:, -1].float().log_softmax(dim=-1).masked_fill_(s.banned, float("-inf"))  # (R, V)
    V = log_probs.size(-1)
    candidates = (log_probs.view(A, K, V) + s.scores[:, :, None]).view(A, K * V)  # (A, K * V)
    top_scores, top_index = candidates.topk(2 * K, dim=1)  # (A, 2K), best first
    top_beam, top_token = top_index // V, top_index % V  # (A, 2K) parent beam and token
    is_eos = top_token == o.eos_id  # (A, 2K)
    lp = s.lp[s.t + 1]  # (1,): |Y| = t tokens + EOS, or t + 1 tokens without EOS

    # EOS candidates among the best K end: their tokens are their parent's, t of them.
    ends = is_eos[:, :K] & top_scores[:, :K].isfinite() & s.active[:, None]  # (A, K)
    end_normalized = torch.where(ends, top_scores[:, :K].double() / lp, float("-inf"))  # (A, K)
    end_tokens = s.history.gather(1, top_beam[:, :K, None].expand(-1, -1, L))  # (A, K, L)

    # The K best non-EOS candidates, in rank order (a stable sort moves the EOS ones to the back).
    live = is_eos.to(torch.uint8).argsort(dim=1, stable=True)[:, :K]  # (A, K) ranks among the 2K
    scores = top_scores.gather(1, live)  # (A, K)
    parent = top_beam.gather(1, live)  # (A, K)
    token = top_token.gather(1, live)  # (A, K)
    history = s.history.gather(1, parent[:, :, None].expand(-1, -1, L))  # (A, K, L), the parents' tokens
    history.index_copy_(2, s.t, token[:, :, None])  # column t

    # The stopping rule, with this step's EOS hypotheses counted; at the limit, the live ones finish as they are.
    nth_best = torch.cat([s.fin_normalized, end_normalized], dim=1).topk(n, dim=1).values[:, -1]  # (A,)
    at_limit = s.limit <= s.t + 1  # (A,)
    done = at_limit | (nth_best.float() >= scores[:, 0] / s.max_lp)  # (A,)
    last_ones = (s.active & at_limit)[:, None] & scores.isfinite()  # (A, K)
    live_normalized = torch.where(last_ones, scores.double() / lp, float("-inf"))  # (A, K)

    # Merge: the n best of (finished so far, then this step's EOS ones, then the last live ones), a stable sort,
    # so that among equal normalized scores the hypothesis that finished first stays first.
    normalized = torch.cat([s.fin_normalized, end_normalized, live_normalized], dim=1)  # (A, n + 2K)
    best = normalized.sort(dim=1, descending=True, stable=True).indices[:, :n]  # (A, n)
    t = s.t.expand(A, K)  # (A, K)
    merged = (
        (s.fin_normalized, normalized),
        (s.fin_score, torch.cat([s.fin_score, top_scores[:, :K], scores], dim=1)),
        (s.fin_length, torch.cat([s.fin_length, t, t + 1], dim=1)),
        (s.fin_eos, torch.cat([s.fin_eos, torch.ones_like(ends), torch.zeros_like(ends)], dim=1)),
    )
    for into, values in merged:
        into.copy_(values.gather(1, best))  # (A, n)
    tokens = torch.cat([s.fin_tokens, end_tokens, history], dim=1)  # (A, n + 2K, L)
    s.fin_tokens.copy_(tokens.gather(1, best[:, :, None].expand(-1, -1, L)))  # (A, n, L)
    s.active.logical_and_(~done)
    s.stop.copy_(~s.active.any())

    # The new beams: scores, tokens, and the self-attention keys and values of the beam each one extends.
    s.scores.copy_(scores)
    s.history.copy_(history)
    s.last.copy_(token.view(A * K, 1))
    reorder = (parent + torch.arange(A, device=parent.device)[:, None] * K).view(A * K)  # (R,)
    for layer in cache:
        for buf in (layer.self_kv.k, layer.self_kv.v):
            buf.copy_(buf.index_select(0, reorder))  # (R, H, t + 1 or L, Dh)
    s.t.add_(1)


@torch.inference_mode()
def beam_search(
    model: Transformer,
    src: Tensor,
    *,
    bos_id: int,
    eos_id: int,
    max_positions: int,
    beam_size: int = 4,
    alpha: float = 0.6,
    length_penalty: str = "gnmt",
    max_extra: int = 50,
    fixed_len: int | None = None,
    engine: Engine | None = None,
) -> list[list[int]]:
    """The best hypothesis of each source, as token ids without BOS and EOS.

    Args:
        src: (B, S) source ids, each ending with EOS as the model was trained (``TranslatorRun.encode_sources``
            appends it), padded with ``model.pad_id``.
        bos_id, eos_id: the target start and end tokens (from the tokenizer).
        max_positions: the decoder's positional limit (the model's ``max_len``); no output is longer.
        beam_size, alpha: K and the length-penalty exponent; the paper's are 4 and 0.6 (§6.1).
        length_penalty: "gnmt" ((5 + |Y|) / 6)^alpha, "power" |Y|^alpha, or "none".
        max_extra: maximum output length = input length + ``max_extra`` (§6.1: + 50).
        fixed_len: if given, decode exactly this many tokens per sentence, with EOS masked out (benchmarks).
        engine: how the steps run (``attnkit.inference.programs``); default: the device's.
    """
    nbest = beam_search_nbest(
        model,
        src,
        bos_id=bos_id,
        eos_id=eos_id,
        max_positions=max_positions,
        n_best=1,
        beam_size=beam_size,
        alpha=alpha,
        length_penalty=length_penalty,
        max_extra=max_extra,
        fixed_len=fixed_len,
        engine=engine,
    )
    return [hyps[0].tokens if hyps else [] for hyps in nbest]


@torch.inference_mode()
def beam_search_nbest(
    model: Transformer,
    src: Tensor,
    *,
    bos_id: int,
    eos_id: int,
    max_positions: int,
    n_best: int | None = None,
    beam_size: int = 4,
    alpha: float = 0.6,
    length_penalty: str = "gnmt",
    max_extra: int = 50,
    fixed_len: int | None = None,
    engine: Engine | None = None,
) -> list[list[Hypothesis]]:
    """The ``n_best`` (default: ``beam_size``) best finished hypotheses of each source, best first, with scores.

    Arguments as for ``beam_search``. The search stops for a sentence once its n-th best finished hypothesis can no
    longer be overtaken, so a larger ``n_best`` may search longer.
    """
    n_best = beam_size if n_best is None else n_best
    if beam_size < 1:
        raise ValueError(f"beam_size={beam_size} must be >= 1")
    if not 1 <= n_best <= beam_size:
        raise ValueError(f"n_best={n_best} must be between 1 and beam_size={beam_size}")
    check_length_penalty(length_penalty, alpha)
    check_call(model, src, bos_id=bos_id, eos_id=eos_id, max_positions=max_positions)
    limits = output_limits(
        src, pad_id=model.pad_id, max_extra=max_extra, max_positions=max_positions, fixed_len=fixed_len
    )
    if src.size(0) == 0:
        return []
    call = plan(model, src, engine, max_positions=max_positions, max_extra=max_extra, fixed_len=fixed_len)
    with evaluating(model):
        return _beam_search(
            model,
            src,
            limits,
            call,
            beam_size=beam_size,
            n_best=n_best,
            kind=length_penalty,
            alpha=alpha,
            bos_id=bos_id,
            eos_id=eos_id,
            suppress_eos=fixed_len is not None,
        )


def _beam_search(
    model: Transformer,
    src: Tensor,
    limits: Tensor,
    call: Plan,
    *,
    beam_size: int,
    n_best: int,
    kind: str,
    alpha: float,
    bos_id: int,
    eos_id: int,
    suppress_eos: bool,
) -> list[list[Hypothesis]]:
    """The decoding loop of ``call`` (state and stopping rule in the module docstring)."""
    K, B, device = beam_size, call.sentences, src.device
    A, S, L = call.rows, call.source, call.cache
    R, vocab = A * K, model.embeddings.token.num_embeddings
    memory, src_mask = encode(model, pad_sources(src, A, S, model.pad_id), call.engine)  # (A, S, D), (A, 1, 1, S)
    # Never emit padding (as fairseq): a pad token in the prefix would be masked out by a full decoder pass
    # (``decoder_self_mask``) but not by the cached one. Never emit the start token, which opens every target and
    # is never one of its words (an undertrained model may rank it first). Never emit EOS when the length is fixed.
    # Banned after the softmax, so that scores stay the model's log-probabilities.
    banned = [model.pad_id, bos_id] + ([eos_id] if suppress_eos else [])

    def allocate() -> BeamState:
        return BeamState(
            t=zeros(device, 1),
            active=zeros(device, A, dtype=torch.bool),
            stop=zeros(device, dtype=torch.bool),
            limit=zeros(device, A),
            max_lp=zeros(device, A, dtype=torch.float32),
            lp=zeros(device, L + 1, dtype=torch.float64),
            scores=zeros(device, A, K, dtype=torch.float32),
            history=zeros(device, A, K, L),
            last=zeros(device, R, 1),
            cache=empty_cache(model, R, S, L, like=memory),
            src_mask=zeros(device, R, 1, 1, S, dtype=torch.bool),
            banned=zeros(device, vocab, dtype=torch.bool),
            fin_tokens=zeros(device, A, n_best, L),
            fin_length=zeros(device, A, n_best),
            fin_score=zeros(device, A, n_best, dtype=torch.float32),
            fin_normalized=zeros(device, A, n_best, dtype=torch.float64),
            fin_eos=zeros(device, A, n_best, dtype=torch.bool),
        )

    options = BeamOptions(K, n_best, eos_id, prefix=call.engine.prefix(device))
    with running(call.engine, beam_step, model, options, (A, S, L, memory.dtype), allocate, call.per_call) as runner:
        s: BeamState = runner.state
        s.t.zero_()
        s.limit.zero_()
        s.limit[:B] = limits
        s.active.copy_(s.limit > 0)  # the sentences that fill the bucket never start
        s.stop.zero_()
        s.max_lp.copy_(torch.as_tensor(penalty(s.limit.float(), kind=kind, alpha=alpha)))  # (A,) float32
        # lp(n) as Python floats, the values the ranking has always divided by (a tensor power may differ by an ulp).
        s.lp.copy_(torch.tensor([float(penalty(n, kind=kind, alpha=alpha)) for n in range(L + 1)]))
        # Only beam 0 is live at first: K copies of BOS would fill the beam with K copies of each extension.
        s.scores.fill_(float("-inf"))
        s.scores[:, 0] = 0.0
        s.last.fill_(bos_id)
        s.src_mask = fill_source_mask(s.src_mask, src_mask.repeat_interleave(K, dim=0), options.prefix)  # (R, 1, 1, S)
        s.banned.copy_(banned_tokens(vocab, banned, device))
        s.fin_normalized.fill_(float("-inf"))
        fill_cross(model, memory, s.cache, repeat=K)
        run_steps(runner, call.steps, lambda: s.stop, call.engine.every(device))
        # The call's one read of its result.
        tokens, length = s.fin_tokens[:B].tolist(), s.fin_length[:B].tolist()
        score, normalized, eos = s.fin_score[:B].tolist(), s.fin_normalized[:B].tolist(), s.fin_eos[:B].tolist()
    return [
        [
            Hypothesis(tokens[a][i][: length[a][i]], score[a][i], normalized[a][i], eos[a][i])
            for i in range(n_best)
            if normalized[a][i] > float("-inf")
        ]
        for a in range(B)
    ]
