"""ONNX export of classifier runs: onnxruntime gives attnkit's logits (to 1e-4) on a padded batch of texts and at
batch sizes and lengths other than the exported example's, for mean and CLS pooling; the files written beside the
model classify text without the run directory; translators, bad opsets and missing packages are refused clearly.

onnx, onnxscript and onnxruntime are test-only dependencies; without them the module is skipped."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from attnkit.errors import InputError
from attnkit.interop.onnx_check import check_onnx
from attnkit.interop.onnx_export import METADATA_KEY, export_onnx, sidecar_paths
from attnkit.tasks.classify import ClassifierRun

onnx = pytest.importorskip("onnx", reason="ONNX export needs onnx (pip install onnx onnxscript onnxruntime)")
pytest.importorskip("onnxscript", reason="the dynamo ONNX exporter needs onnxscript (pip install onnxscript)")
ort = pytest.importorskip("onnxruntime", reason="the parity check needs onnxruntime (pip install onnxruntime)")

TINY = ["d_model=16", "n_heads=2", "d_ff=32", "n_layers=2", "min_freq=1"]
POS = ["good film", "great fun", "loved it a lot", "wonderful acting and a fine story", "nice", "a really great film"]
NEG = ["bad film", "awful", "hated it so much", "terrible acting and a boring story", "poor", "a really bad film"]
TRAIN_TSV = "text\tlabel\n" + "".join(f"{POS[i % 6]}\tpos\n{NEG[i % 6]}\tneg\n" for i in range(15))  # 30 lines
PAIRS_TSV = "source\ttarget\na b c\tc b a\nd e\te d\nf g h i\ti h g f\n"
# Different lengths, so the batch is padded; words unseen in training map to <unk>.
TEXTS = [
    "good",
    "hated it so much, really",
    "a wonderful film with great acting and a fine story, loved it",
    "bad film",
    "nice fun",
    "awful acting",
]


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def runs(tmp_path_factory, quietly) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("onnx-runs")
    (tmp / "train.tsv").write_text(TRAIN_TSV, encoding="utf-8")
    (tmp / "pairs.tsv").write_text(PAIRS_TSV, encoding="utf-8")
    for pooling in ("mean", "cls"):
        quietly(
            "classify",
            "train",
            "--train",
            str(tmp / "train.tsv"),
            "--out",
            str(tmp / pooling),
            "--epochs",
            "1",
            "--quiet",
            "--set",
            *TINY,
            f"pooling={pooling}",
        )
    quietly(
        "translate",
        "train",
        "--train",
        str(tmp / "pairs.tsv"),
        "--out",
        str(tmp / "mt"),
        "--max-steps",
        "1",
        "--quiet",
        "--set",
        *TINY,
        "tokenizer=word",
        "valid_bleu=false",
        "max_len=16",
    )
    return {"mean": tmp / "mean", "cls": tmp / "cls", "mt": tmp / "mt"}


@pytest.fixture(scope="module")
def exports(runs, tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("onnx-out")
    return {pooling: export_onnx(runs[pooling], out / f"{pooling}.onnx") for pooling in ("mean", "cls")}


def _session(path: Path):
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_padded_batch_of_texts_matches_attnkit(runs, exports, pooling):
    run = ClassifierRun(runs[pooling])
    lengths = {len(run.tokenizer.encode(text)) for text in TEXTS}
    assert len(lengths) >= 4  # a padded batch: rows of several lengths
    diff = check_onnx(runs[pooling], exports[pooling], TEXTS)
    assert diff < 1e-4


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_dynamic_batch_and_sequence_axes(runs, exports, pooling):
    """The export traced a (2, 8) example; other shapes, up to max_len, give attnkit's logits too."""
    run = ClassifierRun(runs[pooling])
    graph_input = onnx.load(str(exports[pooling])).graph.input[0]
    assert graph_input.name == "ids"
    assert [d.dim_param for d in graph_input.type.tensor_type.shape.dim] == ["batch", "seq"]  # symbolic, not fixed
    session = _session(exports[pooling])
    generator = torch.Generator().manual_seed(0)
    V, max_len = run.model_cfg.vocab_size, run.model_cfg.max_len
    for B, S in [(1, 1), (5, 23), (3, max_len)]:
        ids = torch.randint(5, V, (B, S), generator=generator)  # (B, S), no special tokens
        ids[-1, S // 2 + 1 :] = run.tokenizer.pad_id  # the last row padded
        with torch.no_grad():
            expected = run.model(ids)  # (B, C)
        got = torch.from_numpy(session.run(["logits"], {"ids": ids.numpy()})[0])  # (B, C)
        assert got.shape == (B, len(run.labels))
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)


def test_exported_files_classify_without_the_run(runs, exports):
    """FILE.json, FILE.tokenizer.json and FILE.onnx alone give ``classify predict``'s probabilities."""
    from tokenizers import Tokenizer as Backend

    meta_path, tokenizer_path = sidecar_paths(exports["mean"])
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    assert meta["onnx"]["sha256"] == hashlib.sha256(exports["mean"].read_bytes()).hexdigest()
    assert tokenizer_path.read_bytes() == (runs["mean"] / "tokenizer.json").read_bytes()
    embedded = json.loads({p.key: p.value for p in onnx.load(str(exports["mean"])).metadata_props}[METADATA_KEY])
    assert embedded["labels"] == meta["labels"] == ["neg", "pos"]
    assert embedded["input"]["pad_id"] == meta["input"]["pad_id"]

    tokenizer = Backend.from_file(str(tokenizer_path))
    seqs = [tokenizer.encode(text).ids[: meta["input"]["max_len"]] for text in TEXTS]
    width = max(map(len, seqs))
    ids = np.array([s + [meta["input"]["pad_id"]] * (width - len(s)) for s in seqs], dtype=np.int64)  # (N, S)
    logits = _session(exports["mean"]).run([meta["output"]["name"]], {meta["input"]["name"]: ids})[0]  # (N, C)
    assert meta["output"]["activation"] == "softmax"
    probs = torch.from_numpy(logits).softmax(dim=-1)  # (N, C)

    predictions = ClassifierRun(runs["mean"]).predict(TEXTS)
    expected = torch.tensor([[p.probs[label] for label in meta["labels"]] for p in predictions])
    torch.testing.assert_close(probs, expected, atol=1e-5, rtol=0)


