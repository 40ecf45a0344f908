"""The token ids of every benchmark input: the special tokens first, where attnkit's tokenizers put them, then
ordinary tokens."""

from __future__ import annotations

# attnkit's tokenizers give the special tokens the first ids (attnkit.tokenization.tokenizer.SPECIAL_TOKENS);
# benchmark inputs draw ordinary tokens from FIRST_ORDINARY_ID up.
PAD_ID, UNK_ID, CLS_ID, BOS_ID, EOS_ID = 0, 1, 2, 3, 4
FIRST_ORDINARY_ID = 5
