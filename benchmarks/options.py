"""Options that attnkit measured and did not ship: ``torch.compile`` and torchao int8 dynamic quantization.

    python benchmarks/options.py [--threads 2] [--reps 10] [--decode]

The seed-000 classifier of the classify suite (batch 32 x length 128, no padding), in float32: inference in eval
mode, and a training step (forward, cross-entropy, backward, Adam). Each option is timed in turns with plain eager
attnkit (``measure_interleaved``), after its compilation or quantization, which is reported separately. JSON lines
on stdout. docs/performance.md quotes one run.

- ``torch.compile`` (Inductor, default mode) of the whole classifier.
- torchao ``Int8DynamicActivationInt8WeightConfig`` (int8 weights, activations quantized per call), inference only;
  skipped with a note when torchao is not installed (``pip install torchao --no-deps``). attnkit's self-attention
  stacks W^Q, W^K, W^V into one matrix, which torchao's int8 tensors cannot be concatenated into, so for this probe
  the three projections run separately (``changes.separate_qkv``).

``--decode`` instead times the compiled decoding engine (``attnkit.inference.programs``: the static-shape step
compiled once per shape bucket) against the eager step on the decode suite's greedy and beam-4 calls (the ``small``
translator, 32 sources of 32 tokens, exactly 32 output tokens), and on 8 of those sources one per call with the
weights rounded to int8 (``--precision int8``): the first call (compilation) is reported separately, the outputs
are compared with eager's. (Before the static-shape step, this probe compiled ``Transformer.decode`` with
``dynamic=True``; docs/performance.md keeps those figures.) It also probes every linear layer of
decoding multiplying by an (in, out) copy of its weight (``torch.addmm`` with no transpose, the faster kernel at
one row: ``profile_decode.py --floor``) instead of ``F.linear``'s (out, in) weight, at batch 32 and one sentence
per call.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch
import torch.nn.functional as F

from attnkit.bench.classify import CONFIGS, make_batch
from attnkit.bench.timing import fixed_threads, measure_interleaved
from attnkit.bench.token_ids import PAD_ID
from attnkit.inference import prepare_for_inference
from attnkit.model.attention import MultiHeadAttention
from attnkit.model.build import build_classifier
from changes import separate_qkv  # benchmarks/changes.py (this script's directory is on sys.path)


def inference(model, ids):
    def call():
        with torch.inference_mode():
            return model(ids)

    return call


def training(model, ids, labels):
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)

    def step():
        loss = F.cross_entropy(model(ids), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def emit(**row) -> None:
    print(json.dumps(row), flush=True)


def compiled_decoding(threads: int, reps: int) -> None:
    """The compiled decoding engine (``Engine("compiled")``: the static-shape step compiled once per bucket), timed in
    turns with the eager step (the ``--decode`` probe): float32 at batch 32, and int8 weights one sentence per call
    (``--precision int8``'s case), each with the first call (compilation) and whether the tokens are eager's."""
    from attnkit.bench.decode import CONFIGS as DECODE_CONFIGS
    from attnkit.bench.decode import make_sources
    from attnkit.bench.decode_calls import SEARCHES, _attnkit, _search
    from attnkit.inference import quantize_for_inference
    from attnkit.inference.programs import Engine
    from attnkit.model.build import build_translator

    cfg = DECODE_CONFIGS["small"]
    eager, compiled = Engine("eager"), Engine("compiled")
    for precision, batch, per_call in (("fp32", 32, 0), ("int8", 8, 1)):
        src = make_sources(cfg, batch, 32, seed=0)
        with fixed_threads(threads):
            torch.manual_seed(0)
            model = prepare_for_inference(build_translator(cfg, pad_id=PAD_ID))
            if precision == "int8":
                quantize_for_inference(model)
            for search, beam in SEARCHES.items():
                calls = [_attnkit(model, src, beam, 32, cfg.max_len, per_call, engine) for engine in (eager, compiled)]
                first = timed(calls[1])
                parts = list(src.split(per_call)) if per_call else [src]
                same = all(
                    _search(model, p, beam, 32, cfg.max_len, eager)
                    == _search(model, p, beam, 32, cfg.max_len, compiled)
                    for p in parts
                )
                base, option = measure_interleaved(calls, warmup=1, reps=reps)
                emit(
                    option="the compiled decoding engine",
                    mode=f"decode {search}, {precision}, "
                    + ("one sentence per call" if per_call else f"batch {batch}"),
                    eager_ms=base.median_s * 1e3,
                    option_ms=option.median_s * 1e3,
                    speedup=base.median_s / option.median_s,
                    first_call_s=first,
                    same_tokens=same,
                    threads=threads,
                )


def transposed_linears(threads: int, reps: int) -> None:
    """Decoding with every ``F.linear`` of the decoder replaced by ``addmm`` on an (in, out) copy of the weight,
    made once per weight, timed in turns with eager decoding (the ``--decode`` probe)."""
    from attnkit.bench.decode import CONFIGS as DECODE_CONFIGS
    from attnkit.bench.decode import make_sources
    from attnkit.bench.decode_calls import SEARCHES, _attnkit
    from attnkit.model.build import build_translator

    linear = F.linear
    copies: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id(weight) -> (weight, its (in, out) copy)

    def by_copy(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if torch.is_grad_enabled():
            return linear(x, weight, bias)
        if id(weight) not in copies or copies[id(weight)][0] is not weight:
            copies[id(weight)] = (weight, weight.t().contiguous())
        rows = x.reshape(-1, x.size(-1))  # (N, in)
        out = rows @ copies[id(weight)][1] if bias is None else torch.addmm(bias, rows, copies[id(weight)][1])
        return out.view(*x.shape[:-1], out.size(-1))  # (..., out)

    def patched(call):
        def run() -> int:
            F.linear = by_copy
            try:
                return call()
            finally:
                F.linear = linear

        return run

    cfg = DECODE_CONFIGS["small"]
    with fixed_threads(threads):
        torch.manual_seed(0)
        model = prepare_for_inference(build_translator(cfg, pad_id=PAD_ID))
        for batch, per_call in ((32, 0), (4, 1)):
            src = make_sources(cfg, batch, 32, seed=0)
            for search, beam in SEARCHES.items():
                call = _attnkit(model, src, beam, 32, cfg.max_len, per_call=per_call)
                base, option = measure_interleaved([call, patched(call)], warmup=1, reps=reps)
                emit(
                    option="every decoder linear by an (in, out) weight copy",
                    mode=f"decode {search}, " + ("one sentence per call" if per_call else f"batch {batch}"),
                    eager_ms=base.median_s * 1e3,
                    option_ms=option.median_s * 1e3,
                    speedup=base.median_s / option.median_s,
                    threads=threads,
                )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--decode", action="store_true", help="probe torch.compile of the decoder step instead")
    args = parser.parse_args()
    if args.decode:
        compiled_decoding(args.threads, args.reps)
        transposed_linears(args.threads, args.reps)
        return 0
    cfg = CONFIGS["seed000"]
    ids, labels, _ = make_batch(cfg, 32, 128, padded=False, seed=0)

    with fixed_threads(args.threads):
        torch.manual_seed(0)
        eager = build_classifier(cfg, pad_id=PAD_ID)
        # torch.compile, inference then training (separate models: compiled graphs differ by mode).
        for mode in ("infer", "train"):
            torch.manual_seed(0)
            model = build_classifier(cfg, pad_id=PAD_ID)
            for m in (model, eager):
                if mode == "infer":
                    prepare_for_inference(m)  # as ClassifierRun runs it: eval, W^Q, W^K, W^V fused once
                else:
                    m.train()
            compiled = torch.compile(model)
            make = (lambda m: inference(m, ids)) if mode == "infer" else (lambda m: training(m, ids, labels))
            first = timed(make(compiled))
            base, option = measure_interleaved([make(eager), make(compiled)], warmup=2, reps=args.reps)
            emit(
                option="torch.compile",
                mode=mode,
                eager_ms=base.median_s * 1e3,
                option_ms=option.median_s * 1e3,
                speedup=base.median_s / option.median_s,
                first_call_s=first,
                threads=args.threads,
            )

        try:
            from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_
        except ImportError:
            print("torchao not installed: int8 dynamic quantization skipped", file=sys.stderr)
            return 0
        prepare_for_inference(eager)
        torch.manual_seed(0)
        model = build_classifier(cfg, pad_id=PAD_ID).eval()
        model.load_state_dict(eager.state_dict())
        for module in model.modules():
            if isinstance(module, MultiHeadAttention):
                module.project_qkv = separate_qkv.__get__(module)
        quantize_(model, Int8DynamicActivationInt8WeightConfig())
        with torch.inference_mode():
            diff = (model(ids) - eager(ids)).abs().max().item()
        base, option = measure_interleaved([inference(eager, ids), inference(model, ids)], warmup=2, reps=args.reps)
        emit(
            option="torchao int8 dynamic",
            mode="infer",
            eager_ms=base.median_s * 1e3,
            option_ms=option.median_s * 1e3,
            speedup=base.median_s / option.median_s,
            max_abs_logit_diff=diff,
            threads=args.threads,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
