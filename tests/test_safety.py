"""Loading untrusted artifacts: pickles are refused unless trusted, and then loaded only as tensors on a torch without
known unpickler escapes; an imported pickle gives exactly the model it holds; a tampered translator run is refused.

(The classifier's flipped-byte case is in tests/test_cli_classify.py.)"""

from __future__ import annotations

import builtins
import functools
import io
import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

from attnkit import compat
from attnkit.cli import build_parser, main
from attnkit.errors import InputError
from attnkit.interop import pickle_import
from attnkit.interop.pickle_import import import_pickle_into_run, load_pickle_state_dict
from attnkit.tasks.classify import ClassifierRun
from attnkit.tasks.translate import TranslatorRun

TEXTS = ["This movie was absolutely amazing", "Terrible, I hated it.", "an unseen zyzzyva"]


def error_line(capsys, *argv: object, stdin: str | None = None, monkeypatch=None) -> str:
    """Exit code 2, nothing on stdout, exactly one ``error:`` line on stderr; returns that line."""
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    code = main([str(arg) for arg in argv])
    out, err = capsys.readouterr()
    assert code == 2, err
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def convert_is_wired() -> bool:
    try:
        build_parser().parse_args(["convert", "--from-pickle", "a.pt", "--model", "run", "--out", "out"])
    except InputError:
        return False
    return True


needs_convert = pytest.mark.skipif(not convert_is_wired(), reason="`attnkit convert` is not wired into cli.py yet")


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def runs(tmp_path_factory, quietly, tiny) -> dict[str, Path]:
    """Two tiny classifiers on the same data with different seeds (same tokenizer, different weights), and a tiny
    translator."""
    tmp = tmp_path_factory.mktemp("safety")
    out = {}
    for name, seed in (("a", "0"), ("b", "1")):
        out[name] = tmp / name
        quietly(*tiny.classify_train(out[name], "--epochs", "1", "--seed", seed))
    out["mt"] = tmp / "mt"
    quietly(*tiny.translate_train(tmp, out["mt"], "--max-steps", "2"))
    return out


def save_pickle(path: Path, obj: object) -> Path:
    torch.save(obj, path)
    return path


