"""The length policy: sequences longer than the model's ``max_len`` are cut (and counted) or refused.

Kept free of torch so that ``attnkit data prepare`` applies exactly the policy training applies without loading
torch (its peak memory is the tokenizer's, not PyTorch's). ``batching`` re-exports both names.
"""

from __future__ import annotations

from dataclasses import dataclass

from attnkit.errors import InputError


@dataclass(frozen=True)
class Truncation:
    """How many inputs were cut to the length limit, of how many, and the longest seen (for the user's report). A
    translator's inputs are its sentences: a pair's source and target are two."""

    n_truncated: int
    n_total: int
    longest: int
    limit: int


def too_long_error(n_over: int, what: str, limit: int, first: str, first_len: int) -> InputError:
    """The one message for policy "error": how many are too long and where the first one is."""
    plural = "s are" if n_over > 1 else " is"
    return InputError(
        f"{n_over} {what}{plural} longer than max_len={limit} tokens (first: {first}, {first_len} "
        f"tokens); raise max_len or use max_len_policy=truncate"
    )


def apply_length_policy(
    seqs: list[list[int]],
    limit: int,
    policy: str,
    *,
    what: str = "input",
    keep_last: int | None = None,
    lines: list[int] | None = None,
    where: str | None = None,
) -> tuple[list[list[int]], Truncation]:
    """Cut sequences longer than ``limit`` tokens (policy "truncate") or refuse them (policy "error").

    ``keep_last`` keeps that many final tokens (an EOS, a [SEP]) when cutting; ``lines`` are the sequences' line
    numbers in their file and ``where`` that file, for the error. Truncation is returned, never silent.
    """
    longest = max((len(s) for s in seqs), default=0)
    over = [i for i, s in enumerate(seqs) if len(s) > limit]
    if over and policy == "error":
        first = f"#{over[0] + 1}"
        if lines:
            first = f"{where}:{lines[over[0]]}" if where else f"line {lines[over[0]]}"
        raise too_long_error(len(over), what, limit, first, len(seqs[over[0]]))
    if over:
        cut = (lambda s: s[: limit - keep_last] + s[-keep_last:]) if keep_last else (lambda s: s[:limit])
        seqs = [s if len(s) <= limit else cut(s) for s in seqs]
    return seqs, Truncation(len(over), len(seqs), longest, limit)
