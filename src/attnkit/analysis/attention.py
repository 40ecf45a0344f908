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

from attnkit.devices import model_device
from attnkit.errors import InputError
from attnkit.model.masking import padding_mask
from attnkit.model.positional import SinusoidalPositionalEncoding
from attnkit.runs import load_run


@dataclass
class CapturedAttention:
    """What ``plot attention`` draws: one kind of map for one text, with the tokens that label its axes."""

    kind: str  # what attends to what, e.g. "encoder self-attention"
    maps: dict[int, Tensor]  # layer -> (H, T, S) weights; each row sums to 1 over the keys
    query_tokens: list[str]  # T labels
    key_tokens: list[str]  # S labels
    note: str = ""


def _fit_positions(embeddings, length: int, what: str) -> str:
    """Make sinusoidal ``embeddings`` cover ``length`` positions (``what`` needs them); returns the note to show.
    Learned positions cannot be extended: the caller truncates instead."""
    position = embeddings.position
    if length <= position.max_len or not isinstance(position, SinusoidalPositionalEncoding):
        return ""
    d_model = position.table.size(1)
    embeddings.position = SinusoidalPositionalEncoding(max_len=length, d_model=d_model).to(position.table.device)
    return (
        f"{what} is longer than the model's max_len={position.max_len}; sinusoids extended to draw all of it "
        f"(predicting, the model reads no more than {position.max_len})"
    )


def _check_layers(layers: list[int] | None, n_layers: int) -> tuple[int, ...]:
    chosen = tuple(range(n_layers)) if not layers else tuple(layers)
    bad = [layer for layer in chosen if not 0 <= layer < n_layers]
    if bad:
        raise InputError(f"--layer {bad[0]}: the model has layers 0..{n_layers - 1}")
    return chosen


def _check_heads(heads: list[int] | None, n_heads: int) -> None:
    bad = [head for head in heads or [] if not 0 <= head < n_heads]
    if bad:
        raise InputError(f"--head {bad[0]}: the model has heads 0..{n_heads - 1}")


# The weights a plot computes and keeps: layers x heads x queries x keys, each layer's (H, T, S) map made whole on
# the explicit path (eq. 1) before it is pooled for drawing. 2**28 float32 weights are 1 GiB; a 20,000-token input
# to a 2-layer, 4-head classifier would ask for 12 GiB.
MAX_WEIGHTS = 2**28


def _check_size(n_layers: int, n_heads: int, n_queries: int, n_keys: int, what: str) -> None:
    """Refuse, before the model runs, maps of more than ``MAX_WEIGHTS`` weights (``what`` names the input)."""
    weights = n_layers * n_heads * n_queries * n_keys
    if weights > MAX_WEIGHTS:
        raise InputError(
            f"plot attention: {what} makes {n_layers} layer(s) x {n_heads} heads x {n_queries:,} x {n_keys:,} = "
            f"{weights:,} attention weights, over the {MAX_WEIGHTS:,} (1 GiB of float32) a plot computes; "
            "shorten the text or show fewer layers (--layer)"
        )


@torch.inference_mode()
def classifier_attention(
    run, text: str, layers: list[int] | None = None, heads: list[int] | None = None
) -> CapturedAttention:
    """Encoder self-attention on ``text`` of a classifier run (a ``LoadedRun`` or ``ClassifierRun``) or of a
    pretrained encoder's (masked LM); ``layers`` and ``heads`` (default all) are checked against the model."""
    model, tokenizer = run.model, run.tokenizer
    ids = tokenizer.encode(text)
    tokens = tokenizer.tokens(text)
    note = _fit_positions(model.embeddings, len(ids), f"input of {len(ids)} tokens")
    if len(ids) > model.embeddings.position.max_len:
        limit = model.embeddings.position.max_len
        note = f"input of {len(ids)} tokens truncated to the model's max_len={limit} (learned positions)"
        ids, tokens = ids[:limit], tokens[:limit]
    chosen = _check_layers(layers, len(model.encoder.layers))
    n_heads = model.encoder.layers[0].self_attn.n_heads
    _check_heads(heads, n_heads)
    _check_size(len(set(chosen)), n_heads, len(ids), len(ids), f"an input of {len(ids):,} tokens")
    src = torch.tensor([ids], device=model_device(model))  # (1, S)
    # The encoder itself, as a classifier's and a pretrained encoder's forward passes run it (§3.2.1).
    _, maps = model.encoder(model.embeddings(src), padding_mask(src, model.pad_id), chosen)
    weights = {i: m[0].float().cpu() for i, m in maps.encoder_self.items()}  # layer -> (H, S, S)
    return CapturedAttention("encoder self-attention", weights, tokens, tokens, note)


