"""``attnkit bench --device cuda``: what can be checked without a GPU (the clock waits for the device, the data-sheet
table, the device reaches every suite), and, marked ``cuda``, every suite run on a GPU (skipped where there is none)."""

from __future__ import annotations

import json
import types

import pytest
import torch

import attnkit.bench
from attnkit.bench import classify, decode, gpu, machine, scaling, timing, train
from attnkit.config import ClassifierConfig, TranslatorConfig
from attnkit.inference.programs import Engine

TINY = TranslatorConfig(vocab_size=120, d_model=32, n_heads=2, d_ff=64, n_layers=2, max_len=48)
TINY_CLS = ClassifierConfig(vocab_size=120, d_model=32, n_heads=2, d_ff=64, n_layers=2, max_len=32, n_classes=2)


@pytest.mark.parametrize(
    ("name", "tflops"),
    [
        ("NVIDIA H100 80GB HBM3", 989.0),  # SXM5
        ("NVIDIA H100 PCIe", 756.0),
        ("NVIDIA H100 NVL", 835.0),
        ("NVIDIA H200", 989.0),
        ("NVIDIA A100-SXM4-80GB", 312.0),
        ("NVIDIA L4", 121.0),
        ("NVIDIA GeForce RTX 4090", None),
    ],
)
def test_the_data_sheet_table_names_the_dense_bf16_peak(name, tflops):
    assert gpu.datasheet_bf16_tflops(name) == tflops


@pytest.mark.parametrize(
    ("name", "float32", "tf32"),
    [("NVIDIA H100 80GB HBM3", 67.0, 494.5), ("NVIDIA H200", 67.0, 494.5), ("NVIDIA A100-SXM4-80GB", 19.5, 156.0)],
)
def test_the_data_sheet_table_names_the_float32_and_tf32_peaks(name, float32, tf32):
    """float32 rows are measured against the float32 peak and TF32 rows against TF32's (dense: half the sparse
    figure NVIDIA prints), not against bfloat16's."""
    assert (gpu.datasheet_tflops(name, "float32"), gpu.datasheet_tflops(name, "tf32")) == (float32, tf32)
    assert all(set(peaks) == set(gpu.DTYPES) for _, peaks in gpu.DATASHEET_TFLOPS)


def test_every_timed_call_waits_for_the_device_before_and_after():
    """Kernels are queued, not finished, when a GPU call returns: the clock must be read after a sync on both sides,
    or a step would be timed by how fast it is queued."""
    events: list[str] = []
    timing.measure(lambda: events.append("call"), warmup=1, reps=2, sync=lambda: events.append("sync"))
    assert events == ["sync", "call", "sync"] * 3
    events.clear()
    timing.measure_interleaved(
        [lambda: events.append("a"), lambda: events.append("b")], warmup=0, reps=1, sync=lambda: events.append("s")
    )
    assert events == ["s", "a", "s", "s", "b", "s"]
    assert gpu.synchronizer(torch.device("cpu")) is None


def test_the_device_reaches_the_suite(monkeypatch):
    seen = {}
    fake = types.SimpleNamespace(IMPLS=("attnkit",), iter_results=lambda **kwargs: seen.update(kwargs) or iter(()))
    monkeypatch.setattr(attnkit.bench, "suite_module", lambda name: fake)
    list(attnkit.bench.iter_suite("train", quick=True, device=torch.device("cpu")))
    assert seen == {"quick": True, "threads": 2, "device": torch.device("cpu")}


def test_the_machine_line_names_the_gpu():
    info = machine.machine_info(threads=1)
    info["gpu"] = {"name": "NVIDIA H100 80GB HBM3", "capability": "9.0", "memory_gib": 79.1, "cuda": "12.8"}
    assert machine.describe_machine(info).startswith("NVIDIA H100 80GB HBM3 (compute 9.0, 79.1 GiB, CUDA 12.8); ")


# ---------------------------------------------------------------------------------------------------------------
# On a GPU


def _cuda() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device())