def test_translator_run_is_refused(runs, tmp_path):
    with pytest.raises(InputError, match="not a classifier"):
        export_onnx(runs["mt"], tmp_path / "mt.onnx")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("opset", [17, 26, 99])  # 26: onnxscript 0.7 wrote 18 instead, after a traceback
def test_unsupported_opset_is_refused(runs, tmp_path, opset):
    with pytest.raises(InputError, match=f"opset {opset}; expected 18 to"):
        export_onnx(runs["mean"], tmp_path / "m.onnx", opset=opset)


def test_an_export_replaces_only_an_earlier_exports_files(runs, exports, tmp_path):
    """FILE.json and FILE.tokenizer.json were written over whatever was there: a user's file, or with ``--out
    RUN/config.onnx`` the run's own config.json (the run then failed its manifest). Only an earlier export's three
    files may be replaced."""
    from attnkit.interop.onnx_export import _check_replaceable

    _check_replaceable(exports["mean"])  # an earlier export: replaceable
    (tmp_path / "model.json").write_text('{"mine": 1}', encoding="utf-8")
    with pytest.raises(InputError, match=r"model.json: exists and is not from an earlier attnkit export"):
        export_onnx(runs["mean"], tmp_path / "model.onnx")
    assert (tmp_path / "model.json").read_text(encoding="utf-8") == '{"mine": 1}'
    with pytest.raises(InputError, match=r"config.json: exists and is not from an earlier attnkit export"):
        export_onnx(runs["mean"], runs["mean"] / "config.onnx")
    (tmp_path / "other.onnx").write_bytes(b"another model")
    with pytest.raises(InputError, match=r"other.onnx: exists and is not from an earlier attnkit export"):
        export_onnx(runs["mean"], tmp_path / "other.onnx")


def test_an_empty_check_text_is_refused_before_the_export(runs, tmp_path, capsys):
    """``--check ""`` failed in onnxruntime after a good export, as if the model were at fault, and the files were
    written with exit code 2."""
    from attnkit.cli import main

    out = tmp_path / "m.onnx"
    assert main(["export", "onnx", "--model", str(runs["mean"]), "--out", str(out), "--check", "good", " "]) == 2
    assert capsys.readouterr().err == "error: --check text #2 is empty\n"
    assert not out.exists()


def test_an_export_is_checked_before_it_is_written_and_a_failed_one_leaves_the_earlier(runs, tmp_path, monkeypatch):
    """Opsets 23 and 24 wrote a model onnxruntime 1.32 cannot run on two tokens, with exit code 0; a failed
    ``--check`` left the export on disk. Every export is now run by onnxruntime before its files appear (FILE.json
    says how it went), and one whose logits are not attnkit's replaces nothing."""
    from attnkit.interop import onnx_check

    out = tmp_path / "m.onnx"
    export_onnx(runs["mean"], out, check=["good", "hated it"])
    checked = json.loads(out.with_suffix(".json").read_text(encoding="utf-8"))["check"]
    assert checked["texts"] == 2 and checked["max_abs_diff"] < 1e-4
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    monkeypatch.setattr(onnx_check, "max_abs_diff", lambda *args: 0.5)  # an export that computes something else
    with pytest.raises(InputError, match=r"m.onnx: onnxruntime's logits differ from attnkit's by 0.5 .* nothing was"):
        export_onnx(runs["cls"], out)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # no temporary file left either


def test_a_run_of_max_len_1_is_refused_not_a_traceback(runs, tmp_path, quietly):
    """torch.export's dynamic length starts at 2: a run of max_len=1 ended in a 122-line traceback (exit 1)."""
    run = tmp_path / "short"
    train = ["classify", "train", "--train", str(runs["mean"].parent / "train.tsv"), "--out", str(run)]
    quietly(*train, "--max-steps", "1", "--quiet", "--set", *TINY, "max_len=1")
    with pytest.raises(InputError, match=r"max_len=1; an ONNX export needs max_len >= 2"):
        export_onnx(run, tmp_path / "m.onnx")
    assert not (tmp_path / "m.onnx").exists()


def test_output_name_must_end_in_onnx(runs, tmp_path):
    with pytest.raises(InputError, match=r"must end in \.onnx"):
        export_onnx(runs["mean"], tmp_path / "m.json")


def test_missing_onnxruntime_says_what_to_install(runs, exports, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # `import onnxruntime` now raises ImportError
    with pytest.raises(InputError, match="onnxruntime, which is not installed .*pip install .*onnxruntime"):
        check_onnx(runs["mean"], exports["mean"], TEXTS)


def test_unreadable_model_is_refused(runs, tmp_path):
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not an ONNX protobuf")
    with pytest.raises(InputError, match="broken.onnx: onnxruntime cannot run it"):
        check_onnx(runs["mean"], broken, TEXTS)