@torch.inference_mode()
def translator_attention(
    run, text: str, layers: list[int] | None = None, heads: list[int] | None = None
) -> CapturedAttention:
    """Cross-attention (the alignment of output to source, §3.2.3) of a translator run on ``text``, for the
    greedy translation the model produces; ``layers`` and ``heads`` are checked before it decodes."""
    from attnkit.decoding import greedy_decode
    from attnkit.decoding.limits import output_limits

    model, tokenizer = run.model, run.tokenizer
    src_ids = tokenizer.encode(text) + [tokenizer.eos_id]
    src_tokens = tokenizer.tokens(text) + ["</s>"]
    # The decoder needs as many positions as the output may have tokens: input length + 50 (§6.1).
    note = _fit_positions(
        model.embeddings,
        len(src_ids) + 50,
        f"input of {len(src_ids)} tokens with up to {len(src_ids) + 50} output tokens",
    )
    max_positions = model.embeddings.position.max_len
    if len(src_ids) > max_positions:
        note = f"input of {len(src_ids)} tokens truncated to the model's max_len={max_positions} (learned positions)"
    src = torch.tensor([src_ids[:max_positions]], device=model_device(model))  # (1, S)
    # Checked before decoding, which would make up to S + 50 steps: at most S + 50 output rows (§6.1's limit).
    chosen = _check_layers(layers, len(model.decoder.layers))
    n_src = src.size(1)
    n_heads = model.decoder.layers[0].cross_attn.n_heads
    _check_heads(heads, n_heads)
    _check_size(
        len(set(chosen)),
        n_heads,
        min(n_src + 50, max_positions),
        n_src,
        f"an input of {n_src:,} tokens (and its output)",
    )
    out = greedy_decode(model, src, bos_id=tokenizer.bos_id, eos_id=tokenizer.eos_id, max_positions=max_positions)[0]
    limit = int(output_limits(src, pad_id=model.pad_id, max_extra=50, max_positions=max_positions, fixed_len=None)[0])
    # Decoder position t (BOS at 0) predicted output token t. When decoding stopped at EOS, the rows are the output
    # tokens and EOS: positions 0 .. len(out). When it ran to the length limit no EOS was emitted, and the rows are
    # the output tokens alone: positions 0 .. len(out) - 1 (position len(out) predicted nothing, and may be past the
    # model's max_len).
    out_tokens = [tokenizer.backend.id_to_token(i) for i in out]
    if len(out) < limit:
        out_tokens.append("</s>")
    tgt_in = torch.tensor([[tokenizer.bos_id] + out[: len(out_tokens) - 1]], device=src.device)  # (1, T)
    memory, src_mask, _ = model.encode(src)  # (1, S, D), (1, 1, 1, S)
    _, maps, _ = model.decode(tgt_in, memory, src_mask, attn_layers=chosen)
    weights = {i: m[0].float().cpu() for i, m in maps.cross.items()}  # layer -> (H, T, S)
    return CapturedAttention(
        "cross-attention (output rows, source columns)", weights, out_tokens, src_tokens[: src.size(1)], note
    )


def attention_for_text(
    run_dir: str | Path,
    text: str,
    layers: list[int] | None = None,
    device: torch.device | str = "cpu",
    heads: list[int] | None = None,
) -> CapturedAttention:
    """The maps a ``plot attention`` shows (on the CPU, computed on ``device``): encoder self-attention (a classifier
    or a pretrained encoder) or cross-attention (translator)."""
    run = load_run(run_dir, device=device)
    if not text.strip():
        raise InputError("plot attention: the text is empty")
    if run.task == "translate":
        return translator_attention(run, text, layers, heads)
    return classifier_attention(run, text, layers, heads)
