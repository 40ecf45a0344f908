"""Model FLOPs: what a forward pass and a training step of the benchmarked models compute, and MFU.

MFU, model FLOPs utilisation = model FLOP/s / the machine's ceiling (the measured float32 matmul on a CPU, the data
sheet's dense peak of the row's arithmetic on a GPU, see ``ceiling.ceiling_results``). Only matrix multiplications
are counted, 2 FLOPs per multiply-add, over real (non-pad) tokens, D = d_model, F = d_ff, V = vocab:

    forward = 2 * sum over tokens of (weights that token is multiplied by) + attention scores and weighted sums
    training step = 3 * forward   (the backward pass costs twice the forward: gradients of inputs and of weights)

    weights per token:  encoder layer  4 D^2 + 2 D F            (W^Q, W^K, W^V, W^O; W_1, W_2)
                        decoder layer  6 D^2 + 2 D F per target token (self W^QKVO, cross W^Q and W^O, FFN)
                                       + 2 D^2 per source token      (cross-attention W^K, W^V on the memory)
                        output projection  D V per target token (tied to the embedding, but a real matmul)
    attention, per layer and sentence:  4 D L_q L_k            (Q K^T and A V; the full square for causal masks,
                                                                as the kernels compute it)

So a training step is 6 * (weights used per token) * tokens + 3 * attention FLOPs; embedding lookups, LayerNorm,
softmax, dropout and the optimizer are not counted (they cost time, which is why MFU stays below 1).
"""

from __future__ import annotations

from collections.abc import Sequence

# Formulas in the module docstring; lengths are per sentence, real tokens only.


def encoder_forward_flops(lengths: Sequence[int], *, d_model: int, d_ff: int, n_layers: int) -> float:
    D, F = d_model, d_ff
    tokens = sum(lengths)
    per_layer = 2 * tokens * (4 * D * D + 2 * D * F) + 4 * D * sum(L * L for L in lengths)
    return n_layers * per_layer


def seq2seq_forward_flops(
    src_lengths: Sequence[int], tgt_lengths: Sequence[int], *, d_model: int, d_ff: int, n_layers: int, vocab_size: int
) -> float:
    """Encoder + decoder (``n_layers`` each) + the output projection, one teacher-forced forward pass."""
    D, F = d_model, d_ff
    src_tokens, tgt_tokens = sum(src_lengths), sum(tgt_lengths)
    encoder = encoder_forward_flops(src_lengths, d_model=D, d_ff=F, n_layers=n_layers)
    decoder_layer = (
        2 * tgt_tokens * (6 * D * D + 2 * D * F)
        + 2 * src_tokens * 2 * D * D
        + 4 * D * sum(t * t + t * s for s, t in zip(src_lengths, tgt_lengths))
    )
    return encoder + n_layers * decoder_layer + 2 * tgt_tokens * D * vocab_size


def training_flops(forward_flops: float) -> float:
    return 3 * forward_flops


def gflops(flop: float, seconds: float) -> float:
    return flop / seconds / 1e9


def mfu(flop_per_step: float, seconds: float, ceiling_gflops: float) -> float:
    return gflops(flop_per_step, seconds) / ceiling_gflops
