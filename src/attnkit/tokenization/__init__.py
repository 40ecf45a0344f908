"""Tokenizers: a word-level vocabulary and subword (BPE, WordPiece) tokenizers, all built on the `tokenizers` library
so that every kind is saved as one ``tokenizer.json`` and restored exactly."""

from attnkit.tokenization.tokenizer import SPECIAL_TOKENS, Tokenizer, train_tokenizer

__all__ = ["SPECIAL_TOKENS", "Tokenizer", "train_tokenizer"]
