"""Length penalties for ranking finished beam-search hypotheses.

§6.1: "We used beam search with a beam size of 4 and length penalty alpha = 0.6", citing Wu et al. (2016), GNMT.
GNMT's eq. 14, which the paper's tensor2tensor implementation uses, is

    lp(Y) = (5 + |Y|)^alpha / (5 + 1)^alpha

and hypotheses are ranked by log P(Y | X) / lp(Y). Without a penalty the summed log-probability, which only falls
as a hypothesis grows, favours short outputs. "power" is |Y|^alpha (fairseq's ``lenpen``; alpha = 1 ranks by the
mean log-probability per token), "none" is lp = 1.

|Y| counts the EOS token when one was emitted, as in tensor2tensor and fairseq.
"""

from __future__ import annotations

import torch
from torch import Tensor

LENGTH_PENALTIES = ("gnmt", "power", "none")


MAX_ALPHA = 10.0  # far above the paper's 0.6; lp(|Y|) = |Y|^alpha must stay a float64 for any output length


def check_length_penalty(kind: str, alpha: float) -> None:
    """Raise ``ValueError`` for an unknown penalty or an alpha outside [0, ``MAX_ALPHA``].

    Beam search stops early on the bound best_live_score / lp(max length), which needs lp to grow with length,
    so alpha must be >= 0; a huge alpha overflows lp.
    """
    if kind not in LENGTH_PENALTIES:
        raise ValueError(f"length_penalty={kind!r}; expected one of {LENGTH_PENALTIES}")
    if alpha < 0:
        raise ValueError(f"alpha={alpha} must be >= 0 (the penalty must not shrink as hypotheses grow)")
    if not alpha <= MAX_ALPHA:  # also nan
        raise ValueError(f"alpha={alpha} must be at most {MAX_ALPHA:g} (lp(|Y|) = |Y|^alpha would overflow)")


def length_penalty(length: int | float | Tensor, *, kind: str, alpha: float) -> float | Tensor:
    """lp(|Y|) for a length, or for a tensor of lengths (elementwise). Divide a summed log-probability by it."""
    if kind == "gnmt":
        return ((5 + length) / 6) ** alpha  # Wu et al. (2016), eq. 14
    if kind == "power":
        return length**alpha
    if kind == "none":
        return torch.ones_like(length, dtype=torch.float) if isinstance(length, Tensor) else 1.0
    raise ValueError(f"length_penalty={kind!r}; expected one of {LENGTH_PENALTIES}")
