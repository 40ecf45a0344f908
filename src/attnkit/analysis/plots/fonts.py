"""Fonts for token labels in Korean, Chinese or Japanese, and the characters that no installed font can draw.

DejaVu Sans, matplotlib's default, has no Hangul, Han or kana: without a fallback font such a token label draws as
empty boxes. matplotlib takes each glyph from the first font of a family list that has it, so the list
(``font_families``) starts with DejaVu Sans (Latin labels look as before) and goes on to the installed fonts of
``CJK_FONTS``. It is an attention grid's family (its token labels and caption included) and the fonts
``missing_glyphs`` checks.
"""

from __future__ import annotations

from collections.abc import Iterable

# Fonts with Hangul, Han and kana, tried in this order after DejaVu Sans where installed: Korean first (the
# project's own second language), then Japanese and Chinese. Any one installed is enough for Korean (Debian:
# fonts-nanum, fonts-noto-cjk); matplotlib only reads a font installed after its font cache was built once that
# cache is deleted.
CJK_FONTS = (
    "Noto Sans CJK KR",
    "Noto Sans CJK JP",
    "Noto Sans KR",
    "NanumGothic",
    "Source Han Sans K",
    "Malgun Gothic",
    "Apple SD Gothic Neo",
    "UnDotum",
    "Baekmuk Gulim",
    "WenQuanYi Zen Hei",
    "Droid Sans Fallback",
)


def font_families() -> list[str]:
    """DejaVu Sans, then the installed ``CJK_FONTS`` (matplotlib falls back glyph by glyph along the list, and
    logs a warning for a family that is not installed, hence only those)."""
    from matplotlib import font_manager

    installed = {font.name for font in font_manager.fontManager.ttflist}
    return ["DejaVu Sans", *(name for name in CJK_FONTS if name in installed)]


def missing_glyphs(texts: Iterable[str]) -> list[str]:
    """The characters of ``texts`` (whitespace aside) that none of ``font_families()`` can draw, in code-point
    order."""
    from matplotlib import font_manager
    from matplotlib.ft2font import FT2Font

    wanted = {char for text in texts for char in text if not char.isspace()}
    for family in font_families():
        path = font_manager.findfont(font_manager.FontProperties(family=family), fallback_to_default=False)
        wanted -= {chr(point) for point in FT2Font(path).get_charmap()}
    return sorted(wanted)
