"""Run directories: the artifact users keep and share. Written atomically, loaded without pickle.

A run directory holds
    config.json        format, task, model and training config, tokenizer roles and fingerprint, attnkit version
    model.safetensors  the weights (safetensors: tensors only, nothing executable)
    tokenizer.json     the tokenizer, in the `tokenizers` library's own format
    labels.json        the label names in id order (classifier)
    metrics.jsonl      one JSON object per logged step / epoch
    manifest.json      the sha256 of every file above but the metrics log, checked on load
    checkpoints/       step_N.safetensors, the last K weights of a translator (for averaging, §6.1)
    .lock              while a training writes the directory: who it is (runs/lock.py)

Every file is written to a temporary name in the same directory, flushed, fsynced and renamed over the old one,
so a kill at any moment leaves either the previous file or the new one, never half of one.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from safetensors.torch import save as safetensors_bytes
from torch import Tensor, nn

from attnkit import __version__
from attnkit.atomic import atomic_write_bytes, atomic_write_json
from attnkit.devices import model_device
from attnkit.errors import InputError

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
TOKENIZER = "tokenizer.json"
LABELS = "labels.json"
METRICS = "metrics.jsonl"
MANIFEST = "manifest.json"
CHECKPOINTS = "checkpoints"
LOCK = ".lock"  # held by the training writing the directory (runs/lock.py); not an artifact of the run

# The run-directory format written into config.json. Runs of the first release carry no "format" key; they are
# format 0 and differ from format 1 only by that key, so both load.
FORMAT = "attnkit-run/1"
FORMAT_BEFORE_VERSIONING = "attnkit-run/0"
READABLE_FORMATS = (FORMAT_BEFORE_VERSIONING, FORMAT)

# What atomic.open_atomic names its temporary files: ".NAME.<uuid4 hex>.tmp" beside the target.
_TEMPORARY = re.compile(r"^\..+\.[0-9a-f]{32}\.tmp$")


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def state_dict_for_saving(model: nn.Module) -> dict[str, torch.Tensor]:
    """Contiguous CPU tensors, each stored once (safetensors refuses shared storage; tied weights are one parameter).
    On the CPU whatever device trained them: a run directory does not depend on the device."""
    return {name: tensor.detach().cpu().contiguous() for name, tensor in model.state_dict().items()}


def save_weights(run_dir: Path, model: nn.Module, filename: str = WEIGHTS) -> None:
    atomic_write_bytes(run_dir / filename, safetensors_bytes(state_dict_for_saving(model)))


def write_manifest(run_dir: Path) -> None:
    """Record the sha256 of every artifact (not the metrics log, which grows) in ``manifest.json``."""
    files = sorted(
        p.name
        for p in run_dir.iterdir()
        if p.is_file() and p.name not in (MANIFEST, METRICS) and not p.name.startswith(".")
    )
    atomic_write_json(
        run_dir / MANIFEST,
        {"attnkit_version": __version__, "sha256": {name: sha256_file(run_dir / name) for name in files}},
    )


def record_hash(run_dir: Path, name: str) -> None:
    """Update ``manifest.json``'s sha256 of the one file ``name``, rewritten since the last ``write_manifest`` (the
    best weights at an evaluation, the config given a larger budget), so that a run killed before its next save
    still checks; nothing before the first manifest."""
    path = run_dir / MANIFEST
    if path.is_file():
        manifest = read_json(path)
        manifest.setdefault("sha256", {})[name] = sha256_file(run_dir / name)
        atomic_write_json(path, manifest)


def check_run_dir(run_dir: str | Path) -> Path:
    """A run directory that exists, has a config and weights, and whose files match the manifest."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        what = "a file" if run_dir.exists() else "no such directory"
        raise InputError(f"{run_dir}: not a run directory ({what})")
    for name in (CONFIG, WEIGHTS):
        if not (run_dir / name).is_file():
            raise InputError(f"{run_dir}: not a run directory (no {name})")
    manifest_path = run_dir / MANIFEST
    if not manifest_path.is_file():
        # Written last, when a run finishes: without it the weights cannot be checked, and the run may be unfinished.
        raise InputError(
            f"{run_dir}: no {MANIFEST}, so its files cannot be checked: a run killed before its first "
            f"save (train it again) or a damaged one"
        )
    hashes = read_json(manifest_path).get("sha256")
    if not isinstance(hashes, dict) or not all(isinstance(v, str) for v in hashes.values()):
        raise InputError(f'{manifest_path}: expected a "sha256" object of file names and hashes; a damaged run')
    # What loading reads must be listed, or a manifest listing nothing would check nothing.
    unlisted = [
        name for name in (CONFIG, WEIGHTS, TOKENIZER, LABELS) if (run_dir / name).is_file() and name not in hashes
    ]
    if unlisted:
        raise InputError(
            f"{manifest_path}: does not list {', '.join(unlisted)}, so it cannot be checked; a damaged run"
        )
    for name, expected in hashes.items():
        path = run_dir / name
        if not path.is_file():
            raise InputError(f"{path}: listed in {MANIFEST} but missing")
        if sha256_file(path) != expected:
            raise InputError(f"{path}: changed or corrupted since it was written (sha256 differs from {MANIFEST})")
    return run_dir


