"""Greedy decoding: feed the previous token, take the most probable next one, until EOS or the length limit.

The decoder is auto-regressive (§3: "consuming the previously generated symbols as additional input when generating
the next"), so each step needs only the newest position: the key/value cache holds the self-attention keys and
values of the positions before it, and the cross-attention keys and values of the source, computed once.

The step (``greedy_step``) has the same shapes at every position: a sentence that emitted EOS or reached its limit
stays in the batch, finished, and its later tokens are not read (``attnkit.decoding.static``). State, R rows
(B sentences, then copies that fill a bucket), L steps at most, before step t:
    t          (1,)        the position being decoded, on the device
    last       (R, 1)      token fed at position t (BOS at t = 0)
    limit      (R,)        maximum number of output tokens of each (§6.1: input length + 50)
    out        (R, L)      tokens emitted; column t is written at step t
    lengths    (R,)        output length of each (its limit until it emits EOS)
    finished   (R,)        True once a row emitted EOS or reached its limit; stop: all of them (0-d)
    score      (R,)        float32: summed log-probabilities of each row's tokens so far, EOS included (only where
                           asked for: ``greedy_decode_scored``)
    cache      n_layers x DecoderLayerCache: self-attention K/V of positions 0 .. t - 1, cross-attention K/V
    src_mask   (R, 1, 1, S) True = real source token;  banned (V,) tokens never emitted
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from attnkit.decoding.beam import Hypothesis
from attnkit.decoding.limits import output_limits
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


@dataclass
class GreedyState:
    """The tensors a greedy step reads and writes (shapes in the module docstring)."""

    t: Tensor
    last: Tensor
    limit: Tensor
    out: Tensor
    lengths: Tensor
    finished: Tensor
    stop: Tensor
    score: Tensor
    cache: list[DecoderLayerCache]
    src_mask: Tensor | None  # None: no padding (``static.fill_source_mask``)
    banned: Tensor


@dataclass(frozen=True)
class GreedyOptions:
    eos_id: int
    prefix: bool  # attend over the written positions only (``Engine.prefix``)
    score: bool = False  # sum the log-probabilities of the emitted tokens into ``GreedyState.score``


def greedy_step(model: Transformer, s: GreedyState, o: GreedyOptions) -> None:
    """One position for every row, in place: the most probable token that is not banned."""
    cache, offset = written(s.cache, s.t, o.prefix)
    logits, _, _ = model.decode(s.last, None, s.src_mask, cache=cache, offset=offset)  # (R, 1, V)
    # In float32, also from a bfloat16 model: ties in argmax stay rare.
    logits = logits[:, -1].float()  # (R, V)
    token = logits.masked_fill(s.banned, float("-inf")).argmax(dim=-1)  # (R,)
    if o.score:  # log P(token) under the whole distribution (as a teacher-forced pass); finished rows add 0
        logp = logits.log_softmax(dim=-1).gather(1, token[:, None])[:, 0]  # (R,)
        s.score.add_(logp.masked_fill(s.finished, 0.0))
    s.out.index_copy_(1, s.t, token[:, None])  # (R, L), column t
    ended = (token == o.eos_id) & ~s.finished  # (R,)
    s.lengths.copy_(torch.where(ended, s.t, s.lengths))  # EOS was output token t: t tokens before it
    s.finished.logical_or_(ended | (s.limit <= s.t + 1))
    s.stop.copy_(s.finished.all())
    s.last.copy_(token[:, None])
    s.t.add_(1)


@torch.inference_mode()
def greedy_decode(
    model: Transformer,
    src: Tensor,
    *,
    bos_id: int,
    eos_id: int,
    max_positions: int,
    max_extra: int = 50,
    fixed_len: int | None = None,
    engine: Engine | None = None,
) -> list[list[int]]:
    """Greedy decoding of a batch of sources with an encoder-decoder ``attnkit.model.transformer.Transformer``.

    Args:
        src: (B, S) source ids, each ending with EOS as the model was trained (``TranslatorRun.encode_sources``
            appends it), padded with ``model.pad_id``.
        bos_id, eos_id: the target start and end tokens (from the tokenizer).
        max_positions: the decoder's positional limit (the model's ``max_len``); no output is longer.
        max_extra: maximum output length = input length + ``max_extra`` (§6.1: + 50).
        fixed_len: if given, decode exactly this many tokens per sentence, with EOS masked out (benchmarks).
        engine: how the steps run (``attnkit.inference.programs``); default: the device's.
    Returns:
        For each source, its output token ids without BOS and EOS (never ``model.pad_id``).
    """
    found = _decode(model, src, bos_id, eos_id, max_positions, max_extra, fixed_len, engine, score=False)
    return [tokens for tokens, _, _ in found]


@torch.inference_mode()
def greedy_decode_scored(
    model: Transformer,
    src: Tensor,
    *,
    bos_id: int,
    eos_id: int,
    max_positions: int,
    max_extra: int = 50,
    engine: Engine | None = None,
) -> list[Hypothesis]:
    """``greedy_decode``'s outputs with their scores, summed during the search: for each source, its tokens, the
    log-probabilities of them and of EOS where it was emitted (each under the step's whole distribution, as a
    teacher-forced pass of the output scores it; ``normalized`` is the same sum: greedy search does not rank by
    length), and whether EOS ended it (else the length limit)."""
    found = _decode(model, src, bos_id, eos_id, max_positions, max_extra, None, engine, score=True)
    return [Hypothesis(tokens, score, score, eos) for tokens, score, eos in found]


def _decode(
    model: Transformer,
    src: Tensor,
    bos_id: int,
    eos_id: int,
    max_positions: int,
    max_extra: int,
    fixed_len: int | None,
    engine: Engine | None,
    *,
    score: bool,
) -> list[tuple[list[int], float, bool]]:
    """Each source's (tokens, score, ended by EOS); unless ``score``, 0.0 and False (not read)."""
    check_call(model, src, bos_id=bos_id, eos_id=eos_id, max_positions=max_positions)
    limits = output_limits(
        src, pad_id=model.pad_id, max_extra=max_extra, max_positions=max_positions, fixed_len=fixed_len
    )
    if src.size(0) == 0:
        return []
    call = plan(model, src, engine, max_positions=max_positions, max_extra=max_extra, fixed_len=fixed_len)
    with evaluating(model):
        found = _greedy(model, src, limits, call, bos_id, eos_id, suppress_eos=fixed_len is not None, score=score)
    out, lengths, scores, eos = found
    return [(row[:n], total, ended) for row, n, total, ended in zip(out, lengths, scores, eos)]


