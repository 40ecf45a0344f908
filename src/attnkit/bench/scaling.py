"""How one encoder layer scales with sequence length: time and peak memory, inference and training.

One post-LN encoder layer (d_model 256, 4 heads, d_ff 1024, §3.1) on one sequence of length L = 128 .. 8,192;
self-attention is O(L^2) in time, and in memory unless the attention kernel is fused. Inference = forward in eval
mode under ``torch.inference_mode``; a training step = forward + backward of mean(y^2) + Adam update, with dropout
0.1 (variant "dropout=0.1") and without ("dropout=0"). attnkit drops out sub-layer outputs only (§5.4) and keeps the
fused ``scaled_dot_product_attention``; ``nn.TransformerEncoderLayer`` also drops out the attention weights, which
forces the explicit (L x L) path while training.

Every measurement runs in a fresh Python process (``python -m attnkit.bench.scaling <json>``), so that memory freed
and cached by an earlier measurement cannot hide the next one's peak: peak_mib is the resident memory the calls add
above the process's resident size just before them (``memory.PeakRSS``), which includes activations, gradients,
optimizer state and allocator overhead, but not the weights and input that exist before the calls. On a GPU
(``device``) the layer runs there and peak_mib is the CUDA allocator's peak above what was allocated before the calls
(``gpu.PeakCUDA``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator

import torch

from attnkit.bench.gpu import PeakCUDA, synchronizer
from attnkit.bench.memory import PeakRSS
from attnkit.bench.results import Result
from attnkit.bench.timing import measure

LENGTHS = (128, 256, 512, 1024, 2048, 4096, 8192)
IMPLS = ("attnkit", "torch.nn")
LAYER = dict(d_model=256, n_heads=4, d_ff=1024)


def _cases(impls, dropouts) -> Iterator[tuple[str, str, float]]:
    for impl in impls:
        yield impl, "infer", 0.0
        for p in dropouts:
            yield impl, "train", p


def iter_results(
    *,
    quick: bool = False,
    threads: int = 2,
    lengths: tuple[int, ...] | None = None,
    impls: tuple[str, ...] | None = None,
    dropouts: tuple[float, ...] = (0.1, 0.0),
    layer: dict | None = None,
    warmup: int | None = None,
    reps: int | None = None,
    budget_s: float = 25.0,
    seed: int = 0,
    device: torch.device | None = None,
) -> Iterator[Result]:
    """Yield one result per (length, implementation, mode, dropout), each measured in a fresh process.
    ``quick``: lengths 128 and 256, 1 warm-up, 2 timed calls."""
    lengths = lengths or ((128, 256) if quick else LENGTHS)
    impls = impls or IMPLS
    layer = {**LAYER, **(layer or {})}
    warmup = warmup if warmup is not None else 1
    reps = reps if reps is not None else (2 if quick else 5)
    config = f"layer-d{layer['d_model']}"
    for length in lengths:
        for impl, mode, dropout in _cases(impls, dropouts):
            job = dict(
                impl=impl,
                mode=mode,
                dropout=dropout,
                length=length,
                layer=layer,
                threads=threads,
                warmup=warmup,
                reps=reps,
                budget_s=budget_s,
                seed=seed,
                device=str(device or "cpu"),
            )
            out = _run_child(job)
            yield Result(
                suite="scaling",
                impl=impl,
                config=config,
                seq_len=length,
                search=None,
                dtype="float32",
                mode=mode,
                variant=f"dropout={dropout:g}" if mode == "train" else None,
                batch=1,
                ms=out["ms"],
                peak_mib=out["peak_mib"],
                threads=threads,
                reps=out["reps"],
            )


def run(*, quick: bool = False, **kwargs) -> list[Result]:
    """All results of ``iter_results`` (same arguments) as a list."""
    return list(iter_results(quick=quick, **kwargs))


def _run_child(job: dict) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(job["threads"])}
    proc = subprocess.run(
        [sys.executable, "-m", "attnkit.bench.scaling", json.dumps(job)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"scaling measurement {job} failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------------------------
# The child process: one measurement


def _layer(impl: str, dropout: float, layer: dict) -> torch.nn.Module:
    from attnkit.config import TransformerConfig
    from attnkit.interop.torch_nn import encoder_layer_to_torch
    from attnkit.model.build import encoder_layer

    ours = encoder_layer(
        TransformerConfig(d_model=layer["d_model"], n_heads=layer["n_heads"], d_ff=layer["d_ff"], dropout=dropout)
    )
    if impl == "attnkit":
        return ours
    if impl == "torch.nn":
        ref = torch.nn.TransformerEncoderLayer(
            layer["d_model"], layer["n_heads"], layer["d_ff"], dropout=dropout, batch_first=True
        )
        encoder_layer_to_torch(ours, ref)
        return ref
    raise ValueError(f"unknown implementation {impl!r}; expected one of {IMPLS}")


def _measure(job: dict) -> dict:
    torch.set_num_threads(job["threads"])
    torch.manual_seed(job["seed"])
    device = torch.device(job.get("device", "cpu"))
    module = _layer(job["impl"], job["dropout"], job["layer"]).to(device)
    x = torch.randn(1, job["length"], job["layer"]["d_model"], device=device)  # (1, L, D)
    is_attnkit = job["impl"] == "attnkit"

    def forward():
        out = module(x)
        return out[0] if is_attnkit else out  # attnkit layers return (output, attention weights or None)

    if job["mode"] == "infer":
        from attnkit.inference import prepare_for_inference

        prepare_for_inference(module)  # eval mode; attnkit's W^Q, W^K, W^V fused once, as inference runs do

        def call():
            with torch.inference_mode():
                forward()
    else:
        module.train()
        optimizer = torch.optim.Adam(module.parameters(), lr=1e-4)

        def call():
            forward().square().mean().backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    with PeakCUDA(device) if device.type == "cuda" else PeakRSS() as peak:
        timing = measure(
            call, warmup=job["warmup"], reps=job["reps"], budget_s=job["budget_s"], sync=synchronizer(device)
        )
    return dict(ms=timing.median_s * 1e3, peak_mib=peak.peak_mib, reps=len(timing.times_s))


if __name__ == "__main__":
    print(json.dumps(_measure(json.loads(sys.argv[1]))))
