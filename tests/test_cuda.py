"""On a CUDA GPU (skipped elsewhere, see the ``cuda`` marker in tests/conftest.py): the tiny classifier and translator
train on the GPU in fp32, bf16 and fp16; a GPU-trained run predicts the same on the CPU and a CPU-trained run the same
on the GPU; a run stopped and resumed on the GPU is bitwise the uninterrupted one (fp16's loss scale included)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from attnkit.data.batching import pad
from attnkit.devices import model_device, resolve_device

pytestmark = [pytest.mark.cuda, pytest.mark.usefixtures("one_thread")]
TEXTS = ["a good film", "a bad film", "the plot was dull and the acting awful"]
PRECISIONS = ["fp32", "bf16", "fp16"]


def cuda() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device())


def test_auto_and_cuda_resolve_to_the_gpu():
    assert resolve_device("auto") == resolve_device("cuda") == cuda()
    count = torch.cuda.device_count()
    with pytest.raises(Exception, match=rf"torch sees {count} CUDA device"):
        resolve_device(f"cuda:{count}")


@pytest.mark.parametrize(
    ("device", "precision"), [("cuda", p) for p in PRECISIONS] + [("cpu", "fp32")], ids=lambda v: str(v)
)
def test_a_classifier_trained_on_one_device_predicts_the_same_on_the_other(tmp_path, quietly, tiny, device, precision):
    from attnkit.tasks.classify import ClassifierRun

    out = tmp_path / "run"
    quietly(*tiny.classify_train(out, "epochs=3", f"precision={precision}"), "--device", device)
    config = json.loads((out / "config.json").read_text())
    assert (config["train"]["precision"], config["train"]["tf32"]) == (precision, True)
    on_gpu, on_cpu = ClassifierRun(out, device="cuda"), ClassifierRun(out, device="cpu")
    assert model_device(on_gpu.model) == cuda() and model_device(on_cpu.model) == torch.device("cpu")
    torch.testing.assert_close(on_gpu.logits(TEXTS), on_cpu.logits(TEXTS), atol=1e-4, rtol=1e-4)
    assert [p.label for p in on_gpu.predict(TEXTS)] == [p.label for p in on_cpu.predict(TEXTS)]
    # Inference in lower precision on the GPU stays close to float32
    for low in ("bf16", "fp16"):
        lowered = ClassifierRun(out, precision=low, device="cuda").logits(TEXTS)
        torch.testing.assert_close(lowered, on_cpu.logits(TEXTS), atol=0.05, rtol=0.05)


@pytest.mark.parametrize(
    ("device", "precision"), [("cuda", p) for p in PRECISIONS] + [("cpu", "fp32")], ids=lambda v: str(v)
)
def test_a_translator_trained_on_one_device_scores_the_same_on_the_other(tmp_path, quietly, tiny, device, precision):
    from attnkit.tasks.translate import TranslatorRun

    out = tmp_path / "run"
    quietly(*tiny.translate_train(tmp_path, out, "max_steps=6", f"precision={precision}"), "--device", device)
    assert json.loads((out / "config.json").read_text())["train"]["precision"] == precision
    on_gpu, on_cpu = TranslatorRun(out, device="cuda"), TranslatorRun(out, device="cpu")
    ids, _ = on_cpu.encode_sources(["a b c", "d e"])
    src = pad(ids, on_cpu.tokenizer.pad_id)  # (2, S)
    assert on_cpu.tokenizer.bos_id is not None
    tgt_in = torch.full((2, 3), on_cpu.tokenizer.bos_id)  # (2, 3)
    with torch.inference_mode():
        gpu_logits = on_gpu.model(src.to(cuda()), tgt_in.to(cuda())).cpu()
        cpu_logits = on_cpu.model(src, tgt_in)
    torch.testing.assert_close(gpu_logits, cpu_logits, atol=1e-4, rtol=1e-4)
    hyps, _ = on_gpu.translate(["a b c", "d e"], beam=2)
    assert len(hyps) == 2 and all(isinstance(h, str) for h in hyps)


def test_the_cli_runs_every_inference_command_on_the_gpu(tmp_path, quietly, tiny, capsys):
    from attnkit.cli import main

    quietly(*tiny.classify_train(tmp_path / "c", "epochs=2"), "--device", "cuda")
    for argv in (
        ["classify", "predict", "--model", tmp_path / "c", "--device", "cuda", "--precision", "bf16", *TEXTS],
        ["classify", "eval", "--model", tmp_path / "c", "--device", "cuda", "--data", tiny.SEED_TSV],
        ["embed", "--model", tmp_path / "c", "--device", "cuda", *TEXTS],
        ["params", "--task", "translate", "--preset", "base", "--device", "cuda", "--json"],
        ["plot", "attention", "--model", tmp_path / "c", "--device", "cuda", "--out", tmp_path / "a.svg", "good"],
    ):
        assert main([str(a) for a in argv]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out.splitlines()
    params = json.loads(out[-2])
    assert params["memory"]["device"] == str(cuda())
    assert params["memory"]["device_bytes"] == torch.cuda.get_device_properties(cuda()).total_memory


def test_serving_on_the_gpu_gives_the_cpus_probabilities(tmp_path, quietly, tiny):
    from attnkit.serving.models import load_model

    quietly(*tiny.classify_train(tmp_path / "c", "epochs=2"), "--device", "cpu")
    gpu, cpu = load_model(tmp_path / "c", "fp32", "cuda"), load_model(tmp_path / "c", "fp32", "cpu")
    seqs = [gpu.token_ids(t) for t in TEXTS]
    on_gpu, on_cpu = gpu.classify(seqs), cpu.classify(seqs)  # type: ignore[attr-defined]
    torch.testing.assert_close(torch.tensor(on_gpu), torch.tensor(on_cpu), atol=1e-5, rtol=1e-5)


# A run stopped at a step and resumed, against the same run left alone, in a fresh process each: cuBLAS needs its
# workspace setting before it starts to be deterministic, and deterministic algorithms make a kernel that is not
# an error rather than a flaky comparison.
RESUME = textwrap.dedent(
    """
    import sys
    import torch
    torch.use_deterministic_algorithms(True)
    from attnkit.config import task_configs
    from attnkit.data.readers.labeled import read_labeled
    from attnkit.data.readers.parallel import read_parallel_tsv
    from attnkit.tasks.classify import train_classifier
    from attnkit.tasks.translate import train_translator
    from attnkit.training.events import Step
    from attnkit.training.task import TrainContext

    task, data, out, precision, stop_at, device, *flags = sys.argv[1:]
    stop_at = int(stop_at)
    common = dict(d_model=16, n_heads=2, d_ff=32, n_layers=1, min_freq=1, precision=precision, checkpoint_every=2,
                  dropout=0.1, seed=3, cuda_graphs="cuda_graphs" in flags)
    if task == "classify":
        model_cfg, train_cfg = task_configs("classify", None, dict(common, epochs=3))
        train, run = read_labeled(data), train_classifier
    else:
        model_cfg, train_cfg = task_configs(
            "translate", None, dict(common, max_steps=10, tokenizer="word", valid_bleu=False, max_len=16, max_tokens=12)
        )
        train, run = read_parallel_tsv(data), train_translator

    def stop(event):
        if isinstance(event, Step) and event.step == stop_at:
            raise KeyboardInterrupt

    kwargs = dict(model_cfg=model_cfg, train_cfg=train_cfg, out_dir=out, context=TrainContext(torch.device(device)))
    if stop_at:
        try:
            run(train, None, on_event=stop, **kwargs)
            raise SystemExit("the run finished before the step it was to stop at")
        except KeyboardInterrupt:
            pass
        run(train, None, resume=True, **kwargs)
    else:
        run(train, None, **kwargs)
    """
)


def run_script(
    task: str, data: Path, out: Path, precision: str, stop_at: int, device: str = "cuda", graphs: bool = False
) -> None:
    env = {**os.environ, "CUBLAS_WORKSPACE_CONFIG": ":4096:8", "PYTHONPATH": os.pathsep.join(sys.path)}
    flags = ["cuda_graphs"] if graphs else []
    done = subprocess.run(
        [sys.executable, "-c", RESUME, task, str(data), str(out), precision, str(stop_at), device, *flags],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    ("task", "precision", "graphs"),
    [(t, p, False) for t in ("classify", "translate") for p in PRECISIONS] + [("translate", "bf16", True)],
    ids=lambda v: {True: "cuda_graphs", False: "eager"}.get(v, v) if isinstance(v, bool) else v,
)
def test_a_run_stopped_and_resumed_on_the_gpu_is_bitwise_the_uninterrupted_run(tmp_path, tiny, task, precision, graphs):
    """Also with ``cuda_graphs=true``: the resumed process records its graphs again and replays them with each
    batch's dropout seed (and makes its first update eagerly), bitwise what the uninterrupted one computed."""
    if task == "classify":
        data = tiny.SEED_TSV
    else:
        data = tmp_path / "pairs.tsv"
        header, body = tiny.PAIRS_TSV.split("\n", 1)
        data.write_text(header + "\n" + body * 3, encoding="utf-8")  # 12 pairs: several batches a step budget
    run_script(task, data, tmp_path / "alone", precision, 0, graphs=graphs)
    run_script(task, data, tmp_path / "stopped", precision, 5, graphs=graphs)  # after the save at step 4
    for name in ("model.safetensors", "train_state.safetensors", "metrics.jsonl"):
        assert (tmp_path / "alone" / name).read_bytes() == (tmp_path / "stopped" / name).read_bytes(), name
    if precision == "fp16":  # the loss scale travelled through the training state's JSON
        from safetensors import safe_open

        with safe_open(str(tmp_path / "alone" / "train_state.safetensors"), framework="pt") as f:
            meta = json.loads(f.metadata()["attnkit_train_state"])
        assert meta["grad_scaler"]["scale"] > 0


