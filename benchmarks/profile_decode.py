"""Where decoding time goes: a PyTorch profile of the decode suite's attnkit call, greedy or beam 4, by category.

    python benchmarks/profile_decode.py [--search greedy|beam4] [--batch 32] [--threads 2] [--rows 12]
        [--precision fp32|bf16|int8]
    python benchmarks/profile_decode.py --floor [--search greedy|beam4] [--batch 1] [--threads 1]

The decode suite's setting (the ``small`` translator, ``--batch`` sources of 32 tokens, exactly 32 output tokens),
one warm-up call, then one profiled call, with the model in ``--precision`` (as ``translate run --precision``
makes it: float32, cast to bfloat16, or bfloat16 with int8 weights). Prints the operators sorted by their own CPU
time, then the call's time by category: matrix multiplication, attention, cache writes and beam reordering,
scoring (log-softmax, top-k, arg max, banning tokens), LayerNorm and elementwise, other operators, and what no
operator accounts for (Python, dispatch, allocation: wall time of the call minus the operators' self time; the
profiler's own overhead falls there too, so the last figure is an upper bound). docs/performance.md quotes it.

``--floor`` times what no PyTorch decoder of this model can skip: the weight matrices of one decoding step (per
decoder layer the stacked W^Q W^K W^V, W^O, cross-attention W^Q and W^O, the FFN's two matrices; then the output
projection onto the vocabulary, 19 MB in float32) applied back to back to ``--batch`` rows (x beam width for beam
4), with nothing else in between: as ``F.linear`` runs them ((out, in) weights) and with (in, out) copies
(``torch.addmm`` without a transpose, the faster kernel at one row) and, where PyTorch has MKL, with MKL's packed
weights (``torch.ops.mkl._mkl_linear``), with oneDNN's packed weights (``OneDNNLinear``'s kernel), and with the
weights rounded to int8 (``attnkit.inference.quantize``: bfloat16 rows, PyTorch's int8 weight kernel) where the rows
are few enough for it. Times 32 such steps, one sentence's worth.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
from torch.profiler import profile

from attnkit.allocator import setting, tune_malloc
from attnkit.bench.decode import CONFIGS, make_sources
from attnkit.bench.decode_calls import SEARCHES, _attnkit
from attnkit.bench.timing import fixed_threads, measure
from attnkit.bench.token_ids import PAD_ID
from attnkit.inference import prepare_for_inference, quantize_for_inference
from attnkit.inference.quantize import INT8_MAX_ROWS, Int8Weight
from attnkit.model.build import build_translator
from attnkit.model.transformer import Transformer

# operator name -> category; the first category whose fragment occurs in the name wins
CATEGORIES = (
    ("matmul", ("addmm", "aten::mm", "bmm", "matmul", "linear", "int8pack_mm")),
    ("attention", ("scaled_dot_product", "flash_attention", "_efficient_attention")),
    ("cache write / reorder", ("copy_", "index_select", "index_copy", "cat", "slice_scatter")),
    ("scoring", ("log_softmax", "topk", "argmax", "index_fill", "gather", "argsort", "sort", "max")),
    ("norm / elementwise", ("layer_norm", "relu", "gelu", "add", "mul", "div", "embedding")),
)


def category(name: str) -> str:
    for label, fragments in CATEGORIES:
        if any(f in name for f in fragments):
            return label
    return "other operators"


def step_weights(model: Transformer) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """(weight (out, in), bias) of every matrix one decoding step multiplies by, in the order it does."""
    weights = []
    for layer in model.decoder.layers:
        self_attn, cross = layer.self_attn, layer.cross_attn
        weights.append((self_attn.qkv.weight, self_attn.qkv.bias))  # (3 H Dh, D): the fused self-attention projection
        for linear in (self_attn.out_proj, cross.q_proj, cross.out_proj, layer.ffn.linear1, layer.ffn.linear2):
            weights.append((linear.weight, linear.bias))
    out = model.embeddings.token.weight if model.output_proj is None else model.output_proj.weight  # (V, D)
    weights.append((out, None))
    return weights


def linear_floor(model: Transformer, rows: int, steps: int = 32, reps: int = 20) -> dict[str, float]:
    """Milliseconds for ``steps`` decoding steps' matrix products alone at ``rows`` rows: median of ``reps``."""
    # Detached: a packed oneDNN weight that requires grad takes a path ~100x slower under autograd.
    weights = [(w.detach(), None if b is None else b.detach()) for w, b in step_weights(model)]
    transposed = [(w.t().contiguous(), b) for w, b in weights]  # (in, out)
    inputs = {w.size(1): torch.randn(rows, w.size(1)) for w, _ in weights}

    def as_linear() -> None:
        for w, b in weights:
            torch.nn.functional.linear(inputs[w.size(1)], w, b)  # (rows, out)

    def as_addmm() -> None:
        for w_t, b in transposed:
            x = inputs[w_t.size(0)]
            torch.addmm(b, x, w_t) if b is not None else x @ w_t  # (rows, out)

    variants = [("F.linear, (out, in) weights", as_linear), ("addmm, (in, out) copies", as_addmm)]
    if torch.backends.mkl.is_available():  # MKL's packed weights, the linear that Inductor's freezing uses
        mkl = torch.ops.mkl
        packed = [(mkl._mkl_reorder_linear_weight(w, rows), w, b) for w, b in weights]

        def as_packed() -> None:
            for p, w, b in packed:
                mkl._mkl_linear(inputs[w.size(1)], p, w, b, rows)  # (rows, out)

        variants.append(("MKL packed weights", as_packed))
    if torch.backends.mkldnn.is_available():  # oneDNN's packed weights (``attnkit.inference.onednn``)
        mkldnn = torch.ops.mkldnn
        reordered = [(mkldnn._reorder_linear_weight(w.contiguous(), None), w, b) for w, b in weights]

        def as_onednn() -> None:
            for p, w, b in reordered:
                mkldnn._linear_pointwise(inputs[w.size(1)], p, b, "none", [], "")  # (rows, out)

        variants.append(("oneDNN packed weights", as_onednn))
    if rows <= INT8_MAX_ROWS:  # ``--precision int8``'s kernel: bfloat16 rows, int8 weights
        rounded = [(Int8Weight.quantize(w.bfloat16()), None if b is None else b.bfloat16()) for w, b in weights]
        bf16_inputs = {k: x.bfloat16() for k, x in inputs.items()}

        def as_int8() -> None:
            for int8, b in rounded:
                int8.linear(bf16_inputs[int8.q.size(1)], b)  # (rows, out)

        variants.append(("int8 weights, bfloat16 rows", as_int8))
    result = {}
    for name, fn in variants:
        result[name] = measure(lambda fn=fn: [fn() for _ in range(steps)], warmup=1, reps=reps).median_s * 1e3
    megabytes = sum(w.numel() for w, _ in weights) * 4 / 1e6
    result["weights, MB"] = megabytes
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--search", choices=tuple(SEARCHES), default="beam4")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", type=int, default=12)
    parser.add_argument("--floor", action="store_true", help="time the step's matrix products alone (see above)")
    parser.add_argument("--precision", choices=("fp32", "bf16", "int8"), default="fp32", help="the profiled model's")
    args = parser.parse_args()
    tune_malloc()  # as the command line does (ATTNKIT_MALLOC=system leaves glibc's defaults)
    print(f"malloc: {setting()}")
    cfg = CONFIGS["small"]
    if args.floor:
        with fixed_threads(args.threads):
            torch.manual_seed(0)
            model = prepare_for_inference(build_translator(cfg, pad_id=PAD_ID))
            rows = args.batch * (4 if args.search == "beam4" else 1)
            floor = linear_floor(model, rows)
        megabytes = floor.pop("weights, MB")
        gflop = 2 * rows * megabytes / 4 * 32 / 1e3  # 2 FLOPs per weight and row, 4 bytes a weight, 32 steps
        print(f"matrix products of 32 decoding steps, {rows} rows, {megabytes:.1f} MB of weights a step:")
        for name, ms in floor.items():
            rates = f"{megabytes * 32 / ms:.1f} GB/s of weights, {gflop / ms * 1e3:.1f} GFLOP/s"
            print(f"  {name:30s} {ms:8.2f} ms  ({rates})")
        return 0
    with fixed_threads(args.threads):
        torch.manual_seed(0)
        model = prepare_for_inference(build_translator(cfg, pad_id=PAD_ID))
        if args.precision == "bf16":
            model.to(torch.bfloat16)
        elif args.precision == "int8":
            quantize_for_inference(model)
        call = _attnkit(model, make_sources(cfg, args.batch, 32, seed=0), SEARCHES[args.search], 32, cfg.max_len)
        call()
        start = time.perf_counter()
        call()
        plain_ms = (time.perf_counter() - start) * 1e3
        with profile() as prof:
            start = time.perf_counter()
            call()
            wall_ms = (time.perf_counter() - start) * 1e3
    events = prof.key_averages()
    print(events.table(sort_by="self_cpu_time_total", row_limit=args.rows))
    shares: dict[str, float] = {}
    for event in events:
        shares[category(event.key)] = shares.get(category(event.key), 0.0) + event.self_cpu_time_total / 1e3
    shares["Python, dispatch, allocation (wall - operators)"] = wall_ms - sum(shares.values())
    what = f"{args.search}, batch {args.batch}, {args.precision}"
    print(f"{what}: {plain_ms:.1f} ms without the profiler, {wall_ms:.1f} ms with it")
    for label, ms in sorted(shares.items(), key=lambda kv: -kv[1]):
        print(f"  {label:50s} {ms:8.1f} ms  {ms / wall_ms:6.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
