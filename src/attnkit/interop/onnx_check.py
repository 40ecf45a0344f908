"""An ONNX export checked against attnkit: onnxruntime runs it on the run's input, and its logits must be the run's.

``check_written`` checks an export before ``onnx_export.export_onnx`` lets it appear (on a padded batch, and the
texts of ``attnkit export onnx --check``); ``check_onnx`` checks an export on disk against its run.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import numpy as np
import torch

from attnkit.errors import InputError, check_texts

INPUT, OUTPUT = "ids", "logits"  # the exported graph's input and output names
PIP = "pip install onnx onnxscript onnxruntime"
CHECK_TOLERANCE = 1e-4  # |onnxruntime logits - attnkit logits| an export may differ by (measured: ~1e-6)


def require(*modules: str) -> None:
    missing = []
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if missing:
        verb = "is" if len(missing) == 1 else "are"
        raise InputError(f"ONNX export and checking need {' and '.join(missing)}, which {verb} not installed ({PIP})")


def check_written(run, path: Path, example: torch.Tensor, texts: list[str], out_path: Path) -> dict[str, object]:
    """The export at ``path`` (a temporary name of ``out_path``) run by onnxruntime on ``example`` (B, S), padded,
    and on ``texts``: what was checked and the largest logit difference from attnkit, for FILE.json; an InputError
    when it is over ``CHECK_TOLERANCE`` or onnxruntime cannot run it. Without onnxruntime, ``texts`` are refused
    (they ask for a check) and the batch is not checked."""
    try:
        importlib.import_module("onnxruntime")
    except ImportError:
        if texts:
            require("onnxruntime")
        return {"onnxruntime": None, "note": f"not checked: onnxruntime is not installed ({PIP})"}
    import onnxruntime

    nothing = "nothing was written; another --opset may export correctly"
    try:
        diff = max_abs_diff(run, path, example, out_path)
        if texts:
            diff = max(diff, max_abs_diff(run, path, encoded(run, texts), out_path))
    except InputError as err:
        raise InputError(f"{err}; {nothing}") from None
    if not diff <= CHECK_TOLERANCE:
        raise InputError(
            f"{out_path}: onnxruntime's logits differ from attnkit's by {diff:.3g} (over {CHECK_TOLERANCE:g}): "
            f"{nothing}"
        )
    return {"onnxruntime": onnxruntime.__version__, "texts": len(texts), "max_abs_diff": diff}


def encoded(run, texts: list[str]) -> torch.Tensor:
    """``texts`` as the run encodes them, right-padded into one (N, S) batch."""
    from attnkit.data.batching import pad
    from attnkit.tasks.classify import encode_examples

    seqs, _ = encode_examples(run.tokenizer, texts, run.model_cfg.max_len, run.max_len_policy)
    return pad(seqs, run.tokenizer.pad_id)  # (N, S)


def max_abs_diff(run, path: Path, ids: torch.Tensor, shown: Path) -> float:
    """Max |onnxruntime logits - attnkit logits| of the model at ``path`` on ``ids`` (N, S); an InputError naming
    ``shown`` when onnxruntime cannot run it or its logits have another shape (an export of another run)."""
    import onnxruntime

    options, run_options = onnxruntime.SessionOptions(), onnxruntime.RunOptions()
    options.log_severity_level = run_options.log_severity_level = 4  # fatal only: its errors are reported below
    try:
        session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        got = session.run([OUTPUT], {INPUT: ids.numpy()}, run_options)[0]  # (N, C)
    except Exception as err:  # onnxruntime raises its own exception types for unreadable or mismatched models
        why = " ".join(str(err).split())  # one line: its messages span several
        raise InputError(f"{shown}: onnxruntime cannot run it on the run's input ({why})") from None
    with torch.inference_mode():
        expected = run.model(ids.to(run.device)).float().cpu().numpy()  # (N, C)
    if got.shape != expected.shape:
        raise InputError(
            f"{shown}: gives logits of shape {got.shape}, the run {expected.shape}: exported from another run?"
        )
    return float(np.abs(got - expected).max())


def check_onnx(run_dir: str | Path, onnx_path: str | Path, texts: list[str]) -> float:
    """Max |onnxruntime logits - attnkit logits| over ``texts``, encoded as the run encodes them and right-padded
    into one (N, S) batch for onnxruntime.

    Raises:
        InputError: onnxruntime is missing, no texts are given, ``onnx_path`` cannot be loaded, or its logits do not
            have the run's shape (an export of another run).
    """
    from attnkit.tasks.classify import ClassifierRun

    require("onnxruntime")
    texts = check_texts(texts, "--check text #{}")  # an empty one fails in onnxruntime, as if the model did
    if not texts:
        raise InputError("check_onnx: no texts given")
    onnx_path = Path(onnx_path)
    if not onnx_path.is_file():
        raise InputError(f"{onnx_path}: no such file")
    run = ClassifierRun(run_dir)
    return max_abs_diff(run, onnx_path, encoded(run, texts), onnx_path)