def test_fp16_overflow_is_skipped_by_the_scaler_not_reported_as_divergence():
    from torch import nn

    from attnkit.config import ClassifierTrainConfig
    from attnkit.training.step import train_step
    from attnkit.training.task import Batch, BatchLoss, TrainContext

    class Task:
        stats: tuple[str, ...] = ()

        def collate(self, indices: list[int]) -> Batch:
            return Batch((x[indices], y[indices]), len(indices))

        def loss(self, model, batch):
            x, y = batch.tensors
            return BatchLoss(torch.nn.functional.cross_entropy(model(x), y, reduction="sum"))

    torch.manual_seed(0)
    model = nn.Linear(4, 2).to(cuda())
    before = {k: v.clone() for k, v in model.state_dict().items()}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cuda", init_scale=2.0**24)  # float16 gradients overflow at 65504
    x, y = torch.randn(8, 4) * 100, torch.randint(0, 2, (8,))
    cfg = ClassifierTrainConfig(precision="fp16")
    batches = [(0, Task().collate(list(range(8))))]
    outcome = train_step(model, optimizer, Task(), batches, cfg, TrainContext(cuda()), scaler, step=1)
    # The loss is finite; its gradient, scaled by 2^24 and cast to float16 for the linear layer, is not.
    assert outcome.problem is None
    assert scaler.get_scale() == 2.0**23  # halved
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # the update was skipped