def _greedy(
    model: Transformer,
    src: Tensor,
    limits: Tensor,
    call: Plan,
    bos_id: int,
    eos_id: int,
    *,
    suppress_eos: bool,
    score: bool,
) -> tuple[list[list[int]], list[int], list[float], list[bool]]:
    """The decoding loop of ``call``; returns the emitted tokens and the output lengths of the B real rows, and with
    ``score`` their scores and whether each ended with EOS (else zeros and False, not read)."""
    B, R, S, L = call.sentences, call.rows, call.source, call.cache
    vocab, device = model.embeddings.token.num_embeddings, src.device
    padded = pad_sources(src, R, S, model.pad_id)  # (R, S)
    memory, src_mask = encode(model, padded, call.engine)  # (R, S, D), (R, 1, 1, S)
    # Never emit padding (as fairseq): a pad token in the prefix would be masked out by a full decoder pass
    # (``decoder_self_mask``) but not by the cached one. Never emit the start token, which opens every target and
    # is never one of its words (an undertrained model may rank it first). Never emit EOS when the length is fixed.
    banned = [model.pad_id, bos_id] + ([eos_id] if suppress_eos else [])

    def allocate() -> GreedyState:
        return GreedyState(
            t=zeros(device, 1),
            last=zeros(device, R, 1),
            limit=zeros(device, R),
            out=zeros(device, R, L),
            lengths=zeros(device, R),
            finished=zeros(device, R, dtype=torch.bool),
            stop=zeros(device, dtype=torch.bool),
            score=zeros(device, R, dtype=torch.float32),
            cache=empty_cache(model, R, S, L, like=memory),
            src_mask=zeros(device, R, 1, 1, S, dtype=torch.bool),
            banned=zeros(device, vocab, dtype=torch.bool),
        )

    options = GreedyOptions(eos_id, prefix=call.engine.prefix(device), score=score)
    with running(call.engine, greedy_step, model, options, (R, S, L, memory.dtype), allocate, call.per_call) as runner:
        s: GreedyState = runner.state
        s.t.zero_()
        s.last.fill_(bos_id)
        s.limit.zero_()
        s.limit[:B] = limits
        s.lengths.copy_(s.limit)
        s.finished.copy_(s.limit == 0)  # the rows that fill the bucket are finished before they start
        s.stop.zero_()
        s.score.zero_()
        s.src_mask = fill_source_mask(s.src_mask, src_mask, options.prefix)
        s.banned.copy_(banned_tokens(vocab, banned, device))
        fill_cross(model, memory, s.cache)
        run_steps(runner, call.steps, lambda: s.stop, call.engine.every(device))
        out, lengths = s.out[:B].tolist(), s.lengths[:B].tolist()  # the call's one read of its result
        if not score:
            return out, lengths, [0.0] * B, [False] * B
        return out, lengths, s.score[:B].tolist(), (s.lengths[:B] < s.limit[:B]).tolist()
