"""Sentence embeddings from a loaded encoder: ``sentence_embeddings`` (``pooling``)."""

from attnkit.tasks.embed.pooling import sentence_embeddings

__all__ = ["sentence_embeddings"]
