"""``attnkit.translate``: the translator's inference API for users (``from attnkit.translate import TranslatorRun``).

A re-export of ``attnkit.tasks.translate`` and ``attnkit.decoding.corpus``; nothing inside attnkit imports this
module.
"""

from attnkit.decoding.corpus import translate_ids
from attnkit.tasks.translate import TranslatorRun, encode_sources

__all__ = ["TranslatorRun", "encode_sources", "translate_ids"]
