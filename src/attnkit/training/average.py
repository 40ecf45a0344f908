"""Checkpoint averaging (§6.1: "we used a single model obtained by averaging the last 5 checkpoints").

The average of the last N step checkpoints of a run is written as a new, self-contained run directory.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from safetensors.torch import save as safetensors_bytes

from attnkit import runs
from attnkit.errors import InputError
from attnkit.runs import checkpoint_paths

AVERAGED_FROM = "averaged_from.json"  # which run and checkpoints an averaged run directory was made from


def average_checkpoints(run_dir: str | Path, last: int, out_dir: str | Path) -> list[Path]:
    """Average the last ``last`` checkpoints of ``run_dir`` into ``out_dir``; returns the checkpoints used."""
    run_dir = runs.check_run_dir(run_dir)
    out_dir = Path(out_dir)
    if last < 1:
        raise InputError(f"--last {last}: must be >= 1")
    paths = checkpoint_paths(run_dir)
    if len(paths) < last:
        raise InputError(
            f"{run_dir}: has {len(paths)} checkpoint(s) in {run_dir / 'checkpoints'}; cannot average the last {last}"
            + (f": average fewer (--last {len(paths)}), or" if len(paths) > 1 else ";")
            + " train with --set keep_last=N checkpoint_every=K (a step checkpoint every K steps and one at the end, "
            "the last N kept; classifiers keep none by default)"
        )
    if out_dir.resolve() == run_dir.resolve():
        raise InputError(f"--out {out_dir}: must differ from the run directory")
    if out_dir.exists() and any(out_dir.iterdir()) and not (out_dir / AVERAGED_FROM).is_file():
        what = "a run that average did not write" if (out_dir / runs.CONFIG).is_file() else "not an attnkit run"
        raise InputError(f"{out_dir}: exists and is {what}; choose a new --out (average replaces only its own)")
    used = paths[-last:]
    total: dict[str, torch.Tensor] = {}
    for path in used:
        try:
            tensors = load_file(str(path))
        except (SafetensorError, OSError) as err:  # the manifest does not cover step checkpoints: say which one
            raise InputError(f"{path}: not a readable safetensors file ({err}): damaged or cut short") from None
        if total and (tensors.keys() != total.keys() or any(t.shape != total[k].shape for k, t in tensors.items())):
            raise InputError(
                f"{path}: holds other tensors (names or shapes) than {used[0].name}; the checkpoints of one run "
                "average, not those of two"
            )
        for name, tensor in tensors.items():
            total[name] = total.get(name, 0) + tensor.double()  # float64 sums: the order of addition does not matter
    averaged = {name: (tensor / last).float().contiguous() for name, tensor in total.items()}

    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / runs.LABELS).unlink(missing_ok=True)  # an earlier average's, of a classifier
    for name in (runs.CONFIG, runs.TOKENIZER, runs.LABELS):  # what the run is, besides its weights
        if name != runs.LABELS or (run_dir / name).is_file():  # labels: a classifier's
            runs.atomic_write_bytes(out_dir / name, (run_dir / name).read_bytes())
    runs.atomic_write_bytes(out_dir / runs.WEIGHTS, safetensors_bytes(averaged))
    runs.atomic_write_json(out_dir / AVERAGED_FROM, {"run": str(run_dir), "checkpoints": [p.name for p in used]})
    runs.write_manifest(out_dir)
    return used