def _references(results) -> dict[str, float]:
    """The GFLOP/s MFU is relative to, by arithmetic: the data-sheet rows, or the measured ceilings for an unknown
    GPU."""
    sheet = {r.dtype: r.gflop_per_s for r in results if r.impl == "data sheet"}
    return sheet or {r.dtype: r.gflop_per_s for r in results if r.impl == "matmul"}


@pytest.mark.cuda
def test_train_suite_on_a_gpu_reports_mfu_against_the_peak_of_each_rows_arithmetic():
    """float32, TF32 and bfloat16 rows, at fixed shapes and on token-budget batches, attnkit's also replayed from
    CUDA graphs; a float32 row's MFU is relative to the float32 peak, never to bfloat16's."""
    results = train.run(
        quick=True, threads=1, configs={"tiny": TINY}, lengths=(8,), tokens_per_batch=256, device=_cuda()
    )
    references = _references(results)
    assert set(references) == {"float32", "tf32", "bfloat16"}
    assert references["float32"] < references["tf32"] < references["bfloat16"]
    rows = [r for r in results if r.impl not in ("matmul", "data sheet")]
    assert {(r.dtype, r.variant) for r in rows} == {
        (dtype, variant) for dtype in ("float32", "tf32", "bfloat16") for variant in (None, "token-budget")
    }
    for r in rows:
        assert r.mfu is not None and r.gflop_per_s is not None
        assert r.mfu == pytest.approx(r.gflop_per_s / references[r.dtype], rel=1e-3) and 0 < r.mfu < 1
    # attnkit's step replayed from CUDA graphs, as translate train runs it, in every precision and variant, its first
    # call (a pass recording each shape) timed apart
    graphed = [r for r in rows if r.impl == "attnkit cuda-graphs"]
    assert {(r.dtype, r.variant) for r in graphed} == {(r.dtype, r.variant) for r in rows}
    assert all((r.first_call_s or 0) > 0 for r in graphed)


@pytest.mark.cuda
def test_classify_suite_on_a_gpu():
    results = classify.run(quick=True, threads=1, configs={"tiny": TINY_CLS}, batch=4, length=16, device=_cuda())
    assert {(r.impl, r.mode, r.dtype) for r in results} >= {
        ("attnkit", "train", "float32"),
        ("attnkit", "infer", "bfloat16"),
        ("torch.nn", "infer", "float32"),
    }
    assert all((r.sentences_per_s or 0) > 0 for r in results if r.impl not in ("matmul", "data sheet"))


@pytest.mark.cuda
def test_decode_suite_on_a_gpu_returns_every_token():
    # every implementation is checked to return exactly batch x steps tokens before it is timed (decode.iter_results)
    impls = ("attnkit", "torch.nn", "transformers")
    engines = (Engine("eager"), Engine("cuda-graph"))  # the compiled graphs too would compile for seconds a bucket
    results = decode.run(
        quick=True,
        threads=1,
        configs={"tiny": TINY},
        batch=3,
        src_len=5,
        impls=impls,
        device=_cuda(),
        attnkit_engines=engines,
    )
    assert {r.impl for r in results} >= {"attnkit", "attnkit cuda-graph", "torch.nn (no cache)"}


@pytest.mark.cuda
def test_scaling_suite_on_a_gpu_measures_cuda_memory():
    results = scaling.run(
        quick=True,
        threads=1,
        lengths=(64,),
        dropouts=(0.1,),
        layer=dict(d_model=16, n_heads=2, d_ff=32),
        device=_cuda(),
    )
    assert all(r.peak_mib is not None and r.peak_mib > 0 for r in results if r.mode == "train")


@pytest.mark.cuda
def test_bench_command_on_cuda_records_the_gpu(tmp_path, monkeypatch):
    from attnkit.cli import main

    monkeypatch.setattr(train, "CONFIGS", {"small": TINY})
    out = tmp_path / "train.json"
    assert main(["bench", "train", "--quick", "--device", "cuda", "--impl", "attnkit", "--json", str(out)]) == 0
    document = json.loads(out.read_text())
    assert document["machine"]["gpu"]["name"] == torch.cuda.get_device_name()
    assert any(r["mfu"] for r in document["results"] if r["impl"] == "attnkit")
