"""Weights from a PyTorch pickle (``torch.save`` output: .pt, .pth, .bin) into a run directory of safetensors.

A pickle is a program: loading one can run any code its author chose. So a pickle is only read when the user
says they trust it (``--trust-pickle``), and even then only through ``torch.load(weights_only=True)``, whose
restricted unpickler builds tensors and plain containers and nothing else, on a torch without its known escapes
(``attnkit.compat.check_torch``). What comes out is checked to be a mapping of names to tensors that fits the
model of an existing run, and is written as a new run directory whose weights are safetensors, so the pickle never
has to be opened again.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import Tensor, nn

from attnkit import runs
from attnkit.compat import check_torch
from attnkit.errors import InputError

# Where training scripts commonly put the state dict inside a saved dict ({"model": ..., "optimizer": ...}).
_NESTED_KEYS = ("model", "state_dict")


def load_pickle_state_dict(path: str | Path, *, trust_pickle: bool) -> dict[str, Tensor]:
    """The state dict saved in the pickle at ``path``: a plain one, or the ``"model"`` / ``"state_dict"`` entry
    of a saved dict. Refused (InputError) unless ``trust_pickle``; anything but str -> Tensor is refused too."""
    path = Path(path)
    if not trust_pickle:
        raise InputError(
            f"refusing to unpickle {path}: pickle files can run code when loaded; "
            "pass --trust-pickle only if you trust where it came from"
        )
    check_torch()
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    try:
        with warnings.catch_warnings():
            # torch warns about pickle protocols on stderr; the CLI's stderr is one "error:" line or nothing.
            warnings.simplefilter("ignore")
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except OSError:
        raise  # the environment (permissions, a disk error), reported as such by the CLI
    except Exception as err:  # noqa: BLE001 - a hostile or broken file can make the unpickler raise anything
        raise InputError(f"{path}: not a loadable PyTorch weights file ({_reason(err)})") from None
    return _state_dict_of(path, obj)


def _reason(err: Exception) -> str:
    """One line out of torch.load's error: the weights-only unpickler's own words, without its multi-line advice
    (which suggests weights_only=False, the very thing not to do with a file you do not trust)."""
    text = str(err)
    marker = "WeightsUnpickler error:"
    if marker in text:
        text = text.split(marker, 1)[1]
        text = "it holds objects other than tensors: " + text.strip().split(". ")[0].split("\n")[0].strip()
    elif "Weights only load failed" in text:  # a blocked module (os.system ...): its paragraph, not the advice
        paragraphs = [" ".join(part.split()) for part in text.split("\n\n") if part.strip()]
        why = [part for part in paragraphs[1:] if "weights_only" not in part and "documentation" not in part]
        text = "it holds objects other than tensors" + (f": {why[0].rstrip('.')}" if why else "")
    else:  # the unpickler's own words (a truncated or foreign file), which may be a bare number: named by its type
        text = f"{type(err).__name__}: {text}" if text.strip() else type(err).__name__
    return " ".join(text.split())


def _state_dict_of(path: Path, obj: object) -> dict[str, Tensor]:
    if not isinstance(obj, Mapping):
        raise InputError(f"{path}: holds a {type(obj).__name__}, expected a state dict (names -> tensors)")
    nested = [key for key in _NESTED_KEYS if isinstance(obj.get(key), Mapping)]
    if len(nested) > 1:
        raise InputError(f"{path}: holds both 'model' and 'state_dict' entries; save only the one to import")
    entries: Mapping = obj[nested[0]] if nested else obj
    state: dict[str, Tensor] = {}
    for name, value in entries.items():
        if not isinstance(name, str):
            raise InputError(f"{path}: key {name!r} is a {type(name).__name__}, expected a parameter name (str)")
        if not isinstance(value, Tensor):
            raise InputError(f"{path}: entry {name!r} is a {type(value).__name__}, not a tensor")
        if value.layout != torch.strided or value.is_quantized:
            raise InputError(f"{path}: tensor {name!r} is {value.layout} / {value.dtype}; expected a dense tensor")
        state[name] = value
    if not state:
        raise InputError(f"{path}: holds no tensors")
    return state


def check_state_dict(path: Path, model: nn.Module, state: Mapping[str, Tensor]) -> None:
    """InputError naming the missing, unexpected, mis-shaped or mis-typed tensors if ``state`` does not fit ``model``:
    the checks of a run's own weights, the dtype kind, since a pickle may hold integers where floats belong, and
    finiteness (a NaN weight makes every prediction NaN)."""
    runs.check_state_dict(path, model, state)
    expected = model.state_dict()
    for name, tensor in state.items():
        if tensor.is_floating_point() != expected[name].is_floating_point():
            raise InputError(
                f"{path}: tensor {name} has dtype {tensor.dtype}, the model expects {expected[name].dtype}"
            )
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            bad = int((~torch.isfinite(tensor)).sum())
            raise InputError(f"{path}: tensor {name} holds {bad} non-finite value(s) (NaN or infinity)")


def import_pickle_into_run(
    pickle_path: str | Path, run_dir: str | Path, out_dir: str | Path, *, trust_pickle: bool
) -> Path:
    """Write a new run directory at ``out_dir``: the config, tokenizer and labels of the run at ``run_dir`` with
    the weights of the pickle at ``pickle_path`` (as safetensors), and a fresh manifest. Returns ``out_dir``."""
    pickle_path, out_dir = Path(pickle_path), Path(out_dir)
    state = load_pickle_state_dict(pickle_path, trust_pickle=trust_pickle)
    run = runs.load_run(run_dir)  # the run's own weights load too: its files are checked against its manifest
    check_state_dict(pickle_path, run.model, state)
    run.model.load_state_dict(state)

    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise InputError(f"{out_dir}: already exists; choose a new --out")
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in (runs.CONFIG, runs.TOKENIZER, runs.LABELS):
        source = run.run_dir / name
        if source.is_file():
            runs.atomic_write_bytes(out_dir / name, source.read_bytes())
    runs.save_weights(out_dir, run.model)
    runs.write_manifest(out_dir)
    return out_dir
