"""Tasks (layer 4): one package per task, each with its data encoding, its training entry and its inference.

``classify`` (text classification), ``translate`` (the encoder-decoder of the paper), ``embed`` (sentence vectors
from a loaded encoder).
"""