# ---------------------------------------------------------------------------------------------------------------
# A training step does not wait for the host (tests/training/test_step_costs.py counts the same on a CPU)


def _pairs(tmp_path: Path, n: int = 200) -> Path:
    """``n`` sentence pairs of 2-12 words (the target reversed): token-budget batches of varied, padded shapes."""
    import random

    r = random.Random(0)
    words = [f"w{i}" for i in range(60)]
    lines = ["source\ttarget"]
    for _ in range(n):
        s = r.choices(words, k=r.randint(2, 12))
        lines.append(" ".join(s) + "\t" + " ".join(reversed(s)))
    path = tmp_path / "pairs.tsv"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("precision", "graphs"), [(p, "false") for p in PRECISIONS] + [("bf16", "true")], ids=lambda v: str(v)
)
def test_a_training_step_synchronises_only_to_read_its_sums(tmp_path, quietly, tiny, monkeypatch, precision, graphs):
    """From the second step on (the first one starts the CUDA context, cuBLAS and the optimizer's state), every step
    runs under ``torch.cuda.set_sync_debug_mode("error")``, which raises at any call that makes the host wait for the
    GPU, except the step's one read of its loss, statistics and gradient norm (``step.read_step``). Replayed from
    CUDA graphs too (``cuda_graphs=true``), where recording a new shape's graph (or the update's) may wait, once."""
    from attnkit.training import graphs as graphs_module
    from attnkit.training import loop
    from attnkit.training import step as step_module

    real_step, real_read = loop.train_step, step_module.read_step
    steps: list[int] = []

    def strict_step(*args, **kwargs):
        steps.append(kwargs["step"])
        if kwargs["step"] == 1:
            return real_step(*args, **kwargs)
        torch.cuda.set_sync_debug_mode("error")
        try:
            return real_step(*args, **kwargs)
        finally:
            torch.cuda.set_sync_debug_mode("default")

    def allowed_read(values: torch.Tensor) -> list[float]:
        mode = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode("default")
        try:
            return real_read(values)
        finally:
            torch.cuda.set_sync_debug_mode(mode)

    def allowed(record):
        def recording(*args, **kwargs):
            mode = torch.cuda.get_sync_debug_mode()
            torch.cuda.set_sync_debug_mode("default")
            try:
                return record(*args, **kwargs)
            finally:
                torch.cuda.set_sync_debug_mode(mode)

        return recording

    monkeypatch.setattr(loop, "train_step", strict_step)
    monkeypatch.setattr(step_module, "read_step", allowed_read)
    for name in ("_record", "_record_update"):
        monkeypatch.setattr(graphs_module.GraphedStep, name, allowed(getattr(graphs_module.GraphedStep, name)))
    out = tmp_path / "run"
    command = [
        "translate", "train", "--train", str(_pairs(tmp_path)), "--out", str(out), "--quiet", "--device", "cuda",
        "--set", *tiny.SET, "tokenizer=word", "valid_bleu=false", "max_tokens=256", "max_steps=12",
        "checkpoint_every=100", f"precision={precision}", f"cuda_graphs={graphs}",
    ]  # fmt: skip
    quietly(*command)
    assert steps == list(range(1, 13))
    quietly(*tiny.classify_train(tmp_path / "c", "epochs=2", f"precision={precision}"), "--device", "cuda")


