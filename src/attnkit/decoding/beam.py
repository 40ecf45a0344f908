"""Beam search, batched over sentences (§6.1: "beam search with a beam size of 4 and length penalty alpha = 0.6").

Each sentence keeps K live hypotheses ("beams"). At each step every beam is extended by every token, and the K best
of the K * V extensions by summed log-probability survive; a hypothesis that emits EOS leaves the beam and joins the
sentence's finished ones, which are ranked by score / lp(|Y|) (``length_penalty``).

Decoding state, for A sentences still being decoded, K beams each, R = A * K rows (row a * K + k is beam k of
sentence a), before step t:
    sentence   list of A ints    original batch index of each working sentence
    limit      (A,)              maximum number of output tokens of each (§6.1: input length + 50)
    max_lp     (A,)              lp(limit), the largest penalty any of its hypotheses can get
    scores     (A, K)            summed log-probabilities of the live hypotheses, best first
    history    (A, K, t)         their tokens so far (BOS not included)
    last       (R, 1)            token each row feeds at position t (BOS at t = 0)
    memory     (R, S, D)         encoder output, repeated per beam; src_mask (R, 1, 1, S), True = real token
    cache      n_layers x DecoderLayerCache with R rows: self-attention K/V of positions 0 .. t - 1, and the
               cross-attention K/V of the source (computed once, repeated per beam)
    finished   per original sentence, up to n finished Hypothesis, best first
    nth_best   list of A floats  normalised score of the n-th best finished hypothesis (-inf while fewer)

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
(``lower_bound_alive_scores`` in its ``beam_search.py``, the implementation the paper used). Stopped sentences are
dropped from the working batch (their rows leave the cache, memory and masks).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from attnkit.decoding.greedy import select_rows
from attnkit.decoding.limits import output_limits

# Aliased: ``length_penalty`` is also the name of the public argument that chooses the kind.
from attnkit.decoding.penalty import check_length_penalty
from attnkit.decoding.penalty import length_penalty as penalty
from attnkit.model.layers import DecoderLayerCache
from attnkit.model.transformer import Transformer


@dataclass(frozen=True)
class Hypothesis:
    """One finished beam-search output."""

    tokens: list[int]  # output ids, without BOS and EOS
    score: float  # log P(tokens, then EOS if emitted | source): the summed log-probabilities
    normalized: float  # score / lp(|Y|), |Y| counting EOS if emitted; hypotheses are ranked by it
    eos: bool  # False if it stopped at the length limit without emitting EOS


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
) -> list[list[int]]:
    """The best hypothesis of each source, as token ids without BOS and EOS.

    Args:
        src: (B, S) source ids, padded with ``model.pad_id``.
        bos_id, eos_id: the target start and end tokens (from the tokenizer).
        max_positions: the decoder's positional limit (the model's ``max_len``); no output is longer.
        beam_size, alpha: K and the length-penalty exponent; the paper's are 4 and 0.6 (§6.1).
        length_penalty: "gnmt" ((5 + |Y|) / 6)^alpha, "power" |Y|^alpha, or "none".
        max_extra: maximum output length = input length + ``max_extra`` (§6.1: + 50).
        fixed_len: if given, decode exactly this many tokens per sentence, with EOS masked out (benchmarks).
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
    limits = output_limits(
        src, pad_id=model.pad_id, max_extra=max_extra, max_positions=max_positions, fixed_len=fixed_len
    )
    if src.size(0) == 0:
        return []
    was_training = model.training
    model.eval()  # no dropout (§5.4 applies it in training only)
    try:
        return _beam_search(
            model,
            src,
            limits,
            beam_size=beam_size,
            n_best=n_best,
            kind=length_penalty,
            alpha=alpha,
            bos_id=bos_id,
            eos_id=eos_id,
            suppress_eos=fixed_len is not None,
        )
    finally:
        model.train(was_training)


