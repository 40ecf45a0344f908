"""Attention maps of a trained model for one text, captured as data (§3.2, Figure 3-5 of the paper).

The layers asked for run the explicit softmax(QK^T / sqrt(d_k)) path and return their weights; every other layer
stays on the fused kernel. Nothing is stored on the modules.

Long inputs: a model with sinusoidal positions is given a longer table (the sinusoids are defined for every
position, §3.5: they "may allow the model to extrapolate to sequence lengths longer than the ones encountered
during training"); one with learned positions has its input truncated to its ``max_len``, and the note says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from attnkit.errors import InputError
from attnkit.model.positional import SinusoidalPositionalEncoding
from attnkit.runs import load_run


@dataclass
class AttentionMaps:
    kind: str  # what attends to what, e.g. "encoder self-attention"
    maps: dict[int, Tensor]  # layer -> (H, T, S) weights; each row sums to 1 over the keys
    query_tokens: list[str]  # T labels
    key_tokens: list[str]  # S labels
    note: str = ""


def _fit_positions(embeddings, length: int) -> str:
    """Make ``embeddings`` cover ``length`` positions; returns a note when the input must be cut instead."""
    position = embeddings.position
    if length <= position.max_len:
        return ""
    if isinstance(position, SinusoidalPositionalEncoding):
        d_model = position.table.size(1)
        embeddings.position = SinusoidalPositionalEncoding(max_len=length, d_model=d_model)
        return f"input of {length} tokens is longer than the model's max_len={position.max_len}; sinusoids extended"
    return ""


def _check_layers(layers: list[int] | None, n_layers: int) -> tuple[int, ...]:
    chosen = tuple(range(n_layers)) if not layers else tuple(layers)
    bad = [layer for layer in chosen if not 0 <= layer < n_layers]
    if bad:
        raise InputError(f"--layer {bad[0]}: the model has layers 0..{n_layers - 1}")
    return chosen


@torch.inference_mode()
def classifier_attention(run, text: str, layers: list[int] | None = None) -> AttentionMaps:
    """Encoder self-attention of a classifier run (a ``LoadedRun`` or ``ClassifierRun``) on ``text``."""
    model, tokenizer = run.model, run.tokenizer
    ids = tokenizer.encode(text)
    tokens = tokenizer.tokens(text)
    note = _fit_positions(model.embeddings, len(ids))
    if len(ids) > model.embeddings.position.max_len:
        limit = model.embeddings.position.max_len
        note = f"input of {len(ids)} tokens truncated to the model's max_len={limit} (learned positions)"
        ids, tokens = ids[:limit], tokens[:limit]
    chosen = _check_layers(layers, len(model.encoder.layers))
    _, maps = model.forward_with_attention(torch.tensor([ids]), chosen)
    return AttentionMaps("encoder self-attention", {i: m[0] for i, m in maps.items()}, tokens, tokens, note)


@torch.inference_mode()
def translator_attention(run, text: str, layers: list[int] | None = None) -> AttentionMaps:
    """Cross-attention (the alignment of output to source, §3.2.3) of a translator run on ``text``, for the
    greedy translation the model produces."""
    from attnkit.decoding import greedy_decode

    model, tokenizer = run.model, run.tokenizer
    src_ids = tokenizer.encode(text) + [tokenizer.eos_id]
    src_tokens = tokenizer.tokens(text) + ["</s>"]
    note = _fit_positions(model.embeddings, len(src_ids) + 50)
    src = torch.tensor([src_ids[: model.embeddings.position.max_len]])
    out = greedy_decode(model, src, bos_id=tokenizer.bos_id, eos_id=tokenizer.eos_id,
                        max_positions=model.embeddings.position.max_len)[0]
    chosen = _check_layers(layers, len(model.decoder.layers))
    memory, src_mask, _ = model.encode(src)
    tgt_in = torch.tensor([[tokenizer.bos_id] + out])  # (1, T)
    _, maps, _ = model.decode(tgt_in, memory, src_mask, attn_layers=chosen)
    out_tokens = [tokenizer.backend.id_to_token(i) for i in out] + ["</s>"]
    return AttentionMaps("cross-attention (output rows, source columns)", {i: m.cross_attn[0] for i, m in maps.items()},
                         out_tokens, src_tokens[: src.size(1)], note)


def attention_for_text(run_dir: str | Path, text: str, layers: list[int] | None = None) -> AttentionMaps:
    """The maps a ``plot attention`` shows: encoder self-attention (classifier) or cross-attention (translator)."""
    run = load_run(run_dir)
    if not text.strip():
        raise InputError("plot attention: the text is empty")
    if run.task == "translate":
        return translator_attention(run, text, layers)
    return classifier_attention(run, text, layers)
