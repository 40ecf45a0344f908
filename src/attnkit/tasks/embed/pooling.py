"""Sentence embeddings: the hidden states of a loaded encoder pooled into one vector per text (as
sentence-transformers does); reading a BERT folder or a run directory is the caller's part (``interop.bert.embed``)."""

from __future__ import annotations

import logging
from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import Tensor

from attnkit.data.batching import apply_length_policy, pad
from attnkit.devices import model_device
from attnkit.errors import InputError
from attnkit.model.classifier import POOLINGS, TransformerClassifier
from attnkit.tokenization import Tokenizer

log = logging.getLogger(__name__)


def sentence_embeddings(
    model: TransformerClassifier,
    tokenizer: Tokenizer,
    texts: Iterable[str],
    *,
    pool: str = "mean",
    normalize: bool = False,
    batch_size: int = 32,
    max_len_policy: str = "truncate",
) -> Tensor:
    """Sentence vectors (N, D) from the encoder of ``model``, in input order; the head is not used.

    ``pool`` "mean" averages the hidden states of the real tokens ([CLS] and [SEP] included, padding not), as
    sentence-transformers does; "cls" takes the first position, the [CLS] token (refused where the tokenizer
    prepends none). ``normalize`` scales each vector to unit L2 norm.
    Texts longer than the position table are truncated (keeping a final [SEP]) and logged, or refused ("error").
    """
    if pool not in POOLINGS:
        raise InputError(f"pool={pool!r}; expected one of {', '.join(POOLINGS)}")
    if pool == "cls" and tokenizer.cls_id is None:  # the first position would be the first word's
        raise InputError("pool='cls' takes the [CLS] token, which this model's tokenizer does not prepend; use mean")
    if tokenizer.pad_id != model.pad_id:
        raise ValueError(f"tokenizer pad id {tokenizer.pad_id} differs from the model's pad_id {model.pad_id}")
    max_len = model.embeddings.position.max_len
    seqs, truncation = apply_length_policy(
        tokenizer.encode_batch(list(texts), max_len),
        max_len,
        max_len_policy,
        what="text",
        keep_last=tokenizer.n_trailing_specials or None,
    )
    if truncation.n_truncated:
        log.warning(
            "%d of %d texts truncated to %d tokens (longest: %d)",
            truncation.n_truncated,
            truncation.n_total,
            truncation.limit,
            truncation.longest,
        )
    out = torch.empty(len(seqs), model.embeddings.token.embedding_dim)  # (N, D)
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))  # similar lengths together: little padding
    was_training = model.training
    device = model_device(model)
    model.eval()
    try:
        with torch.inference_mode():
            for start in range(0, len(order), batch_size):
                batch = order[start : start + batch_size]
                hidden, mask, _ = model.encode(pad([seqs[i] for i in batch], tokenizer.pad_id).to(device))  # (B, S, D)
                out[batch] = model.pool(hidden, mask, pool).float().cpu()  # (B, D)
    finally:
        model.train(was_training)
    return F.normalize(out, dim=-1) if normalize else out  # (N, D)
