"""Tokenizers: a word-level vocabulary and subword (BPE, WordPiece) tokenizers, all built on the `tokenizers` library
so that every kind is saved as one ``tokenizer.json`` and restored exactly.

Modules: ``tokenizer`` (the ``Tokenizer`` a run loads and uses: encode, decode, fingerprint, save and load),
``train`` (``train_tokenizer``: a vocabulary of each kind learned from text), ``bpe`` (the lossless BPE learner it
uses) and ``morphemes`` (Korean morphemes as the word kind's units).
"""

from attnkit.tokenization.tokenizer import SPECIAL_TOKENS, Tokenizer
from attnkit.tokenization.train import train_tokenizer

__all__ = ["SPECIAL_TOKENS", "Tokenizer", "train_tokenizer"]
