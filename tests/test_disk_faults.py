"""Disk faults: a read-only output directory or a full disk ends the command with one ``error:`` line and exit code 2,
and leaves no half-written or temporary file: the last complete artifact is still there, byte for byte, and loads.

Root ignores permission bits, so under root a read-only directory is emulated: creating, renaming or removing an
entry of a directory without write permission fails with EACCES, as the kernel does for everyone else. A full disk
is simulated at ``write``, where the kernel reports ENOSPC; like the kernel's, that error carries no file name.
"""

from __future__ import annotations

import builtins
import errno
import io
import json
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from safetensors.torch import load_file

from attnkit.cli import main
from attnkit.tasks.classify import ClassifierRun
from attnkit.tasks.translate import TranslatorRun

pytestmark = pytest.mark.usefixtures("one_thread")


def one_error_line(capsys, argv: list[str]) -> str:
    """Exit code 2, nothing on stdout, and stderr ending with the one ``error:`` line (training may have printed its
    summary line before it failed), no traceback."""
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2, err
    assert out == ""
    lines = err.splitlines()
    assert [line for line in lines if line.startswith("error:")] == lines[-1:], err
    assert "Traceback" not in err
    return lines[-1]


def hidden_files(directory: Path) -> list[Path]:
    """Temporary files of atomic writes are hidden (".name.<uuid>.tmp")."""
    return [p for p in directory.rglob(".*")]


def snapshot(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


# ---------------------------------------------------------------------------------------------------------------
# Fault injection


def patch_open(monkeypatch, hook: Callable[[str, str, Callable[[], object]], object]) -> None:
    """Send every ``open`` (builtin and ``io.open``) of a named file through ``hook(path, mode, do_open)``."""
    real_open = builtins.open

    def patched(file, mode="r", *args, **kwargs):
        def do_open():
            return real_open(file, mode, *args, **kwargs)

        return do_open() if isinstance(file, int) else hook(os.fspath(file), mode, do_open)

    monkeypatch.setattr(builtins, "open", patched)
    monkeypatch.setattr(io, "open", patched)


def make_read_only(directory: Path, monkeypatch) -> None:
    """chmod 0o500 ``directory``; if that binds nobody (root), emulate the kernel's check for every directory that
    lacks the owner's write bit."""
    directory.chmod(0o500)
    if not os.access(directory, os.W_OK):
        return

    def check(path) -> None:
        parent = Path(os.path.abspath(os.fspath(path))).parent
        try:
            writable = parent.stat().st_mode & stat.S_IWUSR
        except OSError:
            return
        if not writable:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)

    def guard(real, n_paths=1):
        def guarded(*args, **kwargs):
            for path in args[:n_paths]:
                check(path)
            return real(*args, **kwargs)

        return guarded

    for name in ("mkdir", "unlink", "remove", "rmdir"):
        monkeypatch.setattr(os, name, guard(getattr(os, name)))
    for name in ("replace", "rename"):
        monkeypatch.setattr(os, name, guard(getattr(os, name), n_paths=2))

    def on_open(path: str, mode: str, do_open):
        if any(flag in mode for flag in "wxa+"):
            check(path)
        return do_open()

    patch_open(monkeypatch, on_open)


@pytest.fixture
def restore_permissions(tmp_path):
    yield
    for path in [tmp_path, *tmp_path.rglob("*")]:
        if path.is_dir() and not path.is_symlink():
            path.chmod(0o755)


