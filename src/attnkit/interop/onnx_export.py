"""Classifier runs as ONNX models: ``attnkit export onnx`` (the onnxruntime parity check: ``onnx_check``).

``export_onnx`` writes three files for ``--out FILE.onnx``:

    FILE.onnx             the classifier's graph and weights: input ``ids`` int64 (B, S), output ``logits`` float32
                          (B, C), with B and S dynamic (1 <= S <= max_len). Its ``metadata_props`` hold the labels,
                          pad id, length policy and output activation under the key ``attnkit``.
    FILE.tokenizer.json   the run's ``tokenizer.json``, byte for byte (the `tokenizers` library's own format,
                          ``tokenizers.Tokenizer.from_file``); named after FILE so two exports can share a folder.
    FILE.json             everything needed to use FILE.onnx without attnkit: the same metadata, plus the sha256 of
                          FILE.onnx, the source run and the check below.

The three are written to hidden temporary files, and FILE.onnx is checked before any of them appears: onnxruntime
(where it is installed) runs it on a padded batch, the texts of ``--check`` if given, and its logits must be
attnkit's to 1e-4. Only then are they renamed into place, one after another: a failed check, or a kill before it,
leaves an earlier export as it was.

To classify a text with them, as ``attnkit classify predict`` does: ``tokenizer =
tokenizers.Tokenizer.from_file(FILE.tokenizer.json)``; ``tokenizer.encode_special_tokens = True`` where
``encode_special_tokens`` is true in ``input`` (a BPE tokenizer: ``"<pad>"`` typed in a text is text, as attnkit reads
it, not the padding id; the `tokenizers` library does not save this setting); ``ids = tokenizer.encode(text).ids``
(the tokenizer prepends CLS itself when the model pools it); cut ids longer than ``max_len`` to the first ``max_len``
(keeping the last ``keep_last`` ids, BERT's [SEP]) or refuse them, as ``max_len_policy`` says; right-pad a batch
with ``pad_id``; padding never changes a row's logits. ``activation`` "softmax" gives P(labels[c]) = softmax(logits)[c];
"sigmoid" (one logit, a binary head) gives P(labels[1]) = sigmoid(logit).

Exporter: ``torch.onnx.export(dynamo=True)`` (torch.export + onnxscript), the default since PyTorch 2.9. It exports
attnkit's model unchanged (the fused QKV projection's ``torch.cat`` of the three weights is folded into one
constant; ``F.scaled_dot_product_attention`` with a boolean mask becomes plain MatMul/Softmax ops) with truly
symbolic batch and sequence dimensions, and matches attnkit to ~1e-6 at shapes other than the example's. The
TorchScript exporter (``dynamo=False``) gives equally correct numbers here but is deprecated, and traces the
``length <= max_len`` check of the positional table as a constant (a TracerWarning); it is not used. The dynamo
exporter writes opset 18 or newer: a lower opset goes through ONNX's version converter, whose opset-17 graph
onnxruntime rejects (``Split`` with ``num_outputs``), so ``opset`` below 18 is refused; above 25 it falls back to
writing 18 (onnxscript 0.7), so those are refused too. Opsets 23 and 24 export attention as ONNX's ``Attention``
operator, which onnxruntime 1.32 runs wrongly with a padding mask of more than one token (the check catches it).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import logging
import warnings
from contextlib import contextmanager
from pathlib import Path

import torch

from attnkit import __version__
from attnkit.atomic import open_atomic
from attnkit.errors import InputError, check_texts
from attnkit.interop.onnx_check import INPUT, OUTPUT, check_written, require

FORMAT = "attnkit-onnx/1"
MIN_OPSET, MAX_OPSET = 18, 25  # what the dynamo exporter writes as asked (module docstring)
METADATA_KEY = "attnkit"  # the ONNX metadata_props key holding the JSON metadata


def sidecar_paths(onnx_path: str | Path) -> tuple[Path, Path]:
    """The metadata JSON and tokenizer written beside ``FILE.onnx``: ``FILE.json`` and ``FILE.tokenizer.json``."""
    onnx_path = Path(onnx_path)
    return onnx_path.with_suffix(".json"), onnx_path.with_suffix(".tokenizer.json")


@contextmanager
def _quiet_exporter():
    """Library code never prints: silence the exporter's notes the user cannot act on (torchvision ops it skips,
    deprecations inside torch.export), for the duration of one export."""
    logger = logging.getLogger("torch.onnx")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            yield
    finally:
        logger.setLevel(level)


def _check_replaceable(out_path: Path) -> None:
    """FILE.onnx and its two sidecars may replace only an earlier export's (its FILE.json says so): never a file of
    the user's, such as another model's ONNX or a run's config.json (``--out RUN/config.onnx``)."""
    meta_path, tokenizer_path = sidecar_paths(out_path)
    existing = [path for path in (out_path, meta_path, tokenizer_path) if path.exists()]
    if not existing:
        return
    try:
        ours = json.loads(meta_path.read_text(encoding="utf-8")).get("format") == FORMAT
    except (OSError, ValueError, AttributeError):
        ours = False
    if not ours:
        raise InputError(
            f"{existing[0]}: exists and is not from an earlier attnkit export (which {meta_path.name} would say); "
            "choose another --out"
        )


