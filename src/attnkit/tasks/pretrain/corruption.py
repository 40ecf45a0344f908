"""BERT's masked-LM corruption (Devlin et al. 2019, §3.1 "Task #1: Masked LM" and appendix C.2): 15% of each text's
tokens are chosen for prediction; a chosen token is replaced by <mask> 80% of the time, by a random token 10% of
the time, and left unchanged 10% of the time (so that the encoder cannot assume the token it sees at a position is
never the one to predict, and <mask>, absent in fine-tuning, is not the only signal). The loss is taken on the
chosen positions only.

Which tokens are chosen and how they are replaced depend on a seed alone (``batch_seed``), never on the global
random state: a resumed run and every rank of a data-parallel run draw the same masks for the same batch.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import torch
from torch import Tensor

MASK_TOKEN = "<mask>"
REPLACE_WITH_MASK = 0.8  # share of the chosen tokens shown as <mask> (§3.1)
REPLACE_WITH_RANDOM = 0.1  # shown as a random token; the remaining 10% are shown unchanged (§3.1)
_NEVER = 2.0  # the choice score of a token that may not be chosen: above every uniform draw in [0, 1)


def batch_seed(*parts: object) -> int:
    """A 63-bit seed from ``parts`` (the run's seed, the epoch's draw, a batch's example indices)."""
    text = ":".join(
        ",".join(map(str, p)) if isinstance(p, Iterable) and not isinstance(p, str) else str(p) for p in parts
    )
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


def choose_and_corrupt(
    ids: Tensor, *, maskable: Tensor, mask_id: int, mask_prob: float, generator: torch.Generator
) -> tuple[Tensor, Tensor]:
    """ids (B, S) -> (inputs (B, S), chosen (B, S) bool): the ids with the chosen positions corrupted, and which
    positions were chosen. ``maskable`` (V,) bool says which ids may be chosen: never padding, <cls> or any other
    special token.

    As in BERT's data preparation (``create_pretraining_data.py``), each text gets exactly
    max(1, round(mask_prob * n)) of its n maskable tokens chosen, uniformly without replacement, rather than an
    independent coin per token: every text with a real token contributes to the loss, and no batch has zero targets.
    Random replacements are drawn from the maskable (ordinary) tokens, never from the special ones.
    """
    candidate = maskable[ids]  # (B, S) real, ordinary tokens
    n = candidate.sum(dim=1)  # (B,)
    k = torch.where(n > 0, torch.clamp(torch.round(mask_prob * n), min=1), torch.zeros_like(n))  # (B,)
    scores = torch.rand(ids.shape, generator=generator).masked_fill(~candidate, _NEVER)  # (B, S)
    ranks = scores.argsort(dim=1).argsort(dim=1)  # (B, S) rank of each position's score within its text
    chosen = ranks < k[:, None]  # (B, S) the k lowest scores: only candidates, as k <= n
    how = torch.rand(ids.shape, generator=generator)  # (B, S)
    ordinary = maskable.nonzero().squeeze(1)  # (V',)
    random_ids = ordinary[torch.randint(len(ordinary), ids.shape, generator=generator)]  # (B, S)
    to_mask = chosen & (how < REPLACE_WITH_MASK)
    to_random = chosen & (how >= REPLACE_WITH_MASK) & (how < REPLACE_WITH_MASK + REPLACE_WITH_RANDOM)
    inputs = ids.masked_fill(to_mask, mask_id)  # (B, S)
    inputs = torch.where(to_random, random_ids, inputs)  # (B, S)
    return inputs, chosen
