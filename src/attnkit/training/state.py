"""The complete training state, saved without pickle, so that a killed run resumes bit-exactly.

One safetensors file holds every tensor (model weights, optimizer moments, RNG states) and, in its metadata, one
JSON document with everything else (step, data position, loop counters, optimizer hyper-parameters). Nothing in it
can execute code when loaded, and it is written atomically like every other artifact.

What "bit-exact" needs, and where it comes from:
    model and optimizer        every tensor, bitwise
    dropout                    nothing: each batch's masks are seeded from (seed, step, index) by the loop; the
                               global RNG states (CPU, and the GPU's on a GPU) are saved all the same
    fp16 loss scale            the gradient scaler's scale and growth counter (plain numbers: in the JSON)
    data order and position    the batch generator's state at the start of the current epoch (the epoch's order is
                               drawn again from it) and the index of the next batch in that order
    loop counters              step, epoch, best score, running sums: in the JSON
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save as safetensors_bytes
from torch import nn

from attnkit import runs
from attnkit.atomic import atomic_write_bytes
from attnkit.devices import model_device, rng_state, set_rng_state
from attnkit.errors import InputError
from attnkit.runs import state_dict_for_saving

STATE = "train_state.safetensors"
_META_KEY = "attnkit_train_state"


@dataclass
class FitState:
    """Where the one training loop is, and what it has decided so far: enough to continue it exactly.

    Saved in the training state's JSON (every field but the generator state, which is a tensor).
    """

    step: int = 0  # optimizer steps taken (a skipped non-finite step counts: it used its batches)
    epoch: int = 1  # the epoch in progress (1-based); after the last one, epochs + 1
    batch_index: int = 0  # index of the next batch of that epoch's order
    epoch_generator_state: torch.Tensor | None = None  # batch generator state when the epoch's order was drawn
    # Training statistics since the last evaluation (the running loss and, e.g., accuracy the progress shows)
    train_loss_sum: float = 0.0  # summed loss over train_size units
    train_size: int = 0  # units (sentences or target tokens) of the steps taken since the last evaluation
    train_sums: dict[str, float] = field(default_factory=dict)  # the task's statistics summed over those units
    # Model selection
    best_score: float | None = None  # the task's metric at the best evaluation so far
    best_loss: float | None = None  # validation loss at that evaluation (breaks ties)
    best_step: int = 0
    best_epoch: float = 0.0  # epochs completed at the best evaluation
    best_metrics: dict[str, float] = field(default_factory=dict)
    stale: int = 0  # evaluations since the best one (patience)
    last_eval_step: int = 0  # the step of the last evaluation (0: none yet)
    skipped: int = 0  # non-finite steps skipped (skip_nonfinite)
    log_rows: int = 0  # rows in the metrics log when the state was saved: a resume drops the rows after them
    batches_per_step: int = 0  # over all processes: accum_steps x world_size when the run started (0: not recorded)
    planned_steps: int = 0  # the steps the learning-rate schedule was planned over (0: not recorded)


def save_fit_state(
    path: Path,
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    state: FitState,
    data_fingerprint: str,
    scaler: torch.amp.GradScaler | None = None,
) -> None:
    """Write model, optimizer, RNG, loss-scaler and loop state to ``path`` (atomically)."""
    tensors = {f"model.{name}": t for name, t in state_dict_for_saving(model).items()}
    opt = optimizer.state_dict()
    opt_scalars: dict[str, dict] = {}
    for index, param_state in opt["state"].items():
        for key, value in param_state.items():
            if torch.is_tensor(value):
                tensors[f"optim.{index}.{key}"] = value.detach().cpu().contiguous()
            else:
                opt_scalars.setdefault(str(index), {})[key] = value
    for name, rng in rng_state(model_device(model)).items():
        tensors[f"rng.{name}"] = rng
    if state.epoch_generator_state is not None:
        tensors["rng.epoch_batches"] = state.epoch_generator_state
    loop = {f.name: getattr(state, f.name) for f in fields(state) if f.name != "epoch_generator_state"}
    meta = {
        "fit": loop,
        "optimizer_groups": opt["param_groups"],
        "optimizer_scalars": opt_scalars,
        "data_fingerprint": data_fingerprint,
        "grad_scaler": scaler.state_dict() if scaler is not None else None,  # floats and ints
    }
    atomic_write_bytes(path, safetensors_bytes(tensors, metadata={_META_KEY: json.dumps(meta)}))


def load_fit_state(
    path: Path,
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    data_fingerprint: str,
    scaler: torch.amp.GradScaler | None = None,
) -> FitState:
    """Restore model, optimizer, loss scaler and the RNGs from ``path`` onto the model's device; return the loop
    state to continue from."""
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = json.loads(f.metadata()[_META_KEY])
            tensors = {key: f.get_tensor(key) for key in f.keys()}
    except (SafetensorError, OSError, KeyError, TypeError, json.JSONDecodeError) as err:
        raise InputError(f"{path}: not a readable attnkit training state ({err})") from None
    if "fit" not in meta:
        raise InputError(f"{path}: a training state written by an older attnkit; it cannot be resumed by this one")
    if meta["data_fingerprint"] != data_fingerprint:
        raise InputError(
            f"{path}: the training data differs from the data this run was started on; resume with the same files"
        )
    # The tensors are read on the CPU; load_state_dict copies them onto the model's device.
    model.load_state_dict({name[len("model.") :]: t for name, t in tensors.items() if name.startswith("model.")})
    per_param: dict[int, dict] = {}
    for name, tensor in tensors.items():
        if name.startswith("optim."):
            _, index, key = name.split(".", 2)
            per_param.setdefault(int(index), {})[key] = tensor  # load_state_dict moves it to its parameter's device
    for index, scalars in meta["optimizer_scalars"].items():
        per_param.setdefault(int(index), {}).update(scalars)
    groups = meta["optimizer_groups"]
    for group in groups:  # JSON turned tuples into lists
        if "betas" in group:
            group["betas"] = tuple(group["betas"])
    implementation = [{k: g.get(k) for k in ("fused", "foreach")} for g in optimizer.param_groups]
    optimizer.load_state_dict({"state": per_param, "param_groups": groups})
    for group, kernel in zip(optimizer.param_groups, implementation):
        group.update(kernel)  # which kernel steps is this run's choice (make_optimizer), not the saved run's
    if scaler is not None and meta.get("grad_scaler"):  # a run saved without one (fp32, bf16) starts at its default
        scaler.load_state_dict(meta["grad_scaler"])
    rngs = {name: tensors[f"rng.{name}"] for name in ("torch", "cuda", "mps") if f"rng.{name}" in tensors}
    set_rng_state(rngs, model_device(model))
    return FitState(**meta["fit"], epoch_generator_state=tensors.get("rng.epoch_batches"))


def unfinished(run_dir: str | Path) -> str | None:
    """What to tell the user of a run whose training state stops short of its plan with no reason to: not ended by
    ``patience``, and with no ``max_minutes`` that may have ended it. Such a run was killed or interrupted (a closed
    terminal, ``| head``) and holds its best weights so far; a run whose training is going on right now is said to
    be (``runs.training_now``). None for any other run, or one with no state (averaged, exported)."""
    saved = _saved(run_dir)
    if saved is None:
        return None
    step, planned, stale, train = saved
    if (holder := runs.training_now(run_dir)) is not None:
        return f"{run_dir} is being trained ({holder}): these are its best weights as of step {step} of {planned}"
    if (
        not planned
        or step >= planned
        or train.get("max_minutes")
        or (train.get("patience") and stale >= train["patience"])
    ):
        return None
    return (
        f"{run_dir} trained {step} of its {planned} planned steps and was stopped (killed or interrupted): these are "
        "its best weights so far; the same train command with --resume finishes it"
    )


def interrupted(run_dir: str | Path) -> str:
    """What a training run stopped by Ctrl-C leaves in ``run_dir``: the step it last saved, which ``--resume``
    continues from, or nothing to continue (stopped before its first save, which comes every ``checkpoint_every``
    steps and at each evaluation)."""
    saved = _saved(run_dir)
    if saved is not None:
        step, planned, _, _ = saved
        return (
            f"{run_dir} keeps the run as saved at step {step} of {planned}: the same train command with --resume "
            "continues from there"
        )
    try:
        train = runs.read_json(Path(run_dir) / runs.CONFIG)["train"]
        when = f"every {int(train['checkpoint_every'])} steps and at each evaluation"
    except (OSError, KeyError, TypeError, ValueError, InputError):
        when = "every checkpoint_every steps and at each evaluation"
    return f"{run_dir} holds nothing to resume: the run was stopped before its first save ({when})"


def _saved(run_dir: str | Path) -> tuple[int, int, int, dict] | None:
    """(step, planned steps, evaluations without improvement) of the run's saved training state, and its training
    config; None without both."""
    run_dir = Path(run_dir)
    try:
        with safe_open(str(run_dir / STATE), framework="pt") as f:
            fit = json.loads(f.metadata()[_META_KEY])["fit"]
        step, planned, stale = int(fit["step"]), int(fit["planned_steps"]), int(fit["stale"])
        train = runs.read_json(run_dir / runs.CONFIG)["train"]
    except (SafetensorError, OSError, KeyError, TypeError, ValueError, InputError):
        return None
    return step, planned, stale, train


def fingerprint_texts(*columns: list[str]) -> str:
    """sha256 over the training texts (and labels): resuming on other data would not be a resume."""
    import hashlib

    digest = hashlib.sha256()
    for column in columns:
        for value in column:
            digest.update(value.encode("utf-8"))
            digest.update(b"\x00")
        digest.update(b"\x01")
    return digest.hexdigest()
