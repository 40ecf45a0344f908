"""How much Korean the word vocabulary cannot read: the unknown-word rate on John (the Bible recipe's test split) of
word vocabularies trained on the Korean side of the train split, with and without the morpheme pre-tokenizer, and
the lossless BPE beside them.

    attnkit data fetch bible --pair en-ko && python benchmarks/unknown_words.py [--vocab-size 10000 ...]

The morpheme rows need the ko extra (``pip install 'attnkit[ko]'``). Prints a markdown table: per tokenizer, the
share of John's whitespace-separated words with an <unk> among their tokens (comparable across pre-tokenizers,
whose tokens differ), the share of tokens that are <unk>, and the vocabulary size reached.
"""

from __future__ import annotations

import argparse
import time

from attnkit.data.packages import default_cache_dir
from attnkit.data.readers.parallel import read_parallel_tsv
from attnkit.tokenization import Tokenizer, train_tokenizer


def rates(tokenizer: Tokenizer, texts: list[str]) -> tuple[float, float]:
    """(share of words with an <unk>, share of tokens that are <unk>) over ``texts``."""
    words = [word for text in texts for word in text.split()]
    unknown_words = sum(tokenizer.unk_id in ids for ids in tokenizer.encode_batch(words))
    tokens = [ids for ids in tokenizer.encode_batch(texts)]
    n_tokens = sum(len(ids) for ids in tokens)
    return unknown_words / len(words), sum(ids.count(tokenizer.unk_id) for ids in tokens) / n_tokens


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pair", default="en-ko", help="Bible pair whose target side is measured (default en-ko)")
    parser.add_argument("--vocab-size", type=int, nargs="+", default=[10000, 50000])
    parser.add_argument("--min-freq", type=int, default=2)
    args = parser.parse_args()
    directory = default_cache_dir() / "bible" / args.pair
    train = [pair.target for pair in read_parallel_tsv(directory / "train.tsv")]
    test = [pair.target for pair in read_parallel_tsv(directory / "test.tsv")]
    print(f"{args.pair} target side: {len(train)} train verses, {len(test)} test verses (John)\n")
    print("| tokenizer | vocab_size (reached) | unknown words | unknown tokens | train seconds |")
    print("|---|---|---|---|---|")
    for vocab_size in args.vocab_size:
        for kind, pretokenize in (("word", "none"), ("word", "morphemes"), ("bpe", "none")):
            start = time.perf_counter()
            tokenizer = train_tokenizer(
                train, kind=kind, vocab_size=vocab_size, min_freq=args.min_freq, pretokenize=pretokenize
            )
            seconds = time.perf_counter() - start
            words, tokens = rates(tokenizer, test)
            name = kind + (f" + {pretokenize}" if pretokenize != "none" else "")
            print(f"| {name} | {vocab_size} ({tokenizer.vocab_size}) | {words:.2%} | {tokens:.2%} | {seconds:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
