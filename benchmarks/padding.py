"""How much of a fine-tuning epoch is padding: RT polarity's training split in MiniLM's WordPiece tokens, batched as
``classify train`` batches it (length buckets, ``bucket_factor`` 50) and at random (``bucket_factor=1``, as the
Hugging Face recipe draws batches).

    attnkit data fetch rt-polarity && attnkit data fetch minilm && python benchmarks/padding.py [--batch-size 32]

Prints, per batching, the positions the model computes (batch x longest sentence, summed over the epoch) over the
real tokens, and the share of positions that are padding. Every position costs the same in a Transformer layer, so
the first figure is the epoch's time relative to no padding at all (the attention scores grow faster).
"""

from __future__ import annotations

import argparse
import csv
import sys

import torch
from tokenizers import Tokenizer

from attnkit.data.batching import bucketed_batches
from attnkit.data.packages import default_cache_dir


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    cache = default_cache_dir()
    tokenizer = Tokenizer.from_file(str(cache / "minilm" / "tokenizer.json"))
    tokenizer.no_padding()  # the folder's tokenizer.json pads every batch to one length; count real tokens
    with open(cache / "rt-polarity" / "train.tsv", encoding="utf-8", newline="") as f:
        texts = [row[0] for row in csv.reader(f, delimiter="\t")][1:]  # first row: the header
    lengths = [len(encoding.ids) for encoding in tokenizer.encode_batch(texts)]  # [CLS] ... [SEP]
    for bucket_factor in (50, 1):
        batches = bucketed_batches(lengths, args.batch_size, torch.Generator().manual_seed(0), bucket_factor)
        positions = sum(len(batch) * max(lengths[i] for i in batch) for batch in batches)
        tokens = sum(lengths)
        print(
            f"bucket_factor={bucket_factor}: {positions / tokens:.2f} positions per real token, "
            f"{1 - tokens / positions:.0%} padding ({len(texts)} sentences, batch {args.batch_size})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