def _beam_search(
    model: Transformer,
    src: Tensor,
    limits: Tensor,
    *,
    beam_size: int,
    n_best: int,
    kind: str,
    alpha: float,
    bos_id: int,
    eos_id: int,
    suppress_eos: bool,
) -> list[list[Hypothesis]]:
    """The decoding loop (state and stopping rule in the module docstring)."""
    K, B, device = beam_size, src.size(0), src.device
    memory, src_mask, _ = model.encode(src)  # (B, S, D), (B, 1, 1, S)
    # Cross-attention K/V once per sentence, then repeated per beam; self-attention buffers for the longest output.
    cache = model.start_cache(memory, int(limits.max()))
    per_beam = torch.arange(B, device=device).repeat_interleave(K)  # (R,)
    cache = [select_rows(layer, per_beam) for layer in cache]
    src_mask = src_mask[per_beam]  # (R, 1, 1, S)

    sentence = list(range(B))
    limit = limits  # (A,)
    max_lp = torch.as_tensor(penalty(limit.float(), kind=kind, alpha=alpha))  # (A,)
    # Only beam 0 is live at first: K copies of BOS would fill the beam with K copies of each extension.
    scores = torch.full((B, K), float("-inf"), device=device)  # (A, K)
    scores[:, 0] = 0.0
    history = src.new_empty((B, K, 0))  # (A, K, 0)
    last = src.new_full((B * K, 1), bos_id)  # (R, 1)
    finished: list[list[Hypothesis]] = [[] for _ in range(B)]
    nth_best = [float("-inf")] * B
    beam_index = torch.arange(K, device=device)  # (K,)
    # Never emit padding (as fairseq): a pad token in the prefix would be masked out by a full decoder pass
    # (``decoder_self_mask``) but not by the cached one. Never emit EOS when the length is fixed. Banned after the
    # softmax, so that scores stay the model's log-probabilities.
    banned = torch.tensor([model.pad_id] + ([eos_id] if suppress_eos else []), device=device)

    for t in range(int(limits.max())):
        A = scores.size(0)
        logits, _, _ = model.decode(last, None, src_mask, cache=cache, offset=t)  # (R, 1, V)
        log_probs = logits[:, -1].float().log_softmax(dim=-1)  # (R, V)
        # Banning and adding the beams' scores in place: each out-of-place pass wrote another R x V tensor (4 MiB
        # at R = 128, V = 8,000) at every step; the sums are the same floats.
        log_probs[:, banned] = float("-inf")
        V = log_probs.size(-1)
        candidates = log_probs.view(A, K, V).add_(scores[:, :, None]).view(A, K * V)  # (A, K * V)
        top_scores, top_index = candidates.topk(2 * K, dim=1)  # (A, 2K), best first
        top_beam, top_token = top_index // V, top_index % V  # (A, 2K) parent beam and token
        is_eos = top_token == eos_id  # (A, 2K)

        ended = (is_eos[:, :K] & top_scores[:, :K].isfinite()).nonzero()  # (n, 2): (sentence, rank)
        if ended.numel():
            a_idx, rank = ended.unbind(1)  # (n,), (n,)
            tokens = history[a_idx, top_beam[a_idx, rank]].tolist()  # n lists of t tokens, EOS not included
            lp = penalty(t + 1, kind=kind, alpha=alpha)  # |Y| = t tokens + EOS
            for a, toks, score in zip(a_idx.tolist(), tokens, top_scores[a_idx, rank].tolist()):
                nth_best[a] = _add(finished[sentence[a]], Hypothesis(toks, score, score / lp, True), n_best)

        # The K best non-EOS candidates, in rank order (a stable sort moves the EOS ones to the back).
        live = is_eos.to(torch.uint8).argsort(dim=1, stable=True)[:, :K]  # (A, K) ranks among the 2K
        scores = top_scores.gather(1, live)  # (A, K)
        parent = top_beam.gather(1, live)  # (A, K)
        token = top_token.gather(1, live)  # (A, K)
        history = history.gather(1, parent[:, :, None].expand(-1, -1, t))  # (A, K, t), the parents' tokens
        history = torch.cat([history, token[:, :, None]], dim=2)  # (A, K, t + 1)
        reorder = (parent + torch.arange(A, device=device)[:, None] * K).view(A * K)  # (R,) row each new beam extends
        last = token.view(A * K, 1)  # (R, 1)

        at_limit = limit <= t + 1  # (A,)
        done = at_limit | (torch.tensor(nth_best, device=device) >= scores[:, 0] / max_lp)  # (A,)
        if not done.any():
            _reorder_beams(cache, reorder)
            continue
        lp = penalty(t + 1, kind=kind, alpha=alpha)  # |Y| = t + 1 tokens, no EOS
        for a in at_limit.nonzero().view(-1).tolist():
            for toks, score in zip(history[a].tolist(), scores[a].tolist()):
                if score > float("-inf"):
                    _add(finished[sentence[a]], Hypothesis(toks, score, score / lp, False), n_best)
        keep = (~done).nonzero().view(-1)  # (A',)
        if keep.numel() == 0:
            break
        keep_rows = (keep[:, None] * K + beam_index).view(-1)  # (R',)
        cache = [select_rows(layer, reorder.view(A, K)[keep].view(-1)) for layer in cache]
        src_mask, last = src_mask[keep_rows], last[keep_rows]  # (R', 1, 1, S), (R', 1)
        scores, history, limit, max_lp = scores[keep], history[keep], limit[keep], max_lp[keep]  # (A', ..)
        kept = keep.tolist()
        sentence, nth_best = [sentence[a] for a in kept], [nth_best[a] for a in kept]
    return finished


def _add(hyps: list[Hypothesis], hyp: Hypothesis, n_best: int) -> float:
    """Insert ``hyp`` into ``hyps`` (best first, at most ``n_best``); return the n-th best normalised score."""
    hyps.append(hyp)
    hyps.sort(key=lambda h: h.normalized, reverse=True)
    del hyps[n_best:]
    return hyps[-1].normalized if len(hyps) == n_best else float("-inf")


def _reorder_beams(cache: list[DecoderLayerCache], index: Tensor) -> None:
    """Move the self-attention K/V of each row to the beam that extends it, in place; ``index`` (R,) stays within
    sentences. Only rows whose parent is another row are copied.

    The beams of one sentence share its cross-attention K/V, so a reorder within sentences leaves them as they are;
    ``DecoderLayerCache.select`` would copy the (R, H, S, Dh) cross-attention tensors of every layer at every step.
    """
    rows = (index != torch.arange(index.numel(), device=index.device)).nonzero().view(-1)  # (n,) rows that move
    if rows.numel() == 0:
        return
    sources = index[rows]  # (n,)
    for layer in cache:
        for buf in (layer.self_kv.k, layer.self_kv.v):
            buf.index_copy_(0, rows, buf.index_select(0, sources))  # (n, H, L, Dh) moved