def export_onnx(
    run_dir: str | Path, out_path: str | Path, *, opset: int | None = None, check: list[str] | None = None
) -> Path:
    """Write the classifier run at ``run_dir`` as ``out_path`` (FILE.onnx) with FILE.json and FILE.tokenizer.json,
    checked before they appear (module docstring); FILE.json's ``check`` says what was checked.

    Args:
        opset: ONNX operator set to write, 18 to 25 (None: the exporter's default).
        check: texts to check the export on as well (``--check``), besides a padded batch of unknown tokens.
    Returns:
        ``out_path``.
    Raises:
        InputError: onnx or onnxscript is missing, ``out_path`` does not end in ``.onnx`` or is a directory, the
            opset is out of range, the run is not a readable classifier (a translator is refused) or its
            ``max_len`` is 1, or onnxruntime's logits are not attnkit's (nothing is written then).
    """
    from attnkit import runs
    from attnkit.tasks.classify import ClassifierRun

    require("onnx", "onnxscript")
    import onnx

    out_path = Path(out_path)
    if out_path.suffix != ".onnx":
        raise InputError(f"{out_path}: the output file name must end in .onnx")
    if out_path.is_dir():
        raise InputError(f"{out_path}: is a directory; give a file name ending in .onnx")
    _check_replaceable(out_path)
    newest = min(MAX_OPSET, onnx.defs.onnx_opset_version())
    if opset is not None and not MIN_OPSET <= opset <= newest:
        raise InputError(f"opset {opset}; expected {MIN_OPSET} to {newest}")
    if check is not None:
        check = check_texts(check, "--check text #{}")  # before the export: an empty one would fail the check
    run = ClassifierRun(run_dir)  # checks the files against the manifest and that the run is a classifier
    tokenizer, cfg = run.tokenizer, run.model_cfg
    if cfg.max_len < 2:  # torch.export's dynamic length starts at 2 (a traceback of the exporter otherwise)
        raise InputError(f"{run.run_dir}: max_len={cfg.max_len}; an ONNX export needs max_len >= 2")

    # The example only has to be traced; B = 2 and S = 8 keep the exporter from specializing a dimension of size 1.
    length = min(8, cfg.max_len)
    example = torch.full((2, length), tokenizer.unk_id, dtype=torch.long)  # (B, S)
    example[1, length // 2 :] = tokenizer.pad_id
    dynamic = {INPUT: {0: torch.export.Dim("batch"), 1: torch.export.Dim("seq", max=cfg.max_len)}}
    # Imported before the exporter, which imports it lazily: a Ctrl-C in that import left it half-imported, and the
    # exporter's own error handler failed on it (`module 'torch._dynamo' has no attribute 'exc'`, a 100-line traceback).
    importlib.import_module("torch._dynamo")
    with _quiet_exporter(), torch.no_grad():
        program = torch.onnx.export(
            run.model,
            (example,),
            input_names=[INPUT],
            output_names=[OUTPUT],
            dynamo=True,
            dynamic_shapes=dynamic,
            opset_version=opset,
            verbose=False,
        )
    if program is None:  # torch returns None only for the legacy (dynamo=False) exporter
        raise RuntimeError("torch.onnx.export(dynamo=True) returned no program")
    proto = program.model_proto
    written = next(op.version for op in proto.opset_import if op.domain in ("", "ai.onnx"))
    if opset is not None and written != opset:
        raise InputError(f"opset {opset} was asked for, the exporter wrote opset {written}")

    meta = {
        "format": FORMAT,
        "attnkit_version": __version__,
        "exporter": f"torch.onnx.export(dynamo=True), torch {torch.__version__}",
        "opset": written,
        "input": {
            "name": INPUT,
            "dtype": "int64",
            "shape": ["batch", "seq"],
            "pad_id": tokenizer.pad_id,
            "max_len": cfg.max_len,
            "max_len_policy": run.max_len_policy,
            "keep_last": tokenizer.n_trailing_specials,
            "encode_special_tokens": tokenizer.lossless,  # tokenizer.json cannot say it (module docstring)
        },
        "output": {
            "name": OUTPUT,
            "dtype": "float32",
            "shape": ["batch", cfg.n_classes],
            "activation": "sigmoid" if cfg.n_classes == 1 else "softmax",
        },
        "labels": run.labels,
        "pooling": cfg.pooling,
        "tokenizer": tokenizer.meta(),  # kind, special-token roles and fingerprint
    }
    del proto.metadata_props[:]
    proto.metadata_props.add(key=METADATA_KEY, value=json.dumps(meta, ensure_ascii=False))
    onnx.checker.check_model(proto)
    data = proto.SerializeToString()

    meta_path, tokenizer_path = sidecar_paths(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as written:  # each file appears when the block ends, the three one after another
        onnx_file, tokenizer_file, meta_file = (
            written.enter_context(open_atomic(p)) for p in (out_path, tokenizer_path, meta_path)
        )
        onnx_file.write(data)
        onnx_file.flush()
        tokenizer_file.write((run.run_dir / runs.TOKENIZER).read_bytes())
        checked = check_written(run, Path(onnx_file.name), example, check or [], out_path)
        record = {
            **meta,
            "onnx": {"file": out_path.name, "sha256": hashlib.sha256(data).hexdigest()},
            "tokenizer": {"file": tokenizer_path.name, **meta["tokenizer"]},
            "source_run": str(run.run_dir.resolve()),
            "source_manifest_sha256": runs.sha256_file(run.run_dir / runs.MANIFEST),
            "check": checked,
        }
        meta_file.write((json.dumps(record, indent=2, ensure_ascii=False) + "\n").encode("utf-8"))
    return out_path
