"""What a CPU can see of a GPU training step: ATen calls (each a kernel launch on a GPU) and synchronising calls (each
a wait for the GPU) per optimizer step, counted with ``attnkit.bench.dispatch.CallCount``.

    python benchmarks/step_calls.py [--as-gpu] [--steps 4]

Two tables. ``translate train`` (a tiny model, d_model 64, one layer, on a synthetic corpus of 300 word types) at
4,096 and 32,768 tokens a batch: the calls of ``2 x steps`` steps minus those of ``steps`` steps, over ``steps``, so
that what a run does once (the tokenizer, building the model, the final save) cancels out. Then ``bench train``'s
step at the small preset, attnkit against Hugging Face Marian at the same shapes (where transformers is installed).
``--as-gpu`` takes the GPU's choices on the CPU (the loss's fused pass instead of cache-sized blocks, the padding
computed instead of packed; ``losses.blocked_loss``, ``transformer.skips_padding``). Beyond the synchronising calls
counted, the loop reads the device once a step (``training.step.read_step``, a ``.tolist()`` that dispatches
nothing on a CPU).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import tempfile
from pathlib import Path

import torch

from attnkit.bench import peers, train, train_inputs, train_steps
from attnkit.bench.dispatch import CallCount
from attnkit.bench.token_ids import PAD_ID
from attnkit.config import task_configs
from attnkit.data.readers.parallel import Pair
from attnkit.model import transformer
from attnkit.model.build import build_translator
from attnkit.tasks.translate import train_translator
from attnkit.training import losses


def translate_train(data: list[Pair], tokens: int, steps: int, work: Path) -> CallCount:
    """Everything ``train_translator`` dispatches in ``steps`` steps of ``tokens``-token batches."""
    overrides = dict(d_model=64, n_heads=2, d_ff=128, n_layers=1, min_freq=1, tokenizer="word", valid_bleu=False)
    overrides.update(max_steps=steps, max_tokens=tokens, checkpoint_every=10**6)
    model_cfg, train_cfg = task_configs("translate", None, overrides)
    out = work / f"run-{tokens}-{steps}"
    with contextlib.redirect_stderr(io.StringIO()), CallCount() as count:
        train_translator(data, None, model_cfg=model_cfg, train_cfg=train_cfg, out_dir=out)
    return count


def bench_step(tokens: int) -> dict[str, CallCount]:
    """One step of ``bench train``'s closures (after a first step that makes the optimizer's state), per
    implementation, at the small preset and length 32."""
    cfg = train.CONFIGS["small"]
    src, tgt_in, tgt_out = train_inputs.make_batch(cfg, 32, tokens, seed=0)
    ours = build_translator(cfg, pad_id=PAD_ID)
    counts = {}
    for impl in [i for i in ("attnkit", "transformers") if i != "transformers" or peers.available(i)]:
        torch.manual_seed(0)
        model, forward = train_steps.forward_fn(impl, cfg, ours)
        step = train_steps.training_step(model, forward, src, tgt_in, tgt_out)
        step()
        with CallCount() as count:
            step()
        counts[impl] = count
    return counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--as-gpu", action="store_true", help="the GPU's per-device choices, taken on the CPU")
    ap.add_argument("--steps", type=int, default=4)
    a = ap.parse_args()
    torch.set_num_threads(1)
    if a.as_gpu:
        losses.blocked_loss = lambda logits: False
        transformer.skips_padding = lambda device: False
    print(f"choices: {'the GPU' if a.as_gpu else 'the CPU'}'s")
    data = train_inputs.reversal_pairs(12000)
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for tokens in (4096, 32768):
            short, long = (translate_train(data, tokens, n, Path(work)) for n in (a.steps, 2 * a.steps))
            calls = (long.calls - short.calls) / a.steps
            syncs = {k: (long.syncs[k] - short.syncs[k]) / a.steps for k in long.syncs}
            rows.append((tokens, calls, syncs))
            shown = ", ".join(f"{k} {v:.1f}" for k, v in syncs.items() if v) or "none"
            print(
                f"translate train, {tokens:6d} tokens a batch: {calls:7.0f} ATen calls a step; synchronising: {shown}"
            )
    print(f"  32,768 / 4,096 tokens: {rows[1][1] / rows[0][1]:.2f}x the calls (the goal: at most 1.1x)")
    for tokens in (4096, 32768):
        counts = bench_step(tokens)
        line = ", ".join(f"{impl} {count.calls}" for impl, count in counts.items())
        ratio = (
            f"; attnkit / Marian {counts['attnkit'].calls / counts['transformers'].calls:.2f}x"
            if len(counts) > 1
            else ""
        )
        print(f"bench train step, small, {tokens:6d} tokens: ATen calls {line}{ratio}")


if __name__ == "__main__":
    main()