def test_the_compiled_step_computes_the_eager_steps_loss_on_the_gpu(tmp_path, quietly, tiny):
    """``compile=true`` (Inductor's kernels, one graph: a graph break raises) trains to the eager run's losses, step
    by step, on token-budget batches of varied shapes (float32, no TF32, no dropout: the same arithmetic)."""
    losses = {}
    for compile_ in (False, True):
        out = tmp_path / f"compile-{compile_}"
        command = [
            "translate", "train", "--train", str(_pairs(tmp_path, 60)), "--out", str(out), "--quiet", "--device",
            "cuda", "--set", *tiny.SET, "tokenizer=word", "valid_bleu=false", "max_tokens=256", "max_steps=8",
            "dropout=0", "tf32=false", f"compile={str(compile_).lower()}", "cuda_graphs=false",
        ]  # fmt: skip
        quietly(*command)
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        losses[compile_] = [row["loss"] for row in rows if "loss" in row]
    assert len(losses[True]) == 8
    assert losses[True] == pytest.approx(losses[False], rel=1e-4)


def test_steps_replayed_from_cuda_graphs_train_as_the_eager_steps(tmp_path, quietly, tiny):
    """``cuda_graphs=true`` (each batch shape's step recorded once, replayed after; ``training.graphs``) trains to
    the eager run's losses, step by step, on token-budget batches of varied shapes (float32, no TF32, no dropout:
    the same arithmetic up to the padding of fixed-shape batches), compiled or not; with dropout, in bfloat16, it
    trains (resumed: ``test_a_run_stopped_and_resumed_on_the_gpu_is_bitwise_the_uninterrupted_run``)."""

    def losses(out: Path, *settings: str) -> list[float]:
        command = [
            "translate", "train", "--train", str(_pairs(tmp_path, 60)), "--out", str(out), "--quiet", "--device",
            "cuda", "--set", *tiny.SET, "tokenizer=word", "valid_bleu=false", "max_tokens=256", "tf32=false",
            "checkpoint_every=4", *settings,
        ]  # fmt: skip
        quietly(*command)
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        return [row["loss"] for row in rows if "loss" in row]

    eager = losses(tmp_path / "eager", "max_steps=10", "dropout=0", "cuda_graphs=false")
    for compile_ in ("false", "true"):
        graphed = losses(
            tmp_path / f"graphs-{compile_}", "max_steps=10", "dropout=0", "cuda_graphs=true", f"compile={compile_}"
        )
        assert graphed == pytest.approx(eager, rel=1e-4)
    bf16 = losses(tmp_path / "bf16", "max_steps=10", "precision=bf16", "cuda_graphs=true")
    assert len(bf16) == 10 and all(math.isfinite(x) for x in bf16)
