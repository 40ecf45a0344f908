"""What bounds classifier inference: the classify suite's full-length batch (32 sentences of 128 tokens, the
seed-000 classifier: d_model 128, 4 heads, d_ff 512, 2 layers) through attnkit and Hugging Face BERT, timed in
turns with the arithmetic no implementation of this model can skip.

    python benchmarks/profile_classify.py [--threads 2] [--reps 30] [--precision fp32|bf16]

The floor is every matrix product of the forward pass at its exact shape, back to back on inputs made once, with
nothing between them: per layer the stacked W^Q W^K W^V (4,096 x 128 by 128 x 384), the attention itself
(``F.scaled_dot_product_attention`` on 32 x 4 heads x 128 x 32, PyTorch's fused kernel), W^O, and the FFN's two
matrices. No embedding lookup, LayerNorm, residual, activation, pooling or head. So BERT's time over the floor's
is the most any implementation of this model, however fused, could gain on BERT at this batch; the issue asks
1.3x. ``--precision bf16`` runs all three under bfloat16 autocast (CPUs with native bfloat16). The floor's rate
(products and attention together) is also printed against a 1,024 x 1,024 square product's.
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F

from attnkit.allocator import setting, tune_malloc
from attnkit.bench.classify import CONFIGS, forward_fn, inference_call, make_batch
from attnkit.bench.timing import fixed_threads, measure_interleaved
from attnkit.bench.token_ids import PAD_ID
from attnkit.model.build import build_classifier
from attnkit.model.classifier import TransformerClassifier
from attnkit.training.precision import DTYPES


def floor_call(model: TransformerClassifier, batch: int, length: int, dtype: torch.dtype):
    """The forward pass's matrix products and attention alone, on inputs made once (see the module docstring)."""
    n_heads = model.encoder.layers[0].self_attn.n_heads
    d_model = model.encoder.layers[0].self_attn.out_proj.weight.size(0)
    tokens = batch * length
    x = torch.randn(tokens, d_model, dtype=dtype)  # (B*L, D): every layer's input
    layers = []
    for layer in model.encoder.layers:
        attn = layer.self_attn.state_dict()  # the paper's keys, also for a prepared model's fused attention
        w_qkv = torch.cat([attn[f"{p}_proj.weight"] for p in "qkv"])  # (3D, D)
        b_qkv = torch.cat([attn[f"{p}_proj.bias"] for p in "qkv"])  # (3D,)
        out, ffn = layer.self_attn.out_proj, layer.ffn
        layers.append(
            [(w.to(dtype), None if b is None else b.to(dtype)) for w, b in ((w_qkv, b_qkv), (out.weight, out.bias))]
            + [(ffn.linear1.weight.to(dtype), ffn.linear1.bias.to(dtype))]
            + [(ffn.linear2.weight.to(dtype), ffn.linear2.bias.to(dtype))]
        )
    hidden = torch.randn(tokens, layers[0][2][0].size(0), dtype=dtype)  # (B*L, d_ff): the FFN's inner input
    q = torch.randn(batch, n_heads, length, d_model // n_heads, dtype=dtype)  # (B, H, L, Dh)
    k, v = torch.randn_like(q), torch.randn_like(q)

    def call() -> None:
        with torch.inference_mode():
            for (w_qkv, b_qkv), (w_o, b_o), (w_1, b_1), (w_2, b_2) in layers:
                F.linear(x, w_qkv, b_qkv)  # (B*L, 3D)
                F.scaled_dot_product_attention(q, k, v)  # (B, H, L, Dh)
                F.linear(x, w_o, b_o)  # (B*L, D)
                F.linear(x, w_1, b_1)  # (B*L, d_ff)
                F.linear(hidden, w_2, b_2)  # (B*L, D)

    return call


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    args = parser.parse_args()
    tune_malloc()  # as the command line does (ATTNKIT_MALLOC=system leaves glibc's defaults)
    cfg = CONFIGS["seed000"]
    dtype = DTYPES.get(args.precision, torch.float32)
    with fixed_threads(args.threads):
        ids, _, _ = make_batch(cfg, args.batch, args.length, padded=False, seed=0)
        torch.manual_seed(0)
        ours = build_classifier(cfg, pad_id=PAD_ID)
        calls = {"attnkit": inference_call(*forward_fn("attnkit", cfg, ours), ids, args.precision)}
        torch.manual_seed(0)
        calls["transformers (BERT)"] = inference_call(*forward_fn("transformers", cfg, ours), ids, args.precision)
        calls["floor: products + attention alone"] = floor_call(ours, args.batch, args.length, dtype)
        a, b = torch.randn(1024, 1024, dtype=dtype), torch.randn(1024, 1024, dtype=dtype)
        calls["1,024^2 square product"] = lambda: torch.mm(a, b)
        timings = measure_interleaved(list(calls.values()), warmup=3, reps=args.reps, settle_s=0.0)
    ms = {name: t.median_s * 1e3 for name, t in zip(calls, timings)}
    per_token = 2 * (4 * cfg.d_model**2 + 2 * cfg.d_model * cfg.d_ff) * cfg.n_layers  # FLOPs of the products
    attention = 4 * args.batch * args.length**2 * cfg.d_model * cfg.n_layers  # Q K^T and A V
    floor_gflop = (per_token * args.batch * args.length + attention) / 1e9
    square_gflops = 2 * 1024**3 / ms["1,024^2 square product"] / 1e6
    print(f"batch {args.batch} x {args.length}, {args.precision}, {args.threads} threads, {args.reps} rounds in turns;")
    print(f"  malloc: {setting()}")
    for name in list(calls)[:3]:
        rate = floor_gflop / ms[name] * 1e3
        print(f"  {name:36s} {ms[name]:7.2f} ms  {args.batch / ms[name] * 1e3:7.0f} sentences/s  {rate:6.1f} GFLOP/s")
    print(f"  square product ceiling: {square_gflops:.1f} GFLOP/s; the floor (products and attention) runs at "
          f"{floor_gflop / ms['floor: products + attention alone'] * 1e3 / square_gflops:.0%} of it")  # fmt: skip
    bert, floor = ms["transformers (BERT)"], ms["floor: products + attention alone"]
    print(f"  BERT / floor = {bert / floor:.2f}x: the most any implementation could gain on BERT at this batch")
    print(f"  BERT / attnkit = {bert / ms['attnkit']:.2f}x; attnkit spends {1 - floor / ms['attnkit']:.0%} of its time "
          "outside the products and attention")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
