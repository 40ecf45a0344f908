"""Decoding a corpus: encoded sources batched by length, each batch searched greedily or with beam search."""

from __future__ import annotations

from attnkit.data.batching import bucketed_batches, pad
from attnkit.decoding.beam import beam_search
from attnkit.decoding.greedy import greedy_decode
from attnkit.decoding.penalty import LENGTH_PENALTIES, MAX_ALPHA
from attnkit.devices import model_device
from attnkit.errors import InputError
from attnkit.model.transformer import Transformer
from attnkit.tokenization import Tokenizer


def check_decoding_options(*, beam: int, alpha: float, length_penalty: str, batch_size: int) -> None:
    """``InputError`` naming the first impossible decoding option (a search needs at least one hypothesis)."""
    if not isinstance(beam, int) or beam < 1:
        raise InputError(f"beam={beam!r}: the beam size must be an integer >= 1 (1 = greedy search)")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise InputError(f"batch_size={batch_size!r}: must be an integer >= 1")
    if not 0 <= alpha <= MAX_ALPHA:  # also refuses NaN
        raise InputError(f"alpha={alpha!r}: the length-penalty exponent must be in [0, {MAX_ALPHA:g}]")
    if length_penalty not in LENGTH_PENALTIES:
        raise InputError(f"length_penalty={length_penalty!r}; expected one of {', '.join(LENGTH_PENALTIES)}")


def translate_ids(
    model: Transformer,
    tokenizer: Tokenizer,
    sources: list[list[int]],
    *,
    beam: int = 4,
    alpha: float = 0.6,
    length_penalty: str = "gnmt",
    batch_size: int = 32,
) -> list[list[int]]:
    """Decode encoded sources (each ending with EOS) in input order; batches are length-sorted to save padding.

    beam 1 is greedy search; beam > 1 is beam search with the paper's length penalty (§6.1: beam 4, alpha 0.6).
    """
    check_decoding_options(beam=beam, alpha=alpha, length_penalty=length_penalty, batch_size=batch_size)
    max_positions = model.embeddings.position.max_len
    bos_id, eos_id = tokenizer.bos_id, tokenizer.eos_id
    if bos_id is None or eos_id is None:
        raise ValueError("decoding needs a tokenizer with BOS and EOS tokens (a translator's)")
    out: list[list[int]] = [[] for _ in sources]
    device = model_device(model)
    for batch in bucketed_batches([len(s) for s in sources], batch_size, generator=None, bucket_factor=10**9):
        src = pad([sources[i] for i in batch], tokenizer.pad_id).to(device)  # (B, S)
        if beam == 1:
            hyps = greedy_decode(model, src, bos_id=bos_id, eos_id=eos_id, max_positions=max_positions)
        else:
            hyps = beam_search(
                model,
                src,
                beam_size=beam,
                alpha=alpha,
                length_penalty=length_penalty,
                bos_id=bos_id,
                eos_id=eos_id,
                max_positions=max_positions,
            )
        for i, hyp in zip(batch, hyps):
            out[i] = hyp
    return out
