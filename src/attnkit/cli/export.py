"""``attnkit export hf | onnx | ct2``: a run in another library's format."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from attnkit.cli.arguments import Parser
from attnkit.cli.common import note_unfinished, print_json


def cmd_export_onnx(args: argparse.Namespace) -> None:
    import json

    from attnkit.interop.onnx_export import export_onnx, sidecar_paths

    note_unfinished(args.model)  # a run stopped part-way, or being trained now: which weights are exported
    out = export_onnx(args.model, args.out, opset=args.opset, check=args.check)  # checked before it is written
    meta_path, tokenizer_path = sidecar_paths(out)
    result: dict[str, object] = {"out": str(out), "files": [str(p) for p in (out, meta_path, tokenizer_path)]}
    checked = json.loads(meta_path.read_text(encoding="utf-8"))["check"]
    if "max_abs_diff" in checked:  # onnxruntime vs attnkit logits, over a padded batch and the --check texts
        result["max_abs_diff"] = checked["max_abs_diff"]
    else:
        print(f"note: {checked['note']}", file=sys.stderr)
    print_json(result)


def cmd_export_ct2(args: argparse.Namespace) -> None:
    from attnkit.interop.ct2.export import export_ct2

    note_unfinished(args.model)
    out = export_ct2(args.model, args.out, quantization=args.quantization)
    print_json({"out": str(out), "files": sorted(p.name for p in out.iterdir())})


def cmd_export_hf(args: argparse.Namespace) -> None:
    from attnkit.interop.bert import export_bert_folder

    note_unfinished(args.model)
    out = export_bert_folder(args.model, args.out, encoder_only=args.encoder_only)
    print_json({"out": str(out), "files": sorted(p.name for p in out.iterdir())})


def add_commands(commands: argparse._SubParsersAction) -> None:
    export = commands.add_parser("export", help="write a run in another library's format")
    export_cmds = export.add_subparsers(dest="subcommand", required=True, parser_class=Parser)
    p = export_cmds.add_parser(
        "hf",
        help="a BERT-shaped classifier run as a Hugging Face BERT folder (BertForSequenceClassification with its "
        "labels, for cls pooling; --encoder-only: a BertModel, any pooling), a pretraining run as a BertForMaskedLM",
    )
    p.add_argument("--model", type=Path, required=True, help="classifier or pretraining run directory")
    p.add_argument(
        "--out",
        type=Path,
        required=True,
        help="folder to write (config.json, model.safetensors, tokenizer.json, tokenizer_config.json; vocab.txt for "
        "a WordPiece vocabulary)",
    )
    p.add_argument(
        "--encoder-only",
        action="store_true",
        help="write the encoder alone as a BertModel (any pooling; the head is not written, nor BERT's tanh pooler, "
        "which attnkit's models do not have: use last_hidden_state)",
    )
    p.set_defaults(func=cmd_export_hf)
    p = export_cmds.add_parser(
        "onnx", help="a classifier run as an ONNX model (dynamic batch and length) for onnxruntime"
    )
    p.add_argument("--model", type=Path, required=True, help="classifier run directory")
    p.add_argument(
        "--out",
        type=Path,
        required=True,
        help="FILE.onnx to write; FILE.json (labels, pad id, length policy) and FILE.tokenizer.json go beside it",
    )
    p.add_argument("--opset", type=int, default=None, help="ONNX opset, 18 to 25 (default: the exporter's)")
    p.add_argument(
        "--check",
        nargs="+",
        metavar="TEXT",
        help="check the export on these texts too (it is always checked on a padded batch, where onnxruntime is "
        "installed, before it is written): print the max abs logit difference from attnkit",
    )
    p.set_defaults(func=cmd_export_onnx)
    p = export_cmds.add_parser("ct2", help="a translator run as a CTranslate2 model directory")
    p.add_argument("--model", type=Path, required=True, help="translator run directory")
    p.add_argument(
        "--out",
        type=Path,
        required=True,
        help="directory to write (model.bin, config.json, shared_vocabulary.json, tokenizer.json, attnkit_ct2.json)",
    )
    p.add_argument(
        "--quantization",
        metavar="TYPE",
        help="stored weight type: int8, int8_float32, int8_float16, int8_bfloat16, int16, float16, "
        "bfloat16 or float32 (default: float32)",
    )
    p.set_defaults(func=cmd_export_ct2)