class FullDisk:
    """A file whose ``write`` stores part of the data and then fails with ENOSPC, as write(2) on a full disk."""

    def __init__(self, file):
        self._file = file

    def write(self, data) -> int:
        self._file.write(data[: len(data) // 2])
        self._file.flush()
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def __getattr__(self, name):
        return getattr(self._file, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self._file.close()


def fill_disk_at(monkeypatch, name: str, nth: int) -> dict:
    """The ``nth`` atomic write of a file called ``name`` fails with a full disk. Returns a dict that receives the
    bytes ``name`` held when that write started."""
    seen: dict[str, Any] = {"writes": 0, "before": None}

    def on_open(path: str, mode: str, do_open):
        target = Path(path)
        if "x" in mode and target.name.startswith(f".{name}.") and target.name.endswith(".tmp"):
            seen["writes"] += 1
            if seen["writes"] == nth:
                old = target.parent / name
                seen["before"] = old.read_bytes() if old.exists() else None
                return FullDisk(do_open())
        return do_open()

    patch_open(monkeypatch, on_open)
    return seen


# ---------------------------------------------------------------------------------------------------------------
# A read-only output directory


@pytest.mark.parametrize("task", ["classify", "translate"])
def test_read_only_parent_of_the_output_directory(task, tmp_path, capsys, monkeypatch, restore_permissions, tiny):
    locked = tmp_path / "locked"
    locked.mkdir()
    out = locked / "run"
    argv = (
        tiny.classify_train(out, "epochs=1")
        if task == "classify"
        else tiny.translate_train(tmp_path, out, "max_steps=1")
    )
    make_read_only(locked, monkeypatch)
    line = one_error_line(capsys, argv)
    assert line == f"error: {out}: Permission denied"
    assert list(locked.iterdir()) == []


def test_read_only_run_directory_is_left_as_it_was(tmp_path, capsys, monkeypatch, restore_permissions, tiny):
    run = tmp_path / "run"
    assert main(tiny.classify_train(run, "epochs=1")) == 0
    capsys.readouterr()
    before = snapshot(run)
    make_read_only(run, monkeypatch)
    line = one_error_line(capsys, tiny.classify_train(run, "epochs=1", "seed=1"))  # train again over it
    assert line.startswith(f"error: {run}/") and line.endswith(": Permission denied"), line
    monkeypatch.undo()
    assert snapshot(run) == before
    ClassifierRun(run).predict(["still loads"])


@pytest.mark.parametrize("kind", ["onnx", "ct2"])
def test_an_export_into_a_read_only_directory_names_its_output(
    kind, tmp_path, capsys, monkeypatch, restore_permissions, tiny
):
    """The error names the file or folder asked for, not a hidden temporary: a read-only file system refuses even
    to remove a temporary that was never made (EROFS), and that refusal must not replace the error."""
    pytest.importorskip("onnxscript" if kind == "onnx" else "ctranslate2")
    run = tmp_path / "run"
    argv = (
        tiny.classify_train(run, "epochs=1") if kind == "onnx" else tiny.translate_train(tmp_path, run, "max_steps=1")
    )
    assert main(argv) == 0
    capsys.readouterr()
    locked = tmp_path / "locked"
    locked.mkdir()
    out = locked / ("model.onnx" if kind == "onnx" else "ct2")
    make_read_only(locked, monkeypatch)
    line = one_error_line(capsys, ["export", kind, "--model", str(run), "--out", str(out)])
    assert line == f"error: {out}: Permission denied"
    assert list(locked.iterdir()) == []


# ---------------------------------------------------------------------------------------------------------------
# A full disk


@pytest.fixture
def every_epoch_improves(monkeypatch):
    """Validation accuracy 0.1, 0.2, ...: every epoch is the best so far, so every epoch saves model.safetensors."""
    scores = iter(range(1, 100))
    monkeypatch.setattr("attnkit.tasks.classify.train.accuracy", lambda pred, gold: next(scores) / 100)


def test_full_disk_during_the_second_best_model_save(tmp_path, capsys, monkeypatch, every_epoch_improves, tiny):
    run = tmp_path / "run"
    disk = fill_disk_at(monkeypatch, "model.safetensors", nth=2)
    line = one_error_line(capsys, tiny.classify_train(run, "epochs=2", "patience=0"))
    assert disk["writes"] == 2, "epoch 2 did not save model.safetensors"
    assert "No space left on device" in line
    monkeypatch.undo()
    weights = run / "model.safetensors"
    assert weights.read_bytes() == disk["before"]  # epoch 1's weights, whole
    assert hidden_files(run) == []
    load_file(str(weights))
    assert len(ClassifierRun(run).predict(["a wonderful film"])) == 1


def test_full_disk_error_names_the_file(tmp_path, capsys, monkeypatch, tiny):
    run = tmp_path / "run"
    fill_disk_at(monkeypatch, "model.safetensors", nth=1)
    line = one_error_line(capsys, tiny.classify_train(run, "epochs=1"))
    assert "model.safetensors" in line


def test_full_disk_during_a_translator_checkpoint(tmp_path, capsys, monkeypatch, tiny):
    run = tmp_path / "run"
    disk = fill_disk_at(monkeypatch, "model.safetensors", nth=2)
    line = one_error_line(capsys, tiny.translate_train(tmp_path, run, "max_steps=2"))
    assert "No space left on device" in line
    monkeypatch.undo()
    weights = run / "model.safetensors"
    assert weights.read_bytes() == disk["before"] == (run / "checkpoints" / "step_1.safetensors").read_bytes()
    assert hidden_files(run) == []
    assert len(TranslatorRun(run).translate(["a b c"], beam=1)[0]) == 1


def test_full_disk_while_writing_the_config_then_the_same_command_succeeds(tmp_path, capsys, monkeypatch, tiny):
    run = tmp_path / "run"
    fill_disk_at(monkeypatch, "config.json", nth=1)
    line = one_error_line(capsys, tiny.classify_train(run, "epochs=1"))
    assert "No space left on device" in line
    monkeypatch.undo()
    assert not (run / "config.json").exists()
    assert hidden_files(run) == []
    # Space freed, the user runs the same command again: the half-started directory must not be in the way.
    assert main(tiny.classify_train(run, "epochs=1")) == 0, capsys.readouterr().err
    assert json.loads((run / "config.json").read_text())["task"] == "classify"