def read_json_value(path: Path) -> object:
    """Whatever JSON value ``path`` holds; unreadable or not JSON, an ``InputError`` naming it."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise InputError(f"{path}: cannot be read as JSON ({err})") from None


def read_json(path: Path) -> dict:
    """The JSON object ``path`` holds (a config, a manifest); another JSON value (``[1]``, ``null``) is an
    ``InputError`` naming the file, not an AttributeError wherever a key is first looked up."""
    value = read_json_value(path)
    if not isinstance(value, dict):
        raise InputError(f"{path}: expected a JSON object ({{...}}), found {_json_type(value)}")
    return value


def _json_type(value: object) -> str:
    names = {list: "a list", str: "a string", bool: "true or false", int: "a number", float: "a number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def read_labels(path: Path) -> list[str]:
    """A classifier's label names in id order (``labels.json``)."""
    labels = read_json_value(path)
    if not isinstance(labels, list) or not all(isinstance(label, str) for label in labels):
        raise InputError(f"{path}: expected a JSON list of label names")
    return labels


def _first_five(names: list[str]) -> str:
    return f"{names[:5]}{' ...' if len(names) > 5 else ''}"


def check_state_dict(path: Path, model: nn.Module, state: Mapping[str, Tensor]) -> None:
    """InputError naming the missing, unexpected or mis-shaped tensors if ``state`` (read from ``path``) does not
    fit ``model``."""
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise InputError(
            f"{path}: weights do not match the model "
            f"(missing: {_first_five(missing)}, unexpected: {_first_five(unexpected)})"
        )
    for name, tensor in state.items():
        want = tuple(expected[name].shape)
        if tuple(tensor.shape) != want:
            raise InputError(f"{path}: tensor {name} has shape {tuple(tensor.shape)}, the model expects {want}")


def load_weights(model: nn.Module, path: Path) -> None:
    """Load safetensors weights into ``model``, straight onto the device of its parameters; missing, unexpected or
    mis-shaped tensors are named in the error."""
    try:
        state = load_file(str(path), device=str(model_device(model)))
    except (SafetensorError, OSError) as err:
        raise InputError(f"{path}: not a readable safetensors file ({err})") from None
    check_state_dict(path, model, state)
    model.load_state_dict(state)


def config_header(task: str) -> dict:
    return {"format": FORMAT, "attnkit_version": __version__, "task": task}


def check_format(config: dict, path: Path) -> str:
    """The format of a run's ``config`` (read from ``path``); one this attnkit cannot read is an InputError."""
    run_format = config.get("format", FORMAT_BEFORE_VERSIONING)
    if run_format not in READABLE_FORMATS:
        raise InputError(
            f"{path}: run format {run_format!r} is not one this attnkit ({__version__}) reads "
            f"({', '.join(READABLE_FORMATS)}); it was written by another version"
        )
    return run_format


def checkpoint_paths(run_dir: Path) -> list[Path]:
    """Saved step checkpoints, oldest first."""
    return sorted((run_dir / CHECKPOINTS).glob("step_*.safetensors"), key=lambda p: int(p.stem.split("_")[1]))


def remove_temporary_files(run_dir: str | Path) -> list[Path]:
    """Delete what atomic writes killed part-way left behind (``.NAME.<id>.tmp``) in ``run_dir`` and its
    ``checkpoints/``; returns the files removed. The finished files beside them are untouched."""
    run_dir = Path(run_dir)
    removed = []
    for folder in (run_dir, run_dir / CHECKPOINTS):
        if folder.is_dir():
            for path in sorted(folder.iterdir()):
                if path.is_file() and _TEMPORARY.match(path.name):
                    path.unlink(missing_ok=True)
                    removed.append(path)
    return removed


def prepare_run_dir(out_dir: str | Path, resume: bool) -> Path:
    """A fresh run directory (new, empty, or an earlier run to overwrite), or, with ``resume``, an existing run."""
    out_dir = Path(out_dir)
    if resume:
        if not (out_dir / CONFIG).is_file():
            raise InputError(f"{out_dir}: not a run directory to resume (no {CONFIG})")
        check_format(read_json(out_dir / CONFIG), out_dir / CONFIG)
        return out_dir
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError(f"{out_dir}: exists and is not a directory")
    if out_dir.exists() and any(p.name != LOCK for p in out_dir.iterdir()) and not (out_dir / CONFIG).is_file():
        raise InputError(f"{out_dir}: exists and is not an attnkit run directory; choose a new --out")
    out_dir.mkdir(parents=True, exist_ok=True)
    return out_dir
