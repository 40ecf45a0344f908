"""Run directories: atomic writes, bitwise weight round-trips, and errors that name the tensor, file or directory."""

from __future__ import annotations

import json
import os
import stat

import pytest
import torch
from safetensors.torch import save_file

from attnkit import runs
from attnkit.config import ClassifierConfig
from attnkit.errors import InputError
from attnkit.model.build import build_classifier

TINY = ClassifierConfig(vocab_size=50, d_model=16, n_heads=2, d_ff=24, n_layers=1, max_len=20, n_classes=3)


def _disk_full(*args, **kwargs):
    raise OSError("disk full")


# ---------------------------------------------------------------------------------------------------------------
# Atomic writes


def test_atomic_write_replaces_and_leaves_no_temporary_file(tmp_path):
    path = tmp_path / "config.json"
    runs.atomic_write_bytes(path, b"first")
    runs.atomic_write_json(path, {"name": "zürich", "n": 2})
    assert json.loads(path.read_text(encoding="utf-8")) == {"name": "zürich", "n": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["config.json"]


def test_failed_atomic_write_keeps_the_previous_file(tmp_path, monkeypatch):
    path = tmp_path / "model.safetensors"
    runs.atomic_write_bytes(path, b"old weights")
    monkeypatch.setattr(os, "replace", _disk_full)
    with pytest.raises(OSError, match="disk full"):
        runs.atomic_write_bytes(path, b"new weights")
    assert path.read_bytes() == b"old weights"
    assert [p.name for p in tmp_path.iterdir()] == ["model.safetensors"]


def test_atomic_write_gives_the_usual_file_permissions(tmp_path):
    # A run directory is shared: its files get the umask's permissions, like a file opened for writing.
    runs.atomic_write_bytes(tmp_path / "labels.json", b"[]")
    (tmp_path / "plain.json").write_bytes(b"[]")
    mode = stat.S_IMODE((tmp_path / "labels.json").stat().st_mode)
    assert mode == stat.S_IMODE((tmp_path / "plain.json").stat().st_mode)


# ---------------------------------------------------------------------------------------------------------------
# Weights


def test_weights_round_trip_bitwise(tmp_path):
    model = build_classifier(TINY)
    runs.save_weights(tmp_path, model)
    torch.manual_seed(1)
    fresh = build_classifier(TINY)
    assert not torch.equal(fresh.head.weight, model.head.weight)  # the load below has something to do
    runs.load_weights(fresh, tmp_path / runs.WEIGHTS)
    saved, loaded = model.state_dict(), fresh.state_dict()
    assert saved.keys() == loaded.keys()
    for name in saved:
        assert saved[name].dtype == loaded[name].dtype
        assert torch.equal(saved[name], loaded[name]), name


def _corrupted_state(change: str) -> dict[str, torch.Tensor]:
    state = {name: t.clone() for name, t in build_classifier(TINY).state_dict().items()}
    if change == "missing":
        del state["head.bias"]
    elif change == "mis-shaped":
        state["head.weight"] = torch.zeros(4, 16)  # 4 classes where the model has 3
    else:
        state["head.extra"] = torch.zeros(2)
    return state


@pytest.mark.parametrize(
    ("change", "named"), [("missing", "head.bias"), ("mis-shaped", "head.weight"), ("unexpected", "head.extra")]
)
def test_mismatched_weights_name_the_tensor(change, named, tmp_path):
    path = tmp_path / runs.WEIGHTS
    save_file(_corrupted_state(change), str(path))
    model = build_classifier(TINY)
    before = {name: t.clone() for name, t in model.state_dict().items()}
    with pytest.raises(InputError, match=named) as info:
        runs.load_weights(model, path)
    assert str(path) in str(info.value)
    assert all(torch.equal(before[name], t) for name, t in model.state_dict().items())  # nothing half-loaded


def test_a_long_list_of_mismatched_names_is_cut_after_five(tmp_path):
    path = tmp_path / runs.WEIGHTS
    state = build_classifier(TINY).state_dict()
    missing = sorted(state)[:7]
    save_file({name: t for name, t in state.items() if name not in missing}, str(path))
    with pytest.raises(InputError) as info:
        runs.load_weights(build_classifier(TINY), path)
    assert f"missing: {missing[:5]} ..., unexpected: []" in str(info.value)


@pytest.mark.parametrize("content", ['{"0": "neg", "1": "pos"}', '["neg", 1]', '"neg"'])
def test_labels_that_are_not_a_list_of_names_are_refused(tmp_path, content):
    path = tmp_path / runs.LABELS
    path.write_text(content, encoding="utf-8")
    with pytest.raises(InputError, match="expected a JSON list of label names") as info:
        runs.read_labels(path)
    assert str(path) in str(info.value)


def test_labels_are_read_in_id_order(tmp_path):
    path = tmp_path / runs.LABELS
    runs.atomic_write_json(path, ["neg", "pos", "mixed"])
    assert runs.read_labels(path) == ["neg", "pos", "mixed"]


def test_unreadable_weights_file_names_the_file(tmp_path):
    path = tmp_path / runs.WEIGHTS
    path.write_bytes(b"not a safetensors file at all")
    with pytest.raises(InputError, match="not a readable safetensors file") as info:
        runs.load_weights(build_classifier(TINY), path)
    assert str(path) in str(info.value)


# ---------------------------------------------------------------------------------------------------------------
# check_run_dir


@pytest.fixture
def run_dir(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    runs.atomic_write_json(run / runs.CONFIG, {**runs.config_header("classify"), "model": {}})
    runs.atomic_write_json(run / runs.LABELS, ["neg", "pos"])
    runs.save_weights(run, build_classifier(TINY))
    runs.write_manifest(run)
    return run


def test_complete_run_directory_passes(run_dir):
    assert runs.check_run_dir(str(run_dir)) == run_dir
    manifest = json.loads((run_dir / runs.MANIFEST).read_text())
    assert set(manifest["sha256"]) == {runs.CONFIG, runs.LABELS, runs.WEIGHTS}


def test_a_file_is_not_a_run_directory(run_dir):
    path = run_dir / runs.CONFIG
    with pytest.raises(InputError, match="not a run directory") as info:
        runs.check_run_dir(path)
    assert str(path) in str(info.value)


def test_directory_without_config_is_not_a_run(run_dir):
    (run_dir / runs.CONFIG).unlink()
    with pytest.raises(InputError, match="config.json") as info:
        runs.check_run_dir(run_dir)
    assert str(run_dir) in str(info.value)


@pytest.mark.parametrize("name", [runs.CONFIG, runs.LABELS, runs.WEIGHTS])
def test_tampered_file_fails_the_manifest(run_dir, name):
    path = run_dir / name
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(InputError, match="manifest.json") as info:
        runs.check_run_dir(run_dir)
    assert str(path) in str(info.value)


def test_file_listed_in_the_manifest_but_missing(run_dir):
    (run_dir / runs.LABELS).unlink()
    with pytest.raises(InputError, match="missing") as info:
        runs.check_run_dir(run_dir)
    assert str(run_dir / runs.LABELS) in str(info.value)


def test_metrics_log_may_grow_after_the_manifest(run_dir):
    log = runs.MetricsLog(run_dir / runs.METRICS)
    log.write({"step": 1, "loss": 0.5})
    log.close()
    assert runs.check_run_dir(run_dir) == run_dir
    rows = [json.loads(line) for line in (run_dir / runs.METRICS).read_text().splitlines()]
    assert rows == [{"step": 1, "loss": 0.5}]
