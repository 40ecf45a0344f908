"""Decoding an encoder-decoder Transformer: greedy search and beam search (§6.1), both on the key/value cache.

``greedy`` and ``beam`` hold the two searches, ``penalty`` the ranking of finished beam hypotheses (GNMT's
lp, the paper's alpha = 0.6), and ``limits`` the maximum output length (§6.1: input length + 50). Both searches
drop finished sentences from the working batch and return token ids without BOS and EOS. ``corpus`` decodes a
list of encoded sources in length-sorted batches (``translate_ids``).
"""

from attnkit.decoding.beam import Hypothesis, beam_search, beam_search_nbest
from attnkit.decoding.corpus import translate_ids
from attnkit.decoding.greedy import greedy_decode, greedy_decode_scored
from attnkit.decoding.limits import output_limits
from attnkit.decoding.penalty import LENGTH_PENALTIES, length_penalty

__all__ = [
    "LENGTH_PENALTIES",
    "Hypothesis",
    "beam_search",
    "beam_search_nbest",
    "greedy_decode",
    "greedy_decode_scored",
    "length_penalty",
    "output_limits",
    "translate_ids",
]
