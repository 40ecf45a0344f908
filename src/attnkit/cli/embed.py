"""``attnkit embed``: sentence vectors."""

from __future__ import annotations

import argparse

from attnkit.cli.common import add_device_arg, device_of, print_json, texts_from
from attnkit.errors import InputError


def cmd_embed(args: argparse.Namespace) -> None:
    from attnkit.interop.bert import embed

    texts = texts_from(args.texts)
    if not texts:
        raise InputError("embed: no text given (pass TEXT arguments or lines on stdin)")
    vectors = embed(args.model, texts, pool=args.pool, normalize=args.normalize, device=device_of(args))  # (N, D)
    for text, vector in zip(texts, vectors.tolist()):
        print_json({"text": text, "vector": [float(f"{x:.9g}") for x in vector]})  # 9 digits: float32 exactly


def add_commands(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("embed", help="sentence vectors, one JSON object per text")
    p.add_argument(
        "--model",
        required=True,
        metavar="DIR|minilm",
        help="a Hugging Face BERT folder, minilm (the cached recipe), or a classifier or pretraining run directory",
    )
    p.add_argument(
        "--pool",
        choices=("mean", "cls"),
        help="mean over the real tokens or the [CLS] token (default: a classifier run's own pooling, else mean)",
    )
    p.add_argument("--normalize", action="store_true", help="unit-length vectors (cosine similarity = dot product)")
    add_device_arg(p)
    p.add_argument("texts", nargs="*", metavar="TEXT", help="texts (default: one per stdin line)")
    p.set_defaults(func=cmd_embed)
