"""What three of attnkit's choices are worth, measured by switching each off on the same model.

    python benchmarks/changes.py [--threads 2] [--reps 6]

Training: the train suite's ``small`` encoder-decoder (dropout 0.1, 4,096 source + target tokens per batch, lengths
32 and 128) and the scaling suite's encoder layer at length 4,096, one training step each (forward, loss, backward,
Adam), in three variants of the same weights:

- ``shipped``: attnkit as it is: the fused ``scaled_dot_product_attention`` and one stacked W^Q W^K W^V GEMM.
- ``explicit attention``: every attention module on the explicit path (softmax(QK^T / sqrt(d_k)) materialised,
  as when the weights are asked for, or as ``nn.MultiheadAttention`` runs when attention weights are dropped out).
- ``three QKV GEMMs``: Q, K and V projected separately, as before the fused projection.

Decoding: the decode suite's attnkit call (``small``, 32 sources of 32 tokens, exactly 32 output tokens, greedy
and beam 4), shipped and with one choice switched off:

- ``cross K/V every step``: cross-attention projecting the encoder output to keys and values again at every step,
  as a decoder without a static cross-attention cache does.

``--decode`` runs the decoding cases only.

Variants of one case are timed in turns (``measure_interleaved``). JSON lines on stdout, one per (case, variant),
with the time and the ratio to ``shipped``. docs/performance.md quotes one run.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable

import torch
from torch import Tensor

from attnkit.bench import decode, decode_calls
from attnkit.bench.timing import fixed_threads, measure_interleaved
from attnkit.bench.token_ids import PAD_ID
from attnkit.bench.train import CONFIGS
from attnkit.bench.train_inputs import make_batch
from attnkit.bench.train_steps import batch_loss
from attnkit.config import TransformerConfig
from attnkit.inference import prepare_for_inference
from attnkit.model.attention import KVCache, MultiHeadAttention
from attnkit.model.build import build_translator, encoder_layer


def separate_qkv(self: MultiHeadAttention, x: Tensor) -> Tensor:
    """Q, K, V by three GEMMs: a drop-in for ``MultiHeadAttention.project_qkv``."""
    return torch.cat([proj(x) for proj in (self.q_proj, self.k_proj, self.v_proj)], dim=-1)  # (..., 3 H Dh)


def explicit_attention(name: str, module: MultiHeadAttention) -> None:
    """Route every attention module through the explicit path (its weights are computed and dropped)."""
    forward = module.forward
    module.forward = lambda *args, **kwargs: forward(*args, **{**kwargs, "need_weights": True})


def three_gemms(name: str, module: MultiHeadAttention) -> None:
    """Project Q, K and V of every attention module by three GEMMs."""
    module.project_qkv = separate_qkv.__get__(module)


def cross_kv_every_step(name: str, module: MultiHeadAttention) -> None:
    """Make cross-attention ignore its static cache: the cache remembers the encoder output, and every step
    projects it to keys and values again."""
    if not name.endswith("cross_attn"):
        return
    project_kv, forward = module.project_kv, module.forward

    def remembering(memory: Tensor) -> KVCache:
        kv = project_kv(memory)
        kv.memory = memory  # type: ignore[attr-defined]
        return kv

    def uncached(query, key_value=None, *args, **kwargs):
        memory = getattr(key_value, "memory", None)
        return forward(query, key_value if memory is None else memory, *args, **kwargs)

    module.project_kv, module.forward = remembering, uncached


VARIANTS = {"shipped": None, "explicit attention": explicit_attention, "three QKV GEMMs": three_gemms}
DECODE_VARIANTS = {"shipped": None, "cross K/V every step": cross_kv_every_step}


def variant_models(build, variants=VARIANTS) -> list[torch.nn.Module]:
    """One model per variant, each built by ``build()`` under the same seed (so with the same weights), with the
    variant's switch applied to each of its attention modules (by qualified name and module)."""
    models = []
    for switch in variants.values():
        torch.manual_seed(0)
        model = build().train()
        for name, module in model.named_modules():
            if switch is not None and isinstance(module, MultiHeadAttention):
                switch(name, module)
        models.append(model)
    return models


def step_fn(model: torch.nn.Module, loss_fn: Callable[[torch.nn.Module], Tensor]) -> Callable[[], None]:
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)

    def step() -> None:
        loss_fn(model).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def cases():
    """(name, build, loss) for each measured case."""
    cfg = CONFIGS["small"]
    for length in (32, 128):
        src, tgt_in, tgt_out = make_batch(cfg, length, 4096, seed=0)
        yield (
            f"train small L={length}",
            lambda: build_translator(cfg, pad_id=PAD_ID),
            lambda m, s=src, ti=tgt_in, to=tgt_out: batch_loss(m(s, ti), to),
        )
    x = torch.randn(1, 4096, 256)  # (1, L, D)
    layer_cfg = TransformerConfig(d_model=256, n_heads=4, d_ff=1024, dropout=0.1)
    yield ("encoder layer L=4096", lambda: encoder_layer(layer_cfg), lambda m: m(x)[0].square().mean())


def decode_cases():
    """(name, build, call maker) for greedy and beam 4 on the decode suite's inputs."""
    cfg = decode.CONFIGS["small"]
    src = decode.make_sources(cfg, 32, 32, seed=0)  # (B, S)
    for search, beam in decode_calls.SEARCHES.items():
        yield (
            search,
            lambda: build_translator(cfg, pad_id=PAD_ID),
            lambda m, b=beam: decode_calls._attnkit(prepare_for_inference(m), src, b, 32, cfg.max_len),
        )


def decode_variant_calls(build, make_call, search: str) -> tuple[dict, list]:
    """The variants of one decoding case and their calls (``search`` names the case; every variant is per module)."""
    return dict(DECODE_VARIANTS), [make_call(model) for model in variant_models(build, DECODE_VARIANTS)]


def emit(case: str, variants: dict, timings: list, threads: int) -> None:
    """One JSON line per variant; ``slowdown`` is its time over the shipped variant's (the first)."""
    for variant, timing in zip(variants, timings):
        print(
            json.dumps(
                dict(
                    case=case,
                    variant=variant,
                    ms=round(timing.median_s * 1e3, 1),
                    slowdown=round(timing.median_s / timings[0].median_s, 3),
                    reps=len(timing.times_s),
                    threads=threads,
                )
            ),
            flush=True,
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=6)
    parser.add_argument("--decode", action="store_true", help="the decoding cases only")
    args = parser.parse_args()
    with fixed_threads(args.threads):
        for name, build, loss_fn in () if args.decode else cases():
            steps = [step_fn(model, loss_fn) for model in variant_models(build)]
            timings = measure_interleaved(steps, warmup=2, reps=args.reps, budget_s=60.0)
            emit(name, VARIANTS, timings, args.threads)
        for search, build, make_call in decode_cases():
            variants, calls = decode_variant_calls(build, make_call, search)
            timings = measure_interleaved(calls, warmup=1, reps=args.reps, budget_s=60.0)
            emit(f"decode small {search}", variants, timings, args.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
