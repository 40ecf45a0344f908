"""Devices and precision on a machine without a GPU: ``--device`` resolved and checked, every model command taking
``--device cpu`` and ``--device auto`` (the same results) and refusing an absent device with one error line, weights
loaded onto the device, fp16 refused off CUDA, the precision recorded in the run, the fp16 loss scaler (its
arithmetic, its overflow handling and its state in the training state). The GPU side is tests/test_cuda.py."""

from __future__ import annotations

import io
import json
import math
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnkit.cli import main
from attnkit.config import ClassifierTrainConfig
from attnkit.devices import model_device, resolve_device, rng_state, set_rng_state
from attnkit.errors import InputError
from attnkit.runs import load_run
from attnkit.training.precision import autocast, check_precision, grad_scaler
from attnkit.training.state import FitState, load_fit_state, save_fit_state
from attnkit.training.step import train_step
from attnkit.training.task import Batch, BatchLoss, TrainContext

pytestmark = pytest.mark.usefixtures("one_thread")
NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error for an absent GPU")


def cli(capsys, *argv: object, stdin: str | None = None) -> tuple[int, str, str]:
    if stdin is not None:
        sys.stdin = io.StringIO(stdin)
    try:
        code = main([str(a) for a in argv])
    finally:
        sys.stdin = sys.__stdin__
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def no_gpu(monkeypatch):
    """This machine as torch would see it without CUDA or MPS, whatever it has."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)


# ---------------------------------------------------------------------------------------------------------------
# resolve_device


def test_cpu_and_auto_without_a_gpu_are_the_cpu(no_gpu):
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_device(" CPU ") == torch.device("cpu")


def test_auto_prefers_cuda_then_mps(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert resolve_device("auto") == torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert resolve_device("auto") == torch.device("mps", 0)


@pytest.mark.parametrize("spec", ["cuda", "cuda:0", "cuda:3"])
def test_cuda_without_a_gpu_is_an_error_saying_what_torch_sees(no_gpu, spec):
    with pytest.raises(InputError, match=rf"^--device {spec}: no CUDA device is visible to torch .*use --device cpu"):
        resolve_device(spec)


def test_a_gpu_index_past_the_count_names_the_count(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert resolve_device("cuda:0") == torch.device("cuda", 0)
    with pytest.raises(InputError, match=r"^--device cuda:3: torch sees 1 CUDA device \(cuda:0\)"):
        resolve_device("cuda:3")


def test_mps_absent_is_an_error(no_gpu):
    with pytest.raises(InputError, match=r"^--device mps: no Apple MPS device is visible"):
        resolve_device("mps")


@pytest.mark.parametrize("spec", ["gpu", "cpu:1", "mps:1", "cuda:x", "cuda:", "", "auto:0"])
def test_a_bad_spec_lists_the_choices(spec):
    with pytest.raises(InputError, match=r"expected auto, cpu, cuda, cuda:N or mps$"):
        resolve_device(spec)


def test_model_device_and_rng_state_round_trip():
    assert model_device(nn.ReLU()) == torch.device("cpu")  # no parameters: the CPU
    assert model_device(nn.Linear(2, 2)) == torch.device("cpu")
    state = rng_state(torch.device("cpu"))
    first = torch.rand(3)
    set_rng_state(state, torch.device("cpu"))
    assert torch.equal(torch.rand(3), first)


# ---------------------------------------------------------------------------------------------------------------
# Precision


def test_fp16_is_refused_off_cuda_naming_the_key_and_what_to_use():
    with pytest.raises(InputError, match=r"^config key precision=fp16 runs on CUDA devices only; on cpu use bf16"):
        check_precision("fp16", torch.device("cpu"))
    with pytest.raises(InputError, match=r"^config key precision='fp8'; expected one of fp32, bf16, fp16"):
        check_precision("fp8", torch.device("cpu"))
    check_precision("bf16", torch.device("cpu"))  # runs on every CPU (slowly without native bfloat16)
    assert grad_scaler("fp32", torch.device("cpu")) is None and grad_scaler("bf16", torch.device("cpu")) is None


def test_autocast_follows_the_device_and_the_precision():
    layer = nn.Linear(4, 4)
    with autocast("bf16", torch.device("cpu")):
        assert layer(torch.randn(2, 4)).dtype == torch.bfloat16
    with autocast("fp32", torch.device("cpu")):
        assert layer(torch.randn(2, 4)).dtype == torch.float32


def test_precision_choices_in_the_train_configs():
    assert ClassifierTrainConfig(precision="fp16").precision == "fp16"  # valid; the device decides at training
    with pytest.raises(InputError, match=r"config key precision='half'; expected one of fp32, bf16, fp16"):
        ClassifierTrainConfig(precision="half")
    assert ClassifierTrainConfig().tf32 is True


# The loss scaler's arithmetic, on the CPU (torch.amp.GradScaler("cpu") runs the same code as on CUDA)


class LinearTask:
    unit = "sentences"
    stats: tuple[str, ...] = ()

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(8, 4, generator=g), torch.randint(0, 2, (8,), generator=g)

    def collate(self, indices):
        return Batch((self.x[indices], self.y[indices]), len(indices))

    def loss(self, model, batch):
        x, y = batch.tensors
        return BatchLoss(F.cross_entropy(model(x), y, reduction="sum"))


def step_with(scaler, clip_norm=0.0, x_scale=1.0):
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    task = LinearTask()
    task.x *= x_scale
    cfg = ClassifierTrainConfig(clip_norm=clip_norm)
    outcome = train_step(
        model, optimizer, task, [(0, task.collate(list(range(8))))], cfg, TrainContext(), scaler, step=1
    )
    return model, outcome


@pytest.mark.parametrize("clip_norm", [0.0, 0.5])
def test_a_scaled_step_is_bitwise_the_unscaled_one(clip_norm):
    """A power-of-two loss scale is exact, and the gradients are unscaled before clipping and the update: the same
    step as without a scaler (an update or a clip on the scaled gradients would be 2^16 times off)."""
    plain, plain_outcome = step_with(None, clip_norm)
    scaled, outcome = step_with(torch.amp.GradScaler("cpu", init_scale=2.0**16), clip_norm)
    assert outcome.problem is None and outcome.loss_sum == plain_outcome.loss_sum
    for a, b in zip(plain.parameters(), scaled.parameters(), strict=True):
        assert torch.equal(a, b)


def test_an_overflowing_scale_skips_the_update_lowers_the_scale_and_is_no_problem():
    torch.manual_seed(0)  # the model step_with builds
    before = {k: v.clone() for k, v in nn.Linear(4, 2).state_dict().items()}
    scaler = torch.amp.GradScaler("cpu", init_scale=3e38)
    model, outcome = step_with(scaler, x_scale=1e3)  # the loss is finite, its scaled gradients overflow float32
    assert math.isfinite(outcome.loss_sum)
    assert outcome.problem is None  # the scaler's business, not a diverged run
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # no update
    assert scaler.get_scale() == pytest.approx(1.5e38)  # backoff 0.5


def test_the_scalers_state_is_saved_and_restored(tmp_path):
    model = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=7)
    scaler.load_state_dict({**scaler.state_dict(), "scale": 2.0**13, "_growth_tracker": 5})
    path, state = tmp_path / "train_state.safetensors", FitState()
    save_fit_state(path, model=model, optimizer=optimizer, state=state, data_fingerprint="x", scaler=scaler)
    restored = torch.amp.GradScaler("cpu")
    load_fit_state(path, model=model, optimizer=optimizer, data_fingerprint="x", scaler=restored)
    assert restored.state_dict() == scaler.state_dict()
    assert restored.state_dict()["scale"] == 2.0**13 and restored.state_dict()["_growth_tracker"] == 5


# ---------------------------------------------------------------------------------------------------------------
# Run directories and the commands


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory, quietly, tiny) -> Path:
    """A tiny classifier run (``c``), translator run (``t``) and their data, trained on the CPU."""
    work = tmp_path_factory.mktemp("devices")
    quietly(*tiny.classify_train(work / "c", "epochs=2"), "--device", "cpu")
    quietly(*tiny.translate_train(work, work / "t", "max_steps=4"), "--device", "cpu")
    return work


def test_load_run_puts_the_weights_on_the_device(runs_dir):
    from safetensors.torch import load_file

    loaded = load_run(runs_dir / "c", device="cpu")
    assert {p.device for p in loaded.model.parameters()} == {torch.device("cpu")}
    saved = load_file(str(runs_dir / "c" / "model.safetensors"))
    state = loaded.model.state_dict()
    assert all(torch.equal(saved[k], state[k]) for k in saved)


def test_the_run_records_its_precision(runs_dir, tiny, quietly, tmp_path):
    quietly(*tiny.classify_train(tmp_path / "r", "epochs=1", "precision=bf16", "tf32=false"), "--device", "cpu")
    train = json.loads((tmp_path / "r" / "config.json").read_text())["train"]
    assert (train["precision"], train["tf32"]) == ("bf16", False)
    assert json.loads((runs_dir / "c" / "config.json").read_text())["train"]["precision"] == "fp32"


def test_fp16_training_on_the_cpu_is_one_error_line_before_anything_is_written(capsys, tiny, tmp_path):
    code, _, err = cli(capsys, *tiny.classify_train(tmp_path / "r", "precision=fp16"), "--device", "cpu")
    assert code == 2 and err.splitlines() == [
        "error: config key precision=fp16 runs on CUDA devices only; on cpu use bf16 (native on CPUs with AMX or "
        "AVX512-BF16) or fp32"
    ]
    assert not (tmp_path / "r").exists()


def test_fp16_inference_on_the_cpu_is_refused(capsys, runs_dir):
    code, _, err = cli(capsys, "classify", "predict", "--model", runs_dir / "c", "--precision", "fp16", "x")
    assert code == 2 and err.startswith("error: --precision=fp16 runs on CUDA devices only")


def commands(work: Path, tiny) -> dict[str, list[object]]:
    """Every command that runs a model, on the tiny runs in ``work`` (train commands write to ``work/new_*``)."""
    pairs = work / "pairs.tsv"
    return {
        "classify train": tiny.classify_train(work / "new_c", "epochs=1"),
        "classify predict": ["classify", "predict", "--model", work / "c", "a good film", "a bad film"],
        "classify eval": ["classify", "eval", "--model", work / "c", "--data", tiny.SEED_TSV],
        "translate train": tiny.translate_train(work, work / "new_t", "max_steps=2"),
        "translate run": ["translate", "run", "--model", work / "t", "--beam", "2"],
        "translate eval": ["translate", "eval", "--model", work / "t", "--data", pairs, "--beam", "1"],
        "embed": ["embed", "--model", work / "c", "a good film"],
        "params": ["params", "--task", "translate", "--json"],
        "plot attention": ["plot", "attention", "--model", work / "c", "--out", work / "a.svg", "a good film"],
        "ablate": [
            *("ablate", "--task", "classify", "--train", tiny.SEED_TSV, "--valid", tiny.SEED_TSV, "--grid", "d_ff=16"),
            *("--out", work / "new_ablation", "--set", *tiny.SET, "epochs=1"),
        ],
        "serve": ["serve", work / "c", "--port", "0"],
        "bench": ["bench", "train", "--quick"],
    }


COMMANDS = [
    *("classify train", "classify predict", "classify eval", "translate train", "translate run", "translate eval"),
    *("embed", "params", "plot attention", "ablate", "serve", "bench"),
]
RUNNING = ["classify predict", "classify eval", "translate run", "translate eval", "embed", "params", "plot attention"]
TRAINING = ["classify train", "translate train"]
STDIN = {"translate run": "a b c\nd e\n"}


def numbers_close(a: object, b: object) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(numbers_close(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(numbers_close(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float):
        return abs(a - b) <= 1e-4 * max(1.0, abs(a))
    return a == b


@pytest.mark.parametrize("name", RUNNING)
def test_every_inference_command_takes_device_cpu_and_auto_with_the_same_results(capsys, runs_dir, tiny, name):
    """auto is the CPU here and a GPU where there is one: the same outputs either way (to float tolerance)."""
    outputs = []
    for device in ("cpu", "auto"):
        code, out, err = cli(capsys, *commands(runs_dir, tiny)[name], "--device", device, stdin=STDIN.get(name))
        assert code == 0, err
        outputs.append(out)
    if name == "params":  # the memory line names the device
        cpu, auto = (json.loads(o) for o in outputs)
        assert cpu["memory"]["device"] == "cpu" and auto["memory"]["device"] == str(resolve_device("auto"))
        assert cpu["memory"]["training_bytes"] == auto["memory"]["training_bytes"] > cpu["memory"]["weights_bytes"]
        assert cpu["memory"]["weights_bytes"] == 4 * (cpu["total"] + cpu["buffers"])
    elif name == "translate run" or name == "plot attention":
        assert outputs[0] == outputs[1]
    else:
        rows = [[json.loads(line) for line in o.splitlines()] for o in outputs]
        assert numbers_close(rows[0], rows[1]), outputs


@pytest.mark.parametrize("name", TRAINING)
def test_the_training_commands_take_device_cpu_and_auto(capsys, runs_dir, tiny, name, tmp_path):
    summaries = []
    for device in ("cpu", "auto"):
        argv = [new_outputs_in(tmp_path / device, runs_dir, a) for a in commands(runs_dir, tiny)[name]]
        code, out, err = cli(capsys, *argv, "--device", device)
        assert code == 0, err
        summaries.append(json.loads(out))
    assert summaries[0]["steps"] == summaries[1]["steps"] > 0  # the same plan on any device


def new_outputs_in(directory: Path, runs_dir: Path, arg: object) -> object:
    """``arg``, with an output path of a training command (``new_*``) moved from ``runs_dir`` to ``directory``."""
    return str(arg).replace(str(runs_dir), str(directory)) if "new_" in str(arg) else arg


@NO_GPU
@pytest.mark.parametrize("name", COMMANDS)
def test_device_cuda_without_a_gpu_is_one_error_line_and_exit_2(capsys, runs_dir, tiny, name, tmp_path):
    if name == "serve":
        pytest.importorskip("uvicorn")
    argv = [new_outputs_in(tmp_path, runs_dir, a) for a in commands(runs_dir, tiny)[name]]
    code, out, err = cli(capsys, *argv, "--device", "cuda", stdin=STDIN.get(name))
    lines = err.splitlines()
    if name == "bench":
        assert code == 2 and len(lines) == 1 and "no CUDA device is visible" in lines[0]
        return
    assert code == 2, err
    built = "without CUDA" if torch.version.cuda is None else f"for CUDA {torch.version.cuda}"
    assert lines == [
        f"error: --device cuda: no CUDA device is visible to torch (torch.cuda.is_available() is False; torch "
        f"{torch.__version__} was built {built}); use --device cpu or auto"
    ]
    assert out == ""
    assert not list(tmp_path.glob("new_*"))  # refused before anything was written


def test_bench_times_the_cpu_or_a_cuda_gpu(capsys, monkeypatch):
    from attnkit import devices

    monkeypatch.setattr(devices, "_mps_available", lambda: True)
    code, _, err = cli(capsys, "bench", "train", "--device", "mps")
    assert code == 2
    assert err == "error: bench --device mps: the suites time the CPU or a CUDA GPU; use cpu or cuda\n"


def test_serving_loads_onto_the_device(runs_dir):
    from attnkit.serving.models import load_model

    served = load_model(runs_dir / "c", "fp32", torch.device("cpu"))
    assert model_device(served.model) == torch.device("cpu")
    probs = served.classify([served.token_ids("a good film")])  # type: ignore[attr-defined]
    assert abs(sum(probs[0]) - 1.0) < 1e-6