class RunsCodeWhenUnpickled:
    """What a malicious pickle does: ``__reduce__`` makes the unpickler call any function, here
    ``open(marker, "w")``."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (builtins.open, (str(self.marker), "w"))


# ---------------------------------------------------------------------------------------------------------------
# The torch version


@pytest.mark.parametrize(
    "version", ["2.9.1", "2.6.0", "1.13.1+cu117", "2.10.0a0+git5f1e3a", "2.10.0rc1", "2.10.0.dev20251201"]
)
def test_torch_with_a_known_unpickler_escape_is_refused(version):
    with pytest.raises(InputError) as caught:
        compat.check_torch(version)
    message = str(caught.value)
    assert "torch >= 2.10" in message and f"you have {version}" in message
    assert "pip install torch==2.13.0" in message


@pytest.mark.parametrize(
    "version", ["2.13.0+cpu", "2.10.0", "2.10.1", "2.11.0.dev20260101", "2.10.0.post1", "3.0", "2.13.0"]
)
def test_fixed_torch_passes(version):
    compat.check_torch(version)


def test_unreadable_version_is_an_input_error():
    with pytest.raises(InputError, match="cannot read the torch version 'nightly'"):
        compat.check_torch("nightly")


def test_the_installed_torch_passes():
    compat.check_torch()  # attnkit is tested on 2.13


# ---------------------------------------------------------------------------------------------------------------
# Pickles


def test_pickle_is_refused_without_trust_and_never_opened(runs, tmp_path, monkeypatch):
    path = save_pickle(tmp_path / "weights.pt", ClassifierRun(runs["b"]).model.state_dict())
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("torch.load must not be called"))
    with pytest.raises(InputError) as caught:
        load_pickle_state_dict(path, trust_pickle=False)
    message = str(caught.value)
    assert message.startswith(f"refusing to unpickle {path}: pickle files can run code when loaded")
    assert "--trust-pickle" in message
    with pytest.raises(InputError, match="refusing to unpickle"):
        import_pickle_into_run(path, runs["a"], tmp_path / "out", trust_pickle=False)
    assert not (tmp_path / "out").exists()


def test_trusted_pickle_on_an_old_torch_is_refused_before_loading(runs, tmp_path, monkeypatch):
    path = save_pickle(tmp_path / "weights.pt", ClassifierRun(runs["b"]).model.state_dict())
    monkeypatch.setattr(pickle_import, "check_torch", functools.partial(compat.check_torch, "2.9.1"))
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("torch.load must not be called"))
    with pytest.raises(InputError, match="you have 2.9.1"):
        load_pickle_state_dict(path, trust_pickle=True)


@pytest.mark.parametrize("layout", ["plain", "model", "state_dict"])
def test_imported_pickle_predicts_exactly_like_the_run_it_came_from(runs, tmp_path, layout):
    # Run b's weights, pickled, imported into a copy of run a's config and tokenizer (the same, same data): the
    # result must be run b, bit for bit, and not run a.
    source, template = ClassifierRun(runs["b"]), ClassifierRun(runs["a"])
    state = source.model.state_dict()
    saved = {"plain": state, "model": {"model": state, "epoch": 3}, "state_dict": {"state_dict": state, "step": 7}}[
        layout
    ]
    path = save_pickle(tmp_path / "b.pt", saved)
    out = import_pickle_into_run(path, runs["a"], tmp_path / "imported", trust_pickle=True)
    imported = ClassifierRun(out)  # checks the new manifest
    assert torch.equal(imported.logits(TEXTS), source.logits(TEXTS))
    assert not torch.equal(imported.logits(TEXTS), template.logits(TEXTS))
    assert [p.probs for p in imported.predict(TEXTS)] == [p.probs for p in source.predict(TEXTS)]
    names = {p.name for p in out.iterdir()}
    assert names == {"config.json", "tokenizer.json", "labels.json", "model.safetensors", "manifest.json"}
    for name in ("config.json", "tokenizer.json", "labels.json"):
        assert (out / name).read_bytes() == (runs["a"] / name).read_bytes()


def test_translator_pickle_round_trips(runs, tmp_path):
    source = TranslatorRun(runs["mt"])
    state = {name: t + 0.01 * torch.randn_like(t) for name, t in source.model.state_dict().items()}
    path = save_pickle(tmp_path / "mt.pt", state)
    imported = TranslatorRun(import_pickle_into_run(path, runs["mt"], tmp_path / "imported", trust_pickle=True))
    for name, tensor in imported.model.state_dict().items():
        assert torch.equal(tensor, state[name]), name


def test_pickle_with_a_non_tensor_entry_is_refused(runs, tmp_path):
    state = dict(ClassifierRun(runs["b"]).model.state_dict(), note="hello")
    path = save_pickle(tmp_path / "extra.pt", state)
    with pytest.raises(InputError) as caught:
        import_pickle_into_run(path, runs["a"], tmp_path / "out", trust_pickle=True)
    assert str(caught.value) == f"{path}: entry 'note' is a str, not a tensor"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("obj", "problem"),
    [
        ([torch.zeros(2)], "holds a list, expected a state dict"),
        ({}, "holds no tensors"),
        ({3: torch.zeros(2)}, "key 3 is a int, expected a parameter name"),
        ({"model": {"w": torch.zeros(1)}, "state_dict": {"w": torch.zeros(1)}}, "both 'model' and 'state_dict'"),
        ({"w": torch.zeros(3).to_sparse()}, "expected a dense tensor"),
    ],
    ids=["list", "empty", "int_key", "ambiguous", "sparse"],
)
def test_pickle_that_is_not_a_state_dict_is_refused(tmp_path, obj, problem):
    path = save_pickle(tmp_path / "odd.pt", obj)
    with pytest.raises(InputError, match=problem) as caught:
        load_pickle_state_dict(path, trust_pickle=True)
    assert str(caught.value).startswith(f"{path}: ")


def test_pickle_that_would_run_code_is_refused_without_running_it(tmp_path):
    marker = tmp_path / "pwned"
    path = save_pickle(tmp_path / "evil.pt", {"w": torch.zeros(2), "payload": RunsCodeWhenUnpickled(marker)})
    assert not marker.exists()
    with pytest.raises(InputError) as caught:
        load_pickle_state_dict(path, trust_pickle=True)
    assert not marker.exists()  # the unpickler refused the call: nothing ran
    message = str(caught.value)
    assert message.startswith(f"{path}: not a loadable PyTorch weights file (it holds objects other than tensors")
    assert "\n" not in message and "weights_only" not in message  # one line, and no advice to switch safety off


def test_pickle_calling_a_blocked_module_is_refused_without_unsafe_advice(tmp_path):
    """``os.system`` in a reduce: torch's weights-only unpickler blocks the module and says so in a paragraph of its
    own, beside advice to load with weights_only=False; the error line keeps the first and drops the advice."""
    import os

    class Shell:
        def __reduce__(self):
            return (os.system, ("true",))

    path = tmp_path / "shell.pt"
    torch.save({"w": Shell()}, path)
    with pytest.raises(InputError) as caught:
        load_pickle_state_dict(path, trust_pickle=True)
    message = str(caught.value)
    assert message.startswith(f"{path}: not a loadable PyTorch weights file (it holds objects other than tensors")
    assert "system" in message and "\n" not in message and "weights_only" not in message


@pytest.mark.parametrize("content", [b"", b"hello world", b"\x80\x02}q\x00"], ids=["empty", "text", "truncated"])
def test_broken_pickle_is_an_input_error(tmp_path, content):
    path = tmp_path / "broken.pt"
    path.write_bytes(content)
    with pytest.raises(InputError, match="not a loadable PyTorch weights file") as caught:
        load_pickle_state_dict(path, trust_pickle=True)
    assert "\n" not in str(caught.value)


def test_pickle_with_a_nan_weight_is_refused_naming_the_tensor(runs, tmp_path):
    """A NaN weight imported would make every prediction NaN (and predict print NaN, which is not JSON)."""
    state = ClassifierRun(runs["b"]).model.state_dict()
    state["head.weight"] = state["head.weight"].clone()
    state["head.weight"][0, 0] = float("nan")
    path = save_pickle(tmp_path / "nan.pt", state)
    with pytest.raises(InputError, match=r"tensor head.weight holds 1 non-finite value\(s\) \(NaN or infinity\)"):
        import_pickle_into_run(path, runs["b"], tmp_path / "out", trust_pickle=True)
    assert not (tmp_path / "out").exists()


def test_pickle_that_does_not_fit_the_model_names_the_tensors(runs, tmp_path):
    state = ClassifierRun(runs["b"]).model.state_dict()
    state.pop("head.bias")
    state["head.weight"] = torch.zeros(3, 16)
    path = save_pickle(tmp_path / "b.pt", state)
    with pytest.raises(InputError, match=r"missing: \['head.bias'\], unexpected: \[\]"):
        import_pickle_into_run(path, runs["a"], tmp_path / "out", trust_pickle=True)
    state["head.bias"] = torch.zeros(2)
    save_pickle(path, state)
    with pytest.raises(InputError, match=r"tensor head.weight has shape \(3, 16\), the model expects \(2, 16\)"):
        import_pickle_into_run(path, runs["a"], tmp_path / "out", trust_pickle=True)
    state["head.weight"] = torch.zeros(2, 16, dtype=torch.long)  # integers where the model has floats
    save_pickle(path, state)
    with pytest.raises(InputError, match=r"tensor head.weight has dtype torch.int64, the model expects torch.float32"):
        import_pickle_into_run(path, runs["a"], tmp_path / "out", trust_pickle=True)
    assert not (tmp_path / "out").exists()


def test_import_never_writes_into_an_existing_directory(runs, tmp_path):
    path = save_pickle(tmp_path / "b.pt", ClassifierRun(runs["b"]).model.state_dict())
    with pytest.raises(InputError, match="already exists; choose a new --out"):
        import_pickle_into_run(path, runs["a"], runs["a"], trust_pickle=True)  # not even over its own template


@needs_convert
def test_convert_command_refuses_then_imports(runs, tmp_path, capsys):
    path = save_pickle(tmp_path / "b.pt", ClassifierRun(runs["b"]).model.state_dict())
    line = error_line(capsys, "convert", "--from-pickle", path, "--model", runs["a"], "--out", tmp_path / "out")
    assert str(path) in line and "--trust-pickle" in line
    code = main(
        [
            "convert",
            "--from-pickle",
            str(path),
            "--model",
            str(runs["a"]),
            "--out",
            str(tmp_path / "out"),
            "--trust-pickle",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    assert json.loads(out)["out"] == str(tmp_path / "out")
    assert torch.equal(ClassifierRun(tmp_path / "out").logits(TEXTS), ClassifierRun(runs["b"]).logits(TEXTS))


# ---------------------------------------------------------------------------------------------------------------
# Tampered run directories


def test_flipped_byte_in_translator_weights_is_caught(runs, tmp_path, capsys, monkeypatch):
    run = shutil.copytree(runs["mt"], tmp_path / "mt")
    weights = run / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0x01  # inside the tensor data: the file still parses, only the hash can tell
    weights.write_bytes(bytes(data))
    line = error_line(
        capsys, "translate", "run", "--model", run, "--beam", "1", stdin="a b c\n", monkeypatch=monkeypatch
    )
    assert line == f"error: {weights}: changed or corrupted since it was written (sha256 differs from manifest.json)"
